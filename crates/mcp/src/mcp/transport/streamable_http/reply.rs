//! Reading the reply to one of our requests: a JSON body, or an SSE stream resumed where the server left it.

use std::time::Duration;

use eventsource_stream::Event;
use futures::StreamExt;
use serde_json::Value;
use tracing::debug;

use super::{Asks, StreamableHttpTransport, ERROR_BODY_PREVIEW};
use crate::mcp::payload::Payload;
use crate::mcp::protocol;
use crate::mcp::transport::bounded::{self, Events, ERROR_BODY_BYTES, MAX_MESSAGE_BYTES};
use crate::mcp::transport::http_wire::{classify_reqwest, complete_values};
use crate::mcp::transport::{error_body, preview, Relay, RequestHeaders, UpstreamError};

/// Resumptions of one reply stream in a row without a message in between, before giving up.
const MAX_RESUMES: u32 = 5;
/// The longest `retry` the satellite honours before resuming a stream.
const MAX_RESUME_WAIT: Duration = Duration::from_secs(10);

impl StreamableHttpTransport {
    /// A JSON reply, read as it arrives: normally one message (or a batch), but some servers stream several
    /// messages as newline-delimited JSON under `application/json` (notifications first, the response last, or
    /// a `subscriptions/listen` stream that stays open). Each message is handled as an SSE event would be.
    pub(super) async fn read_json_reply(
        &self,
        response: reqwest::Response,
        id: i64,
        headers: &RequestHeaders,
        relay: Option<&Relay>,
        timeout: Duration,
    ) -> Result<Payload, UpstreamError> {
        let mut body = response.bytes_stream();
        let mut buffer: Vec<u8> = Vec::new();
        loop {
            let chunk = body.next().await;
            let ended = chunk.is_none();
            if let Some(chunk) = chunk {
                buffer.extend_from_slice(&chunk.map_err(|err| UpstreamError::Io(err.to_string()))?);
            }
            // What is left after the whole values is one value still coming: bounded like one stdio line.
            if buffer.len() > MAX_MESSAGE_BYTES {
                return Err(UpstreamError::Protocol(format!("a reply longer than {MAX_MESSAGE_BYTES} bytes")));
            }
            // The usual body, one response with the answer, goes on as the server wrote it (mcp::payload). Tried
            // only when the bytes so far may end an object, so a body that comes in many chunks is not rescanned
            // at every one.
            if buffer.trim_ascii_end().ends_with(b"}") {
                let answer = std::str::from_utf8(&buffer).ok().and_then(protocol::result_response);
                if let Some((_, result)) = answer.filter(|(n, _)| *n == id) {
                    return Ok(Payload::text(result.to_owned()));
                }
            }
            let Some((parsed, consumed)) = complete_values(&buffer, ended) else {
                let text = String::from_utf8_lossy(&buffer);
                return Err(UpstreamError::Protocol(format!(
                    "invalid json reply: {}",
                    error_body(&text, &self.headers, ERROR_BODY_PREVIEW)
                )));
            };
            buffer.drain(..consumed);
            for value in parsed {
                // A JSON reply is one body: the server goes on only once its request is answered.
                if let Some(answer) = self.handle_message(value, id, headers, relay, timeout, None).await {
                    return answer;
                }
            }
            if ended {
                return Err(UpstreamError::Protocol(format!("reply did not answer request {id}")));
            }
        }
    }

