//! Running a relayed call for its client: answered with plain JSON when it finishes before its server says
//! anything, else an SSE stream of what the server says, ending with the call's answer.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;
use warp::reply::Response;
use warp::Reply;

use super::asking::{notification_out, AskedOf, Withdrawn};
use super::mode::{heard, long_lived_ends, origin_of, owner_of, retagged, Mode};
use super::{Asked, Exchange};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, RequestId, RpcError};
use crate::mcp::transport::relay::{capability_for, local_answer};
use crate::mcp::transport::Inbound;
use crate::router::RouteError;

/// What running a relayed request came to.
pub enum Answer {
    /// Finished before the server said anything: answer as usual.
    Done(Result<Payload, RouteError>),
    /// The server spoke first: this SSE response carries its messages and then the answer.
    Streamed(Response),
}

/// Comment lines on a long relayed call's stream, so idle proxies keep it open.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// What to do with a message from upstream.
enum Taken {
    /// Send it to the client on the response stream.
    Stream(Inbound),
    /// Answered here (a client without the capability, or a ping), or a log message the client did not ask for.
    Answered,
    /// End the response with `input_required` and park the call.
    Park(Asked),
}

/// What a call came to before its server said anything its client hears.
enum Start {
    /// A long-lived stream ended: its credential was revoked, or the satellite is stopping.
    Ended,
    /// The call finished.
    Finished(Result<Result<Payload, RouteError>, JoinError>),
    /// The server said this first.
    Said(Inbound),
    /// The server's side of the channel closed; the call goes on.
    Quiet,
    /// The server asked a 2026-07-28 client something: the call is to be parked.
    Park(Asked),
}

/// A relayed call under way, and the client's request it answers.
pub(super) struct Relayed {
    pub(super) scope: String,
    /// The client's id for the request.
    pub(super) id: RequestId,
    pub(super) mode: Mode,
    pub(super) call: JoinHandle<Result<Payload, RouteError>>,
    /// What the call's server says meanwhile.
    pub(super) rx: mpsc::Receiver<Inbound>,
}

impl Exchange {
    /// Answer a relayed call: with plain JSON when it ends before its server says anything the client hears, else
    /// with the stream of what it says, ending with the response `finish` makes of the outcome.
    pub(super) async fn drive<Fin>(self: &Arc<Self>, mut relayed: Relayed, finish: Fin) -> Answer
    where
        Fin: FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static,
    {
        let tracked = self.track(&relayed.scope, &relayed.id, relayed.call.abort_handle());
        // The client may go before the server says anything: this handler is then dropped, and the call with it
        // (cancelled upstream, its call slot freed). Its answer had nowhere else to go: the satellite resumes no
        // request's answer on another stream, so a handshake-era client's hang-up cancels too (issue 73; the
        // transport's "disconnection is not cancellation" assumes a server that can resume).
        let waiting = AbortOnDrop(Some(relayed.call.abort_handle()));
        let mut queue = VecDeque::new();
        let mut finish = Some(finish);
        let first = match self.start(&mut relayed).await {
            Start::Ended => {
                // A long-lived stream ended before it said anything: it gets its final response at once, as it
                // would once streaming.
                relayed.call.abort();
                self.untrack(&tracked);
                return Answer::Done(Ok(json!({}).into()));
            }
            Start::Finished(done) => {
                self.untrack(&tracked);
                // What the server said just before its answer (a progress or log line, then the result at once)
                // is in the channel already, though the call won the race: it still goes first.
                let said = self.said_before(&relayed.mode, &relayed.id, &mut relayed.rx);
                if said.is_empty() {
                    return Answer::Done(outcome(done));
                }
                queue.extend(said);
                queue.extend(finish.take().map(|finish| finish(outcome(done))));
                None
            }
            Start::Said(inbound) => Some(inbound),
            Start::Quiet => None,
            Start::Park(asked) => {
                waiting.disarm();
                let Relayed { mode, call, rx, .. } = relayed;
                return Answer::Done(Ok(self.park(owner_of(&mode), origin_of(&mode), call, rx, vec![asked]).into()));
            }
        };
        waiting.disarm();
        Streaming::new(self.clone(), relayed, queue, finish).into_answer(first)
    }

