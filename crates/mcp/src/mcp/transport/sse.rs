//! Legacy HTTP+SSE transport (2024-11-05 style): a GET stream whose first
//! `endpoint` event names the URL to POST messages to; responses come back as
//! `message` events on the stream. A reader task owns the stream.
//!
//! Like a stdio child's pipe, the stream carries the server's messages about every request of ours with nothing
//! naming the request: progress, log lines and requests to the client are matched to calls by `Relays`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{HeaderMap, ACCEPT};
use reqwest::Client;
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use url::Url;

use super::bounded::{self, Events, ERROR_BODY_BYTES, MAX_MESSAGE_BYTES};
use super::http_wire::{classify_reqwest, header_map};
use super::in_flight::{InFlight, Withdraw};
use super::relay::{answer_outside, too_many_asks, Asker, ServerAsks, ASK_TIMEOUT, MAX_OUTSIDE_ASKS};
use super::relays::{self, Relays};
use super::{await_response, error_body, outcome, preview, Pending, Relay, UpstreamError};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, Message, RequestId};

#[derive(Debug)]
pub struct SseTransport {
    label: String,
    client: Client,
    headers: HeaderMap,
    endpoint: Url,
    next_id: AtomicI64,
    pending: Arc<Pending>,
    stop: CancellationToken,
    /// Notifications the server sends on the stream (list changes, resource updates).
    notifications: broadcast::Sender<super::Announcement>,
    /// Our requests with a client to relay to.
    relays: Arc<Relays>,
}

impl SseTransport {
    /// Open the event stream and wait for the `endpoint` event.
    pub async fn connect(
        label: String,
        client: Client,
        url: Url,
        headers: &BTreeMap<String, String>,
        timeout: Duration,
        asker: Option<Asker>,
    ) -> Result<Self, UpstreamError> {
        let headers = header_map(headers)?;
        let response = open_stream(&client, &url, &headers, timeout).await?;
        let pending = Arc::new(Pending::default());
        let stop = CancellationToken::new();
        let (endpoint_tx, endpoint_rx) = oneshot::channel();
        let notifications = broadcast::channel(super::ANNOUNCEMENT_BACKLOG).0;
        let relays = Arc::new(Relays::default());
        let reader = Reader {
            label: label.clone(),
            // Where the stream was answered: the configured URL, or its https upgrade (the only redirect of another
            // origin the client follows), which the endpoint event is resolved against and must match.
            base: response.url().clone(),
            configured: url.clone(),
            pending: pending.clone(),
            endpoint_tx: Some(endpoint_tx),
            notifications: notifications.clone(),
            answers: Answers { client: client.clone(), headers: headers.clone(), endpoint: None, asker },
            asks: ServerAsks::default(),
            outside: ServerAsks::default(),
            relays: relays.clone(),
        };
        tokio::spawn(reader.run(response, stop.clone()));
        // Until the endpoint event, the reader goes with this connect: on a failure below, and when whoever waits
        // for it gives up (the instance removed or replaced, the satellite stopping), which drops this future.
        let reader_guard = stop.drop_guard();

        let endpoint = endpoint_event(endpoint_rx, timeout).await?;
        let stop = reader_guard.disarm();
        Ok(Self { label, client, headers, endpoint, next_id: AtomicI64::new(1), pending, stop, notifications, relays })
    }

    /// Notifications the server sends (list changes, resource updates).
    /// Pass `note` to the announcements' listeners as if the server had sent it outside any request.
    pub fn announce(&self, note: crate::mcp::transport::Announcement) {
        let _ = self.notifications.send(note);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<super::Announcement> {
        self.notifications.subscribe()
    }

    pub fn is_alive(&self) -> bool {
        !self.stop.is_cancelled()
    }

    /// Send a request and wait for its response on the stream. With a `relay`, what the server sends while it
    /// runs (progress under the caller's token, log lines, requests to the client) goes to the relay. A request
    /// that ends without its response (timed out, or the caller gave up) is cancelled with
    /// `notifications/cancelled`, as a client talking to the server directly would.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.pending.register(id)?;
        let mut params = params;
        if let Some(relay) = relay {
            let token = relays::take_progress_token(&mut params, id);
            self.relays.add(id, relay.clone(), token);
        }
        let mut in_flight = InFlight::new(self, id, method);
        let body = protocol::request(RequestId::Number(id), method, params);
        if let Err(err) = self.post(&body, timeout).await {
            in_flight.answered = true;
            self.pending.forget(id);
            return Err(err);
        }
        let outcome = await_response(&self.pending, id, rx, method, timeout).await;
        in_flight.answered = !matches!(outcome, Err(UpstreamError::Timeout { .. }));
        outcome
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), UpstreamError> {
        self.post(&protocol::notification(method, params), Duration::from_secs(30)).await
    }

