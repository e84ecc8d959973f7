//! Streamable HTTP transport (client side).
//!
//! Each request is a POST; the reply is JSON or an SSE stream ending with the
//! response. The `Mcp-Session-Id` the server hands out at `initialize` is sent
//! on every later request; a 404 on a known session (or a 400 that says so) means the server forgot it,
//! so the transport replays the handshake once and retries. Modern-revision
//! requests carry `Mcp-Method`/`Mcp-Name` and never a session.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::{Client, StatusCode};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};
use url::Url;

use super::bounded::{self, ERROR_BODY_BYTES};
use super::http_wire::{classify_reqwest, header_map};
use super::in_flight::{InFlight, Withdraw};
use super::relay::Asker;
use super::{error_body, mask_sent, sent_values, Relay, RequestHeaders, UpstreamError};
use crate::mcp::headers as mirrored;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, Message, RequestId};

mod messages;
mod reply;
mod server_stream;

use messages::Asks;

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
const ERROR_BODY_PREVIEW: usize = 300;
/// The `initialize` params and headers of a handshake-era session.
type Handshake = (Option<Value>, RequestHeaders);

/// How long a `notifications/cancelled` for an abandoned request may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub struct StreamableHttpTransport {
    label: String,
    client: Client,
    url: Url,
    headers: HeaderMap,
    next_id: AtomicI64,
    session: Mutex<Option<String>>,
    /// The initialize request body and the headers it was sent with, replayed when the server forgets the session
    /// (boxed: kept once per connection, it would make every `Transport` larger).
    handshake: Mutex<Option<Box<Handshake>>>,
    /// Notifications the server sends outside our requests, on the GET stream of a handshake-era session.
    notifications: broadcast::Sender<super::Announcement>,
    /// Ends the GET stream with the transport.
    stop: CancellationToken,
    /// Counts the sessions replayed after the server forgot one: what the old session held (subscriptions) is
    /// gone with it, and whoever keeps that state asks again when this changes.
    renewals: tokio::sync::watch::Sender<u64>,
    /// Held while the handshake is replayed, so that requests finding the session gone together replay it once
    /// (boxed: rarely used, and it would make every `Transport` larger).
    renewing: Box<tokio::sync::Mutex<()>>,
    /// The last renewal failed: the session is gone, and the next request renews it before it is sent (sent
    /// without a session, it would only be refused, and nothing would ever renew it).
    renewal_failed: AtomicBool,
    /// Where the server's requests made outside any request of ours go: its owner's clients.
    asker: Option<Asker>,
}

impl Drop for StreamableHttpTransport {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl StreamableHttpTransport {
    /// `headers` are the instance's own; invalid names or values are refused here, before any request.
    pub fn new(
        label: String,
        client: Client,
        url: Url,
        headers: &BTreeMap<String, String>,
    ) -> Result<Self, UpstreamError> {
        Ok(Self {
            label,
            client,
            url,
            headers: header_map(headers)?,
            next_id: AtomicI64::new(1),
            session: Mutex::new(None),
            handshake: Mutex::new(None),
            notifications: broadcast::channel(super::ANNOUNCEMENT_BACKLOG).0,
            stop: CancellationToken::new(),
            renewals: tokio::sync::watch::Sender::new(0),
            renewing: Box::default(),
            renewal_failed: AtomicBool::new(false),
            asker: None,
        })
    }

    /// Requests the server makes outside any request of ours (on its GET stream) go to `asker`.
    pub fn with_asker(mut self, asker: Option<Asker>) -> Self {
        self.asker = asker;
        self
    }

    /// Notifications the server sends outside our requests (list changes, resource updates).
    /// Pass `note` to the announcements' listeners as if the server had sent it outside any request.
    pub fn announce(&self, note: crate::mcp::transport::Announcement) {
        let _ = self.notifications.send(note);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<super::Announcement> {
        self.notifications.subscribe()
    }

    /// Changes each time the server forgot the session and the handshake was replayed on a new one.
    pub fn renewals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.renewals.subscribe()
    }

    pub fn session_id(&self) -> Option<String> {
        self.session.lock().clone()
    }

    /// One request; what the server sends on its reply stream before the response (notifications, requests to
    /// the client) goes to `relay`, and the client's answers go back under the server's own ids.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        let work = async {
            let mut sent_on = self.session_id();
            if sent_on.is_none() && headers.modern.is_none() && self.renewal_failed.load(Ordering::Acquire) {
                self.reinitialize(None).await?;
                sent_on = self.session_id();
            }
            let first = self.request_once(method, params.clone(), headers, relay, timeout).await;
            match first {
                Err(SendError::SessionGone) => {
                    self.reinitialize(sent_on).await?;
                    match self.request_once(method, params, headers, relay, timeout).await {
                        Err(SendError::SessionGone) => Err(UpstreamError::HttpStatus {
                            status: 404,
                            body: "session not found after re-initialize".into(),
                        }),
                        other => other.map_err(SendError::into_upstream),
                    }
                }
                other => other.map_err(SendError::into_upstream),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| UpstreamError::Timeout { method: method.to_owned(), after: timeout })?
    }

