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
//! each batch is claimed for a lease (`Store::claim_events`) before it is
//! sent, so two replicas never send the same events; a replica that dies
//! mid-batch leaves a claim that lapses after `LEASE`, and another replica
//! sends the batch then.
//!
//! Sending is injected (`SendBatch`), so the policy is tested without HTTP;
//! the backend client supplies the real POST.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tracing::{debug, error, info, warn};

use super::wire::EventEnvelope;
use crate::events::{Emitter, Event, EventKind, LimitExceeded, LimitedResource, Throttle};
use crate::store::{Store, StoreError, StoredEvent};

/// The backend refuses bigger batches (BP §8.1).
pub const MAX_BATCH: usize = 100;
/// How often the outbox's bytes on disk are checked against the byte quota.
const BYTE_CHECK_PERIOD: Duration = Duration::from_secs(30);
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

/// How the backend answered one batch.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOutcome {
    /// 2xx. Per-event failures (`failures[]`) are logged, not retried.
    Accepted { failures: Vec<String> },
    /// 400, or an error naming validation: the batch can never succeed.
    Invalid(String),
    /// 401: credentials are being sorted out elsewhere; keep and retry.
    Unauthorized,
    /// 429: keep, and wait longer before the next batch.
    RateLimited,
    /// 5xx, timeout, network: keep and retry next tick.
    Failed(String),
    /// 413: the body was too large for the backend. Fewer events are sent next; one event alone that is
    /// refused so is held (kept, never sent), or it would block every later event for good.
    TooLarge(String),
}

