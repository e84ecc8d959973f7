//! The legacy HTTP+SSE transport (SB §4): `GET /sse` opens a stream whose
//! first event names `/message?session=…`; requests POSTed there are answered
//! on the stream, through the same hierarchical router as `/mcp`, with the
//! identity authenticated at `GET /sse` (OQ-19).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::StreamExt;
use parking_lot::Mutex;
use rand::RngCore;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{info, Instrument as _};
use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use super::audit::finish;
use super::body::Unread;
use super::dispatch::Target;
use super::error::McpError;
use super::exchange::{response_message, Exchange, Withdrawn};
use super::identity::Identity;
use super::stack::PeerAddr;
use super::{json_response, McpDeps, Routing};
use crate::auth::{Principal, SCOPE_READ};
use crate::events::{ClientConnected, ClientDisconnected, Event};
use crate::mcp::protocol::{self, codes, Message, RpcError, LEGACY_VERSIONS};
use crate::mcp::transport::relay::SeatGuard;
use crate::mcp::transport::{Inbound, Relay};
use crate::router::RouteError;

/// Events queued for one stream before the client counts as too slow and is dropped.
const STREAM_BUFFER: usize = 64;
pub const SSE_IDLE: Duration = Duration::from_secs(30 * 60);

struct SseSession {
    principal: Principal,
    /// The `?toolset=` the stream was opened with; resolved again on every message, so an edited toolset applies.
    toolset: Option<String>,
    events: mpsc::Sender<warp::sse::Event>,
    last_seen: Instant,
    tool_calls: u64,
    /// Once the client initialized: its place among the owner's streams that a server's request outside any call
    /// reaches (`Seats`), with the capabilities it declared. Goes with the session.
    seat: Option<SeatGuard>,
    /// What the client declared at `initialize` (`{}` past the bound a session keeps): a server's request during
    /// one of its calls reaches it only when it declared what the request needs, as on `/mcp`.
    capabilities: Option<Arc<Value>>,
}

/// `mcp.client.connected` events of one user (in one team) reported per minute; the streams past it open alike
/// but are reported neither connected nor disconnected, so a client opening and closing streams in a loop cannot
/// flood the outbox (and push out other events). Real clients open a few a minute.
const CONNECTION_EVENTS_PER_MINUTE: u32 = 30;
/// Users whose connection events are counted at once.
const COUNTED_USERS: usize = 10_000;

pub struct SseSessions {
    sessions: Mutex<HashMap<String, SseSession>>,
    /// Server requests awaiting the client's answer and calls it may cancel, per stream.
    exchange: Arc<Exchange>,
    /// Connection events reported per user.
    reported: crate::events::Throttle,
}

impl Default for SseSessions {
    fn default() -> Self {
        Self {
            sessions: Mutex::default(),
            exchange: Arc::default(),
            reported: crate::events::Throttle::with_burst(
                Duration::from_secs(60),
                CONNECTION_EVENTS_PER_MINUTE,
                COUNTED_USERS,
            ),
        }
    }
}

impl SseSessions {
    /// Shutdown: end every legacy stream now (their senders go; requests in flight finish on their own).
    pub fn close_streams(&self) {
        self.sessions.lock().clear();
    }

    /// Open legacy SSE streams.
    pub fn len(&self) -> usize {
        self.sessions.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn sweep(&self, idle: Duration) -> usize {
        let mut sessions = self.sessions.lock();
        let before = sessions.len();
        sessions.retain(|_, s| s.last_seen.elapsed() < idle && !s.events.is_closed());
        before - sessions.len()
    }
}

/// Removes the session when its stream is dropped (client gone) and reports `mcp.client.disconnected`.
struct Unregister {
    id: String,
    sessions: Arc<SseSessions>,
    emitter: crate::events::Emitter,
    /// Owns the task that records the disconnection (awaited at shutdown).
    tasks: tokio_util::task::TaskTracker,
    team_id: String,
    opened: Instant,
    /// Whether the connection was reported; only then is its end.
    reported: bool,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        let removed = self.sessions.sessions.lock().remove(&self.id);
        if !self.reported {
            return;
        }
        // A session the idle sweep already forgot timed out; otherwise the client went away.
        let (reason, tool_calls) = match &removed {
            Some(session) => ("client_close", session.tool_calls),
            None => ("timeout", 0),
        };
        let event = Event::client_disconnected(&ClientDisconnected {
            session_id: crate::secrets::session_reference(&self.id),
            team_id: self.team_id.clone(),
            connection_duration_seconds: self.opened.elapsed().as_secs(),
            tool_execution_count: tool_calls,
            disconnect_reason: reason,
        });
        let emitter = self.emitter.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(async move {
                emitter.emit(event).await;
            });
        }
    }
}