    /// Wait for what comes first of a call: its end, the end of its long-lived stream, or a message from its
    /// server the client is to hear (one answered here, or not heard, is passed over).
    async fn start(&self, relayed: &mut Relayed) -> Start {
        let Relayed { mode, call, rx, .. } = relayed;
        let ends = long_lived_ends(mode);
        loop {
            let ended = async {
                match &ends {
                    Some(ends) => tokio::select! { _ = ends.cancelled() => {}, _ = self.closing.cancelled() => {} },
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                biased;
                _ = ended => return Start::Ended,
                done = &mut *call => return Start::Finished(done),
                next = rx.recv() => next,
            };
            let Some(inbound) = next else { return Start::Quiet };
            match self.take_up(mode, inbound) {
                Taken::Stream(inbound) => return Start::Said(inbound),
                Taken::Answered => continue,
                Taken::Park(asked) => return Start::Park(asked),
            }
        }
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
}

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
    /// The stream of a relayed call, carrying `queue` first. `finish` is gone when the call was answered already:
    /// the stream is then what was queued, and nothing more.
    fn new(exchange: Arc<Exchange>, relayed: Relayed, queue: VecDeque<Value>, finish: Option<Fin>) -> Self {
        let answered = finish.is_none();
        let Relayed { scope, id, mode, call, rx } = relayed;
        let (withdrawn, withdrawals) = Withdrawn::channel();
        Self {
            queue,
            rx: Some(rx).filter(|_| !answered),
            call: Some(call).filter(|_| !answered),
            finish,
            exchange,
            scope,
            request: id,
            mode,
            withdrawn,
            withdrawals,
            asked: Vec::new(),
        }
    }

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

/// What a stream heard while its call runs.
enum Heard {
    /// Word for the client that a server request it was asked no longer waits.
    Note(Value),
    /// A long-lived stream's end: the satellite is stopping, or the caller's credential was revoked.
    Ending,
    /// A message from upstream.
    Upstream(Inbound),
    /// The server's side of the channel closed; the call goes on.
    Quiet,
    /// The call ended.
    Done(Result<Result<Payload, RouteError>, JoinError>),
}

impl<Fin: FnOnce(Result<Payload, RouteError>) -> Value> Streaming<Fin> {
    /// The next message for the client: queued ones, then whatever the server sends, then the answer (or, when
    /// the server asks a 2026-07-28 client something, an `input_required` result, the call parked).
    async fn next(&mut self) -> Option<Value> {
        if let Some(message) = self.queue.pop_front() {
            return Some(message);
        }
        loop {
            match self.hear().await? {
                Heard::Note(note) => return Some(note),
                Heard::Ending => return self.end_long_lived(),
                Heard::Upstream(inbound) => match self.exchange.take_up(&self.mode, inbound) {
                    Taken::Stream(inbound) => {
                        if let Some(message) = self.outbound(inbound) {
                            return Some(message);
                        }
                    }
                    Taken::Answered => {}
                    Taken::Park(asked) => return self.park(asked),
                },
                Heard::Quiet => self.rx = None,
                Heard::Done(done) => return self.answer(done),
            }
        }
    }

    /// Wait for what comes next while the call runs; `None` once it has ended.
    async fn hear(&mut self) -> Option<Heard> {
        let ends = long_lived_ends(&self.mode);
        let long_lived = ends.is_some();
        let closing = self.exchange.closing.clone();
        let ended = ending(ends);
        let call = self.call.as_mut()?;
        Some(match self.rx.as_mut() {
            Some(rx) => tokio::select! {
                biased;
                Some(note) = self.withdrawals.recv() => Heard::Note(note),
                _ = async { tokio::select! { _ = closing.cancelled() => {}, _ = ended => {} } }, if long_lived => {
                    Heard::Ending
                }
                next = rx.recv() => next.map_or(Heard::Quiet, Heard::Upstream),
                done = &mut *call => Heard::Done(done),
            },
            None => tokio::select! {
                biased;
                Some(note) = self.withdrawals.recv() => Heard::Note(note),
                done = &mut *call => Heard::Done(done),
            },
        })
    }

    /// The satellite is stopping, or the caller's credential was revoked: the subscription ends as the spec says a
    /// server does.
    fn end_long_lived(&mut self) -> Option<Value> {
        if let Some(call) = self.call.take() {
            call.abort();
        }
        self.rx = None;
        let finish = self.finish.take()?;
        Some(finish(Ok(json!({}).into())))
    }

    /// The server asked a 2026-07-28 client something: the call is parked, and the stream ends with the
    /// `input_required` result that asks the client.
    fn park(&mut self, asked: Asked) -> Option<Value> {
        let (call, rx) = (self.call.take()?, self.rx.take()?);
        let origin = origin_of(&self.mode);
        let result = self.exchange.park(owner_of(&self.mode), origin, call, rx, vec![asked]);
        Some(protocol::response(self.request.clone(), result))
    }

    /// The call has ended: messages sent before the result still go first, then word of the server's requests
    /// now moot, then the answer.
    fn answer(&mut self, done: Result<Result<Payload, RouteError>, JoinError>) -> Option<Value> {
        self.call = None;
        if let Some(mut rx) = self.rx.take() {
            let said = self.exchange.said_before(&self.mode, &self.request, &mut rx);
            self.queue.extend(said);
        }
        self.withdraw_all();
        let finish = self.finish.take()?;
        self.queue.push_back(finish(outcome(done)));
        self.queue.pop_front()
    }
}

impl<Fin> Streaming<Fin>
where
    Fin: FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static,
{
    /// The SSE response that carries the stream's messages, `first` (if any) after those queued already.
    fn into_answer(mut self, first: Option<Inbound>) -> Answer {
        if let Some(message) = first.and_then(|inbound| self.outbound(inbound)) {
            self.queue.push_back(message);
        }
        let events = futures::stream::unfold(self, |mut state| async move {
            let message = state.next().await?;
            Some((Ok::<_, Infallible>(warp::sse::Event::default().event("message").data(message.to_string())), state))
        });
        let stream = warp::sse::keep_alive().interval(KEEP_ALIVE).text("ping").stream(events);
        Answer::Streamed(warp::sse::reply(stream).into_response())
    }
}

/// Done when `ends` is cancelled; never without it.
async fn ending(ends: Option<CancellationToken>) {
    match ends {
        Some(ends) => ends.cancelled_owned().await,
        None => std::future::pending().await,
    }
}

/// A call that panicked or was cancelled still has an outcome.
fn outcome(done: Result<Result<Payload, RouteError>, JoinError>) -> Result<Payload, RouteError> {
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
