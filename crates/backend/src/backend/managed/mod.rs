//! The running side of managed mode: the heartbeat (BP §3), the command
//! poller with its adaptive cadence and de-duplication (BP §4), one worker
//! applying commands in order and posting a terminal result for each
//! (BP §5-§6), config refreshes through the same reconciler the standalone
//! file uses (BP §7), and the event uploader loop (BP §8.3). One file per loop:
//! `heartbeat`, `poller`, `commands`, `upload`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::Digest;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use super::client::{BackendClient, BackendError};
use super::dedup::{CommandLedger, FINISHED_KEPT};
use super::metrics::ProcessMetrics;
use super::monitor::Channel;
use super::retry_after::Hold;
use crate::auth::introspection::TokenIntrospection;
use crate::backend::wire::Command;
use crate::events::{ConfigErrorKind, ConfigRefresh, Emitter, Event};
use crate::instances::InstanceManager;
use crate::model::InstanceStatus;
use crate::store::{Outbox, Replicas};

mod commands;
mod heartbeat;
mod poller;
mod replicas;
mod upload;

pub use commands::run_command;
use commands::worker;
use heartbeat::heartbeat_loop;
pub use heartbeat::{beat_cadence, heartbeat_body};
pub use poller::poll_cadence;
use poller::poll_loop;
pub use upload::upload_loop;

/// Commands queued for the worker before the poller waits.
const COMMAND_QUEUE: usize = 256;

/// What the managed runtime needs.
#[derive(Clone)]
pub struct ManagedDeps {
    pub client: Arc<BackendClient>,
    pub manager: InstanceManager,
    pub introspection: TokenIntrospection,
    /// Users' OAuth tokens for remote servers (dropped with their introspection results).
    pub oauth: Option<Arc<super::oauth::BackendOAuth>>,
    /// What replicas sharing the database coordinate through (the leader lock, the recorded commands).
    pub replicas: Replicas,
    /// The event outbox the uploader drains.
    pub outbox: Outbox,
    pub events: Emitter,
    /// What the loops last did, for `GET /api/status/backend`.
    pub monitor: Arc<super::monitor::BackendMonitor>,
    /// `DEPLOYSTACK_SATELLITE_URL` as configured, `""` when unset (BP §3.2).
    pub satellite_url: String,
    /// `DEPLOYSTACK_BACKEND_POLLING_INTERVAL`.
    pub idle_poll: Duration,
    pub heartbeat_every: Duration,
    pub event_tick: Duration,
    /// This process among replicas on one database (random per start): the origin of the commands it records.
    pub replica_id: String,
    /// Set while the configuration could not be fetched: [`resync_config`] fetches it again until one is applied.
    pub config_stale: Arc<StaleConfig>,
}

/// Whether the configuration the satellite runs may be behind the backend's: its last fetch failed. The backend
/// delivers a `configure` command once and keeps its `failed` result; the configuration is never fetched on a
/// timer (BP §7.1). Without a retry, the change a failed command announced (a server installed, a member
/// removed with their credentials) waited for the next unrelated `configure`, perhaps for days.
#[derive(Debug, Default)]
pub struct StaleConfig {
    stale: std::sync::atomic::AtomicBool,
    wake: tokio::sync::Notify,
    /// The `Retry-After` of the last failed fetch (429, 503): the next one waits it out.
    hold: Hold,
}

