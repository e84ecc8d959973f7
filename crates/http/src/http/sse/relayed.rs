//! One request on a legacy stream, run with a relay: what the server says meanwhile goes onto the stream as it
//! comes, then the response.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::Instrument as _;
use warp::http::StatusCode;
use warp::reply::Response;

use super::super::dispatch::{Selection, Target};
use super::super::error::McpError;
use super::super::exchange::{response_message, AskedOf, Withdrawn};
use super::super::{json_response, Routing};
use super::{message_event, new_message_id, send_or_give_up, withdrawals_to, SseSessions};
use crate::auth::Principal;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, RequestId};
use crate::mcp::transport::{Inbound, Relay};
use crate::router::RouteError;

/// One request on a legacy stream, run with a relay: the server's notifications and requests go onto the
/// stream as they come, then the response. The POST is answered when the response is on the stream (SB §4),
/// or as soon as the server asks the client something: a client that POSTs one message at a time could not
/// otherwise send its answer.
#[derive(Clone)]
pub(super) struct RelayedCall {
    pub(super) routing: Routing,
    pub(super) sessions: Arc<SseSessions>,
    pub(super) scope: String,
    pub(super) events: mpsc::Sender<warp::sse::Event>,
    /// What the client declared at `initialize`; `None` before it did (then nothing is filtered, as before).
    pub(super) capabilities: Option<Arc<Value>>,
}

/// How a relayed call on a legacy stream ended.
pub(super) enum Ended {
    Sent,
    Refused(crate::auth::AuthError),
    StreamClosed,
}

/// What the server says during one call, and how far its word still goes.
struct Said {
    inbound: mpsc::Receiver<Inbound>,
    /// Told once the server asks the client something: the POST is answered then.
    asked: Option<mpsc::Sender<()>>,
    withdrawn: Withdrawn,
    withdrawals: mpsc::Receiver<Value>,
    /// The server's requests this call's stream carried: those still unanswered when it ends are withdrawn.
    carried: Vec<AskedOf>,
    /// False once the client has left or stopped reading: what the server says is no longer forwarded (a
    /// request of its goes unanswered, its asker told the client is gone), and the call runs on to its
    /// end, as a disconnected client's does, instead of waiting on the stream for ever with its slot on
    /// the instance held.
    forwarding: bool,
}

impl RelayedCall {
    /// The client's stream is gone or full: its session ends (and the stream with it).
    pub(super) fn stream_closed(&self) -> Ended {
        self.end_session();
        Ended::StreamClosed
    }

    fn end_session(&self) {
        self.sessions.end(&self.scope);
    }

    pub(super) async fn run(
        self,
        principal: Principal,
        selection: Selection,
        request_id: RequestId,
        method: String,
        params: Option<Value>,
    ) -> Result<Response, McpError> {
        let message_id = new_message_id();
        let (asked_tx, mut asked) = mpsc::channel::<()>(1);
        let (scope, exchange) = (self.scope.clone(), self.sessions.exchange.clone());
        let tracked = request_id.clone();
        let target = Target::LegacySse(principal, selection);
        let work = self.relay(target, (request_id, method, params), asked_tx, message_id.clone());
        // In the request's span, as `Exchange::respond`'s calls are: the upstream call is its child.
        let mut task = tokio::spawn(work.in_current_span());
        exchange.track(&scope, &tracked, task.abort_handle());
        let ended = tokio::select! {
            biased;
            ended = &mut task => ended.unwrap_or(Ended::Sent),
            _ = asked.recv() => Ended::Sent,
        };
        match ended {
            Ended::Sent => Ok(json_response(StatusCode::OK, &json!({"status": "sent", "messageId": message_id}))),
            Ended::Refused(err) => Err(McpError::Auth(err)),
            Ended::StreamClosed => Err(McpError::SseStreamClosed),
        }
    }

    /// The call, with what the server says meanwhile put on the stream; then word of what is moot now, and the
    /// response under `final_id`.
    async fn relay(
        self,
        target: Target,
        request: (RequestId, String, Option<Value>),
        asked: mpsc::Sender<()>,
        final_id: String,
    ) -> Ended {
        let reply = match self.reply(target, request, asked).await {
            Ok(reply) => reply,
            Err(ended) => return ended,
        };
        let event = warp::sse::Event::default().id(final_id).event("message").data(reply.to_string());
        if !send_or_give_up(&self.events, event).await {
            return self.stream_closed();
        }
        Ended::Sent
    }

