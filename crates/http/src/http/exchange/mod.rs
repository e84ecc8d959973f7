//! The client side of a relayed request: while the satellite runs a client's request upstream, what the server
//! says meanwhile (progress, log messages, sampling/elicitation/roots requests) reaches the client as messages on
//! an SSE response, and the client's answers (POSTed JSON-RPC responses) find their way back. A request that
//! finishes before the server says anything is answered with plain JSON, as before.
//!
//! Server requests get fresh ids (`satellite-N`) on the client's side; an `Exchange` remembers which reply each
//! is waiting for, per session, and which calls a client may cancel with `notifications/cancelled`.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinHandle};
use tracing::Instrument as _;
use warp::reply::Response;
use warp::Reply;

use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, RequestId, RpcError};
use crate::mcp::transport::relay::{capability_for, local_answer};
use crate::mcp::transport::{Inbound, Relay};
use crate::router::RouteError;

type Reply_ = oneshot::Sender<Result<Value, RpcError>>;

/// Pending server requests and cancellable calls of one session table, keyed by session (scope) and id.
#[derive(Debug, Default)]
pub struct Exchange {
    /// Where a client's answer to a server request goes, by session and the id the client knows: to the task that
    /// passes it on to the server's asker, or tells the client the server no longer waits ([`Withdrawn`]).
    replies: Arc<Mutex<HashMap<String, Reply_>>>,
    /// Each session's GET stream, by session (scope), for withdrawals no other stream can carry.
    session_streams: Arc<Mutex<HashMap<String, (u64, Withdrawn)>>>,
    calls: Mutex<Calls>,
    /// 2026-07-28 calls waiting for the client's retry with answers, by the handle in their `requestState`.
    parked: Mutex<HashMap<String, Parked>>,
    next: AtomicU64,
    /// Cancelled at shutdown: long-lived streams (`subscriptions/listen`) end with a final response.
    closing: tokio_util::sync::CancellationToken,
}

/// The calls a client may cancel. Finished ones are dropped in a sweep when the table has doubled since the last
/// one, so tracking a call costs O(1) amortized however many run at once (a sweep per call made it O(n)).
#[derive(Debug, Default)]
struct Calls {
    running: HashMap<String, AbortHandle>,
    sweep_at: usize,
}

/// The table holds at least this many calls before it is swept.
const CALLS_SWEEP_MIN: usize = 64;

/// How the client of a relayed request takes the server's requests.
#[derive(Debug, Clone)]
pub enum Mode {
    /// A handshake-era session: server requests go out on the response stream and the client POSTs the
    /// answers; a disconnected client does not cancel the call. `capabilities`: what it declared at `initialize`.
    Handshake { capabilities: std::sync::Arc<Value> },
    /// A 2026-07-28 request, which has no server requests: one the client declared the capability for ends the
    /// response with an `input_required` result, and the call waits, parked, for the client's retry with the
    /// answers (`resume`). Closing the response stream cancels the call.
    Stateless {
        /// The `clientCapabilities` of the request's envelope.
        capabilities: Value,
        /// Who may resume the call: the endpoint's owner.
        owner: String,
        /// A stream meant to stay open (`subscriptions/listen`): ended, gracefully, at shutdown or once its
        /// credential no longer admits the caller.
        long_lived: Option<LongLived>,
        /// The `io.modelcontextprotocol/logLevel` of the request's envelope: the server's log messages reach the
        /// client at or above it, and none without it, as 2026-07-28 has a server send them.
        log_level: Option<String>,
        /// The request's progress token, and the one its call's progress carries.
        progress: ProgressTokens,
    },
}

/// The progress tokens of a 2026-07-28 request. A call the satellite parked (its server asked the client
/// something) and resumed on the client's retry tells its progress under the token of the request that started
/// it; the retry is a new request (MRTR), whose client knows its progress by the retry's own token, or asked for
/// none. Before, a resumed call's progress went out under the first request's token, which the client no longer
/// listened for.
#[derive(Debug, Clone, Default)]
pub struct ProgressTokens(Option<Box<Tokens>>);

/// Boxed: most requests carry no token, and a `Mode` is moved about with every relayed request.
#[derive(Debug, Clone)]
struct Tokens {
    own: Option<Value>,
    /// The token the call's progress carries: `own`, unless the call was started by an earlier request.
    origin: Option<Value>,
}

impl ProgressTokens {
    /// Those of a request whose `params` may carry `_meta.progressToken`.
    pub fn of(params: Option<&Value>) -> Self {
        let own = params.and_then(|p| p.get("_meta")).and_then(|m| m.get("progressToken")).cloned();
        Self(own.map(|own| Box::new(Tokens { origin: Some(own.clone()), own: Some(own) })))
    }