impl StaleConfig {
    /// The fetch failed, the backend asking for `retry_after` before the next one, or not.
    fn mark(&self, retry_after: Option<Duration>) {
        self.hold.asked(retry_after);
        self.stale.store(true, std::sync::atomic::Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn clear(&self) {
        self.stale.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_stale(&self) -> bool {
        self.stale.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Once the configuration is stale.
    async fn marked(&self) {
        while !self.is_stale() {
            self.wake.notified().await;
        }
    }
}

/// Fetch the configuration again after a failed fetch (the first one, a `configure` command's, a follower's):
/// 2 s, doubling to 60 s, or as long as the last failure's `Retry-After` asked (to `retry_after::CAP`), until one
/// is applied, by this loop or by a command meanwhile. BP §1.9 starts with no servers when the first fetch fails;
/// this brings them.
pub async fn resync_config(deps: ManagedDeps, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = deps.config_stale.marked() => {}
        }
        let mut own = Duration::from_secs(2);
        while deps.config_stale.is_stale() {
            let wait = own.max(deps.config_stale.hold.left());
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            // A failure meanwhile (a `configure` command's fetch) may have asked for a longer wait.
            if !deps.config_stale.is_stale() || deps.config_stale.hold.holds() {
                continue;
            }
            match Managed::refresh_config(&deps).await {
                Ok(result) => info!(%result, "backend configuration applied after a failed fetch"),
                Err(err) => {
                    own = (own * 2).min(Duration::from_secs(60));
                    let retry_in_s = own.max(deps.config_stale.hold.left()).as_secs();
                    warn!(error = %err, retry_in_s, "config fetch failed again; serving the last configuration applied");
                }
            }
        }
    }
}

/// Counters for the debug route and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ManagedStats {
    pub polls: u64,
    pub poll_failures: u64,
    pub commands_run: u64,
    pub results_reposted: u64,
    pub heartbeats: u64,
    pub heartbeat_failures: u64,
}

/// The running loops; stopped by cancelling their token.
#[derive(Clone)]
pub struct Managed {
    deps: ManagedDeps,
    stats: Arc<Mutex<ManagedStats>>,
    metrics: Arc<Mutex<ProcessMetrics>>,
    url_sent: Arc<std::sync::atomic::AtomicBool>,
    /// Replicas: the newest recorded command before the first configuration fetch; later ones are followed
    /// (-1 until read).
    signals_from: Arc<std::sync::atomic::AtomicI64>,
    /// Set once the first configuration fetch has been applied or has failed (BP §1 step 9): polling and the
    /// command worker start then (step 10), while the heartbeat starts with the loops (step 8).
    configured: CancellationToken,
}

impl Managed {
    pub fn new(deps: ManagedDeps, metrics: ProcessMetrics) -> Self {
        Self {
            deps,
            stats: Arc::default(),
            metrics: Arc::new(Mutex::new(metrics)),
            url_sent: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            signals_from: Arc::new(std::sync::atomic::AtomicI64::new(-1)),
            configured: CancellationToken::new(),
        }
    }

    /// Replicas on PostgreSQL: note where the leader's recorded commands stand, before the first configuration
    /// fetch, so a command recorded meanwhile is not missed. Nothing to note on SQLite.
    pub async fn note_signals(&self) {
        if !self.deps.replicas.shared() {
            return;
        }
        match self.deps.replicas.last_signal_id().await {
            Ok(id) => self.signals_from.store(id, std::sync::atomic::Ordering::Relaxed),
            Err(err) => {
                warn!(error = %err, "could not read where the leader's recorded commands stand; following from where they stand once readable")
            }
        }
    }

    pub fn stats(&self) -> Arc<Mutex<ManagedStats>> {
        self.stats.clone()
    }

