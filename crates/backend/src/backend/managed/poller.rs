//! The command poller (BP §4): the adaptive cadence and the de-duplication ledger; new commands go to the worker.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::backend::client::BackendError;
use crate::backend::dedup::{CommandLedger, Seen};
use crate::backend::monitor::Channel;
use crate::backend::polling::{next_delay, PollOutcome, MIN_DELAY};
use crate::backend::retry_after;
use crate::backend::wire::{self, Command, CommandResult, CommandsResponse};
use crate::model::iso;

use super::commands::post_result;
use super::{ManagedDeps, ManagedStats};

pub(super) async fn poll_loop(
    deps: ManagedDeps,
    ledger: Arc<Mutex<CommandLedger>>,
    tx: mpsc::Sender<Command>,
    stats: Arc<Mutex<ManagedStats>>,
    cancel: CancellationToken,
) {
    let poll = {
        let (client, monitor) = (deps.client.clone(), deps.monitor.clone());
        move || {
            let (client, monitor) = (client.clone(), monitor.clone());
            async move {
                let answer = client.poll_commands(&iso(Utc::now())).await;
                monitor.record(Channel::Poll, answer.as_ref().map(|_| ()).map_err(ToString::to_string));
                answer
            }
        }
    };
    let arrivals = Arrivals { deps: deps.clone(), ledger, tx, stats: stats.clone() };
    let handle = |answer: CommandsResponse| arrivals.clone().take(answer);
    let failures = stats.clone();
    poll_cadence(poll, handle, move || failures.lock().poll_failures += 1, deps.idle_poll, cancel).await;
}

/// Where polled commands go: a new one to the worker, one already finished has its result posted again (BP §4.3).
#[derive(Clone)]
struct Arrivals {
    deps: ManagedDeps,
    ledger: Arc<Mutex<CommandLedger>>,
    tx: mpsc::Sender<Command>,
    stats: Arc<Mutex<ManagedStats>>,
}

impl Arrivals {
    /// The commands of one poll's answer: whether an immediate one came, or `None` when the worker is gone.
    async fn take(self, answer: CommandsResponse) -> Option<bool> {
        self.stats.lock().polls += 1;
        let mut immediate = false;
        for command in answer.commands {
            if command.id.is_empty() {
                warn!(command_type = command.kind.command_type(), "command without an id ignored");
                continue;
            }
            immediate |= command.priority == Some(wire::Priority::Immediate);
            let seen = self.ledger.lock().arrive(&command.id);
            match seen {
                Seen::New => {
                    if self.tx.send(command).await.is_err() {
                        return None;
                    }
                }
                Seen::InFlight => {}
                Seen::Finished(result) => {
                    self.stats.lock().results_reposted += 1;
                    if let Ok(result) = serde_json::from_value::<CommandResult>(result) {
                        post_result(&self.deps, &result).await;
                    }
                }
            }
        }
        Some(immediate)
    }
}