    pub async fn close(&self) {
        self.stop.cancel();
        self.pending.close(UpstreamError::Closed(format!("sse connection {} closed", self.label)));
    }

    async fn post(&self, body: &Value, timeout: Duration) -> Result<(), UpstreamError> {
        let mut traced = self.headers.clone();
        super::inject_trace_context(&mut traced);
        let response = self
            .client
            .post(self.endpoint.clone())
            .headers(traced)
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|err| classify_reqwest(&err))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = bounded::head(response, ERROR_BODY_BYTES).await;
        Err(UpstreamError::HttpStatus { status: status.as_u16(), body: error_body(&text, &self.headers, 300) })
    }
}

/// GET the event stream, within `timeout`; a refusal is an error with what its body says.
async fn open_stream(
    client: &Client,
    url: &Url,
    headers: &HeaderMap,
    timeout: Duration,
) -> Result<reqwest::Response, UpstreamError> {
    let response = tokio::time::timeout(
        timeout,
        client.get(url.clone()).headers(headers.clone()).header(ACCEPT, "text/event-stream").send(),
    )
    .await
    .map_err(|_| UpstreamError::Timeout { method: "GET sse".into(), after: timeout })?
    .map_err(|err| classify_reqwest(&err))?;
    let status = response.status();
    if !status.is_success() {
        let body = bounded::head(response, ERROR_BODY_BYTES).await;
        return Err(UpstreamError::HttpStatus { status: status.as_u16(), body: error_body(&body, headers, 300) });
    }
    Ok(response)
}

/// The URL the stream's `endpoint` event names, as the reader sends it within `timeout`, or why there is none.
async fn endpoint_event(
    endpoint_rx: oneshot::Receiver<Result<Url, String>>,
    timeout: Duration,
) -> Result<Url, UpstreamError> {
    match tokio::time::timeout(timeout, endpoint_rx).await {
        Ok(Ok(Ok(endpoint))) => Ok(endpoint),
        Ok(Ok(Err(refused))) => Err(UpstreamError::Protocol(refused)),
        Ok(Err(_)) => Err(UpstreamError::Protocol("sse stream ended before the endpoint event".into())),
        Err(_) => Err(UpstreamError::Timeout { method: "sse endpoint event".into(), after: timeout }),
    }
}

/// A request of ours to a legacy SSE server: its relay goes when it ends; unanswered, it is forgotten and the
/// server told to stop by a POST to its endpoint.
impl Withdraw for &SseTransport {
    fn ended(&self, id: i64) {
        self.relays.remove(id);
    }

    fn abandoned(&self, id: i64, notice: Option<Value>) {
        self.pending.forget(id);
        let (Some(notice), Ok(runtime)) = (notice, tokio::runtime::Handle::try_current()) else { return };
        let answers = Answers {
            client: self.client.clone(),
            headers: self.headers.clone(),
            endpoint: Some(self.endpoint.clone()),
            asker: None,
        };
        runtime.spawn(answers.post(self.label.clone(), notice));
    }
}