    /// Fetch the config and reconcile (BP §7); the `configure` result object on success. Every fetch is an
    /// event: `config.refreshed` when applied, `config.error` when not.
    pub async fn refresh_config(deps: &ManagedDeps) -> Result<Value, BackendError> {
        let began = Instant::now();
        let config = match deps.client.fetch_config().await {
            Ok(config) => config,
            Err(err) => {
                deps.monitor.record(Channel::Config, Err(err.to_string()));
                // BP §8.5-19: the failed fetch is an event too, so the dashboard can say why nothing changed.
                let (kind, status_code) = match &err {
                    BackendError::Status { status: status @ (401 | 403), .. } => (ConfigErrorKind::Auth, Some(*status)),
                    BackendError::Status { status, .. } => (ConfigErrorKind::ServerError, Some(*status)),
                    BackendError::Decode { .. } => (ConfigErrorKind::ServerError, None),
                    BackendError::Network { .. }
                    | BackendError::Timeout { .. }
                    | BackendError::NotRegistered { .. } => (ConfigErrorKind::Network, None),
                };
                deps.events.emit(Event::config_error(kind, &err.to_string(), status_code, 60)).await;
                deps.config_stale.mark(err.retry_after());
                return Err(err);
            }
        };
        deps.monitor.record(Channel::Config, Ok(()));
        deps.config_stale.clear();
        let fetch_ms = began.elapsed().as_millis() as u64;
        let desired = config.desired_state();
        for (key, reason) in &desired.rejected {
            warn!(process_id = %key, reason = %reason, "config entry refused; the others are applied");
        }
        let total = desired.instances.len();
        let enabled = desired.instances.values().filter(|s| s.enabled).count();
        let raw = serde_json::to_vec(&config.mcp_servers).unwrap_or_default();
        let digest = sha2::Sha256::digest(&raw).into();
        let refresh =
            ConfigRefresh::new("backend", digest, total, desired.teams_count(), desired.rejected.len(), fetch_ms);
        let report = deps.manager.apply(desired).await;
        info!(%report, "backend configuration applied");
        deps.events
            .emit(Event::config_refreshed(&ConfigRefresh { change_detected: report.changed(), ..refresh }))
            .await;
        // A user who re-authorised an OAuth server is announced by a configure: connect again with the new token.
        for instance in deps.manager.instances() {
            if instance.spec().requires_oauth && instance.state() == InstanceStatus::RequiresReauth {
                let _ = deps.manager.restart(&instance.spec().process_id).await;
            }
        }
        Ok(
            json!({"configuration_applied": true, "total_servers": total, "enabled_servers": enabled, "startup_time_ms": 0}),
        )
    }

    /// The first configuration fetch has been applied or has failed: commands may be polled and run now.
    pub fn configured(&self) {
        self.configured.cancel();
    }

    /// Start the heartbeat at once (BP §1 step 8: a registration is activated by its first beat, so the beat
    /// must not wait for the first configuration's servers to start), and the poller and worker, or a replica's
    /// following of the leader's commands, once [`Managed::configured`] says the first configuration is in
    /// (step 10). They stop when `cancel` is. Replicas on PostgreSQL run the loops only while they lead.
    pub fn spawn(&self, tracker: &tokio_util::task::TaskTracker, cancel: CancellationToken) {
        if !self.deps.replicas.shared() {
            self.spawn_loops(tracker, cancel);
            return;
        }
        tracker.spawn(
            replicas::leadership(self.clone(), tracker.clone(), cancel.clone())
                .instrument(tracing::info_span!("backend.leadership")),
        );
        let from = self.signals_from.load(std::sync::atomic::Ordering::Relaxed);
        let follow = replicas::follow(self.deps.clone(), from, cancel.clone());
        tracker.spawn(after(self.configured.clone(), cancel, follow).instrument(tracing::info_span!("backend.follow")));
    }

    /// The leader's loops: heartbeat, poller and command worker.
    fn spawn_loops(&self, tracker: &tokio_util::task::TaskTracker, cancel: CancellationToken) {
        let (tx, rx) = mpsc::channel::<Command>(COMMAND_QUEUE);
        let ledger = Arc::new(Mutex::new(CommandLedger::new(FINISHED_KEPT)));
        tracker.spawn(
            heartbeat_loop(
                self.deps.clone(),
                self.metrics.clone(),
                self.stats.clone(),
                self.url_sent.clone(),
                cancel.clone(),
            )
            .instrument(tracing::info_span!("backend.heartbeat")),
        );
        let poll = poll_loop(self.deps.clone(), ledger.clone(), tx, self.stats.clone(), cancel.clone());
        tracker.spawn(
            after(self.configured.clone(), cancel.clone(), poll).instrument(tracing::info_span!("backend.poll")),
        );
        let work = worker(self.deps.clone(), ledger, rx, self.stats.clone(), cancel.clone());
        tracker.spawn(after(self.configured.clone(), cancel, work).instrument(tracing::info_span!("backend.commands")));
    }
}

/// Run `task` once `configured` is set, unless `cancel` comes first.
async fn after(configured: CancellationToken, cancel: CancellationToken, task: impl std::future::Future<Output = ()>) {
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = configured.cancelled() => {}
    }
    task.await
}
