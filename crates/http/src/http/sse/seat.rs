//! A legacy stream's seat among its owner's streams (`Seats`): what a server asks outside any call reaches the
//! client on its stream, as it reaches a `/mcp` client's GET stream.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::super::exchange::Exchange;
use super::super::McpDeps;
use super::{message_event, send_or_give_up, withdrawals_to};
use crate::auth::Principal;
use crate::mcp::protocol;
use crate::mcp::transport::{Inbound, Relay};

/// Give the session a seat among its owner's streams (`Seats`), so a server's request made outside any call reaches
/// this client, when it declared the capability the request needs, as it reaches a `/mcp` client's GET stream. The
/// request goes on the stream under an id of the session's exchange; the client answers by POST. Capabilities past
/// the bound every session keeps get no seat (the server then gets a client's refusal).
pub(super) fn take_seat(deps: &McpDeps, id: &str, principal: &Principal, capabilities: Value) {
    let sessions = &deps.sessions.legacy;
    let mut table = sessions.sessions.lock();
    let Some(session) = table.get_mut(id) else { return };
    if crate::mcp::payload::json_len(&capabilities) > super::super::session::MAX_CAPABILITIES_BYTES {
        session.capabilities = Some(Arc::new(json!({})));
        session.seat = None;
        return;
    }
    let capabilities = Arc::new(capabilities);
    session.capabilities = Some(capabilities.clone());
    let (relay, asks) = Relay::for_client(capabilities);
    let owner = crate::instances::seat_owner(&principal.team, &principal.user);
    // A second initialize replaces the first seat (and what it declared).
    session.seat = Some(deps.routing.manager.seats().take(owner, None, relay));
    // The stream ends when its session goes: this task holds it only while forwarding one request.
    let forwarding = forward_asks(session.events.downgrade(), sessions.exchange.clone(), id.to_owned(), asks);
    // On the satellite's tracker, which shutdown waits for: the seat goes with the session once the drain has
    // closed the legacy streams, and this task with it.
    deps.background.tasks.spawn(forwarding);
}

/// Put each request the seat receives on the stream, with word of those withdrawn, until the stream goes or stops
/// being read.
async fn forward_asks(
    stream: mpsc::WeakSender<warp::sse::Event>,
    exchange: Arc<Exchange>,
    scope: String,
    mut asks: mpsc::Receiver<Inbound>,
) {
    let (withdrawn, mut withdrawals) = withdrawals_to(stream.clone());
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
        if !send_or_give_up(&events, message_event(&message)).await {
            break;
        }
    }
}
