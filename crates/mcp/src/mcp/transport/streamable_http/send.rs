//! Sending one request of ours on the session, and withdrawing it upstream when it ends unanswered.

use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::Value;
use tracing::debug;

use super::session::{forgot_session, SendError};
use super::{StreamableHttpTransport, CANCEL_TIMEOUT, ERROR_BODY_PREVIEW, PROTOCOL_VERSION_HEADER, SESSION_HEADER};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, Message, RequestId, RpcError};
use crate::mcp::transport::bounded::{self, ERROR_BODY_BYTES};
use crate::mcp::transport::in_flight::{InFlight, Withdraw};
use crate::mcp::transport::{error_body, mask_sent, relays, sent_values, Relay, RequestHeaders, UpstreamError};

impl StreamableHttpTransport {
    /// Send request `method` once and read its reply to the response; `SessionGone` when the server no longer
    /// knows the session it was sent on.
    pub(super) async fn request_once(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
        relay: Option<&Relay>,
        timeout: Duration,
    ) -> Result<Payload, SendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let had_session = headers.modern.is_none() && self.session.lock().is_some();
        // A handshake-era request that ends unanswered is cancelled upstream, as a direct client would; on
        // 2026-07-28 closing the request's stream is the cancellation. `initialize` is never cancelled.
        let session = SessionRequest { transport: self, protocol_version: headers.protocol_version.clone() };
        let mut in_flight = InFlight::new(session, id, method);
        let mut params = params;
        if let Some(relay) = relay {
            // Forgotten with `in_flight`, however the request ends.
            if let Some(token) = relays::take_progress_token(&mut params, id) {
                self.relays.add(id, relay.clone(), Some(token));
            }
        }
        let body = protocol::request(RequestId::Number(id), method, params.clone());
        // A 2026-07-28 request is cancelled by closing its stream, not by a notice.
        in_flight.answered = headers.modern.is_some();
        let outcome: Result<Payload, SendError> = async {
            let response = self.post(&body, headers).await?;
            let status = response.status();
            if status == StatusCode::NOT_FOUND && had_session && method != "initialize" {
                return Err(SendError::SessionGone);
            }
            if !status.is_success() {
                return Err(self.refusal(response, had_session).await);
            }
            if method == "initialize" {
                self.remember_handshake(&response, params, headers);
            }
            if is_event_stream(&response) {
                return self.read_sse_reply(response, id, headers, relay, timeout).await.map_err(SendError::from);
            }
            self.read_json_reply(response, id, headers, relay, timeout).await.map_err(SendError::from)
        }
        .await;
        in_flight.answered |= !matches!(outcome, Err(SendError::Upstream(UpstreamError::Timeout { .. })));
        outcome
    }

    /// What a refusal of our request says: the session forgotten (a 400 saying so), the server's JSON-RPC error
    /// (modern servers put one in 4xx bodies; surfaced as such), else the status and the start of its body.
    async fn refusal(&self, response: reqwest::Response, had_session: bool) -> SendError {
        let status = response.status();
        let text = bounded::head(response, ERROR_BODY_BYTES).await;
        if let Ok(value) = serde_json::from_str::<Value>(&text) {
            if status == StatusCode::BAD_REQUEST && had_session && forgot_session(&value) {
                return SendError::SessionGone;
            }
            if let Ok(Message::Response { outcome: Err(err), .. }) = Message::from_value(value) {
                return UpstreamError::Rpc(self.masked(err)).into();
            }
        }
        UpstreamError::HttpStatus {
            status: status.as_u16(),
            body: error_body(&text, &self.headers, ERROR_BODY_PREVIEW),
        }
        .into()
    }

    /// The server's error as it goes to the client and the logs: what the server echoed of our headers is masked.
    fn masked(&self, mut err: RpcError) -> RpcError {
        err.message = mask_sent(&err.message, &self.headers);
        if let Some(data) = err.data.take() {
            err.data = Some(crate::secrets::hide_json(&data, &sent_values(&self.headers)));
        }
        err
    }
}

/// Whether the reply is an SSE stream (else it is JSON).
fn is_event_stream(response: &reqwest::Response) -> bool {
    let content_type =
        response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    content_type.starts_with("text/event-stream")
}

/// A handshake-era request of ours on a Streamable HTTP session, with the protocol version it was sent under. If
/// it ends unanswered, the server is told to stop with `notifications/cancelled`, sent on the session in the
/// background and bounded by a short timeout.
struct SessionRequest<'a> {
    transport: &'a StreamableHttpTransport,
    protocol_version: Option<String>,
}

impl Withdraw for SessionRequest<'_> {
    fn abandoned(&self, id: i64, notice: Option<Value>) {
        let (Some(notice), Ok(runtime)) = (notice, tokio::runtime::Handle::try_current()) else { return };
        let transport = self.transport;
        let mut request = transport
            .client
            .post(transport.url.clone())
            .headers(transport.headers.clone())
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .timeout(CANCEL_TIMEOUT)
            .json(&notice);
        if let Some(version) = &self.protocol_version {
            request = request.header(PROTOCOL_VERSION_HEADER, version);
        }
        if let Some(session) = transport.session.lock().clone() {
            request = request.header(SESSION_HEADER, session);
        }
        let (stop, label) = (transport.stop.clone(), transport.label.clone());
        runtime.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                sent = request.send() => {
                    if let Err(err) = sent {
                        debug!(process_id = %label, request_id = id, error = %err, "cancelling an upstream request failed");
                    }
                }
            }
        });
    }
}
