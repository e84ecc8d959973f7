//! 2026-07-28 calls whose server asked the client something: the response ends with an `input_required` result,
//! and the call waits, parked, until the client's retry brings the answers and it runs on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::mode::{origin_of, owner_of, Mode};
use super::stream::{Answer, Relayed};
use super::{Asked, Exchange};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{codes, RequestId, RpcError};
use crate::mcp::transport::Inbound;
use crate::router::RouteError;

/// A call parked until a 2026-07-28 client retries with the answers to the server's requests.
#[derive(Debug)]
pub(super) struct Parked {
    owner: String,
    /// The progress token of the request that started the call (see [`ProgressTokens`](super::ProgressTokens)).
    origin: Option<Value>,
    call: JoinHandle<Result<Payload, RouteError>>,
    rx: mpsc::Receiver<Inbound>,
    /// The server's requests, by the key the client answers under.
    waiting: Vec<(String, Asked)>,
    since: Instant,
}

/// `requestState` of a call the satellite parked (the rest is a random handle, bound to the caller).
const STATE_PREFIX: &str = "io.deploystack.satellite/parked/";

/// How long a parked call waits for the client's retry at most (the server's own wait usually ends first).
const PARK_LIMIT: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Whether a 2026-07-28 `requestState` is one the satellite issued (else it is the upstream's, passed through).
pub fn is_parked_state(state: Option<&Value>) -> bool {
    state.and_then(Value::as_str).is_some_and(|s| s.starts_with(STATE_PREFIX))
}

impl Exchange {
    /// Go on with a parked call: the client's retry brings `responses` (its `inputResponses`) for the requests
    /// named in `state`. Requests it left unanswered are asked again (a new `input_required`); then the call
    /// runs on as if it had never stopped. A state that is unknown, expired or another caller's is -32602.
    pub async fn resume<Fin>(
        self: &Arc<Self>,
        scope: String,
        id: RequestId,
        mut mode: Mode,
        state: &str,
        responses: Option<&Value>,
        finish: Fin,
    ) -> Answer
    where
        Fin: FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static,
    {
        let owner = owner_of(&mode);
        let Some(parked) = self.unpark(state, &owner) else {
            return Answer::Done(Err(RouteError::Rpc(RpcError::new(
                codes::INVALID_PARAMS,
                "requestState is not valid: unknown, expired or not yours; send the request again without it",
            ))));
        };
        let Parked { call, rx, waiting, origin, .. } = parked;
        // The call's progress carries the token of the request that started it.
        if let Mode::Stateless { progress, .. } = &mut mode {
            progress.started_by(origin);
        }
        let unanswered = answer_asked(waiting, responses);
        if !unanswered.is_empty() {
            return Answer::Done(Ok(self.park(owner, origin_of(&mode), call, rx, unanswered).into()));
        }
        self.drive(Relayed { scope, id, mode, call, rx }, finish).await
    }

    /// The call parked under `state`, taken out of the table; `None` when there is none, or it is not `owner`'s.
    fn unpark(&self, state: &str, owner: &str) -> Option<Parked> {
        let handle = state.strip_prefix(STATE_PREFIX).unwrap_or_default();
        let mut parked = self.parked.lock();
        match parked.get(handle) {
            Some(p) if p.owner == owner => parked.remove(handle),
            _ => None,
        }
    }

    /// Park a call whose server waits on the client; the `input_required` result that asks the client.
    pub(super) fn park(
        &self,
        owner: String,
        origin: Option<Value>,
        call: JoinHandle<Result<Payload, RouteError>>,
        rx: mpsc::Receiver<Inbound>,
        asked: Vec<Asked>,
    ) -> Value {
        let mut requests = serde_json::Map::new();
        let waiting: Vec<(String, Asked)> = asked
            .into_iter()
            .map(|asked| {
                let key = format!("satellite-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
                let mut request = json!({"method": asked.method});
                if let Some(params) = &asked.params {
                    request["params"] = params.clone();
                }
                requests.insert(key.clone(), request);
                (key, asked)
            })
            .collect();
        let handle = uuid::Uuid::new_v4().simple().to_string();
        let mut parked = self.parked.lock();
        // Calls that ended or waited too long are let go (and stopped), keeping the map bounded.
        parked.retain(|_, p| {
            let keep = !p.call.is_finished() && p.since.elapsed() < PARK_LIMIT;
            if !keep {
                p.call.abort();
            }
            keep
        });
        parked.insert(handle.clone(), Parked { owner, origin, call, rx, waiting, since: Instant::now() });
        json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": format!("{STATE_PREFIX}{handle}"),
        })
    }
}

/// Pass the client's `responses` on to the requests `waiting` for them; those it left unanswered are returned, to
/// be asked again. One its server withdrew meanwhile is not asked again.
fn answer_asked(waiting: Vec<(String, Asked)>, responses: Option<&Value>) -> Vec<Asked> {
    let mut unanswered = Vec::new();
    for (key, asked) in waiting {
        match responses.and_then(|r| r.get(&key)) {
            Some(answer) => {
                let _ = asked.reply.send(Ok(answer.clone()));
            }
            // Withdrawn by its server meanwhile: not asked again.
            None if asked.reply.is_closed() => {}
            None => unanswered.push(asked),
        }
    }
    unanswered
}