    /// The token the call's progress carries.
    fn origin(&self) -> Option<Value> {
        self.0.as_ref().and_then(|tokens| tokens.origin.clone())
    }

    /// The call was started by an earlier request, whose progress token it carries.
    fn started_by(&mut self, origin: Option<Value>) {
        let own = self.0.take().and_then(|tokens| tokens.own);
        self.0 = (own.is_some() || origin.is_some()).then(|| Box::new(Tokens { own, origin }));
    }

    /// A server's progress notification as this request's client hears it: under the request's own token, or not
    /// at all when it asked for none. Any other notification goes as it is.
    fn retag(&self, inbound: Inbound) -> Option<Inbound> {
        let Some(tokens) = self.0.as_deref().filter(|tokens| tokens.origin != tokens.own) else { return Some(inbound) };
        let Inbound::Notification { method, mut params, held } = inbound else { return Some(inbound) };
        if method == "notifications/progress" {
            let token = params.as_mut().and_then(Value::as_object_mut).and_then(|p| p.get_mut("progressToken"));
            if let Some(token) = token.filter(|token| Some(&**token) == tokens.origin.as_ref()) {
                *token = tokens.own.clone()?;
            }
        }
        Some(Inbound::Notification { method, params, held })
    }
}

/// What a request's client hears of a notification its call's server sent (a resumed call's progress retagged).
fn retagged(mode: &Mode, inbound: Inbound) -> Option<Inbound> {
    match mode {
        Mode::Stateless { progress, .. } => progress.retag(inbound),
        Mode::Handshake { .. } => Some(inbound),
    }
}

/// The token a call's progress carries, kept with the call when it is parked.
fn origin_of(mode: &Mode) -> Option<Value> {
    match mode {
        Mode::Stateless { progress, .. } => progress.origin(),
        Mode::Handshake { .. } => None,
    }
}

/// What ends a long-lived stream besides shutdown: `ends`, cancelled by whoever watches its credential. Cancelled
/// too once the last copy of the request's mode goes, whichever way the request ended (streamed, answered at once,
/// its client gone), so the watcher never outlives it.
#[derive(Debug, Clone)]
pub struct LongLived {
    ends: tokio_util::sync::CancellationToken,
    _gone: Arc<tokio_util::sync::DropGuard>,
}

impl LongLived {
    pub fn new() -> Self {
        let ends = tokio_util::sync::CancellationToken::new();
        Self { _gone: Arc::new(ends.clone().drop_guard()), ends }
    }

    /// The token that ends the stream; the watcher cancels it, and stops when it is cancelled.
    pub fn ends(&self) -> tokio_util::sync::CancellationToken {
        self.ends.clone()
    }
}

impl Default for LongLived {
    fn default() -> Self {
        Self::new()
    }
}

/// RFC 5424 severity of a log level, lowest first; an unknown one counts as the highest, so it is never lost.
fn severity(level: &str) -> usize {
    let levels = protocol::LOG_LEVELS;
    levels.iter().position(|known| *known == level).unwrap_or(levels.len())
}

/// Whether a 2026-07-28 client hears this message: a log message only at or above the level its request asked
/// for, and none when it asked for none. Everything else goes as it is.
fn heard(mode: &Mode, inbound: &Inbound) -> bool {
    let (Mode::Stateless { log_level, .. }, Inbound::Notification { method, params, .. }) = (mode, inbound) else {
        return true;
    };
    if method != "notifications/message" {
        return true;
    }
    let level = params.as_ref().and_then(|p| p.get("level")).and_then(Value::as_str).unwrap_or("");
    log_level.as_deref().is_some_and(|wanted| severity(level) >= severity(wanted))
}

/// A call parked until a 2026-07-28 client retries with the answers to the server's requests.
#[derive(Debug)]
struct Parked {
    owner: String,
    /// The progress token of the request that started the call (see [`ProgressTokens`]).
    origin: Option<Value>,
    call: JoinHandle<Result<Payload, RouteError>>,
    rx: mpsc::Receiver<Inbound>,
    /// The server's requests, by the key the client answers under.
    waiting: Vec<(String, Asked)>,
    since: Instant,
}

/// A server request waiting for the client's answer.
#[derive(Debug)]
struct Asked {
    method: String,
    params: Option<Value>,
    reply: Reply_,
}