/// The cadence of BP §4.4 around any poll: the first poll at once, then the backend's hint (2-300 s), 2 s after
/// a poll that brought an immediate command, doubling to 300 s while polls fail. `handle` returns whether an
/// immediate command came, or `None` to stop.
pub async fn poll_cadence<P, PF, H, HF>(
    mut poll: P,
    mut handle: H,
    mut on_failure: impl FnMut(),
    idle: Duration,
    cancel: CancellationToken,
) where
    P: FnMut() -> PF,
    PF: std::future::Future<Output = Result<CommandsResponse, BackendError>>,
    H: FnMut(CommandsResponse) -> HF,
    HF: std::future::Future<Output = Option<bool>>,
{
    let mut delay = MIN_DELAY;
    loop {
        let started = tokio::time::Instant::now();
        // The wait a 429 or 503 asked for (`Retry-After`), counted from its answer.
        let mut asked = None;
        delay = match poll().await {
            Ok(answer) => {
                let mode = answer.polling_mode.as_ref().map(|m| m.as_str().to_owned());
                let hint = answer.next_poll_interval.map(|n| n as i64);
                let Some(immediate) = handle(answer).await else { return };
                if immediate {
                    MIN_DELAY
                } else {
                    next_delay(&PollOutcome::Ok { mode, hint_seconds: hint }, delay, idle)
                }
            }
            Err(err) => {
                on_failure();
                asked = err.retry_after();
                if err.status() == Some(401) {
                    warn!(error = %err, "API key rejected while polling commands");
                } else {
                    warn!(error = %err, retry_after_s = asked.map(|a| a.as_secs()), "polling commands failed");
                }
                next_delay(&PollOutcome::Failed, delay, idle)
            }
        };
        let wait = retry_after::bounded(delay.saturating_sub(started.elapsed()), asked);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::VecDeque;

    fn answer(mode: &str, hint: Option<u64>) -> Result<CommandsResponse, BackendError> {
        Ok(serde_json::from_value(json!({"commands": [], "polling_mode": mode, "next_poll_interval": hint})).unwrap())
    }

    fn failed() -> Result<CommandsResponse, BackendError> {
        Err(BackendError::Network { endpoint: "commands", reason: "refused".into() })
    }

    /// With paused time: the gaps between polls follow the hints, the fallback table and the failure backoff.
    #[tokio::test(start_paused = true)]
    async fn polls_follow_the_hints_and_back_off_on_failure() {
        let script: VecDeque<Result<CommandsResponse, BackendError>> = VecDeque::from([
            answer("immediate", Some(2)),
            answer("normal", Some(10)),
            answer("slow", None),
            failed(),
            failed(),
            failed(),
            answer("normal", Some(30)),
            answer("slow", Some(60)),
        ]);
        let script = Arc::new(Mutex::new(script));
        let times = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (s, t, c) = (script.clone(), times.clone(), cancel.clone());
        let poll = move || {
            t.lock().push((tokio::time::Instant::now() - start).as_secs());
            let next = s.lock().pop_front();
            if next.is_none() {
                c.cancel();
            }
            async move { next.unwrap_or_else(|| answer("slow", Some(60))) }
        };
        poll_cadence(poll, |_| async { Some(false) }, || {}, Duration::from_secs(45), cancel).await;
        let times = times.lock().clone();
        let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        // hint 2, hint 10, no hint + slow = idle 45, failures 90, 180, 300 (capped), hint 30, hint 60.
        assert_eq!(gaps, [2, 10, 45, 90, 180, 300, 30, 60]);
    }

    fn busy(status: u16, retry_after: Option<Duration>) -> Result<CommandsResponse, BackendError> {
        let refusal = crate::backend::client::Refusal::of(status, None);
        let message = "busy".to_owned();
        Err(BackendError::Status { endpoint: "commands", status, refusal, message, body: None, retry_after })
    }

    /// With paused time: a 429 or 503 with `Retry-After` holds the next poll back as long as asked, never less than
    /// the own backoff and never past the cap; the doubling goes on from the own backoff.
    #[tokio::test(start_paused = true)]
    async fn a_retry_after_holds_the_next_poll_back_within_the_own_backoff_and_the_cap() {
        let script = VecDeque::from([
            answer("normal", Some(2)),
            busy(429, Some(Duration::from_secs(20))),
            busy(503, Some(Duration::from_secs(1))),
            busy(429, Some(Duration::MAX)),
            busy(503, None),
            answer("normal", Some(2)),
        ]);
        let script = Arc::new(Mutex::new(script));
        let times = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (s, t, c) = (script.clone(), times.clone(), cancel.clone());
        let poll = move || {
            t.lock().push((tokio::time::Instant::now() - start).as_secs());
            let next = s.lock().pop_front();
            if next.is_none() {
                c.cancel();
            }
            async move { next.unwrap_or_else(|| answer("slow", Some(60))) }
        };
        poll_cadence(poll, |_| async { Some(false) }, || {}, Duration::from_secs(45), cancel).await;
        let times = times.lock().clone();
        let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        // hint 2; asked 20 (own 4); asked 1 (own 8); asked for ever (own 16): the cap; none (own 32); hint 2.
        assert_eq!(gaps, [2, 20, 8, 300, 32, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_command_brings_the_next_poll_within_two_seconds() {
        let polls = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (p, c) = (polls.clone(), cancel.clone());
        let poll = move || {
            let mut polls = p.lock();
            polls.push((tokio::time::Instant::now() - start).as_secs());
            if polls.len() == 3 {
                c.cancel();
            }
            async { answer("slow", Some(60)) }
        };
        let mut first = true;
        let handle = move |_| {
            let immediate = std::mem::replace(&mut first, false);
            async move { Some(immediate) }
        };
        poll_cadence(poll, handle, || {}, Duration::from_secs(60), cancel).await;
        assert_eq!(*polls.lock(), [0, 2, 62]);
    }
}
