//! Clients for the three upstream transports, behind one enum.
//!
//! Each transport moves JSON-RPC messages and matches responses to requests;
//! protocol negotiation and `_meta` stamping live one level up in
//! `mcp::client`. Every request carries its own timeout.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::mcp::payload::Payload;
use crate::mcp::protocol::RpcError;

pub(crate) mod bounded;
pub mod http_wire;
mod in_flight;
pub mod junk;
pub mod relay;
pub(crate) mod relays;
pub mod sse;
pub mod stderr;
pub mod stdio;
pub mod streamable_http;

pub use relay::{Inbound, Relay};

/// Server notifications queued per listener before the slowest one starts to miss some.
pub(crate) const ANNOUNCEMENT_BACKLOG: usize = 64;

/// A notification a server sent outside any request. Shared, not copied: a channel slot holds a pointer rather
/// than a whole `Value` (16 bytes against 80 for each of a channel's slots, allocated when it is made), and
/// each listener gets the same message.
pub type Announcement = std::sync::Arc<Value>;
pub use sse::SseTransport;
pub use stdio::{ExitInfo, ResourceLimits, StderrSink, StderrTail, StdioLaunch, StdioTransport};
pub use streamable_http::StreamableHttpTransport;

/// What went wrong talking to an upstream MCP server. Each cause is its own variant carrying its data, so
/// decisions (status, retry, restart, re-authorisation) are a `match`, never a reading of the message.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// The server answered with a JSON-RPC error: it is alive and refused the request.
    #[error("server returned error {}: {}", .0.code, .0.message)]
    Rpc(RpcError),
    #[error("request timeout: {method} after {}ms", .after.as_millis())]
    Timeout { method: String, after: Duration },
    /// The stdio child is gone: how it ended (exit code or signal), and what it last said.
    #[error("process {label} is not running: {}{}", .exit.describe(), suffix(.detail))]
    Exited { label: String, exit: ExitInfo, detail: Option<String> },
    /// The stream or pipe closed; nothing more will arrive.
    #[error("{0}")]
    Closed(String),
    /// The operating system could not start the program.
    #[error("failed to spawn mcp server: {program}: {message}{}", suffix(.detail))]
    Spawn { program: String, kind: std::io::ErrorKind, message: String, detail: Option<String> },
    /// Not started at all: the sandbox refused the command.
    #[error("failed to spawn mcp server: {0}")]
    Refused(String),
    /// Not started yet: a cap on processes (the user's or the satellite's) was reached.
    #[error("failed to spawn mcp server: {0}")]
    AtCapacity(String),
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("http status {status}: {body}")]
    HttpStatus { status: u16, body: String },
    /// A GitHub-deployed server could not be deployed: the step that failed, and why.
    #[error("GitHub deployment failed at {step}: {reason}")]
    Deployment { step: &'static str, reason: String, transient: bool },
    /// The user has no usable OAuth token for this server; the text says what to do.
    #[error("{0}")]
    OAuth(String),
    /// The server said something that is not valid MCP.
    #[error("{0}")]
    Protocol(String),
    #[error("io error: {0}")]
    Io(String),
}

fn suffix(detail: &Option<String>) -> String {
    detail.as_deref().map(|d| format!("; {d}")).unwrap_or_default()
}

impl UpstreamError {
    /// The OS refused to start `program`.
    pub fn spawn(program: &str, err: &std::io::Error) -> Self {
        UpstreamError::Spawn { program: program.to_owned(), kind: err.kind(), message: err.to_string(), detail: None }
    }

    /// Attach context (the child's last stderr line, say) to the failures that can carry it; the cause stays.
    pub fn with_detail(self, context: &str) -> Self {
        let add =
            |detail: Option<String>| Some(detail.map_or_else(|| context.to_owned(), |d| format!("{d}; {context}")));
        match self {
            UpstreamError::Exited { label, exit, detail } => UpstreamError::Exited { label, exit, detail: add(detail) },
            UpstreamError::Spawn { program, kind, message, detail } => {
                UpstreamError::Spawn { program, kind, message, detail: add(detail) }
            }
            UpstreamError::Closed(m) => UpstreamError::Closed(format!("{m}; {context}")),
            UpstreamError::Protocol(m) => UpstreamError::Protocol(format!("{m}; {context}")),
            UpstreamError::Io(m) => UpstreamError::Io(format!("{m}; {context}")),
            UpstreamError::Connect(m) => UpstreamError::Connect(format!("{m}; {context}")),
            other => other,
        }
    }
}

/// Protocol headers an HTTP transport sends with a request; ignored by stdio.
#[derive(Debug, Clone, Default)]
pub struct RequestHeaders {
    /// `MCP-Protocol-Version`, once a version is negotiated.
    pub protocol_version: Option<String>,
    /// `Mcp-Method` and `Mcp-Name` of the 2026-07-28 revision.
    pub modern: Option<ModernHeaders>,
}