/// What to do with a message from upstream.
enum Taken {
    /// Send it to the client on the response stream.
    Stream(Inbound),
    /// Answered here (a client without the capability, or a ping), or a log message the client did not ask for.
    Answered,
    /// End the response with `input_required` and park the call.
    Park(Asked),
}

/// Notes of withdrawn requests one stream may have waiting: there is one per server request it carried, so a
/// stream past this many is not being read (the note then goes the way it goes when the stream is gone).
pub const WITHDRAWALS: usize = 1024;

/// Where a client stream hears that a server request it carried no longer waits for an answer (the server
/// withdrew it, or the asker gave up: the call ended, or the client was too slow): the `notifications/cancelled`
/// the satellite sends the client under the id the client knows, so that it stops asking its user. Cheap to clone.
#[derive(Clone)]
pub struct Withdrawn(Arc<dyn Fn(Value) -> Result<(), Value> + Send + Sync>);

impl Withdrawn {
    /// `tell` puts the notification on the client's stream, or hands it back when that stream is gone.
    pub fn new(tell: impl Fn(Value) -> Result<(), Value> + Send + Sync + 'static) -> Self {
        Self(Arc::new(tell))
    }

    /// One that puts the notification on a channel whose receiving end the stream reads. A stream that has
    /// fallen [`WITHDRAWALS`] notes behind gets the next one handed back, as a stream that is gone does.
    pub fn channel() -> (Self, mpsc::Receiver<Value>) {
        let (tx, rx) = mpsc::channel(WITHDRAWALS);
        (Self::new(move |note| tx.try_send(note).map_err(mpsc::error::TrySendError::into_inner)), rx)
    }

    fn tell(&self, note: Value) -> Result<(), Value> {
        (self.0)(note)
    }
}

/// A session's GET stream, told of requests withdrawn after the stream that carried them has ended (a POST's SSE
/// answer ends with its call, and a request on it may be another call's: `Inbound::Request::ours`). Unregistered
/// when dropped (with the GET stream).
pub struct HearsWithdrawals {
    streams: Arc<Mutex<HashMap<String, (u64, Withdrawn)>>>,
    scope: String,
    id: u64,
}

impl Drop for HearsWithdrawals {
    fn drop(&mut self) {
        let mut streams = self.streams.lock();
        if streams.get(&self.scope).is_some_and(|(id, _)| *id == self.id) {
            streams.remove(&self.scope);
        }
    }
}

impl std::fmt::Debug for Withdrawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Withdrawn")
    }
}

/// A server request the client was asked under `id` (in the exchange's table under `key`), for a stream that,
/// once its call has ended, tells the client about those still unanswered ([`Exchange::withdraw`]).
#[derive(Debug)]
pub struct AskedOf {
    key: String,
    id: String,
}

/// The `notifications/cancelled` that tells a client not to answer its request `id`.
fn cancelled(id: &str, reason: &str) -> Value {
    protocol::notification("notifications/cancelled", Some(json!({"requestId": id, "reason": reason})))
}

/// `requestState` of a call the satellite parked (the rest is a random handle, bound to the caller).
const STATE_PREFIX: &str = "io.deploystack.satellite/parked/";
/// How long a parked call waits for the client's retry at most (the server's own wait usually ends first).
const PARK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Whether a 2026-07-28 `requestState` is one the satellite issued (else it is the upstream's, passed through).
pub fn is_parked_state(state: Option<&Value>) -> bool {
    state.and_then(Value::as_str).is_some_and(|s| s.starts_with(STATE_PREFIX))
}

/// The key of a client's running call: its scope and its id, with the id's kind, since a string id and a number
/// id are different ids even when they read alike (`"7"` and `7`). Keyed by the text alone, a cancel for `7`
/// stopped the call `"7"`.
fn call_key(scope: &str, id: &RequestId) -> String {
    let kind = match id {
        RequestId::String(_) => "s",
        RequestId::Number(_) | RequestId::Wide(_) => "n",
    };
    key_of(scope, kind, id)
}

fn key(scope: &str, id: &impl std::fmt::Display) -> String {
    key_of(scope, "", id)
}

/// `scope`, a NUL, `kind` and `id`, in one allocation (a running call is keyed on every relayed request).
fn key_of(scope: &str, kind: &str, id: &impl std::fmt::Display) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(scope.len() + kind.len() + 17);
    key.push_str(scope);
    key.push('\u{0}');
    key.push_str(kind);
    let _ = write!(key, "{id}");
    key
}

