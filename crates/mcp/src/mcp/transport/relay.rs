//! What an upstream server says while one of our requests runs, on its way to the client that made the request:
//! notifications about the request (progress, log messages) and requests to the client (sampling, elicitation,
//! roots, ping), whose answers go back upstream under the server's own id. The transport that reads the server
//! hands these to the request's `Relay`; the HTTP edge turns them into messages on the client's stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::mcp::protocol::{codes, RpcError};

/// Messages queued for one client request: past this, a server's request waits for room, a notification is
/// dropped. Notifications are held to [`BACKLOG_BYTES`] too, so this many can be small ones only.
const CAPACITY: usize = 4096;
/// The bytes of notifications queued for one client request, at most: a burst of progress or log messages from a
/// server reaches a client that keeps up whole, and a client that does not read costs no more than this.
const BACKLOG_BYTES: usize = 4 * 1024 * 1024;

/// One message from the server for the client.
#[derive(Debug)]
pub enum Inbound {
    /// `held` counts the notification against its relay's backlog until the client end takes it.
    Notification { method: String, params: Option<Value>, held: Held },
    Request {
        method: String,
        params: Option<Value>,
        reply: oneshot::Sender<Result<Value, RpcError>>,
        /// Whether the request is surely about the client request this relay belongs to. On stdio and legacy SSE,
        /// where a server's request names none of ours, it goes to the newest call: with several running it may
        /// be about another, and must not be withdrawn when this one ends.
        ours: bool,
    },
}

/// A queued notification's share of its relay's backlog, given back when it is dropped (taken by the client end,
/// or refused by a full channel).
#[derive(Debug)]
pub struct Held {
    backlog: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.backlog.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The way from an upstream request back to its client; cheap to clone.
#[derive(Debug, Clone)]
pub struct Relay {
    tx: mpsc::Sender<Inbound>,
    /// Bytes of notifications queued and not yet taken by the client end.
    backlog: Arc<AtomicUsize>,
    /// Whether requests reach the client end at all.
    answers: bool,
    /// Whether the client takes the server's requests as requests (a handshake-era session). A 2026-07-28
    /// client instead gets `input_required` results, which it answers by retrying.
    handshake: bool,
    /// What a handshake-era client declared at `initialize`, declared on its behalf to a 2026-07-28 server.
    capabilities: Option<std::sync::Arc<Value>>,
    /// The instance whose task status notifications this relay carries, their task ids sealed to it
    /// (`mcp::task_ids`); `None` for a server that offers no tasks.
    tasks_of: Option<Arc<str>>,
}

impl Relay {
    /// A relay and the receiving end the client's stream reads. `answers`: whether server requests can reach
    /// the client at all.
    pub fn channel(answers: bool) -> (Relay, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        (Relay { tx, backlog: Arc::default(), answers, handshake: answers, capabilities: None, tasks_of: None }, rx)
    }

    /// A relay for a handshake-era client that declared `capabilities` at `initialize`.
    pub fn for_client(capabilities: std::sync::Arc<Value>) -> (Relay, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        let capabilities = Some(capabilities).filter(|c| c.is_object());
        (Relay { tx, backlog: Arc::default(), answers: true, handshake: true, capabilities, tasks_of: None }, rx)
    }

    /// The capabilities of a handshake-era client, when known.
    pub fn client_capabilities(&self) -> Option<&Value> {
        self.capabilities.as_deref()
    }

    /// A relay for a 2026-07-28 request: requests reach the receiving end, which turns them into
    /// `input_required` results.
    pub fn stateless_channel() -> (Relay, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        (Relay { tx, backlog: Arc::default(), answers: true, handshake: false, capabilities: None, tasks_of: None }, rx)
    }

    /// Whether the client takes server requests as requests (handshake era), so the satellite answers an
    /// upstream's `input_required` result by asking it and retrying on its behalf.
    pub fn takes_requests(&self) -> bool {
        self.handshake
    }

    /// This relay for what `instance` (a process id) says: the task ids of its task status notifications reach the
    /// client sealed to it, as the ids of its answers do.
    pub fn sealing_tasks_of(&self, instance: &str) -> Relay {
        Relay { tasks_of: Some(Arc::from(instance)), ..self.clone() }
    }

