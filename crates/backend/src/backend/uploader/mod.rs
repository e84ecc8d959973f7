//! The event uploader of a managed satellite (BP §8.3): drains the SQLite
//! outbox oldest first in batches of at most 100, one batch in flight,
//! deletes only what a 2xx accepted, backs off on 429, keeps everything on
//! 401, 5xx and network errors, holds an event the backend rejects as
//! invalid (400) with a loud log (offering it once more if the backend
//! was refusing everything then), and keeps the outbox under a quota by
//! dropping the oldest events with a loud log — never silently. A stored
//! event that no longer makes an envelope (an unknown type, a payload that
//! is not an object) is held in the outbox with the reason and logged with
//! its sequence number: kept, never sent, never dropped silently.
//!
//! Replicas sharing one PostgreSQL database all upload (docs/scale-out.md):
//! each batch is claimed for a lease (`Outbox::claim_events`) before it is
//! sent, so two replicas never send the same events; a replica that dies
//! mid-batch leaves a claim that lapses after `LEASE`, and another replica
//! sends the batch then.
//!
//! Sending is injected (`SendBatch`), so the policy is tested without HTTP;
//! the backend client supplies the real POST.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tracing::{error, info, warn};

use super::retry_after;
use super::wire::EventEnvelope;
use crate::events::{Emitter, EventKind, Throttle};
use crate::store::{Outbox, StoreError, StoredEvent};

/// The backend refuses bigger batches (BP §8.1).
pub const MAX_BATCH: usize = 100;
/// Most bytes of envelopes in one batch (BP §8.3 is silent on size; the reference backend's HTTP server refuses
/// bodies over 1 MiB with 413). A batch stops before the event that would pass this; an event bigger than it by
/// itself is still tried alone, and held if the backend refuses it as too large (docs/decisions.md).
pub const MAX_BATCH_BYTES: usize = 512 * 1024;
const BACKOFF_FIRST: Duration = Duration::from_secs(3);
/// Events held as invalid in a row, with no batch accepted between, before each further one waits a backoff.
const INVALID_BEFORE_BACKOFF: u32 = 3;
const BACKOFF_MAX: Duration = Duration::from_secs(48);
/// How long a claimed batch is this replica's alone: well above the backend client's 10 s request timeout, so
/// a live replica never loses a batch it is still sending.
pub const LEASE: Duration = Duration::from_secs(60);
/// How long a batch's answer is waited for (BP §0.1: 10 s), unless a slow backend got longer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a batch's answer is waited for after timeouts: half the lease, so a live replica never loses a claim
/// on a batch it is still sending.
const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// How the backend answered one batch.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOutcome {
    /// 2xx. Per-event failures (`failures[]`) are logged, not retried.
    Accepted { failures: Vec<String> },
    /// 400, or an error naming validation: the batch can never succeed.
    Invalid(String),
    /// 401: credentials are being sorted out elsewhere; keep and retry.
    Unauthorized,
    /// 429: keep, and wait longer before the next batch, at least as long as its `Retry-After` asked.
    RateLimited(Option<Duration>),
    /// 5xx, network: keep and retry next tick.
    Failed(String),
    /// 503 with a `Retry-After`: keep, and send the next batch once it has passed.
    Unavailable { reason: String, retry_after: Duration },
    /// No answer within the timeout: the backend may have stored the batch and be slow. Kept and sent again with the
    /// same event ids (the backend's dedupe key), fewer at a time, after a backoff, with more time to answer: a slow
    /// backend gets less, not more.
    TimedOut(String),
    /// 413: the body was too large for the backend. Fewer events are sent next; one event alone that is
    /// refused so is held (kept, never sent), or it would block every later event for good.
    TooLarge(String),
}

/// POST one batch of envelopes to the backend, waiting at most the given time for its answer.
pub type SendBatch = Arc<dyn Fn(Vec<EventEnvelope>, Duration) -> BoxFuture<'static, BatchOutcome> + Send + Sync>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    pub sent: u64,
    pub held_invalid: u64,
    pub dropped_over_quota: u64,
    pub failed_batches: u64,
    /// Stored events that make no envelope, held in the outbox.
    pub held: u64,
}