impl Exchange {
    /// Turn a message from upstream into the JSON-RPC message the client sees; a request is registered under a
    /// fresh id, its answer awaited by `reply`. Should the asker stop waiting before the client answers,
    /// `withdrawn` is told, to tell the client (after the request: the caller sends what this returns first);
    /// the stream that carries a request surely about its own call may also tell it itself, once that call has
    /// ended, through the [`AskedOf`] returned. `None`: nothing to send (a request whose asker is gone already).
    pub fn outbound(
        &self,
        scope: &str,
        request: &RequestId,
        inbound: Inbound,
        withdrawn: &Withdrawn,
    ) -> Option<(Value, Option<AskedOf>)> {
        Some(match inbound {
            Inbound::Notification { method, params, .. } => (notification_out(request, &method, params), None),
            // Withdrawn before it reached the client: it is not asked at all.
            Inbound::Request { reply, .. } if reply.is_closed() => return None,
            Inbound::Request { method, params, mut reply, ours } => {
                let id = format!("satellite-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
                let key = key(scope, &id);
                let (answer, answered) = oneshot::channel();
                {
                    let mut replies = self.replies.lock();
                    // Requests whose passer ended (answered or withdrawn) are dropped here, keeping the map bounded.
                    replies.retain(|_, waiting| !waiting.is_closed());
                    replies.insert(key.clone(), answer);
                }
                // Passes the client's answer on, or, when the asker stops waiting first, takes the request out of
                // the table and tells the client. It ends with one or the other: the asker's wait is bounded.
                let (replies, watched, told, id_) = (self.replies.clone(), key.clone(), withdrawn.clone(), id.clone());
                let (session_streams, session) = (self.session_streams.clone(), scope.to_owned());
                tokio::spawn(async move {
                    tokio::select! {
                        answer = answered => {
                            if let Ok(answer) = answer {
                                let _ = reply.send(answer);
                            }
                        }
                        _ = reply.closed() => {
                            // Told under the lock: a stream that finds the request gone from the table finds this
                            // word on its channel already (`Streaming::withdraw_all`).
                            let mut replies = replies.lock();
                            if replies.remove(&watched).is_some() {
                                let note = cancelled(&id_, "the server no longer waits for an answer");
                                // The stream that carried it has ended: the session's GET stream, if one is open.
                                if let Err(note) = told.tell(note) {
                                    if let Some((_, stream)) = session_streams.lock().get(&session) {
                                        let _ = stream.tell(note);
                                    }
                                }
                            }
                        }
                    }
                });
                let asked = ours.then_some(AskedOf { key, id: id.clone() });
                (message(Some(json!(id)), &method, params), asked)
            }
        })
    }

    /// The GET stream of session `scope` hears, through `withdrawn`, of requests withdrawn once the stream that
    /// carried them has ended; until the returned guard is dropped (a newer GET stream of the session takes over).
    pub fn hear_withdrawals(&self, scope: &str, withdrawn: Withdrawn) -> HearsWithdrawals {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.session_streams.lock().insert(scope.to_owned(), (id, withdrawn));
        HearsWithdrawals { streams: self.session_streams.clone(), scope: scope.to_owned(), id }
    }

    /// Whether the request is still unanswered.
    pub fn waits(&self, asked: &AskedOf) -> bool {
        self.replies.lock().contains_key(&asked.key)
    }

    /// A stream's call has ended: the server's requests it carried that are still unanswered are moot. Each is
    /// taken out of the table (its asker told the client is gone) and the `notifications/cancelled` that tells the
    /// client returned, to go before the call's answer; `None` when it was answered or withdrawn already.
    pub fn withdraw(&self, asked: &AskedOf) -> Option<Value> {
        let waiting = self.replies.lock().remove(&asked.key)?;
        drop(waiting);
        Some(cancelled(&asked.id, "the request it was asked for has ended"))
    }

    /// Shutdown: long-lived streams end now, with their final response.
    pub fn close_long_lived(&self) {
        self.closing.cancel();
    }

    /// Deliver a client's answer to the server request it names; false when nothing waits for it.
    pub fn deliver(&self, scope: &str, id: &RequestId, outcome: Result<Value, RpcError>) -> bool {
        match self.replies.lock().remove(&key(scope, &id.to_string())) {
            Some(waiting) => waiting.send(outcome).is_ok(),
            None => false,
        }
    }

    /// Remember a running call so the client can cancel it; forgotten when it ends. Returns its key in the table.
    pub fn track(&self, scope: &str, id: &RequestId, call: AbortHandle) -> String {
        let key = call_key(scope, id);
        let mut calls = self.calls.lock();
        if calls.running.len() >= calls.sweep_at {
            calls.running.retain(|_, running| !running.is_finished());
            calls.sweep_at = (calls.running.len() * 2).max(CALLS_SWEEP_MIN);
        }
        calls.running.insert(key.clone(), call);
        key
    }

    /// A call answered at once leaves the table now, not at the next sweep (which, after a burst, may be far off).
    /// Only a finished entry goes: one under the same key may be a newer call reusing the id.
    fn untrack(&self, key: &str) {
        let mut calls = self.calls.lock();
        if calls.running.get(key).is_some_and(AbortHandle::is_finished) {
            calls.running.remove(key);
        }
    }

    /// `notifications/cancelled` from the client: stop the named call (which cancels it upstream in turn).
    pub fn cancel(&self, scope: &str, params: Option<&Value>) {
        let Some(id) = params.and_then(|p| p.get("requestId")) else { return };
        let Ok(id) = RequestId::deserialize(id) else { return };
        if let Some(call) = self.calls.lock().running.remove(&call_key(scope, &id)) {
            call.abort();
        }
    }

    /// Run one client request with a relay: `Answer::Done` when it completes before the server says anything
    /// (the caller answers with plain JSON, as without a relay), else an SSE stream of the server's messages
    /// ending with the response `finish` makes of the outcome. It stops on `notifications/cancelled`; what the
    /// server asks of the client and what a disconnection means depend on the `mode`.
    pub async fn respond<Fut, Fin>(
        self: &Arc<Self>,
        scope: String,
        id: RequestId,
        mode: Mode,
        run: impl FnOnce(Relay) -> Fut,
        finish: Fin,
    ) -> Answer
    where
        Fut: Future<Output = Result<Payload, RouteError>> + Send + 'static,
        Fin: FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static,
    {
        let (relay, rx) = match &mode {
            Mode::Handshake { capabilities } => Relay::for_client(std::sync::Arc::clone(capabilities)),
            Mode::Stateless { .. } => Relay::stateless_channel(),
        };
        // Boxed: the call's future is large, and tokio moves a future it holds inline each time the task's stage
        // changes (profiled: ~2.5% of a proxied call's CPU in those copies). In the request's span: the upstream
        // call's span is its child (one trace, the traceparent an HTTP upstream sees), and its lines carry the
        // request's id.
        let call: JoinHandle<Result<Payload, RouteError>> = tokio::spawn(Box::pin(run(relay)).in_current_span());
        self.drive(scope, id, mode, call, rx, finish).await
    }

    /// Go on with a parked call: the client's retry brings `responses` (its `inputResponses`) for the requests
    /// named in `state`. Requests it left unanswered are asked again (a new `input_required`); then the call
    /// runs on as if it had never stopped. A state that is unknown, expired or another caller's is -32602.
    pub async fn resume<Fin>(
        self: &Arc<Self>,
        scope: String,
        id: RequestId,
        mode: Mode,
        state: &str,
        responses: Option<&Value>,
        finish: Fin,
    ) -> Answer
    where
        Fin: FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static,
    {
        let owner = match &mode {
            Mode::Stateless { owner, .. } => owner.clone(),
            Mode::Handshake { .. } => String::new(),
        };
        let handle = state.strip_prefix(STATE_PREFIX).unwrap_or_default();
        let parked = {
            let mut parked = self.parked.lock();
            match parked.get(handle) {
                Some(p) if p.owner == owner => parked.remove(handle),
                _ => None,
            }
        };
        let Some(parked) = parked else {
            return Answer::Done(Err(RouteError::Rpc(RpcError::new(
                codes::INVALID_PARAMS,
                "requestState is not valid: unknown, expired or not yours; send the request again without it",
            ))));
        };
        let Parked { call, rx, waiting, origin, .. } = parked;
        // The call's progress carries the token of the request that started it.
        let mut mode = mode;
        if let Mode::Stateless { progress, .. } = &mut mode {
            progress.started_by(origin);
        }
        let mut unanswered = Vec::new();
        for (key, asked) in waiting {
            match responses.and_then(|r| r.get(&key)) {
                Some(answer) => {
                    let _ = asked.reply.send(Ok(answer.clone()));
                }
                // Withdrawn by its server meanwhile: not asked again.
                None if asked.reply.is_closed() => {}
                None => unanswered.push(asked),
            }
        }
        if !unanswered.is_empty() {
            return Answer::Done(Ok(self.park(owner, origin_of(&mode), call, rx, unanswered).into()));
        }
        self.drive(scope, id, mode, call, rx, finish).await
    }

    async fn drive<Fin>(
        self: &Arc<Self>,
        scope: String,
        id: RequestId,
        mode: Mode,
        mut call: JoinHandle<Result<Payload, RouteError>>,
        mut rx: mpsc::Receiver<Inbound>,
        finish: Fin,
    ) -> Answer
    where
        Fin: FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static,
    {
        let tracked = self.track(&scope, &id, call.abort_handle());
        // The client may go before the server says anything: this handler is then dropped, and the call with it
        // (cancelled upstream, its call slot freed). Its answer had nowhere else to go: the satellite resumes no
        // request's answer on another stream, so a handshake-era client's hang-up cancels too (issue 73; the
        // transport's "disconnection is not cancellation" assumes a server that can resume).
        let waiting = AbortOnDrop(Some(call.abort_handle()));
        let mut queue = VecDeque::new();
        let mut finish = Some(finish);
        let ends = match &mode {
            Mode::Stateless { long_lived: Some(long_lived), .. } => Some(long_lived.ends()),
            _ => None,
        };
        let first = loop {
            let ended = async {
                match &ends {
                    Some(ends) => tokio::select! { _ = ends.cancelled() => {}, _ = self.closing.cancelled() => {} },
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                biased;
                _ = ended => {
                    // A long-lived stream ended (its credential revoked, or shutdown) before it said anything: it
                    // gets its final response at once, as it would once streaming.
                    call.abort();
                    self.untrack(&tracked);
                    return Answer::Done(Ok(json!({}).into()));
                }
                done = &mut call => {
                    self.untrack(&tracked);
                    // What the server said just before its answer (a progress or log line, then the result at
                    // once) is in the channel already, though the call won the race: it still goes first.
                    let said = self.said_before(&mode, &id, &mut rx);
                    if said.is_empty() {
                        return Answer::Done(outcome(done));
                    }
                    queue.extend(said);
                    queue.extend(finish.take().map(|finish| finish(outcome(done))));
                    break None;
                }
                next = rx.recv() => next,
            };
            let Some(inbound) = next else { break None };
            match self.take_up(&mode, inbound) {
                Taken::Stream(inbound) => break Some(inbound),
                Taken::Answered => continue,
                Taken::Park(asked) => {
                    waiting.disarm();
                    return Answer::Done(Ok(self
                        .park(owner_of(&mode), origin_of(&mode), call, rx, vec![asked])
                        .into()));
                }
            }
        };
        waiting.disarm();
        // Answered already (above): the stream is what was queued, and nothing more.
        let answered = finish.is_none();
        let (withdrawn, withdrawals) = Withdrawn::channel();
        let mut state = Streaming {
            queue,
            rx: Some(rx).filter(|_| !answered),
            call: Some(call).filter(|_| !answered),
            finish,
            exchange: self.clone(),
            scope,
            request: id,
            mode,
            withdrawn,
            withdrawals,
            asked: Vec::new(),
        };
        if let Some(message) = first.and_then(|inbound| state.outbound(inbound)) {
            state.queue.push_back(message);
        }
        let events = futures::stream::unfold(state, |mut state| async move {
            let message = state.next().await?;
            Some((Ok::<_, Infallible>(warp::sse::Event::default().event("message").data(message.to_string())), state))
        });
        let stream = warp::sse::keep_alive().interval(KEEP_ALIVE).text("ping").stream(events);
        Answer::Streamed(warp::sse::reply(stream).into_response())
    }

    /// The notifications a finished call's server sent before its answer, as the client sees them. A request
    /// still queued is dropped with the call that made it (its asker is gone), as on a stream ([`Streaming`]).
    fn said_before(&self, mode: &Mode, request: &RequestId, rx: &mut mpsc::Receiver<Inbound>) -> Vec<Value> {
        let mut said = Vec::new();
        while let Ok(inbound) = rx.try_recv() {
            if !heard(mode, &inbound) {
                continue;
            }
            if let Some(Inbound::Notification { method, params, .. }) = retagged(mode, inbound) {
                said.push(notification_out(request, &method, params));
            }
        }
        said
    }

    /// Decide what a message from upstream becomes for this client.
    fn take_up(&self, mode: &Mode, inbound: Inbound) -> Taken {
        // A request its server withdrew (or gave up on) before it came to be asked: nobody waits for an answer.
        if matches!(&inbound, Inbound::Request { reply, .. } if reply.is_closed()) {
            return Taken::Answered;
        }
        let Mode::Stateless { capabilities, .. } = mode else { return Taken::Stream(inbound) };
        match inbound {
            Inbound::Request { method, params, reply, .. } => {
                match capability_for(&method) {
                    Some(name) if capabilities.get(name).is_some() => Taken::Park(Asked { method, params, reply }),
                    // What the client would answer without the capability (a ping is answered here).
                    _ => {
                        let _ = reply.send(local_answer(&method));
                        Taken::Answered
                    }
                }
            }
            notification if heard(mode, &notification) => match retagged(mode, notification) {
                Some(notification) => Taken::Stream(notification),
                None => Taken::Answered,
            },
            _ => Taken::Answered,
        }
    }

    /// Park a call whose server waits on the client; the `input_required` result that asks the client.
    fn park(
        &self,
        owner: String,
        origin: Option<Value>,
        call: JoinHandle<Result<Payload, RouteError>>,
        rx: mpsc::Receiver<Inbound>,
        asked: Vec<Asked>,
    ) -> Value {
        let mut requests = serde_json::Map::new();
        let waiting: Vec<(String, Asked)> = asked
            .into_iter()
            .map(|asked| {
                let key = format!("satellite-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
                let mut request = json!({"method": asked.method});
                if let Some(params) = &asked.params {
                    request["params"] = params.clone();
                }
                requests.insert(key.clone(), request);
                (key, asked)
            })
            .collect();
        let handle = uuid::Uuid::new_v4().simple().to_string();
        let mut parked = self.parked.lock();
        // Calls that ended or waited too long are let go (and stopped), keeping the map bounded.
        parked.retain(|_, p| {
            let keep = !p.call.is_finished() && p.since.elapsed() < PARK_LIMIT;
            if !keep {
                p.call.abort();
            }
            keep
        });
        parked.insert(handle.clone(), Parked { owner, origin, call, rx, waiting, since: Instant::now() });
        json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": format!("{STATE_PREFIX}{handle}"),
        })
    }
}

fn owner_of(mode: &Mode) -> String {
    match mode {
        Mode::Stateless { owner, .. } => owner.clone(),
        Mode::Handshake { .. } => String::new(),
    }
}

/// What running a relayed request came to.
pub enum Answer {
    /// Finished before the server said anything: answer as usual.
    Done(Result<Payload, RouteError>),
    /// The server spoke first: this SSE response carries its messages and then the answer.
    Streamed(Response),
}

/// Comment lines on a long relayed call's stream, so idle proxies keep it open.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

struct Streaming<Fin> {
    queue: VecDeque<Value>,
    rx: Option<mpsc::Receiver<Inbound>>,
    call: Option<JoinHandle<Result<Payload, RouteError>>>,
    finish: Option<Fin>,
    exchange: Arc<Exchange>,
    scope: String,
    /// The client's id for the request this stream answers.
    request: RequestId,
    mode: Mode,
    /// Told when a server request this stream carried no longer waits for the client's answer...
    withdrawn: Withdrawn,
    /// ...which the stream hears here and passes on.
    withdrawals: mpsc::Receiver<Value>,
    /// The server requests this stream carried; those unanswered when the call ends are withdrawn then.
    asked: Vec<AskedOf>,
}

impl<Fin> Drop for Streaming<Fin> {
    /// A 2026-07-28 client that closes the stream before its answer cancels the call.
    fn drop(&mut self) {
        if let (Mode::Stateless { .. }, Some(call)) = (&self.mode, self.call.as_ref()) {
            call.abort();
        }
    }
}

/// Aborts a call when dropped, unless disarmed first.
struct AbortOnDrop(Option<AbortHandle>);

impl AbortOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(call) = self.0.take() {
            call.abort();
        }
    }
}