    /// Pass a notification on; dropped when the client is gone, or has fallen [`BACKLOG_BYTES`] behind (a client
    /// that stopped reading must not make the server's reader wait, nor cost unbounded memory).
    pub fn notify(&self, method: &str, params: Option<Value>) {
        // A server cancels only its own requests, whose ids the client never saw (it knows them by the ids the
        // satellite gave them): passed on, the client would take it for one of its own requests.
        if method == "notifications/cancelled" {
            return;
        }
        let mut params = params;
        if let (Some(instance), Some(params)) = (&self.tasks_of, &mut params) {
            crate::mcp::task_ids::seal_notification(method, params, instance);
        }
        let bytes = method.len() + params.as_ref().map_or(0, crate::mcp::payload::json_len);
        // One notification larger than the bound still goes to a client that has taken everything before it.
        let before = self.backlog.fetch_add(bytes, Ordering::Relaxed);
        if before > 0 && before + bytes > BACKLOG_BYTES {
            self.backlog.fetch_sub(bytes, Ordering::Relaxed);
            tracing::debug!(method, bytes, "a notification dropped: its client is too far behind");
            return;
        }
        let held = Held { backlog: self.backlog.clone(), bytes };
        let _ = self.tx.try_send(Inbound::Notification { method: method.to_owned(), params, held });
    }

    /// Ask the client and wait at most `timeout` for its answer. A client that cannot answer, is gone or does
    /// not answer in time makes this an error the server receives as the answer.
    pub async fn ask(&self, method: &str, params: Option<Value>, timeout: Duration) -> Result<Value, RpcError> {
        self.ask_as(method, params, timeout, true).await
    }

    /// [`Relay::ask`] of a request that is `ours` (about this relay's client request) or perhaps another's.
    pub async fn ask_as(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        ours: bool,
    ) -> Result<Value, RpcError> {
        if !self.answers {
            return Err(unsupported(method));
        }
        // The satellite declares every capability upstream on behalf of all its clients; a client that did not
        // declare this one gets nothing it never asked for, and the server the answer such a client gives.
        if let (Some(needed), Some(declared)) = (capability_for(method), self.client_capabilities()) {
            if declared.get(needed).is_none() {
                return local_answer(method);
            }
        }
        let (reply, answer) = oneshot::channel();
        let request = Inbound::Request { method: method.to_owned(), params, reply, ours };
        // The wait for room on a stalled client's stream counts against the timeout too.
        let asked = async {
            if self.tx.send(request).await.is_err() {
                return Err(RpcError::new(codes::INTERNAL_ERROR, "the client is gone"));
            }
            answer.await.unwrap_or_else(|_| Err(RpcError::new(codes::INTERNAL_ERROR, "the client is gone")))
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(outcome) => outcome,
            Err(_) => Err(RpcError::new(
                codes::INTERNAL_ERROR,
                format!("the client did not answer {method} within {}s", timeout.as_secs()),
            )),
        }
    }

    /// Whether the client end is still there.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Done when the client end is gone (its stream closed).
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// How long a server's request may wait for a client's answer.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(300);

/// The requests a server made that wait for their client's answer, each a task, by the server's own id, on the
/// transports whose reader answers them (stdio, legacy SSE). A server may withdraw one with
/// `notifications/cancelled`: its task is stopped, so no answer is sent, and the client that was asked hears
/// that it no longer needs to answer (`http::exchange`). They end with the reader that holds them.
#[derive(Debug, Default)]
pub struct ServerAsks {
    tasks: tokio::task::JoinSet<()>,
    by_id: HashMap<crate::mcp::protocol::RequestId, tokio::task::AbortHandle>,
}

impl ServerAsks {
    /// Run `answering`, the work of answering the server's request `id` (`None`: an answer that cannot be
    /// withdrawn, such as a refusal on its way).
    pub fn spawn<F>(&mut self, id: Option<crate::mcp::protocol::RequestId>, answering: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.reap();
        let handle = self.tasks.spawn(answering);
        if let Some(id) = id {
            self.by_id.insert(id, handle);
        }
    }

    /// Those still waiting.
    pub fn len(&mut self) -> usize {
        self.reap();
        self.tasks.len()
    }

    pub fn is_empty(&mut self) -> bool {
        self.len() == 0
    }

    /// The server's `notifications/cancelled`: stop answering the request it names, if one of its requests waits.
    /// True when one did.
    pub fn withdraw(&mut self, params: Option<&Value>) -> bool {
        let Some(id) = params.and_then(|p| p.get("requestId")) else { return false };
        let Ok(id) = serde_json::from_value::<crate::mcp::protocol::RequestId>(id.clone()) else { return false };
        match self.by_id.remove(&id) {
            Some(task) => {
                task.abort();
                true
            }
            None => false,
        }
    }