    pub async fn notify(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
    ) -> Result<(), UpstreamError> {
        let body = protocol::notification(method, params);
        let response = self.post(&body, headers).await?;
        let status = response.status();
        if status.is_success() {
            if method == "notifications/initialized" {
                self.open_server_stream(headers);
            }
            return Ok(());
        }
        let text = bounded::head(response, ERROR_BODY_BYTES).await;
        Err(UpstreamError::HttpStatus {
            status: status.as_u16(),
            body: error_body(&text, &self.headers, ERROR_BODY_PREVIEW),
        })
    }

    /// End the session with DELETE; errors are only logged, the server may already have dropped it.
    pub async fn close(&self) {
        let Some(session) = self.session.lock().take() else { return };
        let request = self
            .client
            .delete(self.url.clone())
            .headers(self.headers.clone())
            .header(SESSION_HEADER, session)
            .timeout(Duration::from_secs(2));
        if let Err(err) = request.send().await {
            debug!(process_id = %self.label, error = %err, "closing mcp session failed");
        }
    }

    /// Replay the handshake on a new session, the server having forgotten `gone`; nothing to do when another
    /// request already replaced it. (Each request that found it gone replaying it left the server an orphan
    /// session per request, and ran the restore of subscriptions and log level once each.)
    async fn reinitialize(&self, gone: Option<String>) -> Result<(), UpstreamError> {
        let _one = self.renewing.lock().await;
        // Replaced by another request's renewal meanwhile. No session at all (a renewal that failed) is renewed
        // again here, or nothing would ever renew it.
        if self.session.lock().as_ref().is_some_and(|current| Some(current) != gone.as_ref()) {
            return Ok(());
        }
        info!(process_id = %self.label, "mcp session expired upstream, re-initializing once");
        *self.session.lock() = None;
        // Set before the handshake is replayed, cleared only once it succeeded: a renewal cut short (its request's
        // timeout, its caller gone) leaves no session either, and the next request must renew it.
        self.renewal_failed.store(true, Ordering::Release);
        let Some((params, headers)) = self.handshake.lock().clone().map(|kept| *kept) else {
            return Err(UpstreamError::Protocol("session lost before any initialize".into()));
        };
        let renewed = async {
            self.request_once("initialize", params, &headers, None, Duration::from_secs(30))
                .await
                .map_err(SendError::into_upstream)?;
            self.notify("notifications/initialized", None, &headers).await
        }
        .await;
        renewed?;
        self.renewal_failed.store(false, Ordering::Release);
        self.renewals.send_modify(|renewed| *renewed += 1);
        Ok(())
    }

    async fn post(&self, body: &Value, headers: &RequestHeaders) -> Result<reqwest::Response, UpstreamError> {
        let mut traced = self.headers.clone();
        super::inject_trace_context(&mut traced);
        let mut request = self
            .client
            .post(self.url.clone())
            .headers(traced)
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .json(body);
        if let Some(version) = &headers.protocol_version {
            request = request.header(PROTOCOL_VERSION_HEADER, version);
        }
        if let Some(modern) = &headers.modern {
            request = request.header(mirrored::METHOD, &modern.method);
            if let Some(name) = &modern.name {
                request = request.header(mirrored::NAME, mirrored::encode_value(name));
            }
            for (name, value) in &modern.params {
                request = request.header(name, value);
            }
        } else if let Some(session) = self.session.lock().clone() {
            request = request.header(SESSION_HEADER, session);
        }
        request.send().await.map_err(|err| classify_reqwest(&err))
    }

