//! The server's requests to a client: each goes out under a fresh id, the client's answer is passed back to the
//! asker, and a request the asker no longer waits for is withdrawn from the client with `notifications/cancelled`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::{key, Exchange, Reply_};
use crate::mcp::protocol::{self, RequestId, RpcError};
use crate::mcp::transport::Inbound;

/// Each session's GET stream, by session (scope), with the number that tells a newer one from an older.
pub(super) type SessionStreams = Arc<Mutex<HashMap<String, (u64, Withdrawn)>>>;

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
    streams: SessionStreams,
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

/// The task that waits on one server request the client was asked: it passes the client's answer on, or, when the
/// asker stops waiting first, takes the request out of the table and tells the client. It ends with one or the
/// other: the asker's wait is bounded.
struct Watch {
    replies: Arc<Mutex<HashMap<String, Reply_>>>,
    session_streams: SessionStreams,
    /// The request's key in `replies`, and the id the client knows it by.
    key: String,
    id: String,
    session: String,
    /// The stream that carried the request.
    told: Withdrawn,
}

impl Watch {
    async fn run(self, answered: oneshot::Receiver<Result<Value, RpcError>>, mut reply: Reply_) {
        tokio::select! {
            answer = answered => {
                if let Ok(answer) = answer {
                    let _ = reply.send(answer);
                }
            }
            _ = reply.closed() => self.withdraw(),
        }
    }

    /// The asker stopped waiting: the request leaves the table, and the client is told, unless it answered first.
    fn withdraw(&self) {
        // Told under the lock: a stream that finds the request gone from the table finds this word on its channel
        // already (`Streaming::withdraw_all`).
        let mut replies = self.replies.lock();
        if replies.remove(&self.key).is_some() {
            let note = cancelled(&self.id, "the server no longer waits for an answer");
            // The stream that carried it has ended: the session's GET stream, if one is open.
            if let Err(note) = self.told.tell(note) {
                if let Some((_, stream)) = self.session_streams.lock().get(&self.session) {
                    let _ = stream.tell(note);
                }
            }
        }
    }
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
            Inbound::Request { method, params, reply, ours } => {
                let id = format!("satellite-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
                let key = key(scope, &id);
                let answered = self.await_answer(&key);
                let watch = Watch {
                    replies: self.replies.clone(),
                    session_streams: self.session_streams.clone(),
                    key: key.clone(),
                    id: id.clone(),
                    session: scope.to_owned(),
                    told: withdrawn.clone(),
                };
                tokio::spawn(watch.run(answered, reply));
                let asked = ours.then_some(AskedOf { key, id: id.clone() });
                (message(Some(json!(id)), &method, params), asked)
            }
        })
    }

    /// Register a request under `key`: the client's answer to it comes out of the receiver returned.
    fn await_answer(&self, key: &str) -> oneshot::Receiver<Result<Value, RpcError>> {
        let (answer, answered) = oneshot::channel();
        let mut replies = self.replies.lock();
        // Requests whose passer ended (answered or withdrawn) are dropped here, keeping the map bounded.
        replies.retain(|_, waiting| !waiting.is_closed());
        replies.insert(key.to_owned(), answer);
        answered
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

    /// Deliver a client's answer to the server request it names; false when nothing waits for it.
    pub fn deliver(&self, scope: &str, id: &RequestId, outcome: Result<Value, RpcError>) -> bool {
        match self.replies.lock().remove(&key(scope, &id.to_string())) {
            Some(waiting) => waiting.send(outcome).is_ok(),
            None => false,
        }
    }
}

/// A server's notification as the client of `request` sees it.
pub(super) fn notification_out(request: &RequestId, method: &str, mut params: Option<Value>) -> Value {
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