    /// One request of a batch, run as [`RelayedCall::run`] runs one alone (tracked for cancellation, what the server
    /// says meanwhile put on the stream, `asked` told when it asks the client something) once `gate` lets it, its
    /// response handed back for the batch's array rather than put on the stream.
    pub(super) fn spawn_in_batch(
        self,
        target: Target,
        request: (RequestId, String, Option<Value>),
        asked: mpsc::Sender<()>,
        gate: Arc<tokio::sync::Semaphore>,
    ) -> tokio::task::JoinHandle<Result<Value, Ended>> {
        let (scope, exchange, tracked) = (self.scope.clone(), self.sessions.exchange.clone(), request.0.clone());
        let work = async move {
            let _turn = gate.acquire_owned().await;
            self.reply(target, request, asked).await
        };
        let task = tokio::spawn(work.in_current_span());
        exchange.track(&scope, &tracked, task.abort_handle());
        task
    }

    /// The call, with what the server says meanwhile put on the stream, then word of what is moot now: its
    /// response, or how it ended without one.
    async fn reply(
        &self,
        target: Target,
        (request_id, method, params): (RequestId, String, Option<Value>),
        asked: mpsc::Sender<()>,
    ) -> Result<Value, Ended> {
        let (relay, inbound) = match self.capabilities.clone() {
            Some(capabilities) => Relay::for_client(capabilities),
            None => Relay::channel(true),
        };
        let call = target.dispatch(&self.routing, Some(&self.scope), &method, params, Some(&relay));
        let (withdrawn, withdrawals) = withdrawals_to(self.events.downgrade());
        let mut said =
            Said { inbound, asked: Some(asked), withdrawn, withdrawals, carried: Vec::new(), forwarding: true };
        let outcome = self.forward_until_answered(call, &request_id, &mut said).await;
        if !said.forwarding {
            return Err(Ended::StreamClosed);
        }
        for message in self.moot(&request_id, &mut said) {
            if !send_or_give_up(&self.events, message_event(&message)).await {
                return Err(self.stream_closed());
            }
        }
        if let (Err(RouteError::Forbidden(err)), Some(_)) = (&outcome, &said.asked) {
            return Err(Ended::Refused(err.clone()));
        }
        Ok(response_message(request_id, outcome.map(protocol::payload_for_handshake)))
    }

    /// Run the call, putting on the stream what the server says meanwhile and word of its requests withdrawn.
    async fn forward_until_answered(
        &self,
        call: impl std::future::Future<Output = Result<Payload, RouteError>>,
        request_id: &RequestId,
        said: &mut Said,
    ) -> Result<Payload, RouteError> {
        tokio::pin!(call);
        loop {
            tokio::select! {
                biased;
                outcome = &mut call => return outcome,
                Some(note) = said.withdrawals.recv() => {
                    if said.forwarding {
                        self.forward(&note, said).await;
                    }
                }
                Some(inbound) = said.inbound.recv() => {
                    if !said.forwarding {
                        continue;
                    }
                    let exchange = &self.sessions.exchange;
                    let Some((message, asked)) = exchange.outbound(&self.scope, request_id, inbound, &said.withdrawn)
                    else {
                        continue;
                    };
                    if message.get("id").is_some() {
                        if let Some(tx) = said.asked.take() {
                            let _ = tx.try_send(());
                        }
                    }
                    if let Some(asked) = asked {
                        said.carried.retain(|asked| exchange.waits(asked));
                        said.carried.push(asked);
                    }
                    self.forward(&message, said).await;
                }
            }
        }
    }

    /// Put a message on the stream; a client that has left or stopped reading is forwarded nothing more, and its
    /// session ends.
    async fn forward(&self, message: &Value, said: &mut Said) {
        if !send_or_give_up(&self.events, message_event(message)).await {
            said.forwarding = false;
            self.end_session();
        }
    }

    /// Once the call has ended: what the server said just before its answer, then word of the requests now moot
    /// (those withdrawn meanwhile, and those of this call left unanswered).
    fn moot(&self, request_id: &RequestId, said: &mut Said) -> Vec<Value> {
        let exchange = &self.sessions.exchange;
        // Its requests are moot now, the call having ended: only its notifications go on.
        let mut last = Vec::new();
        while let Ok(inbound) = said.inbound.try_recv() {
            let Inbound::Notification { .. } = inbound else { continue };
            last.extend(exchange.outbound(&self.scope, request_id, inbound, &said.withdrawn));
        }
        let mut notes: Vec<Value> = last.into_iter().map(|(message, _)| message).collect();
        notes.extend(said.carried.iter().filter_map(|asked| exchange.withdraw(asked)));
        while let Ok(note) = said.withdrawals.try_recv() {
            notes.push(note);
        }
        notes
    }
}