    async fn request_once(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
        relay: Option<&Relay>,
        timeout: Duration,
    ) -> Result<Payload, SendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let had_session = headers.modern.is_none() && self.session.lock().is_some();
        let body = protocol::request(RequestId::Number(id), method, params.clone());
        // A handshake-era request that ends unanswered is cancelled upstream, as a direct client would; on
        // 2026-07-28 closing the request's stream is the cancellation. `initialize` is never cancelled.
        let session = SessionRequest { transport: self, protocol_version: headers.protocol_version.clone() };
        let mut in_flight = InFlight::new(session, id, method);
        // A 2026-07-28 request is cancelled by closing its stream, not by a notice.
        in_flight.answered = headers.modern.is_some();
        let outcome: Result<Payload, SendError> = async {
            let response = self.post(&body, headers).await?;
            let status = response.status();
            if status == StatusCode::NOT_FOUND && had_session && method != "initialize" {
                return Err(SendError::SessionGone);
            }
            if !status.is_success() {
                let text = bounded::head(response, ERROR_BODY_BYTES).await;
                // Modern servers put a JSON-RPC error in 4xx bodies; surface it as such.
                if let Ok(value) = serde_json::from_str::<Value>(&text) {
                    if status == StatusCode::BAD_REQUEST && had_session && forgot_session(&value) {
                        return Err(SendError::SessionGone);
                    }
                    if let Ok(Message::Response { outcome: Err(err), .. }) = Message::from_value(value) {
                        // The error's text goes to the client and the logs: what the server echoed of our headers is masked.
                        let mut err = err;
                        err.message = mask_sent(&err.message, &self.headers);
                        if let Some(data) = err.data.take() {
                            err.data = Some(crate::secrets::hide_json(&data, &sent_values(&self.headers)));
                        }
                        return Err(UpstreamError::Rpc(err).into());
                    }
                }
                return Err(UpstreamError::HttpStatus {
                    status: status.as_u16(),
                    body: error_body(&text, &self.headers, ERROR_BODY_PREVIEW),
                }
                .into());
            }
            if method == "initialize" {
                if let Some(session) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
                    *self.session.lock() = Some(session.to_owned());
                }
                *self.handshake.lock() = Some(Box::new((params, headers.clone())));
            }
            let content_type =
                response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
            if content_type.starts_with("text/event-stream") {
                return self.read_sse_reply(response, id, headers, relay, timeout).await.map_err(SendError::from);
            }
            self.read_json_reply(response, id, headers, relay, timeout).await.map_err(SendError::from)
        }
        .await;
        in_flight.answered |= !matches!(outcome, Err(SendError::Upstream(UpstreamError::Timeout { .. })));
        outcome
    }

    /// The headers of a GET stream of this session: the instance's own, SSE, the negotiated version, the session.
    fn stream_headers(&self, headers: &RequestHeaders) -> HeaderMap {
        let mut map = self.headers.clone();
        map.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        if let Some(version) = headers.protocol_version.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            map.insert(PROTOCOL_VERSION_HEADER, version);
        }
        if let Some(session) = self.session.lock().as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
            map.insert(SESSION_HEADER, session);
        }
        map
    }
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

/// Whether a 400's error says the server does not know the session it was sent. The spec answers an unknown
/// session with 404, but the SDKs' example servers, which many servers are built from, answer 400 "Bad Request: No
/// valid session ID provided" (server-everything among them): a server restarted that way would otherwise fail
/// every call until the instance is restarted, where a 404 costs one replayed handshake. Only a refusal of the
/// transport's kind counts: no request `id` (the server did not read the request), the SDKs' transport codes
/// (-32000, -32001), and a message saying the session is unknown; an application error worded alike is an answer.
fn forgot_session(body: &Value) -> bool {
    let unread = body.get("id").is_none_or(Value::is_null);
    let code = body.pointer("/error/code").and_then(Value::as_i64);
    let transport = matches!(code, Some(codes::TRANSPORT_ERROR | codes::UNAUTHORIZED));
    let message = body.pointer("/error/message").and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
    let unknown = message.contains("session") && (message.contains("no valid") || message.contains("not found"));
    unread && transport && unknown
}

/// An internal signal that the server no longer knows our session.
enum SendError {
    SessionGone,
    Upstream(UpstreamError),
}

impl From<UpstreamError> for SendError {
    fn from(err: UpstreamError) -> Self {
        SendError::Upstream(err)
    }
}

impl SendError {
    fn into_upstream(self) -> UpstreamError {
        match self {
            SendError::SessionGone => UpstreamError::HttpStatus { status: 404, body: "session not found".into() },
            SendError::Upstream(err) => err,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::forgot_session;

    #[test]
    fn a_400_saying_the_session_is_unknown_is_a_forgotten_session() {
        let refusal = |id: Value, code: i64, message: &str| json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        // server-everything's, as the TypeScript SDK's example servers answer.
        assert!(forgot_session(&refusal(Value::Null, -32000, "Bad Request: No valid session ID provided")));
        assert!(forgot_session(&json!({"jsonrpc": "2.0", "error": {"code": -32001, "message": "Session not found"}})));
        let required = refusal(Value::Null, -32000, "Bad Request: Mcp-Session-Id header is required");
        assert!(!forgot_session(&required), "asked for one, not forgotten");
        assert!(!forgot_session(&refusal(Value::Null, -32602, "Invalid params: uri not found")));
        let answered = refusal(json!(7), -32000, "session not found in the tenant's store");
        assert!(!forgot_session(&answered), "an answer to the request, not a refusal of the session");
        assert!(!forgot_session(&refusal(Value::Null, -32603, "Session not found")), "an application's error code");
    }
}
