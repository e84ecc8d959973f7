//! Streamable HTTP transport (client side).
//!
//! Each request is a POST; the reply is JSON or an SSE stream ending with the
//! response. The `Mcp-Session-Id` the server hands out at `initialize` is sent
//! on every later request; a 404 on a known session (or a 400 that says so) means the server forgot it,
//! so the transport replays the handshake once and retries. Modern-revision
//! requests carry `Mcp-Method`/`Mcp-Name` and never a session.
//!
//! Here the transport and its calls; `send` sends one request, `reply` reads its reply (JSON or SSE),
//! `messages` handles what the reply carries, `session` keeps and renews the session, and `server_stream` reads
//! the session's GET stream.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::Client;
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::debug;
use url::Url;

use super::bounded::{self, ERROR_BODY_BYTES};
use super::http_wire::{classify_reqwest, header_map};
use super::relay::Asker;
use super::relays::Relays;
use super::{error_body, Relay, RequestHeaders, UpstreamError};
use crate::mcp::headers as mirrored;
use crate::mcp::payload::Payload;
use crate::mcp::protocol;

mod messages;
mod reply;
mod send;
mod server_stream;
mod session;

use messages::Asks;
use session::SendError;

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
    /// Our requests that asked for progress, by the token of ours that stands for their client's own: the server
    /// sees only ours, a plain string (a client's own may be a float or an integer past 2^53, which a server may
    /// refuse or round), and its progress reaches the client under the token it sent, on either stream.
    relays: Arc<Relays>,
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
            relays: Arc::default(),
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
