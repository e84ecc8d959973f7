//! The client side of a relayed request: while the satellite runs a client's request upstream, what the server
//! says meanwhile (progress, log messages, sampling/elicitation/roots requests) reaches the client as messages on
//! an SSE response, and the client's answers (POSTed JSON-RPC responses) find their way back. A request that
//! finishes before the server says anything is answered with plain JSON, as before.
//!
//! Server requests get fresh ids (`satellite-N`) on the client's side; an `Exchange` remembers which reply each
//! is waiting for, per session, and which calls a client may cancel with `notifications/cancelled`.

mod asking;
mod mode;
mod park;
mod stream;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinHandle};
use tracing::Instrument as _;

use crate::mcp::payload::Payload;
use crate::mcp::protocol::{RequestId, RpcError};
use crate::mcp::transport::Relay;
use crate::router::RouteError;

pub use asking::{AskedOf, HearsWithdrawals, Withdrawn, WITHDRAWALS};
pub use mode::{LongLived, Mode, ProgressTokens};
pub use park::is_parked_state;
pub use stream::{response_message, Answer};

use asking::SessionStreams;
use park::Parked;
use stream::Relayed;

/// A server request waiting for the client's answer.
#[derive(Debug)]
pub(super) struct Asked {
    pub(super) method: String,
    pub(super) params: Option<Value>,
    pub(super) reply: Reply_,
}

type Reply_ = oneshot::Sender<Result<Value, RpcError>>;

/// Pending server requests and cancellable calls of one session table, keyed by session (scope) and id.
#[derive(Debug, Default)]
pub struct Exchange {
    /// Where a client's answer to a server request goes, by session and the id the client knows: to the task that
    /// passes it on to the server's asker, or tells the client the server no longer waits ([`Withdrawn`]).
    replies: Arc<Mutex<HashMap<String, Reply_>>>,
    /// Each session's GET stream, by session (scope), for withdrawals no other stream can carry.
    session_streams: SessionStreams,
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
    /// Shutdown: long-lived streams end now, with their final response.
    pub fn close_long_lived(&self) {
        self.closing.cancel();
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
        self.drive(Relayed { scope, id, mode, call, rx }, finish).await
    }
}

#[cfg(test)]
mod tests;