/// POST one batch of envelopes to the backend.
pub type SendBatch = Arc<dyn Fn(Vec<EventEnvelope>) -> BoxFuture<'static, BatchOutcome> + Send + Sync>;

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
    store: Store,
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
    /// The most the outbox may take on disk (`Store::prune_events_to_bytes`); unbounded unless `with_byte_quota`.
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
    pub fn new(store: Store, send: SendBatch, batch: usize, quota: i64) -> Self {
        Self {
            store: store.clone(),
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
            emitter: Emitter::new(store),
            backoff: None,
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

    /// Emit the uploader's own events (`resource.limit.exceeded`) through `emitter` (default: one of its own).
    pub fn with_emitter(mut self, emitter: Emitter) -> Self {
        self.emitter = emitter;
        self
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

    /// Extra wait the rate limiter asked for before the next batch.
    pub fn backoff(&self) -> Option<Duration> {
        self.backoff
    }

    /// Send the oldest batch, if any, and act on the answer.
    pub async fn tick(&mut self) -> Result<Tick, StoreError> {
        self.enforce_quota().await?;
        if !self.started {
            let released = self.store.release_stale_claims().await?;
            if released > 0 {
                info!(released, "event claims of a previous run released");
            }
            self.started = true;
        }
        let lease_ms = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
        let batch = self.store.claim_events(&self.owner, self.cap as i64, lease_ms, None).await?;
        let Some(first) = batch.first().map(|e| e.seq) else { return Ok(Tick::Idle) };
        let mut envelopes = Vec::with_capacity(batch.len());
        let mut seqs = Vec::with_capacity(batch.len());
        let mut bytes = 0;
        for event in &batch {
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
                    self.store.hold_event(event.seq, &reason).await?;
                    self.stats.held += 1;
                }
            }
        }
        if envelopes.is_empty() {
            return Ok(Tick::Held(batch.len()));
        }
        let n = envelopes.len();
        match (self.send)(envelopes).await {
            BatchOutcome::Accepted { failures } => {
                for failure in &failures {
                    warn!(failure = %failure, "backend refused one event of an accepted batch");
                }
                self.store.delete_claimed(&self.owner, &seqs).await?;
                self.stats.sent += n as u64;
                self.backoff = None;
                self.invalid_in_a_row = 0;
                self.cap = (self.cap * 2).min(self.batch);
                self.offer_streak_again().await?;
                Ok(Tick::Sent(n))
            }
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
            BatchOutcome::Invalid(reason) => {
                let held = format!("the backend rejects this event as invalid: {reason}");
                error!(seq = seqs[0], reason = %reason, "backend rejected one event as invalid; held in the outbox, not sent");
                self.store.hold_event(seqs[0], &held).await?;
                self.stats.held_invalid += 1;
                self.invalid_in_a_row += 1;
                if !self.offered_again.contains(&seqs[0]) {
                    self.streak.push(seqs[0]);
                }
                if self.invalid_in_a_row <= INVALID_BEFORE_BACKOFF {
                    return Ok(Tick::Held(1));
                }
                // Event after event refused with nothing accepted between: not one bad event but a backend that
                // refuses everything. Each is still held (kept), at the backoff's pace rather than at once.
                let wait = self.backoff.map_or(BACKOFF_FIRST, |b| (b * 2).min(BACKOFF_MAX));
                self.backoff = Some(wait);
                warn!(
                    in_a_row = self.invalid_in_a_row,
                    wait_s = wait.as_secs(),
                    "backend rejects every event; backing off"
                );
                Ok(Tick::Kept { events: 0, wait: Some(wait) })
            }
            BatchOutcome::TooLarge(reason) if n > 1 => {
                self.cap = n / 2;
                self.stats.failed_batches += 1;
                warn!(events = n, bytes, next = self.cap, reason = %reason,
                      "backend refused a batch of events as too large; sending fewer at a time");
                Ok(Tick::Shrunk { from: n, to: self.cap })
            }
            BatchOutcome::TooLarge(reason) => {
                let held = format!("the backend refuses this event as too large ({bytes} bytes): {reason}");
                error!(seq = seqs[0], bytes, reason = %reason,
                       "backend refused one event as too large; held in the outbox, not sent");
                self.store.hold_event(seqs[0], &held).await?;
                self.stats.held += 1;
                Ok(Tick::Held(1))
            }
            BatchOutcome::RateLimited => {
                let wait = self.backoff.map_or(BACKOFF_FIRST, |b| (b * 2).min(BACKOFF_MAX));
                self.backoff = Some(wait);
                self.stats.failed_batches += 1;
                warn!(events = n, wait_s = wait.as_secs(), "backend rate-limited events; backing off");
                Ok(Tick::Kept { events: n, wait: Some(wait) })
            }
            BatchOutcome::Unauthorized => {
                self.stats.failed_batches += 1;
                warn!(events = n, "backend refused the satellite's credentials for events; keeping them");
                Ok(Tick::Kept { events: n, wait: None })
            }
            BatchOutcome::Failed(reason) => {
                self.stats.failed_batches += 1;
                warn!(events = n, reason = %reason, "sending events failed; keeping them for the next tick");
                Ok(Tick::Kept { events: n, wait: None })
            }
        }
    }

    /// A batch was accepted: the events held as invalid during a streak of refusals (more than one in a row) are
    /// offered again, once. The backend accepts now what it refused then, so most of them were not bad events but
    /// a refusing backend's victims; a bad one among them is found and held again, for good.
    async fn offer_streak_again(&mut self) -> Result<(), StoreError> {
        let streak = std::mem::take(&mut self.streak);
        if streak.len() < 2 {
            return Ok(());
        }
        let released = self.store.release_held(&streak).await?;
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
            if let Err(err) = self.store.release_claims(&self.owner).await {
                warn!(error = %err, "could not release this replica's event claims; they lapse after the lease");
            }
        }
        let left = self.store.event_count().await?;
        if left > 0 {
            warn!(left, "events still in the outbox at shutdown; they are sent after the next start");
        } else {
            info!("event outbox flushed");
        }
        Ok(left)
    }

    /// Hold the outbox to its quotas, in events and on disk, the oldest events going first (with an error log and a
    /// throttled `resource.limit.exceeded` event).
    async fn enforce_quota(&mut self) -> Result<(), StoreError> {
        // A replica the gate passes over holds the outbox within twice its quotas, in case no replica leads for
        // long (the leader lock cannot be taken, or a vanished leader's session lingers on the server).
        let (quota, quota_bytes) = match (self.prunes)() {
            true => (self.quota, self.quota_bytes),
            false => (self.quota.saturating_mul(2), self.quota_bytes.saturating_mul(2)),
        };
        // Counting walks the outbox; the span of its sequence numbers, two index lookups, can only overstate the
        // count. A backlog drained batch by batch would otherwise be counted whole before each batch.
        let count = match self.store.event_seq_span().await? {
            span if span <= quota => span,
            _ => self.store.event_count().await?,
        };
        if count > quota {
            let dropped = self.store.prune_events(quota).await?;
            self.stats.dropped_over_quota += dropped;
            error!(dropped, quota, "event outbox over its quota: oldest events dropped");
            let message = format!("event outbox over its quota of {quota} events: {dropped} oldest dropped");
            self.report_over_quota(count as u64, quota.max(0) as u64, message).await;
        }
        // Measuring the outbox walks it once over the cheap check: at most every `BYTE_CHECK_PERIOD`, not for each
        // batch of a backlog being drained.
        let due = self.bytes_checked.is_none_or(|at| at.elapsed() >= BYTE_CHECK_PERIOD);
        if due && quota_bytes < u64::MAX {
            self.bytes_checked = Some(std::time::Instant::now());
            let pruned = self.store.prune_events_to_bytes(quota_bytes).await?;
            let dropped = pruned.events;
            if dropped > 0 {
                self.stats.dropped_over_quota += dropped;
                let max_mib = quota_bytes / (1024 * 1024);
                error!(dropped, max_mib, "event outbox over its size quota: oldest events dropped");
                let message = format!("event outbox over its quota of {max_mib} MiB on disk: {dropped} oldest dropped");
                self.report_over_quota(pruned.outbox, quota_bytes, message).await;
            }
        }
        // The pages this replica's batches freed, the ones just before included: in managed mode the outbox
        // shrinks only while a backlog drains, and inserts take freed pages first whenever it grows.
        if self.store.release_free_pages(u64::MAX).await? > 0 {
            debug!("event outbox: free pages given back to the disk");
        }
        Ok(())
    }

    async fn report_over_quota(&mut self, current_value: u64, limit_value: u64, message: String) {
        if let Some(suppressed) = self.quota_events.allow("outbox", std::time::Instant::now()) {
            let exceeded = LimitExceeded {
                team_id: "*".into(),
                resource_type: LimitedResource::EventOutbox,
                current_value,
                limit_value,
                user_id: None,
                installation_id: None,
                message,
                suppressed_count: suppressed,
            };
            self.emitter.emit(Event::limit_exceeded(&exceeded)).await;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewEvent;
    use futures::FutureExt;
    use parking_lot::Mutex;
    use serde_json::{json, Value};

    fn row(i: usize, process_id: &str) -> NewEvent<'_> {
        NewEvent {
            event_type: "mcp.server.status_changed",
            emitted_at: crate::model::iso(chrono::Utc::now()),
            data: json!({"n": i}).to_string().into(),
            process_id: Some(process_id),
            held: None,
        }
    }

    async fn store_with(n: usize) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let ids: Vec<String> = (0..n).map(|i| format!("p{}", i % 3)).collect();
        let events: Vec<NewEvent<'_>> = (0..n).map(|i| row(i, &ids[i])).collect();
        store.append_events(&events).await.unwrap();
        (dir, store)
    }

    /// A backend answering from a script (then `Accepted`), recording what it received.
    fn scripted(script: Vec<BatchOutcome>) -> (SendBatch, Arc<Mutex<Vec<Vec<Value>>>>) {
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.into_iter().collect::<std::collections::VecDeque<_>>()));
        let seen = received.clone();
        let send: SendBatch = Arc::new(move |batch| {
            seen.lock().push(batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect());
            let outcome = script.lock().pop_front().unwrap_or(BatchOutcome::Accepted { failures: vec![] });
            async move { outcome }.boxed()
        });
        (send, received)
    }

    fn numbers(batches: &[Vec<Value>]) -> Vec<i64> {
        batches.iter().flatten().map(|e| e["data"]["n"].as_i64().unwrap()).collect()
    }

    #[tokio::test]
    async fn batches_of_at_most_100_in_order_deleting_only_what_was_accepted() {
        let (_dir, store) = store_with(250).await;
        let (send, received) = scripted(vec![]);
        let mut up = Uploader::new(store.clone(), send, 500, 10_000);
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(100), "a batch never exceeds 100");
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(100));
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(50));
        assert_eq!(up.tick().await.unwrap(), Tick::Idle, "no empty batch is sent");
        let got = received.lock().clone();
        assert_eq!(got.len(), 3);
        assert_eq!(numbers(&got), (0..250).collect::<Vec<_>>(), "oldest first, nothing twice");
        assert_eq!(got[0][0]["type"], "mcp.server.status_changed");
        assert!(got[0][0]["timestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(store.event_count().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn failures_keep_the_batch_and_429_backs_off_doubling_to_48s() {
        let (_dir, store) = store_with(10).await;
        let script = vec![
            BatchOutcome::Failed("500".into()),
            BatchOutcome::Unauthorized,
            BatchOutcome::RateLimited,
            BatchOutcome::RateLimited,
            BatchOutcome::RateLimited,
            BatchOutcome::RateLimited,
            BatchOutcome::RateLimited,
            BatchOutcome::RateLimited,
        ];
        let (send, received) = scripted(script);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        assert_eq!(up.tick().await.unwrap(), Tick::Kept { events: 10, wait: None });
        assert_eq!(up.tick().await.unwrap(), Tick::Kept { events: 10, wait: None });
        let waits: Vec<u64> = {
            let mut waits = Vec::new();
            for _ in 0..6 {
                if let Tick::Kept { wait: Some(w), .. } = up.tick().await.unwrap() {
                    waits.push(w.as_secs());
                }
            }
            waits
        };
        assert_eq!(waits, [3, 6, 12, 24, 48, 48]);
        assert_eq!(store.event_count().await.unwrap(), 10, "nothing lost while the backend refuses");
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(10));
        assert_eq!(up.backoff(), None, "success resets the backoff");
        // The same ten events went each time, in the same order.
        assert!(received.lock().iter().all(|b| numbers(std::slice::from_ref(b)) == (0..10).collect::<Vec<_>>()));
    }

    #[tokio::test]
    async fn a_backend_refusing_every_event_is_not_drained_at_full_speed() {
        let (_dir, store) = store_with(50).await;
        let send: SendBatch = Arc::new(|_| async { BatchOutcome::Invalid("400: validation failed".into()) }.boxed());
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        let mut held = 0;
        let waited = loop {
            match up.tick().await.unwrap() {
                Tick::Held(n) => held += n,
                Tick::Shrunk { .. } => {}
                Tick::Kept { wait, .. } => break wait,
                other => panic!("unexpected {other:?}"),
            }
        };
        assert_eq!(held, INVALID_BEFORE_BACKOFF as usize, "a few held at once");
        assert_eq!(waited, Some(BACKOFF_FIRST), "then each waits a backoff");
        assert_eq!(store.event_count().await.unwrap(), 50, "every event kept (held or waiting)");
    }

    /// A proxy before the backend answered 400 to everything for a while: the events it refused one at a time were
    /// held. Once a batch goes through again, they are offered again and sent, none lost.
    #[tokio::test]
    async fn events_refused_while_everything_was_refused_are_sent_once_the_backend_accepts() {
        let (_dir, store) = store_with(50).await;
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (gate, seen) = (refusing.clone(), received.clone());
        let send: SendBatch = Arc::new(move |batch| {
            let outcome = if gate.load(std::sync::atomic::Ordering::SeqCst) {
                BatchOutcome::Invalid("400: bad request".into())
            } else {
                seen.lock().push(batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect::<Vec<Value>>());
                BatchOutcome::Accepted { failures: vec![] }
            };
            async move { outcome }.boxed()
        });
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        let mut backoffs = 0;
        while backoffs < 3 {
            if let Tick::Kept { wait: Some(_), .. } = up.tick().await.unwrap() {
                backoffs += 1;
            }
        }
        let held = up.stats().held_invalid;
        assert!(held > INVALID_BEFORE_BACKOFF as u64, "several events held during the outage: {held}");
        refusing.store(false, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..50 {
            if up.tick().await.unwrap() == Tick::Idle {
                break;
            }
        }
        let mut sent = numbers(&received.lock());
        sent.sort_unstable();
        assert_eq!(sent, (0..50).collect::<Vec<_>>(), "every event sent once, the held ones included");
        assert_eq!(store.event_count().await.unwrap(), 0, "nothing left held in the outbox");
    }

    /// Two bad events next to each other look like a short streak of refusals: they are offered once more, held
    /// again, and then never offered again, so the uploader comes to rest.
    #[tokio::test]
    async fn bad_events_offered_again_after_a_streak_are_held_for_good() {
        let (_dir, store) = store_with(300).await;
        let offers = Arc::new(Mutex::new(std::collections::HashMap::<i64, u32>::new()));
        let seen = offers.clone();
        let send: SendBatch = Arc::new(move |batch| {
            let batch: Vec<Value> = batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
            let bad: Vec<i64> =
                batch.iter().filter_map(|e| e["data"]["n"].as_i64()).filter(|n| (37..=38).contains(n)).collect();
            if batch.len() == 1 {
                for n in &bad {
                    *seen.lock().entry(*n).or_default() += 1;
                }
            }
            let outcome = match bad.is_empty() {
                true => BatchOutcome::Accepted { failures: vec![] },
                false => BatchOutcome::Invalid("400: validation failed".into()),
            };
            async move { outcome }.boxed()
        });
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        let mut rested = false;
        for _ in 0..500 {
            if up.tick().await.unwrap() == Tick::Idle {
                rested = true;
                break;
            }
        }
        assert!(rested, "the uploader comes to rest");
        assert_eq!(*offers.lock(), [(37, 2), (38, 2)].into_iter().collect(), "each bad event alone twice, no more");
        let kept = store.events(None, 0, 10).await.unwrap();
        assert_eq!(kept.iter().map(|e| e.data["n"].as_i64().unwrap()).collect::<Vec<_>>(), [37, 38]);
        assert!(kept.iter().all(|e| e.held.is_some()), "both held");
    }

    #[tokio::test]
    async fn an_invalid_event_is_found_and_held_and_the_rest_are_sent() {
        let (_dir, store) = store_with(1000).await;
        let received = Arc::new(Mutex::new(Vec::new()));
        let seen = received.clone();
        // A backend that refuses any batch holding event 37 (before, the whole batch of 100 went with it).
        let send: SendBatch = Arc::new(move |batch| {
            let batch: Vec<Value> = batch.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
            let poisoned = batch.iter().any(|e| e["data"]["n"] == 37);
            if !poisoned {
                seen.lock().push(batch);
            }
            let outcome = if poisoned {
                BatchOutcome::Invalid("400: validation failed".into())
            } else {
                BatchOutcome::Accepted { failures: vec![] }
            };
            async move { outcome }.boxed()
        });
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        for _ in 0..200 {
            if up.tick().await.unwrap() == Tick::Idle {
                break;
            }
        }
        let mut sent = numbers(&received.lock());
        sent.sort_unstable();
        assert_eq!(sent, (0..1000).filter(|n| *n != 37).collect::<Vec<_>>(), "every other event sent, once");
        assert_eq!(up.stats().held_invalid, 1);
        let kept = store.events(None, 0, 10).await.unwrap();
        assert_eq!(kept.len(), 1, "the refused event stays in the outbox");
        assert!(kept[0].held.as_deref().unwrap().contains("validation failed"), "{:?}", kept[0].held);
        assert_eq!(kept[0].data["n"], 37);
    }

    /// A stored event that makes no envelope is held with its reason and logged, never sent and never deleted;
    /// the events around it go as usual.
    #[tokio::test]
    async fn an_event_that_makes_no_envelope_is_held_not_dropped() {
        let (_dir, store) = store_with(2).await;
        let mut bad = row(2, "p2");
        bad.event_type = "mcp.from.a.newer.version";
        let mut not_object = row(3, "p3");
        not_object.data = json!([1, 2]).to_string().into();
        store.append_events(&[bad, not_object, row(4, "p4")]).await.unwrap();
        let (send, received) = scripted(vec![]);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(3));
        assert_eq!(numbers(&received.lock()), [0, 1, 4]);
        assert_eq!(up.stats().held, 2);
        let kept = store.events(None, 0, 10).await.unwrap();
        assert_eq!(kept.len(), 2, "the held events stay in the outbox");
        assert!(kept[0].held.as_deref().unwrap().contains("unknown event type"));
        assert!(kept[1].held.as_deref().unwrap().contains("not a JSON object"));
        assert_eq!(up.tick().await.unwrap(), Tick::Idle, "held events are not offered again");
    }

    #[tokio::test]
    async fn over_the_quota_the_oldest_are_dropped_and_counted() {
        let (_dir, store) = store_with(30).await;
        let (send, received) = scripted(vec![BatchOutcome::Failed("down".into())]);
        let mut up = Uploader::new(store.clone(), send, 100, 20);
        up.tick().await.unwrap();
        assert_eq!(up.stats().dropped_over_quota, 10);
        let batch = received.lock()[0].clone();
        let (status, limits): (Vec<Value>, Vec<Value>) =
            batch.into_iter().partition(|e| e["type"] == "mcp.server.status_changed");
        assert_eq!(numbers(&[status]), (10..30).collect::<Vec<_>>(), "the newest 20 are kept");
        assert_eq!(limits.len(), 1, "the overflow is reported once");
        assert_eq!(limits[0]["type"], "resource.limit.exceeded");
        assert_eq!(limits[0]["data"]["resource_type"], "event_outbox");
        assert_eq!(limits[0]["data"]["current_value"], 30);
        assert_eq!(limits[0]["data"]["limit_value"], 20);
    }

    /// Gaps in the outbox's sequence numbers (events sent out of order, by other replicas) are not events: the
    /// cheap span check only decides whether to count, and the count decides.
    #[tokio::test]
    async fn gaps_in_the_sequence_are_not_counted_as_events() {
        let (_dir, store) = store_with(30).await;
        let middle: Vec<i64> = store.events(None, 0, 100).await.unwrap()[5..20].iter().map(|e| e.seq).collect();
        sqlx::query(&format!(
            "DELETE FROM event_outbox WHERE seq IN ({})",
            middle.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
        ))
        .execute(store.pool())
        .await
        .unwrap();
        assert_eq!((store.event_seq_span().await.unwrap(), store.event_count().await.unwrap()), (30, 15));
        let (send, _received) = scripted(vec![BatchOutcome::Failed("down".into())]);
        let mut up = Uploader::new(store.clone(), send, 100, 20);
        up.tick().await.unwrap();
        assert_eq!(up.stats().dropped_over_quota, 0, "15 events are within a quota of 20");
        assert_eq!(store.event_count().await.unwrap(), 15);
    }

    /// Of replicas sharing one outbox, only the one the gate names (the leader) holds it to its quotas; the
    /// others hold it within twice them, in case none leads for long. When the gate opens, the outbox is pruned
    /// at once.
    #[tokio::test]
    async fn only_the_replica_the_gate_names_prunes_the_outbox() {
        let (_dir, store) = store_with(50).await;
        let leads = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = leads.clone();
        let (send, _received) = scripted(vec![BatchOutcome::Failed("down".into()); 2]);
        let mut up = Uploader::new(store.clone(), send, 100, 20)
            .with_prune_gate(Arc::new(move || gate.load(std::sync::atomic::Ordering::SeqCst)));
        up.tick().await.unwrap();
        assert_eq!((up.stats().dropped_over_quota, store.event_count().await.unwrap()), (10, 41), "a follower: 40");
        leads.store(true, std::sync::atomic::Ordering::SeqCst);
        up.tick().await.unwrap();
        assert_eq!(up.stats().dropped_over_quota, 31, "the leader: 20");
    }

    /// A backend away while big request logs pile up: the outbox is held to its bytes on disk, the oldest going,
    /// and the overflow is reported with the bytes.
    #[tokio::test]
    async fn over_the_byte_quota_the_oldest_are_dropped_and_reported() {
        const MAX: u64 = 1024 * 1024;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let pad = "y".repeat(20_000);
        let rows: Vec<NewEvent<'_>> = (0..150)
            .map(|n| NewEvent {
                event_type: "mcp.server.status_changed",
                emitted_at: crate::model::iso(chrono::Utc::now()),
                data: json!({"n": n, "pad": pad}).to_string().into(),
                process_id: None,
                held: None,
            })
            .collect();
        store.append_events(&rows).await.unwrap();
        let (send, received) = scripted(vec![BatchOutcome::Failed("down".into())]);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000).with_byte_quota(MAX);
        up.tick().await.unwrap();
        let dropped = up.stats().dropped_over_quota;
        assert!((100..150).contains(&dropped), "{dropped} dropped of 150 events of 20 KB");
        assert!(store.outbox_bytes().await.unwrap() <= MAX);
        let sent = numbers(&received.lock()[..1]);
        assert_eq!(sent.first().copied(), Some(dropped as i64), "the oldest kept is the first sent");
        assert_eq!(store.event_count().await.unwrap() as u64, 150 - dropped + 1, "the rest and the report wait");
        let limits = store.events(Some("resource.limit.exceeded"), 0, 10).await.unwrap();
        assert_eq!(limits.len(), 1, "the overflow is reported");
        assert_eq!(limits[0].data["limit_value"], MAX);
        assert!(limits[0].data["current_value"].as_u64().unwrap() > 2 * MAX, "the outbox's own bytes before the prune");
    }

    #[tokio::test]
    async fn flush_sends_everything_within_the_deadline() {
        let (_dir, store) = store_with(230).await;
        let (send, received) = scripted(vec![]);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        assert_eq!(up.flush(Duration::from_secs(5)).await.unwrap(), 0);
        assert_eq!(received.lock().len(), 3);
        // A backend that keeps failing leaves the events for the next start.
        let (_dir2, store) = store_with(7).await;
        let (send, _) = scripted(vec![BatchOutcome::Failed("x".into()); 100]);
        let mut up = Uploader::new(store, send, 100, 10_000);
        assert_eq!(up.flush(Duration::from_secs(5)).await.unwrap(), 7);
    }

    fn too_large() -> BatchOutcome {
        BatchOutcome::TooLarge("backend answered 413 Payload Too Large".into())
    }

    /// A 413 would come back for the same batch for ever, and every later event would wait behind it: the
    /// batch is sent in halves, and an event the backend refuses even alone is held, so the rest still go.
    #[tokio::test]
    async fn a_batch_refused_as_too_large_is_sent_in_halves_and_an_event_too_large_alone_is_held() {
        let (_dir, store) = store_with(8).await;
        let (send, received) = scripted(vec![too_large()]);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        assert_eq!(up.tick().await.unwrap(), Tick::Shrunk { from: 8, to: 4 });
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(4));
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(4), "an accepted batch lets the next one grow back");
        assert_eq!(up.tick().await.unwrap(), Tick::Idle);
        assert_eq!(numbers(&received.lock()), [(0..8).collect::<Vec<_>>(), (0..8).collect()].concat());
        assert_eq!(store.event_count().await.unwrap(), 0);

        let (_dir, store) = store_with(3).await;
        let (send, received) = scripted(vec![too_large(), too_large()]);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        assert_eq!(up.tick().await.unwrap(), Tick::Shrunk { from: 3, to: 1 });
        assert_eq!(up.tick().await.unwrap(), Tick::Held(1), "one event refused alone is held");
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(1));
        assert_eq!(up.tick().await.unwrap(), Tick::Sent(1));
        assert_eq!(up.tick().await.unwrap(), Tick::Idle);
        assert_eq!(numbers(&received.lock()), [0, 1, 2, 0, 1, 2]);
        assert_eq!(up.stats().held, 1);
        let kept = store.events(None, 0, 10).await.unwrap();
        assert_eq!(kept.len(), 1, "the held event is kept, not dropped");
        assert_eq!(kept[0].data["n"], 0);
        assert!(kept[0].held.as_deref().is_some_and(|why| why.contains("too large")), "{:?}", kept[0].held);
    }

    /// No batch passes MAX_BATCH_BYTES of envelopes (so no 413 is needed to find the backend's limit), yet an
    /// event bigger than that by itself is still sent, alone.
    #[tokio::test]
    async fn a_batch_stops_before_the_event_that_would_pass_its_byte_budget() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let sizes = [200 * 1024, 200 * 1024, 200 * 1024, 2 * MAX_BATCH_BYTES, 10, 10];
        let texts: Vec<String> =
            sizes.iter().enumerate().map(|(i, size)| json!({"n": i, "pad": "x".repeat(*size)}).to_string()).collect();
        let rows: Vec<NewEvent<'_>> =
            texts.iter().map(|text| NewEvent { data: text.as_str().into(), ..row(0, "p0") }).collect();
        store.append_events(&rows).await.unwrap();
        let (send, received) = scripted(vec![]);
        let mut up = Uploader::new(store.clone(), send, 100, 10_000);
        let mut ticks = Vec::new();
        loop {
            match up.tick().await.unwrap() {
                Tick::Idle => break,
                tick => ticks.push(tick),
            }
        }
        assert_eq!(ticks, [Tick::Sent(2), Tick::Sent(1), Tick::Sent(1), Tick::Sent(2)]);
        let batches = received.lock().clone();
        for batch in &batches {
            let bytes: usize = batch.iter().map(|e| e.to_string().len()).sum();
            assert!(batch.len() == 1 || bytes <= MAX_BATCH_BYTES, "{} events in {bytes} bytes", batch.len());
        }
        assert_eq!(numbers(&batches), (0..6).collect::<Vec<_>>(), "in order, each once");
        assert_eq!(store.event_count().await.unwrap(), 0);
    }
}