#[derive(Debug, Clone)]
pub struct ModernHeaders {
    pub method: String,
    pub name: Option<String>,
    /// `Mcp-Param-{Name}` headers (lower-case names, encoded values) mirrored from a `tools/call`'s arguments.
    pub params: Vec<(String, String)>,
}

/// One upstream connection, whatever its transport.
#[derive(Debug)]
pub enum Transport {
    Stdio(StdioTransport),
    StreamableHttp(StreamableHttpTransport),
    Sse(SseTransport),
}

impl Transport {
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
        timeout: Duration,
    ) -> Result<Value, UpstreamError> {
        self.request_relayed(method, params, headers, timeout, None).await.and_then(read_payload)
    }

    /// A request whose notifications and server-to-client requests go to `relay` (its client) while it runs.
    /// Dropping the future cancels the request upstream where the transport can say so.
    pub async fn request_relayed(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        // The HTTP transports' futures are boxed: held inline, the ~3 KB of a Streamable HTTP request made every
        // call's future that size, a stdio call's too, and every proxied call copies its call future into a box
        // (`InstanceManager::call_relayed`). A remote call pays one small allocation instead.
        match self {
            Transport::Stdio(t) => t.request(method, params, timeout, relay).await,
            Transport::StreamableHttp(t) => Box::pin(t.request(method, params, headers, timeout, relay)).await,
            Transport::Sse(t) => Box::pin(t.request(method, params, timeout, relay)).await,
        }
    }

    pub async fn notify(
        &self,
        method: &str,
        params: Option<Value>,
        headers: &RequestHeaders,
    ) -> Result<(), UpstreamError> {
        match self {
            Transport::Stdio(t) => t.notify(method, params).await,
            Transport::StreamableHttp(t) => t.notify(method, params, headers).await,
            Transport::Sse(t) => t.notify(method, params).await,
        }
    }

    /// What the server sends outside any request of ours (list changes, resource updates), as JSON-RPC
    /// notifications; the channel closes with the transport.
    pub fn announcements(&self) -> tokio::sync::broadcast::Receiver<Announcement> {
        match self {
            Transport::Stdio(t) => t.subscribe(),
            Transport::StreamableHttp(t) => t.subscribe(),
            Transport::Sse(t) => t.subscribe(),
        }
    }

    /// Announce `note` as if the server had sent it outside any request: what a 2026-07-28 server says on the
    /// satellite's own `subscriptions/listen` stream.
    pub fn announce(&self, note: Announcement) {
        match self {
            Transport::Stdio(t) => t.announce(note),
            Transport::StreamableHttp(t) => t.announce(note),
            Transport::Sse(t) => t.announce(note),
        }
    }

    /// For a Streamable HTTP session, changes each time the server forgot it and a new one was negotiated (see
    /// [`StreamableHttpTransport::renewals`]); the other transports end with their session instead.
    pub fn session_renewals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Transport::StreamableHttp(t) => Some(t.renewals()),
            Transport::Stdio(_) | Transport::Sse(_) => None,
        }
    }

    /// Whether the 2026-07-28 `server/discover` probe makes sense on this transport.
    /// The legacy HTTP+SSE transport predates it.
    pub fn may_speak_modern(&self) -> bool {
        !matches!(self, Transport::Sse(_))
    }

    /// Close the connection: stdio stops the child (stdin closed, then signals), HTTP ends its session.
    pub async fn close(&self) {
        match self {
            Transport::Stdio(t) => t.close().await,
            Transport::StreamableHttp(t) => t.close().await,
            Transport::Sse(t) => t.close().await,
        }
    }

    pub fn is_alive(&self) -> bool {
        match self {
            Transport::Stdio(t) => t.is_alive(),
            Transport::StreamableHttp(_) => true,
            Transport::Sse(t) => t.is_alive(),
        }
    }
}

type Waiter = oneshot::Sender<Result<Payload, UpstreamError>>;

/// Requests waiting for their response, by numeric id. Once closed, every
/// waiter is failed and new registrations fail at once.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    state: Mutex<PendingState>,
}

#[derive(Debug, Default)]
struct PendingState {
    waiters: HashMap<i64, Waiter>,
    closed: Option<UpstreamError>,
}

impl Pending {
    pub(crate) fn register(&self, id: i64) -> Result<oneshot::Receiver<Result<Payload, UpstreamError>>, UpstreamError> {
        let mut state = self.state.lock();
        if let Some(err) = &state.closed {
            return Err(err.clone());
        }
        let (tx, rx) = oneshot::channel();
        state.waiters.insert(id, tx);
        Ok(rx)
    }

    pub(crate) fn forget(&self, id: i64) {
        self.state.lock().waiters.remove(&id);
    }

