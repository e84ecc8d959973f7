//! A JSON-RPC batch POSTed to `/message` by a legacy stream's client (2025-03-26 basic: a receiver MUST support
//! batches). Each message is handled as if posted alone, the requests side by side (a few at a time, as on
//! `/mcp`); their responses go on the stream as one array once all are answered (JSON-RPC 2.0 §6, the 2025-03-26
//! schema's `JSONRPCBatchResponse`), as `/mcp` answers a batch with one array.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tracing::Instrument as _;
use warp::http::StatusCode;
use warp::reply::Response;

use super::super::dispatch::Target;
use super::super::error::McpError;
use super::super::mcp::{select_toolset, BATCH_CONCURRENCY, MAX_BATCH_MESSAGES};
use super::super::{json_response, McpDeps};
use super::relayed::{Ended, RelayedCall};
use super::sessions::Touched;
use super::{accepted, invalid, new_message_id, notified, relayed_call, send_or_give_up};
use crate::auth::Principal;
use crate::mcp::protocol::{self, Message, RequestId};

/// One message of a batch, in the batch's order: answered already (one that is no JSON-RPC message), or a request
/// whose call runs.
enum Slot {
    Answered(Value),
    Running(RequestId, JoinHandle<Result<Value, Ended>>),
}

/// Answer a batch: refused as `/mcp` refuses it (empty, past the cap, carrying `initialize`, which 2025-03-26
/// forbids in a batch), else 202 when it holds no request (nothing is answered), else answered as one request
/// alone is: once its responses are on the stream, or as soon as the server asks the client something (a client
/// that POSTs one message at a time could not otherwise send its answer).
pub(super) async fn answer_batch(
    deps: &McpDeps,
    id: &str,
    caller: Principal,
    stream: Touched,
    messages: Vec<Value>,
) -> Result<Response, McpError> {
    check(&messages)?;
    let selection = select_toolset(&deps.routing.toolsets, &caller, stream.toolset.as_deref());
    let call = relayed_call(deps, id, stream);
    let (asked_tx, mut asked) = mpsc::channel::<()>(1);
    let target = Target::LegacySse(caller.clone(), selection);
    let slots = start(deps, (id, &caller), &call, target, messages, &asked_tx).await;
    drop(asked_tx);
    if slots.is_empty() {
        return Ok(accepted());
    }
    let message_id = new_message_id();
    let mut gathered = tokio::spawn(gather(slots, call, message_id.clone()).in_current_span());
    let ended = tokio::select! {
        biased;
        ended = &mut gathered => ended.map_err(|_| McpError::Internal)?,
        Some(()) = asked.recv() => Ended::Sent,
    };
    match ended {
        Ended::Sent => Ok(json_response(StatusCode::OK, &json!({"status": "sent", "messageId": message_id}))),
        Ended::Refused(err) => Err(McpError::Auth(err)),
        Ended::StreamClosed => Err(McpError::SseStreamClosed),
    }
}

/// A batch `/mcp` would refuse is refused the same way.
fn check(messages: &[Value]) -> Result<(), McpError> {
    if messages.is_empty() {
        return Err(McpError::EmptyBatch);
    }
    if messages.len() > MAX_BATCH_MESSAGES {
        return Err(McpError::BatchTooLarge { messages: messages.len(), max: MAX_BATCH_MESSAGES });
    }
    if messages.iter().any(|m| m.get("method").and_then(Value::as_str) == Some("initialize")) {
        return Err(McpError::InitializeInBatch);
    }
    Ok(())
}

/// Each message in turn, as if posted alone: a notification or a response taken at once, a request's call started
/// (at most [`BATCH_CONCURRENCY`] of them running at a time), one that is no JSON-RPC message answered with an error.
async fn start(
    deps: &McpDeps,
    (id, caller): (&str, &Principal),
    call: &RelayedCall,
    target: Target,
    messages: Vec<Value>,
    asked: &mpsc::Sender<()>,
) -> Vec<Slot> {
    let gate = Arc::new(Semaphore::new(BATCH_CONCURRENCY));
    let mut slots = Vec::new();
    for message in messages {
        match Message::from_value(message) {
            Err(err) => slots.push(Slot::Answered(invalid(&err))),
            Ok(Message::Notification { method, params }) => notified(deps, id, caller, &method, params).await,
            Ok(Message::Response { id: answered, outcome }) => {
                deps.sessions.legacy.exchange.deliver(id, &answered, outcome);
            }
            Ok(Message::Request { id: request_id, method, params }) => {
                let request = (request_id.clone(), method, params);
                let task = call.clone().spawn_in_batch(target.clone(), request, asked.clone(), gate.clone());
                slots.push(Slot::Running(request_id, task));
            }
        }
    }
    slots
}

/// The batch's responses, in its order, put on the stream as one array under `message_id`. A request refused for
/// want of a scope gets its own error; when every one is, the POST is refused instead, with the challenge that says
/// which scope to ask for (as on `/mcp`). A request the client cancelled gets no response.
async fn gather(slots: Vec<Slot>, call: RelayedCall, message_id: String) -> Ended {
    let mut replies = Vec::with_capacity(slots.len());
    let mut refused = Vec::new();
    for slot in slots {
        match slot {
            Slot::Answered(reply) => replies.push(reply),
            Slot::Running(request_id, task) => match task.await {
                Ok(Ok(reply)) => replies.push(reply),
                Ok(Err(Ended::Refused(err))) => {
                    replies.push(protocol::error_response(Some(request_id), McpError::Auth(err.clone()).rpc()));
                    refused.push(err);
                }
                Ok(Err(ended)) => return ended,
                // Cancelled by the client (`notifications/cancelled`): no response is due.
                Err(_) => {}
            },
        }
    }
    if !refused.is_empty() && refused.len() == replies.len() {
        return Ended::Refused(refused.swap_remove(0));
    }
    if replies.is_empty() {
        return Ended::Sent;
    }
    let event = warp::sse::Event::default().id(message_id).event("message").data(Value::Array(replies).to_string());
    if !send_or_give_up(&call.events, event).await {
        return call.stream_closed();
    }
    Ended::Sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_refused_as_mcp_refuses_it() {
        let ping = |id: usize| json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        assert_eq!(check(&[]), Err(McpError::EmptyBatch));
        let over: Vec<Value> = (0..=MAX_BATCH_MESSAGES).map(ping).collect();
        assert_eq!(check(&over), Err(McpError::BatchTooLarge { messages: 101, max: 100 }));
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}});
        assert_eq!(check(&[initialize]), Err(McpError::InitializeInBatch));
        assert_eq!(check(&[ping(1), ping(2)]), Ok(()));
    }
}