/// BP §8.5-15 `client_type` from the user agent.
fn client_type(user_agent: &str) -> &'static str {
    let ua = user_agent.to_ascii_lowercase();
    if ua.contains("vscode") || ua == "undici" {
        "vscode"
    } else if ua.contains("cursor") {
        "cursor"
    } else if ua.contains("claude") {
        "claude"
    } else {
        "unknown"
    }
}

pub fn routes(deps: McpDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer per request, not a copy of every dependency: warp runs this for each route it tries.
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    let peer = warp::ext::optional::<PeerAddr>();
    let open = warp::path!("sse")
        .and(warp::get())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and(warp::header::headers_cloned())
        .and(peer)
        .and(with.clone())
        .then(|query: String, headers: HeaderMap, peer: Option<PeerAddr>, deps: Arc<McpDeps>| async move {
            let answer = open(&deps, &headers, super::mcp::toolset_param(&query)).await;
            finish(&deps.gate, "sse", peer, &headers, None, answer).await
        });
    let message = warp::path!("message")
        .and(warp::post())
        .and(warp::query::<HashMap<String, String>>())
        .and(warp::header::headers_cloned())
        .and(super::body::unread())
        .and(peer)
        .and(with)
        .then(
            |query: HashMap<String, String>,
             headers: HeaderMap,
             body: Unread,
             peer: Option<PeerAddr>,
             deps: Arc<McpDeps>| async move {
                let answer = message(&deps, &query, &headers, body).await;
                finish(&deps.gate, "sse", peer, &headers, None, answer).await
            },
        );
    open.or(message).unify()
}

async fn open(deps: &McpDeps, headers: &HeaderMap, toolset: Option<String>) -> Result<Response, McpError> {
    let sessions = &deps.sessions.legacy;
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
    let principal = deps
        .gate
        .auth
        .authenticate_request(authorization)
        .await
        .and_then(|p| p.require(SCOPE_READ).map(|_| p))
        .map_err(McpError::Auth)?;
    // A toolset that cannot be used refuses the stream, with the reason, rather than opening an empty one.
    super::mcp::select_toolset(&deps.routing.toolsets, &principal, toolset.as_deref()).map_err(McpError::Rpc)?;
    // Held for as long as the stream is open: each holds a connection, and one caller's must not take them all.
    let caller = super::callers::member_key(principal.user.as_str(), principal.team.as_str());
    let streams = &deps.places.streams;
    let place = streams.take(caller.into()).ok_or(McpError::CallerStreams { limit: streams.max() })?;
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let team_id = principal.team.0.clone();
    let connected_user = principal.user.clone();
    // The stream ends once its token no longer admits its caller (revoked, expired, the user gone).
    let credential = super::credential::Credential::Bearer {
        authorization: authorization.unwrap_or_default().to_owned(),
        user: principal.user.clone(),
        team: principal.team.clone(),
    };
    let (auth, manager) = (deps.gate.auth.clone(), deps.routing.manager.clone());
    let revoked = super::credential::revoked(auth, manager, credential, "legacy sse");
    sessions.sessions.lock().insert(
        id.clone(),
        SseSession {
            principal,
            toolset,
            events: tx,
            last_seen: Instant::now(),
            tool_calls: 0,
            seat: None,
            capabilities: None,
        },
    );
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let user_agent = header_text("user-agent").unwrap_or_else(|| "unknown".into());
    let ip =
        crate::activity::ip_address(header_text("x-forwarded-for").as_deref(), header_text("x-real-ip").as_deref());
    let connected = ClientConnected {
        session_id: crate::secrets::session_reference(&id),
        client_type: client_type(&user_agent),
        user_agent,
        team_id: team_id.clone(),
        transport: "sse",
        ip_address: ip,
    };
    let user_key = super::callers::member_key(connected_user.as_str(), &team_id);
    let reported = match sessions.reported.allow(&user_key, Instant::now()) {
        Some(held) => {
            if held > 0 {
                info!(user = %connected_user, team = %team_id, held, "legacy SSE streams opened past the reporting budget were not reported as connections");
            }
            deps.background.events.emit(Event::client_connected(&connected)).await;
            true
        }
        None => false,
    };
    let endpoint = warp::sse::Event::default().event("endpoint").data(format!("/message?session={id}"));
    let guard = Unregister {
        id,
        sessions: sessions.clone(),
        emitter: deps.background.events.clone(),
        tasks: deps.background.tasks.clone(),
        team_id,
        opened: Instant::now(),
        reported,
    };
    let events = futures::stream::once(async move { endpoint })
        .chain(ReceiverStream::new(rx))
        .map(move |event| {
            let _keep = (&guard, &place);
            Ok::<_, Infallible>(event)
        })
        .take_until(revoked);
    let stream = warp::sse::keep_alive().interval(Duration::from_secs(30)).text("heartbeat").stream(events);
    let mut response = warp::sse::reply(stream).into_response();
    response.headers_mut().insert("access-control-allow-origin", warp::http::HeaderValue::from_static("*"));
    Ok(response)
}