impl Drop for SseTransport {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The URL an `endpoint` event names, resolved against the stream's (`base`). It must be of the stream's origin, as
/// the TypeScript SDK requires too: messages carry the server's headers, and a server must not be able to send them,
/// and every call, to another host.
///
/// One exception: when the configured `http://` URL was upgraded to `https://` on the same host, a server behind a
/// TLS terminator names the plain address it knows, of the configured origin. A client connecting directly would
/// take that (the TypeScript SDK checks the configured origin); the satellite takes it upgraded, so that its
/// messages stay on the secure channel the stream came by.
fn endpoint_url(configured: &Url, base: &Url, data: &str) -> Result<Url, String> {
    let mut endpoint = base.join(data).map_err(|err| format!("the sse endpoint event is not a URL: {err}"))?;
    let upgraded = configured.scheme() == "http" && base.scheme() == "https" && configured.host() == base.host();
    if upgraded && endpoint.origin() == configured.origin() {
        endpoint
            .set_scheme("https")
            .and_then(|()| endpoint.set_port(base.port()))
            .map_err(|()| "the sse endpoint event's URL cannot be upgraded to https".to_owned())?;
    }
    if endpoint.origin() != base.origin() {
        return Err(format!(
            "the sse endpoint event names another origin ({}) than the stream's ({})",
            endpoint.origin().ascii_serialization(),
            base.origin().ascii_serialization()
        ));
    }
    Ok(endpoint)
}

struct Reader {
    label: String,
    base: Url,
    /// The URL the instance names, which `base` may be the https upgrade of.
    configured: Url,
    pending: Arc<Pending>,
    /// The first `endpoint` event's URL, or why it cannot be used.
    endpoint_tx: Option<oneshot::Sender<Result<Url, String>>>,
    notifications: broadcast::Sender<super::Announcement>,
    answers: Answers,
    /// The server's requests during a call of ours, waiting for that call's client; they end with the stream.
    asks: ServerAsks,
    /// Those made outside any call (at most `MAX_OUTSIDE_ASKS` wait), as on stdio.
    outside: ServerAsks,
    relays: Arc<Relays>,
}

/// How the server's requests are answered, the answer POSTed to the endpoint: asked of the client whose call is
/// running (the newest, as over stdio), or outside any call of the instance owner's clients.
#[derive(Clone)]
struct Answers {
    client: Client,
    headers: HeaderMap,
    endpoint: Option<Url>,
    asker: Option<Asker>,
}

impl Answers {
    /// Ask the client of the call in flight (`relay`), else the owner's clients outside any call, and POST the
    /// answer.
    async fn answer(
        self,
        label: String,
        relay: Option<(Relay, bool)>,
        id: RequestId,
        method: String,
        params: Option<Value>,
    ) {
        let answer = match relay {
            Some((relay, ours)) => relay.ask_as(&method, params, ASK_TIMEOUT, ours).await,
            None => answer_outside(self.asker.as_ref(), &method, params).await,
        };
        let reply = match answer {
            Ok(result) => protocol::response(id, result),
            Err(err) => protocol::error_response(Some(id), err),
        };
        self.post(label, reply).await;
    }

    async fn post(self, label: String, reply: Value) {
        let Some(endpoint) = self.endpoint else { return };
        let sent = self.client.post(endpoint).headers(self.headers).json(&reply).timeout(ANSWER_TIMEOUT).send().await;
        if let Err(err) = sent {
            debug!(process_id = %label, error = %err, "answering the server's request failed");
        }
    }
}

/// How long POSTing an answer may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

impl Reader {
    async fn run(mut self, response: reqwest::Response, stop: CancellationToken) {
        let mut events = Events::of(response, MAX_MESSAGE_BYTES);
        let reason = loop {
            let event = tokio::select! {
                _ = stop.cancelled() => break "closed".to_owned(),
                event = events.next() => event,
            };
            match event {
                None => break "sse stream ended".to_owned(),
                Some(Err(err)) => break format!("sse stream failed: {err}"),
                // The endpoint is set once: requests and the answers to the server's own requests go where the
                // first event said. (Were a later one followed, answers would move but requests not.)
                Some(Ok(event)) if event.event == "endpoint" && self.answers.endpoint.is_some() => {
                    warn!(process_id = %self.label, "a second sse endpoint event ignored; messages go where the first said");
                }
                Some(Ok(event)) if event.event == "endpoint" => {
                    match endpoint_url(&self.configured, &self.base, event.data.trim()) {
                        Ok(endpoint) => {
                            self.answers.endpoint = Some(endpoint.clone());
                            if let Some(tx) = self.endpoint_tx.take() {
                                let _ = tx.send(Ok(endpoint));
                            }
                        }
                        Err(err) => {
                            warn!(process_id = %self.label, error = %err, "invalid sse endpoint event");
                            if let Some(tx) = self.endpoint_tx.take() {
                                let _ = tx.send(Err(err));
                            }
                        }
                    }
                }
                Some(Ok(event)) if event.event.is_empty() || event.event == "message" => self.on_message(&event.data),
                Some(Ok(event)) => debug!(process_id = %self.label, event = %event.event, "sse event ignored"),
            }
        };
        stop.cancel();
        self.pending.close(UpstreamError::Closed(format!("sse connection {}: {reason}", self.label)));
    }