    /// An SSE reply, read until its response: the server's requests on it are answered while it is read on, and a
    /// stream the server ends early is resumed.
    pub(super) async fn read_sse_reply(
        &self,
        response: reqwest::Response,
        id: i64,
        headers: &RequestHeaders,
        relay: Option<&Relay>,
        timeout: Duration,
    ) -> Result<Payload, UpstreamError> {
        let mut events = Events::of(response, MAX_MESSAGE_BYTES);
        let mut place = Place::default();
        // The server's requests on this stream are answered while it is read on.
        let mut asks = Asks::default();
        loop {
            loop {
                let event = tokio::select! {
                    biased;
                    Some(done) = asks.running.next(), if !asks.running.is_empty() => {
                        asks.finished(done);
                        continue;
                    }
                    event = events.next() => event,
                };
                let Some(event) = event else { break };
                let event = event.map_err(|err| UpstreamError::Io(format!("sse stream: {err}")))?;
                place.note(&event);
                if !carries_message(&event) {
                    continue;
                }
                // The answer itself goes on as the server wrote it (mcp::payload).
                if let Some((_, result)) = protocol::result_response(&event.data).filter(|(n, _)| *n == id) {
                    return Ok(Payload::text(result.to_owned()));
                }
                let Ok(value) = serde_json::from_str::<Value>(&event.data) else {
                    debug!(process_id = %self.label, data = %preview(&event.data, 200), "invalid json in sse event, skipped");
                    continue;
                };
                place.resumed = 0;
                if let Some(answer) = self.handle_message(value, id, headers, relay, timeout, Some(&mut asks)).await {
                    return answer;
                }
            }
            events = Events::of(self.reopen_reply(&mut place, headers, &mut asks).await?, MAX_MESSAGE_BYTES);
        }
    }

    /// The server closed the stream before answering. With an event id it means to go on later: resume with GET
    /// and Last-Event-ID (2025-11-25 resumability), as a client talking to it directly would.
    async fn reopen_reply(
        &self,
        place: &mut Place,
        headers: &RequestHeaders,
        asks: &mut Asks<'_>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let (Some(event_id), true) = (place.last_event_id.clone(), place.resumed < MAX_RESUMES) else {
            return Err(UpstreamError::Protocol("the server ended its reply stream before the response".into()));
        };
        place.resumed += 1;
        debug!(process_id = %self.label, last_event_id = %event_id, "resuming the reply stream");
        // The questions asked so far go on while the stream is asked for again: a server may hold its answer
        // to the GET until the client has answered.
        let reopened = async {
            tokio::time::sleep(place.retry).await;
            self.resume(&event_id, headers).await
        };
        tokio::pin!(reopened);
        loop {
            tokio::select! {
                biased;
                Some(done) = asks.running.next(), if !asks.running.is_empty() => asks.finished(done),
                reopened = &mut reopened => break reopened,
            }
        }
    }

    /// GET the stream again from after `last_event_id`.
    async fn resume(&self, last_event_id: &str, headers: &RequestHeaders) -> Result<reqwest::Response, UpstreamError> {
        let request = self
            .client
            .get(self.url.clone())
            .headers(self.stream_headers(headers))
            .header("last-event-id", last_event_id);
        let response = request.send().await.map_err(|err| classify_reqwest(&err))?;
        let status = response.status();
        if !status.is_success() {
            let text = bounded::head(response, ERROR_BODY_BYTES).await;
            return Err(UpstreamError::HttpStatus {
                status: status.as_u16(),
                body: error_body(&text, &self.headers, ERROR_BODY_PREVIEW),
            });
        }
        Ok(response)
    }
}

/// Where a reply stream was left, to resume it from there.
#[derive(Default)]
struct Place {
    /// The id of the last event that had one.
    last_event_id: Option<String>,
    /// How long the server asked to wait before resuming (at most [`MAX_RESUME_WAIT`]).
    retry: Duration,
    /// Resumptions in a row without a message in between.
    resumed: u32,
}

impl Place {
    /// What `event` says of where the stream is: its id, and the wait before resuming.
    fn note(&mut self, event: &Event) {
        if !event.id.is_empty() {
            self.last_event_id = Some(event.id.clone());
        }
        if let Some(wait) = event.retry {
            self.retry = wait.min(MAX_RESUME_WAIT);
        }
    }
}

/// Whether `event` is a message event with something in it.
fn carries_message(event: &Event) -> bool {
    (event.event.is_empty() || event.event == "message") && !event.data.trim().is_empty()
}