    /// Forget the ended ones: the table holds only what still waits.
    fn reap(&mut self) {
        let mut ended = false;
        while self.tasks.try_join_next().is_some() {
            ended = true;
        }
        if ended {
            self.by_id.retain(|_, task| !task.is_finished());
        }
    }
}
/// A server's requests made outside any request of ours that may wait for a client at once, per connection;
/// more are refused at once (-32603).
pub const MAX_OUTSIDE_ASKS: usize = 32;

/// The answer to a server's request refused because too many of its requests wait already.
pub fn too_many_asks() -> RpcError {
    RpcError::new(codes::INTERNAL_ERROR, "too many requests wait for the client")
}

/// The client capability a server request needs (`None`: any client may take it, as `ping`).
pub fn capability_for(method: &str) -> Option<&'static str> {
    match method {
        "sampling/createMessage" => Some("sampling"),
        "elicitation/create" => Some("elicitation"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

/// The client streams on which a server's requests made outside any request of ours can reach a client: each
/// handshake-era session's GET stream takes a seat for its owner, on an instance's endpoint (that instance's
/// seat) or on `/mcp` (a seat for all the owner's instances). Owners never share a seat: a server only asks the
/// clients of the user its instance belongs to.
#[derive(Debug, Default)]
pub struct Seats {
    by_owner: Mutex<HashMap<String, Vec<Seat>>>,
    next: AtomicU64,
}

#[derive(Debug)]
struct Seat {
    id: u64,
    /// The instance whose endpoint the stream is on; `None` on `/mcp`.
    instance: Option<String>,
    relay: Relay,
}

/// A taken seat, given back when dropped (with the stream that holds it).
#[derive(Debug)]
pub struct SeatGuard {
    seats: Arc<Seats>,
    owner: String,
    id: u64,
}

impl Drop for SeatGuard {
    fn drop(&mut self) {
        let mut by_owner = self.seats.by_owner.lock();
        if let Some(seats) = by_owner.get_mut(&self.owner) {
            seats.retain(|seat| seat.id != self.id);
            if seats.is_empty() {
                by_owner.remove(&self.owner);
            }
        }
    }
}

impl Seats {
    /// A client stream of `owner` takes a seat, on `instance`'s endpoint or (`None`) on `/mcp`.
    pub fn take(self: &Arc<Self>, owner: String, instance: Option<String>, relay: Relay) -> SeatGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.by_owner.lock().entry(owner.clone()).or_default().push(Seat { id, instance, relay });
        SeatGuard { seats: self.clone(), owner, id }
    }

    /// The newest client of `owner` that can take `method`: on the instance's own endpoint first, then on `/mcp`.
    fn choose(&self, owner: &str, instance: &str, method: &str) -> Option<Relay> {
        let by_owner = self.by_owner.lock();
        let seats = by_owner.get(owner)?;
        let able = |seat: &&Seat| {
            !seat.relay.is_closed()
                && capability_for(method).is_none_or(|name| {
                    seat.relay.client_capabilities().is_some_and(|declared| declared.get(name).is_some())
                })
        };
        let own = seats.iter().rev().filter(able).find(|seat| seat.instance.as_deref() == Some(instance));
        own.or_else(|| seats.iter().rev().filter(able).find(|seat| seat.instance.is_none()))
            .map(|seat| seat.relay.clone())
    }

    /// Seats taken now, for every owner.
    pub fn len(&self) -> usize {
        self.by_owner.lock().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How one instance's server reaches its owner's clients with a request made outside any request of ours.
#[derive(Debug, Clone)]
pub struct Asker(Arc<AskerOf>);

#[derive(Debug)]
struct AskerOf {
    seats: Arc<Seats>,
    owner: String,
    instance: String,
}

impl Asker {
    pub fn new(seats: Arc<Seats>, owner: String, instance: String) -> Self {
        Self(Arc::new(AskerOf { seats, owner, instance }))
    }

    /// Ask the owner's newest client that can answer; with none, what a client without the capability answers.
    pub async fn ask(&self, method: &str, params: Option<Value>) -> Result<Value, RpcError> {
        let AskerOf { seats, owner, instance } = &*self.0;
        match seats.choose(owner, instance, method) {
            Some(relay) => relay.ask(method, params, ASK_TIMEOUT).await,
            None => local_answer(method),
        }
    }
}

/// Answer a server's request made outside any request of ours: through `asker` when there is one.
pub async fn answer_outside(asker: Option<&Asker>, method: &str, params: Option<Value>) -> Result<Value, RpcError> {
    match asker {
        Some(asker) => asker.ask(method, params).await,
        None => local_answer(method),
    }
}

/// The answer to a server request no client can take: what a client without that capability answers, except
/// for `ping` and `roots/list`, which have harmless answers.
pub fn local_answer(method: &str) -> Result<Value, RpcError> {
    match method {
        "ping" => Ok(json!({})),
        "roots/list" => Ok(json!({"roots": []})),
        other => Err(unsupported(other)),
    }
}

fn unsupported(method: &str) -> RpcError {
    RpcError::new(codes::METHOD_NOT_FOUND, format!("the client cannot take {method} here"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's `notifications/cancelled` names one of its own requests, by an id the client never saw: it is
    /// not passed on (on stdio and legacy SSE too), while the server's other notifications are.
    #[tokio::test]
    async fn a_servers_cancellation_is_not_passed_on() {
        let (relay, mut rx) = Relay::for_client(std::sync::Arc::new(json!({})));
        relay.notify("notifications/cancelled", Some(json!({"requestId": 1})));
        relay.notify("notifications/progress", Some(json!({"progressToken": "t", "progress": 1})));
        let Some(Inbound::Notification { method, .. }) = rx.recv().await else { panic!("a notification") };
        assert_eq!(method, "notifications/progress");
        assert!(rx.try_recv().is_err());
    }

    /// A burst of notifications reaches a client that keeps up whole; one that does not read holds at most
    /// `BACKLOG_BYTES` of them, and gets room again as it reads. Before, the 65th queued notification was dropped.
    #[tokio::test]
    async fn notifications_queue_up_to_a_byte_bound_not_a_short_count() {
        let (relay, mut rx) = Relay::channel(true);
        for n in 0..1000 {
            relay.notify("notifications/progress", Some(json!({"progressToken": 1, "progress": n})));
        }
        let mut heard = 0;
        while let Ok(inbound) = rx.try_recv() {
            assert!(matches!(inbound, Inbound::Notification { .. }));
            heard += 1;
        }
        assert_eq!(heard, 1000, "a burst is passed on whole");
        assert_eq!(relay.backlog.load(Ordering::Relaxed), 0, "what was taken is given back");

        let big = "x".repeat(100 * 1024);
        for _ in 0..100 {
            relay.notify("notifications/message", Some(json!({"level": "info", "data": big})));
        }
        let queued = std::iter::from_fn(|| rx.try_recv().ok()).count();
        assert!((39..=41).contains(&queued), "{queued} of 100 notifications of 100 KiB held; the bound is 4 MiB");
        relay.notify("notifications/message", Some(json!({"level": "info", "data": big})));
        assert!(rx.try_recv().is_ok(), "room again once the client read");
        let huge = "x".repeat(5 * 1024 * 1024);
        relay.notify("notifications/message", Some(json!({"level": "info", "data": huge})));
        assert!(rx.try_recv().is_ok(), "one message past the bound still goes to a client that keeps up");
    }

    #[tokio::test]
    async fn a_client_is_asked_only_what_it_declared_it_can_answer() {
        let (relay, mut rx) = Relay::for_client(std::sync::Arc::new(json!({"roots": {}})));
        let refused = relay.ask("sampling/createMessage", None, Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(refused.code, codes::METHOD_NOT_FOUND, "{refused:?}");
        let refused = relay.ask("elicitation/create", None, Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(refused.code, codes::METHOD_NOT_FOUND, "{refused:?}");
        assert!(rx.try_recv().is_err(), "nothing reached the client");
        // What it declared, and what needs no capability, reach it.
        let client = tokio::spawn(async move {
            let mut asked = Vec::new();
            while let Some(Inbound::Request { method, reply, .. }) = rx.recv().await {
                asked.push(method);
                let _ = reply.send(Ok(json!({"roots": []})));
            }
            asked
        });
        relay.ask("roots/list", None, Duration::from_secs(5)).await.unwrap();
        relay.ask("ping", None, Duration::from_secs(5)).await.unwrap();
        drop(relay);
        assert_eq!(client.await.unwrap(), ["roots/list", "ping"]);
    }

    #[tokio::test]
    async fn requests_reach_the_client_and_its_answer_comes_back() {
        let (relay, mut rx) = Relay::channel(true);
        let client = tokio::spawn(async move {
            match rx.recv().await {
                Some(Inbound::Request { method, reply, .. }) => {
                    assert_eq!(method, "sampling/createMessage");
                    let _ = reply.send(Ok(json!({"content": {"type": "text", "text": "hi"}})));
                }
                other => panic!("{other:?}"),
            }
        });
        let answer = relay.ask("sampling/createMessage", None, Duration::from_secs(5)).await.unwrap();
        assert_eq!(answer["content"]["text"], "hi");
        client.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_fails_after_its_timeout() {
        let (relay, _rx) = Relay::channel(true);
        let err = relay.ask("elicitation/create", None, Duration::from_secs(30)).await.unwrap_err();
        assert!(err.message.contains("did not answer"), "{}", err.message);
        let (stateless, _rx) = Relay::channel(false);
        assert_eq!(
            stateless.ask("sampling/createMessage", None, Duration::from_secs(1)).await.unwrap_err().code,
            -32601
        );
        let (gone, rx) = Relay::channel(true);
        drop(rx);
        assert!(gone.ask("roots/list", None, Duration::from_secs(1)).await.is_err());
    }

    /// A client whose stream is stalled (connected, reading nothing: its relay's channel is full) does not hold the
    /// server's request for ever: the wait for room counts against the timeout. Before, the send waited unbounded.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_client_stream_fails_the_request_after_its_timeout() {
        let (relay, _stalled) = Relay::channel(true);
        for _ in 0..CAPACITY {
            relay.notify("notifications/progress", None);
        }
        let asked =
            tokio::time::timeout(Duration::from_secs(60), relay.ask("roots/list", None, Duration::from_secs(30)));
        let err = asked.await.expect("an answer within the request's timeout").unwrap_err();
        assert!(err.message.contains("did not answer roots/list within 30s"), "{}", err.message);
    }

    /// A client that answers every request it gets with `who`.
    fn seat_answering(
        seats: &Arc<Seats>,
        owner: &str,
        instance: Option<&str>,
        caps: Value,
        who: &'static str,
    ) -> SeatGuard {
        let (relay, mut rx) = Relay::for_client(Arc::new(caps));
        tokio::spawn(async move {
            while let Some(inbound) = rx.recv().await {
                if let Inbound::Request { reply, .. } = inbound {
                    let _ = reply.send(Ok(json!({"from": who})));
                }
            }
        });
        seats.take(owner.to_owned(), instance.map(str::to_owned), relay)
    }

    #[tokio::test]
    async fn a_server_asks_its_owners_client_on_its_own_endpoint_first_and_never_another_owners() {
        let seats = Arc::new(Seats::default());
        let asker = Asker::new(seats.clone(), "acme\0alice".into(), "every-alice".into());
        let roots = json!({"roots": {}});
        let _bob = seat_answering(&seats, "acme\0bob", None, roots.clone(), "bob");
        let _bobs_instance = seat_answering(&seats, "acme\0bob", Some("every-alice"), roots.clone(), "bob");
        assert_eq!(asker.ask("roots/list", None).await.unwrap(), json!({"roots": []}), "another owner's clients: none");

        let on_mcp = seat_answering(&seats, "acme\0alice", None, roots.clone(), "mcp");
        let _other = seat_answering(&seats, "acme\0alice", Some("other-alice"), roots.clone(), "other");
        assert_eq!(asker.ask("roots/list", None).await.unwrap()["from"], "mcp");
        let own = seat_answering(&seats, "acme\0alice", Some("every-alice"), json!({}), "own");
        assert_eq!(asker.ask("roots/list", None).await.unwrap()["from"], "mcp", "its own client lacks roots");
        assert_eq!(asker.ask("ping", None).await.unwrap()["from"], "own", "a ping needs no capability");
        let sampling = asker.ask("sampling/createMessage", None).await.unwrap_err();
        assert_eq!(sampling.code, codes::METHOD_NOT_FOUND, "no client of alice's declared sampling");
        drop(own);
        drop(on_mcp);
        assert_eq!(asker.ask("roots/list", None).await.unwrap(), json!({"roots": []}), "seats given back");
        assert_eq!(seats.len(), 3);
    }
}