pub struct Uploader {
    outbox: Outbox,
    /// This replica's name on its claims: random per process.
    owner: String,
    lease: Duration,
    /// Whether the first tick ran (it releases a dead process's claims on SQLite).
    started: bool,
    send: SendBatch,
    batch: usize,
    /// Events per batch now: `batch`, halved after each 413 and doubled back after each accepted batch.
    cap: usize,
    /// Most events the outbox may hold; older ones beyond it are dropped with an error log.
    quota: i64,
    /// The most the outbox may take on disk (`Outbox::prune_events_to_bytes`); unbounded unless `with_byte_quota`.
    quota_bytes: u64,
    /// When the outbox's bytes were last measured.
    bytes_checked: Option<std::time::Instant>,
    /// Whether this replica holds the outbox to its quotas now: of replicas sharing one database only one does
    /// (the leader), so the outbox is not counted and measured once per replica; the others hold it within twice
    /// them. Default: always.
    prunes: PruneGate,
    /// Where the uploader's own events go (the satellite's emitter, whose queue keeps what the outbox refuses).
    emitter: Emitter,
    backoff: Option<Duration>,
    /// The wait the backend's last refusal asked for (`Retry-After`, to `retry_after::CAP`), past `backoff`.
    asked: Option<Duration>,
    /// How long the next batch's answer is waited for: `base_timeout`, doubled after each timeout (to
    /// [`MAX_TIMEOUT`]) and halved back after each batch accepted within half of it.
    timeout: Duration,
    base_timeout: Duration,
    /// How long the backend took to answer the last batch.
    answer_took: Duration,
    /// Events held as invalid since the backend last accepted a batch: past a few, the backend (or a proxy before
    /// it) likely refuses everything, and each further one waits a backoff rather than going at once.
    invalid_in_a_row: u32,
    /// The events held as invalid since the backend last accepted a batch. One alone is one bad event; more are
    /// likely a backend (or a proxy before it) that refused everything for a while, so once a batch is accepted
    /// again they are offered once more. One offered again and refused again stays held (`offered_again`).
    streak: Vec<i64>,
    /// Events already offered again after a streak: held again, they are not offered a third time.
    offered_again: std::collections::HashSet<i64>,
    stats: UploadStats,
    /// One `resource.limit.exceeded` a minute while the outbox overflows.
    quota_events: Throttle,
}

/// Asked before each check of the outbox's quotas: whether this uploader is the one that holds the outbox to them
/// (the others hold it within twice them).
pub type PruneGate = Arc<dyn Fn() -> bool + Send + Sync>;

/// What one tick did.
#[derive(Debug, Clone, PartialEq)]
pub enum Tick {
    Idle,
    Sent(usize),
    Kept {
        events: usize,
        wait: Option<Duration>,
    },
    /// Every event of the batch was held (none sendable); the next tick reads on.
    Held(usize),
    /// The backend refused a batch of `from` events as too large or invalid: the next tick sends at most `to`.
    Shrunk {
        from: usize,
        to: usize,
    },
}

impl Tick {
    /// Whether the outbox may have more to send right away (the uploader reads on without waiting a tick).
    pub fn reads_on(&self) -> bool {
        matches!(self, Tick::Sent(_) | Tick::Held(_) | Tick::Shrunk { .. })
    }
}

impl Uploader {
    /// The uploader draining `outbox`, its own events (`resource.limit.exceeded`) going through `events` (the
    /// satellite's emitter).
    pub fn new(outbox: Outbox, events: Emitter, send: SendBatch, batch: usize, quota: i64) -> Self {
        Self {
            outbox,
            owner: format!("{:016x}", rand::random::<u64>()),
            lease: LEASE,
            started: false,
            send,
            batch: batch.clamp(1, MAX_BATCH),
            cap: batch.clamp(1, MAX_BATCH),
            quota,
            quota_bytes: u64::MAX,
            bytes_checked: None,
            prunes: Arc::new(|| true),
            emitter: events,
            backoff: None,
            asked: None,
            timeout: TIMEOUT,
            base_timeout: TIMEOUT,
            answer_took: Duration::ZERO,
            invalid_in_a_row: 0,
            streak: Vec::new(),
            offered_again: std::collections::HashSet::new(),
            stats: UploadStats::default(),
            quota_events: Throttle::new(Duration::from_secs(60), 1),
        }
    }

