//! The messages of the reply to one of our requests: its response, the server's notifications, and the server's
//! own requests, answered by the client through the relay or locally.

use std::time::Duration;

use futures::future::{AbortHandle, Abortable, Aborted, BoxFuture};
use futures::stream::FuturesUnordered;
use serde_json::Value;
use tracing::debug;

use super::StreamableHttpTransport;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, Message, RequestId, RpcError};
use crate::mcp::transport::relay::{answer_outside, too_many_asks, MAX_OUTSIDE_ASKS};
use crate::mcp::transport::{outcome, Relay, RequestHeaders, UpstreamError};

impl StreamableHttpTransport {
    /// One message (or batch) from the reply to request `id`: its response ends the request; notifications go
    /// to the relay; the server's own requests are answered (by the client through the relay, or locally), each
    /// in `asks` while the stream is read on when there is one, else before the next message is read. A server's
    /// `notifications/cancelled` of one of its own requests stops asking the client; it is not passed on (its id
    /// is the server's, which a client would take for one of its own requests).
    pub(super) async fn handle_message<'a>(
        &'a self,
        value: Value,
        id: i64,
        headers: &'a RequestHeaders,
        relay: Option<&'a Relay>,
        timeout: Duration,
        mut asks: Option<&mut Asks<'a>>,
    ) -> Option<Result<Payload, UpstreamError>> {
        let items = match value {
            Value::Array(items) => items,
            single => vec![single],
        };
        for item in items {
            match Message::from_value(item) {
                Ok(Message::Response { id: RequestId::Number(n), outcome: result }) if n == id => {
                    return Some(outcome(result));
                }
                Ok(Message::Notification { method, params }) if method == "notifications/cancelled" => {
                    if let Some(asks) = asks.as_deref_mut() {
                        asks.withdrawn(params.as_ref());
                    }
                }
                // Progress under a token of ours goes back under the client's own.
                Ok(Message::Notification { method, params }) => {
                    if let (Err(params), Some(relay)) = (self.relays.deliver_progress(&method, params), relay) {
                        relay.notify(&method, params);
                    }
                }
                Ok(Message::Request { id: server_id, method, params }) => match asks.as_deref_mut() {
                    // As many waiting at once as outside any request, at most: more are refused at once.
                    Some(asks) if asks.running.len() >= MAX_OUTSIDE_ASKS => {
                        self.refuse_server(server_id, &method, headers).await;
                    }
                    Some(asks) => {
                        let key = serde_json::to_string(&server_id).unwrap_or_default();
                        asks.push(key, self.answer_server(server_id, method, params, headers, relay, timeout));
                    }
                    None => self.answer_server(server_id, method, params, headers, relay, timeout).await,
                },
                _ => {}
            }
        }
        None
    }

    /// Refuse a request the server made during one of ours, too many of its requests waiting already.
    async fn refuse_server(&self, server_id: RequestId, method: &str, headers: &RequestHeaders) {
        debug!(process_id = %self.label, method = %method, "too many server requests waiting, refused");
        let reply = protocol::error_response(Some(server_id), too_many_asks());
        if let Err(err) = self.post(&reply, headers).await {
            debug!(process_id = %self.label, error = %err, "refusing the server's request failed");
        }
    }

    /// Answer a request the server made during one of ours: by the client through `relay`, within our request's
    /// own time, else locally; the answer goes back by POST on the session.
    async fn answer_server(
        &self,
        server_id: RequestId,
        method: String,
        params: Option<Value>,
        headers: &RequestHeaders,
        relay: Option<&Relay>,
        timeout: Duration,
    ) {
        let answer = match relay {
            Some(relay) => relay.ask(&method, params, timeout).await,
            None => tokio::time::timeout(timeout, answer_outside(self.asker.as_ref(), &method, params))
                .await
                .unwrap_or_else(|_| Err(RpcError::new(codes::INTERNAL_ERROR, "no client answered in time"))),
        };
        let reply = match answer {
            Ok(result) => protocol::response(server_id, result),
            Err(err) => protocol::error_response(Some(server_id), err),
        };
        if let Err(err) = self.post(&reply, headers).await {
            debug!(process_id = %self.label, error = %err, "answering the server's request failed");
        }
    }
}

/// The server's requests made on one reply stream, each answered while the stream is read on: a request waiting
/// on a person (an elicitation) holds up neither the server's progress nor its cancelling that very request.
/// Dropped with the stream: once our request is answered, the server's requests during it are moot.
#[derive(Default)]
pub(super) struct Asks<'a> {
    /// Each ends with its server id (as JSON text).
    pub(super) running: FuturesUnordered<Abortable<BoxFuture<'a, String>>>,
    /// Those running, by the server's id, to stop asking when the server cancels one.
    by_id: std::collections::HashMap<String, AbortHandle>,
}

impl<'a> Asks<'a> {
    /// `answering` the server's request `key` (its id as JSON text) while the stream is read on.
    fn push(&mut self, key: String, answering: impl std::future::Future<Output = ()> + Send + 'a) {
        let done = key.clone();
        let answering: BoxFuture<'a, String> = Box::pin(async move {
            answering.await;
            done
        });
        let (handle, registration) = AbortHandle::new_pair();
        self.by_id.insert(key, handle);
        self.running.push(Abortable::new(answering, registration));
    }

    /// One ended: answered (its id no longer listed), or withdrawn (unlisted when the server cancelled it).
    pub(super) fn finished(&mut self, done: Result<String, Aborted>) {
        if let Ok(key) = done {
            self.by_id.remove(&key);
        }
    }

    /// The server's `notifications/cancelled` with `params`: the request it names is no longer asked.
    fn withdrawn(&mut self, params: Option<&Value>) {
        if let Some(cancelled) = params.and_then(|p| p.get("requestId")).map(Value::to_string) {
            self.cancel(&cancelled);
        }
    }

    /// The server no longer waits for its request `key`: no answer is sent.
    fn cancel(&mut self, key: &str) {
        if let Some(handle) = self.by_id.remove(key) {
            handle.abort();
        }
    }
}
