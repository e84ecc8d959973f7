//! The manager's insides: the parts it is made of, each holding the few handles its job needs and doing that job
//! in its own file, and the supervisor's own handles (the settings, its background tasks, the stop signal). What
//! crosses parts (start, crash and restart, watches, respawn, calls, recovery, publishing a discovery) are the
//! supervisor's steps: `impl Inner` blocks in `lifecycle`.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::UpstreamSettings;
use crate::mcp::client::ClientOptions;
use crate::mcp::transport::stderr::StderrSettings;

use super::holds::DriftHolds;
use super::lifecycle::{load_stored, CallLog, CatalogPublisher, Connector, Room};
use super::limits::ProcessSlots;
use super::reporter::Reporter;
use super::roster::Roster;
use super::ManagerDeps;

/// The supervisor of every instance, and the parts it works with.
pub(super) struct Inner {
    pub(super) settings: UpstreamSettings,
    /// The instances wanted and running, and the reconciler's turns.
    pub(super) roster: Roster,
    /// Spawning and connecting: the sandbox, the HTTP client, OAuth tokens, the deployer.
    pub(super) connector: Connector,
    /// Process slots and dormancy.
    pub(super) room: Room,
    /// Discovered catalogs into the store and the search index, and their events.
    pub(super) publisher: CatalogPublisher,
    /// Run-time tool switches and drift holds.
    pub(super) holds: DriftHolds,
    /// Status changes, events, and who must look again.
    pub(super) reporter: Reporter,
    /// Recorded tool calls: their events, request logs and metrics.
    pub(super) call_log: CallLog,
    /// The background work of the instances (watches, restarts, probes), awaited at shutdown.
    pub(super) tasks: TaskTracker,
    pub(super) shutdown: CancellationToken,
}

impl Inner {
    /// The parts made from `deps`; the catalogs and drift holds stored by a previous run are loaded.
    pub(super) async fn new(deps: ManagerDeps) -> Result<Self, crate::store::StoreError> {
        let ManagerDeps {
            settings,
            client_options,
            inherited_env,
            sandbox,
            http,
            store,
            search,
            events,
            logs,
            oauth,
            deployer,
            metrics,
        } = deps;
        let stored = load_stored(&store).await?;
        // Drifted tools an admin has not accepted yet stay held across restarts.
        let holds = DriftHolds::load(store.clone()).await?;
        let lifecycle = &settings.lifecycle;
        let slots = ProcessSlots::new(lifecycle.max_processes_per_user, lifecycle.max_processes);
        let stderr = StderrSettings {
            per_second: lifecycle.log_rate_limit,
            max_line_bytes: lifecycle.log_max_line_bytes,
            warning_interval: lifecycle.log_rate_warning_interval,
        };
        let connector = Connector {
            sandbox,
            inherited_env,
            stderr,
            http,
            client_options: ClientOptions { handshake_timeout: settings.handshake_timeout, ..client_options },
            oauth,
            deployer,
            seats: Default::default(),
            logs: logs.clone(),
            metrics: metrics.clone(),
        };
        Ok(Self {
            roster: Roster::new(stored, settings.reconcile_concurrency.max(1)),
            connector,
            room: Room::new(slots, events.clone()),
            publisher: CatalogPublisher::new(search, store, events.clone(), settings.drift_window),
            holds,
            reporter: Reporter::new(events),
            call_log: CallLog::new(logs, metrics),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            settings,
        })
    }
}