    fn on_message(&mut self, data: &str) {
        // An answer goes on as the server wrote it (mcp::payload).
        if let Some((id, result)) = protocol::result_response(data) {
            self.pending.resolve(id, Ok(Payload::text(result.to_owned())));
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(data) else {
            warn!(process_id = %self.label, data = %preview(data, 200), "invalid json in sse message, skipped");
            return;
        };
        match Message::from_value(value) {
            Ok(Message::Response { id: RequestId::Number(id), outcome: result }) => {
                self.pending.resolve(id, outcome(result));
            }
            Ok(Message::Notification { method, params }) => {
                // The server no longer waits for one of its requests: its client is asked no more.
                if method == "notifications/cancelled"
                    && (self.asks.withdraw(params.as_ref()) || self.outside.withdraw(params.as_ref()))
                {
                    return;
                }
                if let Err(params) = self.relays.deliver(&method, params) {
                    let _ = self.notifications.send(std::sync::Arc::new(protocol::notification(&method, params)));
                }
            }
            Ok(Message::Request { id, method, params }) => {
                let answers = self.answers.clone();
                if let Some(relay) = self.relays.newest() {
                    self.asks
                        .spawn(Some(id.clone()), answers.answer(self.label.clone(), Some(relay), id, method, params));
                    return;
                }
                if self.outside.len() >= MAX_OUTSIDE_ASKS {
                    debug!(process_id = %self.label, method = %method, "too many server requests waiting, refused");
                    let refused = protocol::error_response(Some(id), too_many_asks());
                    self.asks.spawn(None, answers.post(self.label.clone(), refused));
                    return;
                }
                self.outside.spawn(Some(id.clone()), answers.answer(self.label.clone(), None, id, method, params));
            }
            Ok(other) => debug!(process_id = %self.label, message = ?other, "sse message ignored"),
            Err(err) => warn!(process_id = %self.label, error = %err, "malformed json-rpc message on sse stream"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("url")
    }

    /// A path, or an absolute URL of the stream's origin, is taken; another origin is not. After an upgrade from
    /// http to https on the same host, the configured plain origin is taken upgraded, and only that.
    #[test]
    fn an_endpoint_is_of_the_streams_origin_or_the_configured_one_upgraded() {
        let plain = url("http://mcp.example.com/sse");
        let secure = url("https://mcp.example.com/sse");
        let cases: [(&Url, &str, Option<&str>); 8] = [
            (&plain, "/messages?s=1", Some("http://mcp.example.com/messages?s=1")),
            (&plain, "http://mcp.example.com/m", Some("http://mcp.example.com/m")),
            (&plain, "http://evil.example.com/m", None),
            (&plain, "https://mcp.example.com/m", None),
            (&secure, "/messages?s=1", Some("https://mcp.example.com/messages?s=1")),
            (&secure, "http://mcp.example.com/messages?s=1", Some("https://mcp.example.com/messages?s=1")),
            (&secure, "http://mcp.example.com:8080/m", None),
            (&secure, "http://evil.example.com/m", None),
        ];
        for (base, data, expected) in cases {
            let got = endpoint_url(&plain, base, data).ok().map(String::from);
            assert_eq!(got.as_deref(), expected, "{base} + {data}");
        }
        // Without an upgrade, the configured origin is just the stream's.
        let direct = url("https://mcp.example.com/sse");
        assert!(endpoint_url(&direct, &direct, "http://mcp.example.com/m").is_err());
    }
}