    /// Deliver a response; returns false when no one waits for this id.
    pub(crate) fn resolve(&self, id: i64, outcome: Result<Payload, UpstreamError>) -> bool {
        let waiter = self.state.lock().waiters.remove(&id);
        match waiter {
            Some(tx) => {
                // The waiter may have timed out and gone; that is fine.
                let _ = tx.send(outcome);
                true
            }
            None => false,
        }
    }

    pub(crate) fn close(&self, err: UpstreamError) {
        let waiters: Vec<Waiter> = {
            let mut state = self.state.lock();
            state.closed.get_or_insert(err.clone());
            state.waiters.drain().map(|(_, w)| w).collect()
        };
        for waiter in waiters {
            let _ = waiter.send(Err(err.clone()));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.state.lock().waiters.len()
    }
}

/// Await a registered waiter under a deadline, forgetting it on timeout.
pub(crate) async fn await_response(
    pending: &Pending,
    id: i64,
    rx: oneshot::Receiver<Result<Payload, UpstreamError>>,
    method: &str,
    timeout: Duration,
) -> Result<Payload, UpstreamError> {
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(UpstreamError::Closed("connection closed before the response arrived".into())),
        Err(_) => {
            pending.forget(id);
            Err(UpstreamError::Timeout { method: method.to_owned(), after: timeout })
        }
    }
}

/// Map a response outcome from the wire into the transport's result.
pub(crate) fn outcome(outcome: Result<Value, RpcError>) -> Result<Payload, UpstreamError> {
    outcome.map(Payload::Value).map_err(UpstreamError::Rpc)
}

/// A result read as a value, for the satellite's own requests (handshakes, listings) that look inside it.
pub fn read_payload(payload: Payload) -> Result<Value, UpstreamError> {
    payload.into_value().map_err(|err| UpstreamError::Protocol(format!("result is not readable JSON: {err}")))
}

/// A short, single-line preview of untrusted text for logs and errors.
pub fn preview(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out.replace(['\n', '\r'], " ")
}

/// The preview of a remote server's error body, with the values of the headers the satellite sent it masked: a
/// server that echoes the request (its `Authorization`, a user's OAuth token, an API key header) would otherwise put
/// them in statuses, events and request logs, where the instance's configured secrets are masked but a user's
/// OAuth token, fetched at connect time, is not among them.
pub(crate) fn error_body(text: &str, sent: &reqwest::header::HeaderMap, max: usize) -> String {
    preview(&mask_sent(text, sent), max)
}

/// `text` with every header value of `sent` masked (and the credential after an auth scheme): a server may echo
/// the headers it was sent. All of them, not only the well-known credential headers: an instance's own headers
/// are often its API keys under names of the vendor's choosing.
pub(crate) fn mask_sent(text: &str, sent: &reqwest::header::HeaderMap) -> String {
    crate::secrets::hide(text, &sent_values(sent))
}

/// The values `mask_sent` masks: every header value sent, and the credential after an auth scheme, longest first.
pub(crate) fn sent_values(sent: &reqwest::header::HeaderMap) -> Vec<String> {
    let mut values = Vec::new();
    for value in sent.values().filter_map(|v| v.to_str().ok()) {
        if let Some((_, credential)) = value.split_once(' ') {
            values.push(credential.trim().to_owned());
        }
        values.push(value.to_owned());
    }
    // Longest first, so a whole header value is masked before the credential inside it.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values
}

/// A short preview of a JSON value for error messages.
pub fn preview_value(value: &Value) -> String {
    preview(&value.to_string(), 200)
}

/// Add the current span's W3C trace context (`traceparent`, `tracestate`) to an outgoing request's headers,
/// so an HTTP upstream joins the caller's trace. Does nothing when traces are off.
pub(crate) fn inject_trace_context(headers: &mut reqwest::header::HeaderMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    struct Injector<'a>(&'a mut reqwest::header::HeaderMap);
    impl opentelemetry::propagation::Injector for Injector<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                reqwest::header::HeaderName::from_bytes(key.as_bytes()),
                reqwest::header::HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut Injector(headers))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closing_fails_every_waiter_and_later_registrations() {
        let pending = Pending::default();
        let rx1 = pending.register(1).unwrap();
        let rx2 = pending.register(2).unwrap();
        pending.close(UpstreamError::Closed("gone".into()));
        assert!(matches!(rx1.await.unwrap(), Err(UpstreamError::Closed(_))));
        assert!(matches!(rx2.await.unwrap(), Err(UpstreamError::Closed(_))));
        assert!(pending.register(3).is_err());
    }

    #[tokio::test]
    async fn timeout_forgets_the_waiter() {
        let pending = Pending::default();
        let rx = pending.register(9).unwrap();
        let err = await_response(&pending, 9, rx, "tools/list", Duration::from_millis(5)).await.unwrap_err();
        assert!(matches!(err, UpstreamError::Timeout { .. }));
        assert_eq!(pending.len(), 0);
        assert!(!pending.resolve(9, Ok(Payload::Value(Value::Null))));
    }
}