impl<Fin> Streaming<Fin> {
    /// A message from upstream for this stream's client; a request is remembered, to be withdrawn if unanswered
    /// when the call ends.
    fn outbound(&mut self, inbound: Inbound) -> Option<Value> {
        let (message, asked) = self.exchange.outbound(&self.scope, &self.request, inbound, &self.withdrawn)?;
        if let Some(asked) = asked {
            // Those answered or withdrawn already are forgotten, so a long stream keeps no more than it waits on.
            self.asked.retain(|asked| self.exchange.waits(asked));
            self.asked.push(asked);
        }
        Some(message)
    }

    /// The call has ended: the client is told of each server request it was asked that is now moot, before the
    /// call's answer.
    fn withdraw_all(&mut self) {
        for asked in std::mem::take(&mut self.asked) {
            if let Some(note) = self.exchange.withdraw(&asked) {
                self.queue.push_back(note);
            }
        }
        while let Ok(note) = self.withdrawals.try_recv() {
            self.queue.push_back(note);
        }
    }
}

impl<Fin: FnOnce(Result<Payload, RouteError>) -> Value> Streaming<Fin> {
    /// The next message for the client: queued ones, then whatever the server sends, then the answer (or, when
    /// the server asks a 2026-07-28 client something, an `input_required` result, the call parked).
    async fn next(&mut self) -> Option<Value> {
        if let Some(message) = self.queue.pop_front() {
            return Some(message);
        }
        loop {
            let ends = match &self.mode {
                Mode::Stateless { long_lived: Some(long_lived), .. } => Some(long_lived.ends()),
                _ => None,
            };
            let long_lived = ends.is_some();
            let closing = self.exchange.closing.clone();
            let ended = async move {
                match ends {
                    Some(ends) => ends.cancelled_owned().await,
                    None => std::future::pending().await,
                }
            };
            let call = self.call.as_mut()?;
            let (inbound, done) = match self.rx.as_mut() {
                Some(rx) => tokio::select! {
                    biased;
                    Some(note) = self.withdrawals.recv() => return Some(note),
                    _ = async { tokio::select! { _ = closing.cancelled() => {}, _ = ended => {} } }, if long_lived => {
                        // The satellite is stopping, or the caller's credential was revoked: end the subscription
                        // as the spec says a server does.
                        call.abort();
                        self.call = None;
                        self.rx = None;
                        let finish = self.finish.take()?;
                        return Some(finish(Ok(json!({}).into())));
                    }
                    next = rx.recv() => match next {
                        Some(inbound) => (Some(inbound), None),
                        None => {
                            self.rx = None;
                            continue;
                        }
                    },
                    done = &mut *call => (None, Some(done)),
                },
                None => tokio::select! {
                    biased;
                    Some(note) = self.withdrawals.recv() => return Some(note),
                    done = &mut *call => (None, Some(done)),
                },
            };
            if let Some(inbound) = inbound {
                match self.exchange.take_up(&self.mode, inbound) {
                    Taken::Stream(inbound) => match self.outbound(inbound) {
                        Some(message) => return Some(message),
                        None => continue,
                    },
                    Taken::Answered => continue,
                    Taken::Park(asked) => {
                        let (call, rx) = (self.call.take()?, self.rx.take()?);
                        let origin = origin_of(&self.mode);
                        let result = self.exchange.park(owner_of(&self.mode), origin, call, rx, vec![asked]);
                        return Some(protocol::response(self.request.clone(), result));
                    }
                }
            }
            let done = done?;
            self.call = None;
            // Messages sent before the result still go first, and then word of the server's requests now moot.
            if let Some(mut rx) = self.rx.take() {
                let said = self.exchange.said_before(&self.mode, &self.request, &mut rx);
                self.queue.extend(said);
            }
            self.withdraw_all();
            let finish = self.finish.take()?;
            self.queue.push_back(finish(outcome(done)));
            return self.queue.pop_front();
        }
    }
}