async fn message(
    deps: &McpDeps,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Unread,
) -> Result<Response, McpError> {
    let sessions = &deps.sessions.legacy;
    let id = query.get("session").or_else(|| query.get("sessionId")).map(String::as_str).unwrap_or("");
    let well_formed = id.len() >= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !well_formed {
        return Err(McpError::MissingSseSession);
    }
    // Every message authenticates, as every `/mcp` request does: the session id alone is not a credential, and a
    // token revoked since the stream opened stops working at once. It must be the identity that opened the stream.
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
    let caller = deps.gate.auth.authenticate_request(authorization).await.map_err(McpError::Auth)?;
    // One of the caller's places (`http::callers`), shared with its `/mcp` requests; at its limit, a spare one for
    // a small body that holds no request, so that a caller at its limit can still cancel or answer.
    let busy = || McpError::CallerBusy { limit: deps.places.requests.max() };
    let length = headers.get(warp::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    let place = deps
        .places
        .requests
        .admit(super::callers::member_key(caller.user.as_str(), caller.team.as_str()).into(), length)
        .ok_or_else(busy)?;
    // Read once, after authentication: counted for activity here, answered below (or refused as unreadable there).
    let body = body.read().await?;
    let parsed = serde_json::from_slice::<Value>(&body);
    let admitted = match &parsed {
        Ok(Value::Array(messages)) => place.admits(messages),
        Ok(message) => place.admits(std::slice::from_ref(message)),
        Err(_) => true,
    };
    if !admitted {
        return Err(busy());
    }
    let tool_call = match &parsed {
        Ok(Value::Array(messages)) => crate::activity::calls_a_tool(messages),
        Ok(message) => crate::activity::calls_a_tool(std::slice::from_ref(message)),
        Err(_) => false,
    };
    let (principal, toolset, events, declared) = {
        let mut table = sessions.sessions.lock();
        let session = table.get_mut(id).ok_or(McpError::SseSessionNotFound)?;
        if caller.user != session.principal.user || caller.team != session.principal.team {
            return Err(McpError::SseSessionOfAnother);
        }
        session.last_seen = Instant::now();
        session.tool_calls += u64::from(tool_call);
        (caller.clone(), session.toolset.clone(), session.events.clone(), session.capabilities.clone())
    };
    caller.require(SCOPE_READ).map_err(McpError::Auth)?;
    // Legacy SSE callers count as client activity too (SB §17): by OAuth client when the stream's token had one.
    let client_id = principal.client_id.clone().unwrap_or_else(|| "legacy-sse".to_owned());
    let auth_type = if principal.client_id.is_some() { "oauth" } else { "sse" };
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    deps.background.activity.record(&crate::activity::Seen {
        user_id: &principal.user.0,
        team_id: &principal.team.0,
        client_id: &client_id,
        auth_type,
        client_name_header: header_text("x-mcp-client-name"),
        user_agent: header_text("user-agent"),
        session_id: Some(id),
        forwarded_for: header_text("x-forwarded-for"),
        real_ip: header_text("x-real-ip"),
        tool_call,
    });
    let value = parsed.map_err(|err| McpError::Parse(err.to_string()))?;
    let reply = match Message::from_value(value) {
        Err(err) => {
            protocol::error_response(None, RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {err}")))
        }
        Ok(Message::Notification { method, params }) => {
            match method.as_str() {
                "notifications/cancelled" => sessions.exchange.cancel(id, params.as_ref()),
                "notifications/roots/list_changed" => {
                    super::mcp::roots_changed(&deps.routing.manager, &principal, params).await
                }
                _ => {}
            }
            return Ok(json_response(StatusCode::ACCEPTED, &json!({"status": "accepted", "messageId": null})));
        }
        Ok(Message::Response { id: answered, outcome }) => {
            sessions.exchange.deliver(id, &answered, outcome);
            return Ok(json_response(StatusCode::ACCEPTED, &json!({"status": "accepted", "messageId": null})));
        }
        Ok(Message::Request { id: request_id, method, params }) if method == "initialize" => {
            let capabilities = params.as_ref().and_then(|p| p.get("capabilities")).cloned().unwrap_or_default();
            take_seat(deps, id, &principal, capabilities);
            let id = request_id;
            let requested = params.as_ref().and_then(|p| p.get("protocolVersion")).and_then(Value::as_str);
            let version =
                requested.filter(|v| *v == "2024-11-05" || LEGACY_VERSIONS.contains(v)).unwrap_or("2024-11-05");
            match super::mcp::select_toolset(&deps.routing.toolsets, &principal, toolset.as_deref()) {
                // The toolset the stream was opened with is gone since: say so, as `/mcp` does.
                Err(err) => protocol::error_response(Some(id), err),
                Ok(selected) => {
                    let mut identity = Identity::hierarchical_with(selected.as_deref());
                    // The legacy stream does not carry list changes: promise none.
                    identity.promise_no_list_changes();
                    protocol::response(
                        id,
                        json!({"protocolVersion": version, "capabilities": identity.capabilities,
                               "serverInfo": identity.server_info, "instructions": identity.instructions}),
                    )
                }
            }
        }
        Ok(Message::Request { id: request_id, method, params }) => {
            let call = RelayedCall {
                routing: deps.routing.clone(),
                sessions: sessions.clone(),
                scope: id.to_owned(),
                events,
                capabilities: declared,
            };
            let selection = super::mcp::select_toolset(&deps.routing.toolsets, &principal, toolset.as_deref());
            return call.run(principal, selection, request_id, method, params).await;
        }
    };
    let message_id = new_message_id();
    let event = warp::sse::Event::default().id(message_id.clone()).event("message").data(reply.to_string());
    if events.try_send(event).is_err() {
        // The stream is gone or not keeping up: end the session rather than buffer without bound.
        sessions.sessions.lock().remove(id);
        return Err(McpError::SseStreamClosed);
    }
    Ok(json_response(StatusCode::OK, &json!({"status": "sent", "messageId": message_id})))
}

/// Give the session a seat among its owner's streams (`Seats`), so a server's request made outside any call reaches
/// this client, when it declared the capability the request needs, as it reaches a `/mcp` client's GET stream. The
/// request goes on the stream under an id of the session's exchange; the client answers by POST. Capabilities past
/// the bound every session keeps get no seat (the server then gets a client's refusal).
fn take_seat(deps: &McpDeps, id: &str, principal: &Principal, capabilities: Value) {
    let sessions = &deps.sessions.legacy;
    let mut table = sessions.sessions.lock();
    let Some(session) = table.get_mut(id) else { return };
    if crate::mcp::payload::json_len(&capabilities) > super::session::MAX_CAPABILITIES_BYTES {
        session.capabilities = Some(Arc::new(json!({})));
        session.seat = None;
        return;
    }
    let capabilities = Arc::new(capabilities);
    session.capabilities = Some(capabilities.clone());
    let (relay, mut asks) = Relay::for_client(capabilities);
    let owner = crate::instances::seat_owner(&principal.team, &principal.user);
    // A second initialize replaces the first seat (and what it declared).
    session.seat = Some(deps.routing.manager.seats().take(owner, None, relay));
    // The stream ends when its session goes: this task holds it only while forwarding one request.
    let (stream, exchange, scope) = (session.events.downgrade(), sessions.exchange.clone(), id.to_owned());
    let (withdrawn, mut withdrawals) = withdrawals_to(stream.clone());
    // On the satellite's tracker, which shutdown waits for: the seat goes with the session once the drain has
    // closed the legacy streams, and this task with it.
    deps.background.tasks.spawn(async move {
        loop {
            let message = tokio::select! {
                inbound = asks.recv() => {
                    let Some(inbound) = inbound else { break };
                    match exchange.outbound(&scope, &protocol::RequestId::Number(0), inbound, &withdrawn) {
                        Some((message, _)) => message,
                        None => continue,
                    }
                }
                Some(note) = withdrawals.recv() => note,
            };
            let Some(events) = stream.upgrade() else { break };
            // A stream the client stopped reading is not waited on for long (nor kept open by this wait): the
            // request then goes unanswered and the server gets its timeout's error.
            let event = warp::sse::Event::default().event("message").data(message.to_string());
            if !send_or_give_up(&events, event).await {
                break;
            }
        }
    });
}

/// Word that a server request no longer waits for its answer, for a legacy stream: through the channel returned,
/// which whoever puts the requests on the stream reads between them (so the word never overtakes its request);
/// once that reader is gone, onto the stream directly, if it has room.
fn withdrawals_to(events: mpsc::WeakSender<warp::sse::Event>) -> (Withdrawn, mpsc::Receiver<Value>) {
    let (tx, rx) = mpsc::channel::<Value>(super::exchange::WITHDRAWALS);
    let withdrawn = Withdrawn::new(move |note| {
        let note = match tx.try_send(note) {
            Ok(()) => return Ok(()),
            // A reader that far behind is not reading: the word is handed back, not put before its request.
            Err(mpsc::error::TrySendError::Full(note)) => return Err(note),
            Err(mpsc::error::TrySendError::Closed(note)) => note,
        };
        match events.upgrade() {
            Some(events) => {
                let event = warp::sse::Event::default().event("message").data(note.to_string());
                events.try_send(event).map_err(|_| note)
            }
            None => Err(note),
        }
    });
    (withdrawn, rx)
}

/// How long a message waits for room on a legacy stream before the client is taken to have stopped reading.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Put `event` on a legacy stream, waiting at most [`SEND_TIMEOUT`] for room: false when the client has left or
/// stopped reading (its stream full all that time).
async fn send_or_give_up(events: &mpsc::Sender<warp::sse::Event>, event: warp::sse::Event) -> bool {
    matches!(tokio::time::timeout(SEND_TIMEOUT, events.send(event)).await, Ok(Ok(())))
}

fn new_message_id() -> String {
    format!("msg-{}-{}", chrono::Utc::now().timestamp_millis(), rand::random::<u32>())
}

/// One request on a legacy stream, run with a relay: the server's notifications and requests go onto the
/// stream as they come, then the response. The POST is answered when the response is on the stream (SB §4),
/// or as soon as the server asks the client something: a client that POSTs one message at a time could not
/// otherwise send its answer.
struct RelayedCall {
    routing: Routing,
    sessions: Arc<SseSessions>,
    scope: String,
    events: mpsc::Sender<warp::sse::Event>,
    /// What the client declared at `initialize`; `None` before it did (then nothing is filtered, as before).
    capabilities: Option<Arc<Value>>,
}

/// How a relayed call on a legacy stream ended.
enum Ended {
    Sent,
    Refused(crate::auth::AuthError),
    StreamClosed,
}

impl RelayedCall {
    /// The client's stream is gone or full: its session ends (and the stream with it).
    fn stream_closed(&self) -> Ended {
        self.end_session();
        Ended::StreamClosed
    }

    fn end_session(&self) {
        self.sessions.sessions.lock().remove(&self.scope);
    }

    async fn run(
        self,
        principal: Principal,
        selection: super::dispatch::Selection,
        request_id: protocol::RequestId,
        method: String,
        params: Option<Value>,
    ) -> Result<Response, McpError> {
        let message_id = new_message_id();
        let (asked_tx, asked) = tokio::sync::oneshot::channel::<()>();
        let (scope, exchange) = (self.scope.clone(), self.sessions.exchange.clone());
        let final_id = message_id.clone();
        let tracked = request_id.clone();
        // In the request's span, as `Exchange::respond`'s calls are: the upstream call is its child.
        let work = async move {
            let (relay, mut rx) = match self.capabilities.clone() {
                Some(capabilities) => Relay::for_client(capabilities),
                None => Relay::channel(true),
            };
            let target = Target::LegacySse(principal, selection);
            let call = target.dispatch(&self.routing, Some(&self.scope), &method, params, Some(&relay));
            tokio::pin!(call);
            let mut asked_tx = Some(asked_tx);
            let (withdrawn, mut withdrawals) = withdrawals_to(self.events.downgrade());
            // The server's requests this call's stream carried: those still unanswered when it ends are withdrawn.
            let mut carried = Vec::new();
            // False once the client has left or stopped reading: what the server says is no longer forwarded (a
            // request of its goes unanswered, its asker told the client is gone), and the call runs on to its
            // end, as a disconnected client's does, instead of waiting on the stream for ever with its slot on
            // the instance held.
            let mut forwarding = true;
            let outcome = loop {
                tokio::select! {
                    biased;
                    outcome = &mut call => break outcome,
                    Some(note) = withdrawals.recv() => {
                        if !forwarding {
                            continue;
                        }
                        let event = warp::sse::Event::default().event("message").data(note.to_string());
                        if !send_or_give_up(&self.events, event).await {
                            forwarding = false;
                            self.end_session();
                        }
                    }
                    Some(inbound) = rx.recv() => {
                        if !forwarding {
                            continue;
                        }
                        let Some((message, asked)) =
                            self.sessions.exchange.outbound(&self.scope, &request_id, inbound, &withdrawn)
                        else {
                            continue;
                        };
                        if message.get("id").is_some() {
                            if let Some(tx) = asked_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        if let Some(asked) = asked {
                            carried.retain(|asked| self.sessions.exchange.waits(asked));
                            carried.push(asked);
                        }
                        let event = warp::sse::Event::default().event("message").data(message.to_string());
                        if !send_or_give_up(&self.events, event).await {
                            forwarding = false;
                            self.end_session();
                        }
                    }
                }
            };
            if !forwarding {
                return Ended::StreamClosed;
            }
            // What the server said just before its answer; its requests are moot now, the call having ended.
            let mut said = Vec::new();
            while let Ok(inbound) = rx.try_recv() {
                let Inbound::Notification { .. } = inbound else { continue };
                said.extend(self.sessions.exchange.outbound(&self.scope, &request_id, inbound, &withdrawn));
            }
            // Then word of the requests now moot: those withdrawn meanwhile, and those of this call left unanswered.
            let mut notes: Vec<Value> = said.into_iter().map(|(message, _)| message).collect();
            notes.extend(carried.iter().filter_map(|asked| self.sessions.exchange.withdraw(asked)));
            while let Ok(note) = withdrawals.try_recv() {
                notes.push(note);
            }
            for message in notes {
                let event = warp::sse::Event::default().event("message").data(message.to_string());
                if !send_or_give_up(&self.events, event).await {
                    return self.stream_closed();
                }
            }
            if let (Err(RouteError::Forbidden(err)), Some(_)) = (&outcome, &asked_tx) {
                return Ended::Refused(err.clone());
            }
            let reply = response_message(request_id, outcome.map(protocol::payload_for_handshake));
            let event = warp::sse::Event::default().id(final_id).event("message").data(reply.to_string());
            if !send_or_give_up(&self.events, event).await {
                return self.stream_closed();
            }
            Ended::Sent
        };
        let mut task = tokio::spawn(work.in_current_span());
        exchange.track(&scope, &tracked, task.abort_handle());
        let ended = tokio::select! {
            biased;
            ended = &mut task => ended.unwrap_or(Ended::Sent),
            _ = asked => Ended::Sent,
        };
        match ended {
            Ended::Sent => Ok(json_response(StatusCode::OK, &json!({"status": "sent", "messageId": message_id}))),
            Ended::Refused(err) => Err(McpError::Auth(err)),
            Ended::StreamClosed => Err(McpError::SseStreamClosed),
        }
    }
}
