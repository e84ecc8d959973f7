//! The session's GET stream: what a handshake-era server sends outside our requests, read for as long as the
//! transport lives.

use std::ops::ControlFlow;
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::debug;
use url::Url;

use super::{StreamableHttpTransport, CANCEL_TIMEOUT};
use crate::mcp::protocol::{self, Message, RequestId};
use crate::mcp::transport::bounded::{Events, MAX_MESSAGE_BYTES};
use crate::mcp::transport::relay::{answer_outside, too_many_asks, Asker, MAX_OUTSIDE_ASKS};
use crate::mcp::transport::relays::Relays;
use crate::mcp::transport::{Announcement, RequestHeaders};

/// Wait before reopening a session's GET stream the server ended, doubled after each failed reopening up to
/// [`SERVER_STREAM_RETRY_MAX`].
const SERVER_STREAM_RETRY: Duration = Duration::from_secs(5);
const SERVER_STREAM_RETRY_MAX: Duration = Duration::from_secs(60);

impl StreamableHttpTransport {
    /// Open the session's GET stream, on which a handshake-era server sends what is not tied to a request
    /// (list changes, resource updates); it is reopened when the server ends it, until the transport goes or
    /// the server says it has no such stream (405), forgot the session (404, 400, 410) or refuses the credentials
    /// this stream was opened with (401, 403: a renewal opens a new stream). Any other refusal (a 502 from a proxy
    /// while the server restarts, a 503, a 429) or a network error is passing: the stream is asked for again,
    /// backing off.
    pub(super) fn open_server_stream(&self, headers: &RequestHeaders) {
        if self.session.lock().is_none() {
            return;
        }
        let base = self.stream_headers(headers);
        // The answers to the server's requests on this stream go back by POST on the same session.
        let mut answer_headers = base.clone();
        answer_headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        answer_headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let stream = ServerStream {
            client: self.client.clone(),
            url: self.url.clone(),
            base,
            answer_headers,
            notifications: self.notifications.clone(),
            relays: self.relays.clone(),
            stop: self.stop.clone(),
            label: self.label.clone(),
            asker: self.asker.clone(),
            asks: tokio::task::JoinSet::new(),
        };
        tokio::spawn(stream.run());
    }
}

/// One session's GET stream, read (and reopened) by its own task until the transport's `stop`.
struct ServerStream {
    client: Client,
    url: Url,
    /// The headers the stream is asked for with.
    base: HeaderMap,
    /// The headers of the answers to the server's requests.
    answer_headers: HeaderMap,
    notifications: broadcast::Sender<Announcement>,
    /// The transport's requests that asked for progress.
    relays: std::sync::Arc<Relays>,
    stop: CancellationToken,
    label: String,
    asker: Option<Asker>,
    /// Requests waiting for a client's answer; they end with the stream.
    asks: tokio::task::JoinSet<()>,
}

impl ServerStream {
    async fn run(mut self) {
        let mut retry = SERVER_STREAM_RETRY;
        loop {
            let request = self.client.get(self.url.clone()).headers(self.base.clone());
            let response = tokio::select! {
                _ = self.stop.cancelled() => return,
                response = request.send() => response,
            };
            let failed = match response {
                Ok(response) if response.status().is_success() => {
                    retry = SERVER_STREAM_RETRY;
                    if self.read(response).await.is_break() {
                        return;
                    }
                    false
                }
                Ok(response) if refused_for_good(response.status()) => {
                    debug!(process_id = %self.label, status = %response.status(), "no server stream on this session");
                    return;
                }
                Ok(response) => {
                    debug!(process_id = %self.label, status = %response.status(), "server stream refused for now; asking again");
                    true
                }
                Err(err) => {
                    debug!(process_id = %self.label, error = %err, "server stream failed");
                    true
                }
            };
            let wait = retry;
            retry = if failed { (retry * 2).min(SERVER_STREAM_RETRY_MAX) } else { SERVER_STREAM_RETRY };
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Read the stream until the server ends it; `Break` when the transport went meanwhile.
    async fn read(&mut self, response: Response) -> ControlFlow<()> {
        let mut events = Events::of(response, MAX_MESSAGE_BYTES);
        loop {
            let event = tokio::select! {
                _ = self.stop.cancelled() => return ControlFlow::Break(()),
                event = events.next() => event,
            };
            let Some(Ok(event)) = event else { return ControlFlow::Continue(()) };
            let Ok(value) = serde_json::from_str::<Value>(&event.data) else { continue };
            match Message::from_value(value) {
                // Progress about one of our requests goes to its call, whichever stream the server sent it on.
                Ok(Message::Notification { method, params }) => {
                    if let Err(params) = self.relays.deliver_progress(&method, params) {
                        let note = protocol::notification(&method, params);
                        let _ = self.notifications.send(std::sync::Arc::new(note));
                    }
                }
                Ok(Message::Request { id, method, params }) => self.ask(id, method, params).await,
                _ => {}
            }
        }
    }

    /// A request of the server's: asked of the owner's clients while the stream is read on, or refused at once when
    /// too many wait already.
    async fn ask(&mut self, id: RequestId, method: String, params: Option<Value>) {
        while self.asks.try_join_next().is_some() {}
        if self.asks.len() >= MAX_OUTSIDE_ASKS {
            debug!(process_id = %self.label, method = %method, "too many server requests waiting, refused");
            let reply = protocol::error_response(Some(id), too_many_asks());
            post_answer(&self.client, &self.url, &self.answer_headers, &reply, &self.label).await;
            return;
        }
        let (client, url, headers) = (self.client.clone(), self.url.clone(), self.answer_headers.clone());
        let (asker, label) = (self.asker.clone(), self.label.clone());
        self.asks.spawn(async move {
            let reply = match answer_outside(asker.as_ref(), &method, params).await {
                Ok(result) => protocol::response(id, result),
                Err(err) => protocol::error_response(Some(id), err),
            };
            post_answer(&client, &url, &headers, &reply, &label).await;
        });
    }
}

/// Whether a refusal of the stream is final for this session: no such stream (405), the session forgotten (404,
/// 400, 410), or the credentials it was opened with refused (401, 403).
fn refused_for_good(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::NOT_FOUND
            | StatusCode::BAD_REQUEST
            | StatusCode::GONE
            | StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
    )
}

/// POST the answer to a server's request made on the GET stream.
async fn post_answer(client: &Client, url: &Url, headers: &HeaderMap, reply: &Value, label: &str) {
    let sent = client.post(url.clone()).headers(headers.clone()).timeout(CANCEL_TIMEOUT).json(reply).send().await;
    if let Err(err) = sent {
        debug!(process_id = %label, error = %err, "answering the server's request failed");
    }
}