    /// How long a claimed batch stays this replica's (default `LEASE`).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Wait `timeout` for a batch's answer (default [`TIMEOUT`]); a timeout doubles it for the next batches.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.base_timeout = timeout;
        self
    }

    /// How long the next batch's answer will be waited for.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The most the outbox may take on disk, its oldest events dropped past it (default: no bound).
    pub fn with_byte_quota(mut self, bytes: u64) -> Self {
        self.quota_bytes = bytes;
        self
    }

    /// Hold the outbox to its quotas while `gate` says so, and within twice them otherwise (default: always):
    /// replicas sharing a database leave it to one of them.
    pub fn with_prune_gate(mut self, gate: PruneGate) -> Self {
        self.prunes = gate;
        self
    }

    /// The name this replica claims batches under (default: random).
    pub fn with_owner(mut self, owner: String) -> Self {
        self.owner = owner;
        self
    }

    /// This replica's name on its claims.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn stats(&self) -> UploadStats {
        self.stats
    }

    /// Extra wait before the next batch: the backoff, or the backend's `Retry-After` when it asked for longer.
    pub fn backoff(&self) -> Option<Duration> {
        self.backoff.max(self.asked)
    }

    /// Send the oldest batch, if any, and act on the answer.
    pub async fn tick(&mut self) -> Result<Tick, StoreError> {
        self.enforce_quota().await?;
        if !self.started {
            let released = self.outbox.release_stale_claims().await?;
            if released > 0 {
                info!(released, "event claims of a previous run released");
            }
            self.started = true;
        }
        let lease_ms = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let batch = self.outbox.claim_events(&self.owner, self.cap as i64, lease_ms, None).await?;
        let Some(first) = batch.first().map(|e| e.seq) else { return Ok(Tick::Idle) };
        let (envelopes, seqs, bytes) = self.envelopes(&batch).await?;
        if envelopes.is_empty() {
            return Ok(Tick::Held(batch.len()));
        }
        let started = tokio::time::Instant::now();
        self.asked = None; // waited out: the loop waits `backoff()` before each tick
        let outcome = (self.send)(envelopes, self.timeout).await;
        self.answer_took = started.elapsed();
        self.answered(outcome, first, &seqs, bytes).await
    }

    /// The envelopes of a claimed batch, within [`MAX_BATCH_BYTES`] (always at least one), with their events' seqs
    /// and their size. A stored event that makes no envelope is held.
    async fn envelopes(&mut self, batch: &[StoredEvent]) -> Result<(Vec<EventEnvelope>, Vec<i64>, usize), StoreError> {
        let mut envelopes = Vec::with_capacity(batch.len());
        let mut seqs = Vec::with_capacity(batch.len());
        let mut bytes = 0;
        for event in batch {
            match envelope(event) {
                Ok(envelope) => {
                    // Events left out stay claimed by this replica; the next tick claims them again first.
                    let size = crate::mcp::payload::json_len(&envelope);
                    if !envelopes.is_empty() && bytes + size > MAX_BATCH_BYTES {
                        break;
                    }
                    bytes += size;
                    envelopes.push(envelope);
                    seqs.push(event.seq);
                }
                Err(reason) => {
                    error!(seq = event.seq, event_type = %event.event_type, reason = %reason,
                           "stored event makes no envelope; held in the outbox, not sent");
                    self.outbox.hold_event(event.seq, &reason).await?;
                    self.stats.held += 1;
                }
            }
        }
        Ok((envelopes, seqs, bytes))
    }

    /// Act on the backend's answer to the batch of `seqs` (`bytes` in all, the first claimed `first`).
    async fn answered(
        &mut self,
        outcome: BatchOutcome,
        first: i64,
        seqs: &[i64],
        bytes: usize,
    ) -> Result<Tick, StoreError> {
        let n = seqs.len();
        match outcome {
            BatchOutcome::Accepted { failures } => self.accepted(&failures, seqs).await,
            // One bad event must not take the others with it, nor a backend (or a proxy before it) that refuses every
            // batch empty the outbox: the batch is halved until the refused event goes alone, and that one is held
            // with the reason (kept, not sent), as an event too large alone is. Events held in a streak of refusals
            // are offered once more when a batch is accepted again (`offer_streak_again`).
            BatchOutcome::Invalid(reason) if n > 1 => {
                self.cap = n / 2;
                self.stats.failed_batches += 1;
                warn!(events = n, first_seq = first, next = self.cap, reason = %reason,
                      "backend rejected a batch as invalid; sending fewer at a time to find the event it refuses");
                Ok(Tick::Shrunk { from: n, to: self.cap })
            }
            BatchOutcome::Invalid(reason) => self.held_invalid(seqs[0], &reason).await,
            BatchOutcome::TooLarge(reason) if n > 1 => {
                self.cap = n / 2;
                self.stats.failed_batches += 1;
                warn!(events = n, bytes, next = self.cap, reason = %reason,
                      "backend refused a batch of events as too large; sending fewer at a time");
                Ok(Tick::Shrunk { from: n, to: self.cap })
            }
            BatchOutcome::TooLarge(reason) => self.held_too_large(seqs[0], bytes, &reason).await,
            BatchOutcome::RateLimited(asked) => Ok(self.rate_limited(n, asked)),
            BatchOutcome::Unavailable { reason, retry_after } => Ok(self.unavailable(n, &reason, retry_after)),
            BatchOutcome::Unauthorized => {
                self.stats.failed_batches += 1;
                warn!(events = n, "backend refused the satellite's credentials for events; keeping them");
                Ok(Tick::Kept { events: n, wait: None })
            }
            BatchOutcome::TimedOut(reason) => Ok(self.timed_out(n, &reason)),
            BatchOutcome::Failed(reason) => {
                self.stats.failed_batches += 1;
                warn!(events = n, reason = %reason, "sending events failed; keeping them for the next tick");
                Ok(Tick::Kept { events: n, wait: None })
            }
        }
    }

    /// The batch of `seqs` was accepted: it leaves the outbox, and the next batches may be larger and answered
    /// sooner.
    async fn accepted(&mut self, failures: &[String], seqs: &[i64]) -> Result<Tick, StoreError> {
        let n = seqs.len();
        for failure in failures {
            warn!(failure = %failure, "backend refused one event of an accepted batch");
        }
        self.outbox.delete_claimed(&self.owner, seqs).await?;
        self.stats.sent += n as u64;
        self.backoff = None;
        self.invalid_in_a_row = 0;
        self.cap = (self.cap * 2).min(self.batch);
        // Back toward the setting only once the backend answers well within the wait: one that is slow but steady
        // keeps the longer wait, rather than alternating an accepted batch with one that times out (and that it
        // stores twice).
        if self.answer_took <= self.timeout / 2 {
            self.timeout = (self.timeout / 2).max(self.base_timeout);
        }
        self.offer_streak_again().await?;
        Ok(Tick::Sent(n))
    }

    /// The event `seq`, sent alone, was rejected as invalid: it is held, and a streak of such backs off.
    async fn held_invalid(&mut self, seq: i64, reason: &str) -> Result<Tick, StoreError> {
        let held = format!("the backend rejects this event as invalid: {reason}");
        error!(seq, reason = %reason, "backend rejected one event as invalid; held in the outbox, not sent");
        self.outbox.hold_event(seq, &held).await?;
        self.stats.held_invalid += 1;
        self.invalid_in_a_row += 1;
        if !self.offered_again.contains(&seq) {
            self.streak.push(seq);
        }
        if self.invalid_in_a_row <= INVALID_BEFORE_BACKOFF {
            return Ok(Tick::Held(1));
        }
        // Event after event refused with nothing accepted between: not one bad event but a backend that
        // refuses everything. Each is still held (kept), at the backoff's pace rather than at once.
        let wait = self.backoff.map_or(BACKOFF_FIRST, |b| (b * 2).min(BACKOFF_MAX));
        self.backoff = Some(wait);
        warn!(in_a_row = self.invalid_in_a_row, wait_s = wait.as_secs(), "backend rejects every event; backing off");
        Ok(Tick::Kept { events: 0, wait: Some(wait) })
    }

    /// The event `seq` (`bytes` long), sent alone, was refused as too large: it is held, or it would block every
    /// later event for good.
    async fn held_too_large(&mut self, seq: i64, bytes: usize, reason: &str) -> Result<Tick, StoreError> {
        let held = format!("the backend refuses this event as too large ({bytes} bytes): {reason}");
        error!(seq, bytes, reason = %reason, "backend refused one event as too large; held in the outbox, not sent");
        self.outbox.hold_event(seq, &held).await?;
        self.stats.held += 1;
        Ok(Tick::Held(1))
    }

    /// The backend rate-limited a batch of `n` events: kept, and the next batch waits longer, and at least as long as
    /// the backend `asked` (`backoff()`).
    fn rate_limited(&mut self, n: usize, asked: Option<Duration>) -> Tick {
        self.backoff = Some(self.backoff.map_or(BACKOFF_FIRST, |b| (b * 2).min(BACKOFF_MAX)));
        self.asked = asked.map(|asked| asked.min(retry_after::CAP));
        let wait = self.backoff().unwrap_or(BACKOFF_FIRST);
        self.stats.failed_batches += 1;
        warn!(events = n, wait_s = wait.as_secs(), "backend rate-limited events; backing off");
        Tick::Kept { events: n, wait: Some(wait) }
    }

    /// The backend was unavailable for a batch of `n` events and said for how long: kept, and the next batch waits
    /// that long, or the backoff of earlier refusals when longer (`backoff()`).
    fn unavailable(&mut self, n: usize, reason: &str, retry_after: Duration) -> Tick {
        self.asked = Some(retry_after.min(retry_after::CAP));
        let wait = self.backoff().unwrap_or(retry_after);
        self.stats.failed_batches += 1;
        warn!(events = n, wait_s = wait.as_secs(), reason = %reason, "backend unavailable for events; keeping them until its Retry-After has passed");
        Tick::Kept { events: n, wait: Some(wait) }
    }

    /// The backend did not answer a batch of `n` events in time: fewer, later, with more time.
    fn timed_out(&mut self, n: usize, reason: &str) -> Tick {
        self.stats.failed_batches += 1;
        self.cap = (n / 2).max(1);
        let waited = self.timeout;
        self.timeout = (self.timeout * 2).min(MAX_TIMEOUT.max(self.base_timeout));
        let wait = self.backoff.map_or(BACKOFF_FIRST, |b| (b * 2).min(BACKOFF_MAX));
        self.backoff = Some(wait);
        warn!(events = n, waited_s = waited.as_secs_f64(), next_events = self.cap,
              next_timeout_s = self.timeout.as_secs_f64(), wait_s = wait.as_secs(), reason = %reason,
              "backend did not answer a batch of events in time; sending it again, fewer at a time, later, with more time (the same event ids)");
        Tick::Kept { events: n, wait: Some(wait) }
    }

    /// A batch was accepted: the events held as invalid during a streak of refusals (more than one in a row) are
    /// offered again, once. The backend accepts now what it refused then, so most of them were not bad events but
    /// a refusing backend's victims; a bad one among them is found and held again, for good.
    async fn offer_streak_again(&mut self) -> Result<(), StoreError> {
        let streak = std::mem::take(&mut self.streak);
        if streak.len() < 2 {
            return Ok(());
        }
        let released = self.outbox.release_held(&streak).await?;
        warn!(
            events = released,
            first_seq = streak[0],
            "the backend accepts events again after refusing several in a row; offering those it refused once more"
        );
        // Bounded: an event goes in here once per process, and only after it was refused twice it is never offered
        // again, so this holds at most the outbox's refused events.
        self.offered_again.extend(streak);
        Ok(())
    }

    /// Send until the outbox is empty, a batch is kept, or `deadline` passes; returns the events left.
    pub async fn flush(&mut self, deadline: Duration) -> Result<i64, StoreError> {
        let until = tokio::time::Instant::now() + deadline;
        // A send cut by the deadline may have reached the backend: its claim is kept (it lapses after the lease)
        // rather than handed to another replica at once, which would send it again.
        let mut cut = false;
        while tokio::time::Instant::now() < until {
            let tick = tokio::time::timeout_at(until, self.tick()).await;
            match tick {
                Ok(Ok(tick)) if tick.reads_on() => continue,
                Ok(Ok(_)) => break,
                Err(_) => {
                    cut = true;
                    break;
                }
                Ok(Err(err)) => return Err(err),
            }
        }
        if !cut {
            if let Err(err) = self.outbox.release_claims(&self.owner).await {
                warn!(error = %err, "could not release this replica's event claims; they lapse after the lease");
            }
        }
        let left = self.outbox.event_count().await?;
        if left > 0 {
            warn!(left, "events still in the outbox at shutdown; they are sent after the next start");
        } else {
            info!("event outbox flushed");
        }
        Ok(left)
    }
}

/// The BP §8.1 envelope of a stored event, or why it makes none.
pub fn envelope(event: &StoredEvent) -> Result<EventEnvelope, String> {
    let kind =
        EventKind::parse(&event.event_type).ok_or_else(|| format!("unknown event type {:?}", event.event_type))?;
    let serde_json::Value::Object(data) = &event.data else {
        return Err("stored payload is not a JSON object".to_owned());
    };
    Ok(EventEnvelope { kind, timestamp: event.emitted_at.clone(), data: data.clone() })
}

mod quota;

#[cfg(test)]
mod tests;
