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

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinHandle};
use warp::reply::Response;
use warp::Reply;

use crate::mcp::protocol::{self, codes, RequestId, RpcError};
use crate::mcp::transport::{Inbound, Relay};
use crate::router::RouteError;

type Reply_ = oneshot::Sender<Result<Value, RpcError>>;

/// Pending server requests and cancellable calls of one session table, keyed by session (scope) and id.
#[derive(Debug, Default)]
pub struct Exchange {
    replies: Mutex<HashMap<String, Reply_>>,
    calls: Mutex<HashMap<String, AbortHandle>>,
    next: AtomicU64,
}

fn key(scope: &str, id: &str) -> String {
    format!("{scope}\u{0}{id}")
}

impl Exchange {
    /// Turn a message from upstream into the JSON-RPC message the client sees; a request is registered under a
    /// fresh id, its answer awaited by `reply`.
    pub fn outbound(&self, scope: &str, request: &RequestId, inbound: Inbound) -> Value {
        match inbound {
            Inbound::Notification { method, mut params } => {
                if let Some(params) = params.as_mut() {
                    protocol::retag_subscription(params, request);
                }
                message(None, &method, params)
            }
            Inbound::Request { method, params, reply } => {
                let id = format!("satellite-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
                let mut replies = self.replies.lock();
                // Requests whose asker gave up (timed out, client gone) are dropped here, keeping the map bounded.
                replies.retain(|_, waiting| !waiting.is_closed());
                replies.insert(key(scope, &id), reply);
                message(Some(json!(id)), &method, params)
            }
        }
    }

    /// Deliver a client's answer to the server request it names; false when nothing waits for it.
    pub fn deliver(&self, scope: &str, id: &RequestId, outcome: Result<Value, RpcError>) -> bool {
        match self.replies.lock().remove(&key(scope, &id.to_string())) {
            Some(waiting) => waiting.send(outcome).is_ok(),
            None => false,
        }
    }

    /// Remember a running call so the client can cancel it; forgotten when it ends.
    pub fn track(&self, scope: &str, id: &RequestId, call: AbortHandle) {
        let mut calls = self.calls.lock();
        calls.retain(|_, running| !running.is_finished());
        calls.insert(key(scope, &id.to_string()), call);
    }

    /// `notifications/cancelled` from the client: stop the named call (which cancels it upstream in turn).
    pub fn cancel(&self, scope: &str, params: Option<&Value>) {
        let Some(id) = params.and_then(|p| p.get("requestId")) else { return };
        let id = match id {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if let Some(call) = self.calls.lock().remove(&key(scope, &id)) {
            call.abort();
        }
    }

    /// Run one client request with a relay: `Answer::Done` when it completes before the server says anything
    /// (the caller answers with plain JSON, as without a relay), else an SSE stream of the server's messages
    /// ending with the response `finish` makes of the outcome. It stops on `notifications/cancelled`. A
    /// handshake-era call keeps running if the client disconnects (there, disconnection is not cancellation); a
    /// 2026-07-28 request (`stateless`) stops, since closing its stream is how that revision cancels.
    pub async fn respond<Fut, Fin>(
        self: &Arc<Self>,
        scope: String,
        id: RequestId,
        stateless: bool,
        run: impl FnOnce(Relay) -> Fut,
        finish: Fin,
    ) -> Answer
    where
        Fut: Future<Output = Result<Value, RouteError>> + Send + 'static,
        Fin: FnOnce(Result<Value, RouteError>) -> Value + Send + Sync + 'static,
    {
        // A 2026-07-28 request has no way to answer the server's requests (that revision has none).
        let (relay, mut rx) = Relay::channel(!stateless);
        let mut call: JoinHandle<Result<Value, RouteError>> = tokio::spawn(run(relay));
        self.track(&scope, &id, call.abort_handle());
        // The client may go before the server says anything: this handler is then dropped.
        let waiting = AbortOnDrop(Some(call.abort_handle()).filter(|_| stateless));
        let first = tokio::select! {
            biased;
            done = &mut call => return Answer::Done(outcome(done)),
            first = rx.recv() => first,
        };
        waiting.disarm();
        let mut state = Streaming {
            queue: VecDeque::new(),
            rx: Some(rx),
            call: Some(call),
            finish: Some(finish),
            exchange: self.clone(),
            scope,
            request: id,
            cancel_on_drop: stateless,
        };
        if let Some(inbound) = first {
            let message = state.exchange.outbound(&state.scope, &state.request, inbound);
            state.queue.push_back(message);
        }
        let events = futures::stream::unfold(state, |mut state| async move {
            let message = state.next().await?;
            Some((Ok::<_, Infallible>(warp::sse::Event::default().event("message").data(message.to_string())), state))
        });
        let stream = warp::sse::keep_alive().interval(KEEP_ALIVE).text("ping").stream(events);
        Answer::Streamed(warp::sse::reply(stream).into_response())
    }
}

/// What running a relayed request came to.
pub enum Answer {
    /// Finished before the server said anything: answer as usual.
    Done(Result<Value, RouteError>),
    /// The server spoke first: this SSE response carries its messages and then the answer.
    Streamed(Response),
}

/// Comment lines on a long relayed call's stream, so idle proxies keep it open.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

struct Streaming<Fin> {
    queue: VecDeque<Value>,
    rx: Option<mpsc::Receiver<Inbound>>,
    call: Option<JoinHandle<Result<Value, RouteError>>>,
    finish: Option<Fin>,
    exchange: Arc<Exchange>,
    scope: String,
    /// The client's id for the request this stream answers.
    request: RequestId,
    /// Stop the call when the client drops the stream before its answer (2026-07-28 cancellation).
    cancel_on_drop: bool,
}

impl<Fin> Drop for Streaming<Fin> {
    fn drop(&mut self) {
        if let (true, Some(call)) = (self.cancel_on_drop, self.call.as_ref()) {
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

impl<Fin: FnOnce(Result<Value, RouteError>) -> Value> Streaming<Fin> {
    /// The next message for the client: queued ones, then whatever the server sends, then the answer.
    async fn next(&mut self) -> Option<Value> {
        if let Some(message) = self.queue.pop_front() {
            return Some(message);
        }
        let call = self.call.as_mut()?;
        let done = match self.rx.as_mut() {
            Some(rx) => tokio::select! {
                biased;
                next = rx.recv() => match next {
                    Some(inbound) => return Some(self.exchange.outbound(&self.scope, &self.request, inbound)),
                    None => {
                        self.rx = None;
                        call.await
                    }
                },
                done = &mut *call => done,
            },
            None => call.await,
        };
        self.call = None;
        // Messages sent before the result still go first.
        if let Some(rx) = self.rx.as_mut() {
            while let Ok(inbound) = rx.try_recv() {
                let message = self.exchange.outbound(&self.scope, &self.request, inbound);
                self.queue.push_back(message);
            }
        }
        self.rx = None;
        let finish = self.finish.take()?;
        self.queue.push_back(finish(outcome(done)));
        self.queue.pop_front()
    }
}

/// A call that panicked or was cancelled still has an outcome.
fn outcome(done: Result<Result<Value, RouteError>, tokio::task::JoinError>) -> Result<Value, RouteError> {
    done.unwrap_or_else(|err| {
        let reason = if err.is_cancelled() { "request cancelled" } else { "internal error while handling the request" };
        Err(RouteError::Rpc(RpcError::new(codes::INTERNAL_ERROR, reason)))
    })
}

/// The JSON-RPC response for a relayed call's outcome; a scope refusal that surfaces mid-stream is an error object.
pub fn response_message(id: RequestId, outcome: Result<Value, RouteError>) -> Value {
    match outcome {
        Ok(result) => protocol::response(id, result),
        Err(RouteError::Rpc(err)) => protocol::error_response(Some(id), err),
        Err(RouteError::Forbidden(err)) => {
            protocol::error_response(Some(id), RpcError::new(codes::INVALID_REQUEST, err.to_string()))
        }
    }
}

fn message(id: Option<Value>, method: &str, params: Option<Value>) -> Value {
    let mut out = json!({"jsonrpc": "2.0", "method": method});
    if let Some(id) = id {
        out["id"] = id;
    }
    if let Some(params) = params {
        out["params"] = params;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_reach_the_request_that_asked_and_only_in_its_session() {
        let exchange = Exchange::default();
        let (reply, answer) = oneshot::channel();
        let asker = RequestId::Number(1);
        let out = exchange.outbound(
            "s1",
            &asker,
            Inbound::Request { method: "sampling/createMessage".into(), params: None, reply },
        );
        let id = RequestId::String(out["id"].as_str().unwrap().to_owned());
        assert_eq!(out["method"], "sampling/createMessage");
        assert!(!exchange.deliver("s2", &id, Ok(json!({}))), "another session cannot answer");
        assert!(exchange.deliver("s1", &id, Ok(json!({"ok": true}))));
        assert_eq!(answer.await.unwrap().unwrap()["ok"], true);
        assert!(!exchange.deliver("s1", &id, Ok(json!({}))), "answered once");
    }
}
