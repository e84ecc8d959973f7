//! The legacy HTTP+SSE transport (SB §4): `GET /sse` opens a stream whose
//! first event names `/message?session=…`; requests POSTed there are answered
//! on the stream, through the same hierarchical router as `/mcp`, with the
//! identity authenticated at `GET /sse` (OQ-19).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;
use warp::Filter;

use super::audit::finish;
use super::body::Unread;
use super::exchange::Withdrawn;
use super::mcp::roots_changed;
use super::stack::PeerAddr;
use super::{json_response, McpDeps};
use crate::auth::Principal;
use crate::mcp::protocol::{self, codes, RpcError};
use relayed::RelayedCall;
use sessions::Touched;

mod batch;
mod message;
mod open;
mod relayed;
mod seat;
mod sessions;

pub use sessions::SseSessions;

/// Events queued for one stream before the client counts as too slow and is dropped.
const STREAM_BUFFER: usize = 64;
pub const SSE_IDLE: Duration = Duration::from_secs(30 * 60);

pub fn routes(deps: McpDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer per request, not a copy of every dependency: warp runs this for each route it tries.
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    let peer = warp::ext::optional::<PeerAddr>();
    let open = warp::path!("sse")
        .and(super::allow::cors_get())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and(warp::header::headers_cloned())
        .and(peer)
        .and(with.clone())
        .then(|query: String, headers: HeaderMap, peer: Option<PeerAddr>, deps: Arc<McpDeps>| async move {
            let answer = open::open(&deps, &headers, super::mcp::toolset_param(&query)).await;
            finish(&deps.gate, "sse", peer, &headers, None, answer).await
        });
    let message = warp::path!("message")
        .and(super::allow::cors_post())
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
                let answer = message::message(&deps, &query, &headers, body).await;
                finish(&deps.gate, "sse", peer, &headers, None, answer).await
            },
        );
    open.or(message).unify()
}

/// The error answering a message that is not a JSON-RPC message.
fn invalid(err: &impl std::fmt::Display) -> Value {
    protocol::error_response(None, RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {err}")))
}

/// What a notification of the stream's client does: a cancellation stops the call it names, a change of its roots
/// reaches its servers; any other is taken and nothing more.
async fn notified(deps: &McpDeps, id: &str, caller: &Principal, method: &str, params: Option<Value>) {
    match method {
        "notifications/cancelled" => deps.sessions.legacy.exchange.cancel(id, params.as_ref()),
        "notifications/roots/list_changed" => roots_changed(&deps.routing.manager, caller, params).await,
        _ => {}
    }
}

/// A request of the stream's client, to run with a relay on its stream.
fn relayed_call(deps: &McpDeps, id: &str, stream: Touched) -> RelayedCall {
    RelayedCall {
        routing: deps.routing.clone(),
        sessions: deps.sessions.legacy.clone(),
        scope: id.to_owned(),
        events: stream.events,
        capabilities: stream.capabilities,
    }
}

/// A notification or a response, taken.
fn accepted() -> Response {
    json_response(StatusCode::ACCEPTED, &json!({"status": "accepted", "messageId": null}))
}

/// A message event of a legacy stream, carrying `message`.
fn message_event(message: &Value) -> warp::sse::Event {
    warp::sse::Event::default().event("message").data(message.to_string())
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
            Some(events) => events.try_send(message_event(&note)).map_err(|_| note),
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