/// A call that panicked or was cancelled still has an outcome.
fn outcome(done: Result<Result<Payload, RouteError>, tokio::task::JoinError>) -> Result<Payload, RouteError> {
    done.unwrap_or_else(|err| {
        let reason = if err.is_cancelled() { "request cancelled" } else { "internal error while handling the request" };
        Err(RouteError::Rpc(RpcError::new(codes::INTERNAL_ERROR, reason)))
    })
}

/// The JSON-RPC response for a relayed call's outcome; a scope refusal that surfaces mid-stream is an error object.
pub fn response_message(id: RequestId, outcome: Result<Payload, RouteError>) -> Value {
    match outcome {
        // A result goes out as a message of a stream here, which is a value.
        Ok(result) => match protocol::answer_value(result) {
            Ok(result) => protocol::response(id, result),
            Err(err) => protocol::error_response(Some(id), err),
        },
        Err(RouteError::Rpc(err)) => protocol::error_response(Some(id), err),
        Err(RouteError::Forbidden(err)) => {
            protocol::error_response(Some(id), RpcError::new(codes::INVALID_REQUEST, err.to_string()))
        }
    }
}

/// A server's notification as the client of `request` sees it.
fn notification_out(request: &RequestId, method: &str, mut params: Option<Value>) -> Value {
    if let Some(params) = params.as_mut() {
        protocol::retag_subscription(params, request);
    }
    message(None, method, params)
}

fn message(id: Option<Value>, method: &str, params: Option<Value>) -> Value {
    let mut out = protocol::notification(method, None);
    if let Some(id) = id {
        out["id"] = id;
    }
    if let Some(params) = params {
        out["params"] = params;
    }
    out
}

#[cfg(test)]
mod tests;
