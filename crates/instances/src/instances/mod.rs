//! Per-user instances: the reconciler that moves the live set toward a
//! desired state, and the supervisor of each instance (`lifecycle`): start
//! (spawn or connect, handshake, discovery), crash and restart policy, idle
//! dormancy and respawn, recovery of remote servers, call limits, stop.
//! Only this module spawns processes.
//!
//! Reconciles are serialised; within one, instances are stopped and started
//! with bounded parallelism, and each instance's lifecycle lock keeps it from
//! being worked on twice at once. A failed discovery never clears the tools
//! an instance had. Every status change goes through the transition function
//! and is recorded with its `mcp.server.status_changed` event.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use parking_lot::RwLock;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

use crate::config::UpstreamSettings;
use crate::control::{diff, DesiredState, SnapshotDiff};
use crate::events::{Emitter, StopReason};
use crate::mcp::client::ClientOptions;
use crate::model::{Catalog, InstallationId, InstanceSpec, ProcessId, TeamId, UserId};
use crate::search::SearchIndex;
use crate::store::Catalogs;

pub mod deploy;
mod instance;
mod lifecycle;
pub mod limits;
mod live;
pub mod policy;
mod reconcile;
pub mod sandbox;
pub mod status;

pub use instance::{
    missed_announcements, Instance, InstanceError, Release, StatusEntry, ToolOverrides, MAX_SUBSCRIPTIONS,
};
use limits::ProcessSlots;
pub use reconcile::ReconcileReport;

/// Sent to remote MCP servers (SB §12.2).
pub const REMOTE_USER_AGENT: &str = "Mozilla/5.0 (compatible; DeployStack-Satellite/1.0; +https://deploystack.io)";
/// At most one `resource.limit.exceeded` per (team, resource, instance) in this window.
const LIMIT_EVENT_WINDOW: Duration = Duration::from_secs(60);
/// Time a stdio child gets to leave after stdin closes, before signals.
const STDIO_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Everything the manager needs from outside.
pub struct ManagerDeps {
    pub settings: UpstreamSettings,
    pub client_options: ClientOptions,
    /// The environment every stdio child starts from (already stripped of the satellite's own settings).
    pub inherited_env: BTreeMap<String, String>,
    /// Allow-list, argument checks, per-team directories, rlimits and isolation of stdio children.
    pub sandbox: Arc<sandbox::SandboxPolicy>,
    pub http: reqwest::Client,
    pub store: Catalogs,
    /// The tool index; the manager keeps it in step with every catalog it holds.
    pub search: SearchIndex,
    /// Where lifecycle events go (the SQLite outbox).
    pub events: Emitter,
    /// Server and request log capture (BP §9).
    pub logs: crate::logcapture::LogCapture,
    /// Managed mode: users' OAuth tokens for remote servers that require them (BP §11).
    pub oauth: Option<Arc<dyn OAuthTokens>>,
    /// Managed mode: builds GitHub-deployed servers (SB §9.9).
    pub deployer: Option<Arc<deploy::Deployer>>,
    /// Tool calls by server and outcome, for `/metrics`.
    pub metrics: crate::metrics::Metrics,
}

/// Where a remote instance's OAuth bearer token comes from (the backend, in managed mode).
pub trait OAuthTokens: Send + Sync {
    /// The access token for this instance's user, or why there is none.
    fn bearer<'a>(&'a self, spec: &'a InstanceSpec) -> futures::future::BoxFuture<'a, Result<String, NoToken>>;
    /// The server refused the token: forget it.
    fn invalidate(&self, spec: &InstanceSpec);
}

/// Why an instance has no OAuth token to connect with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoToken {
    /// The user must authorise (again): the backend holds no token for them. A message for the user.
    Required(String),
    /// The backend could not be asked now (5xx, 429, a timeout): the token may well exist, so the instance is
    /// retried like an unreachable server, not sent to re-authorisation (SB §11.3).
    Unavailable(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no instance {0}")]
    NotFound(String),
    #[error("no enabled instance of installation {0}")]
    NoInstallation(String),
}

/// Handle to the instance set; cheap to clone.
#[derive(Clone)]
pub struct InstanceManager {
    inner: Arc<Inner>,
}

struct Inner {
    deps: ManagerDeps,
    slots: Arc<ProcessSlots>,
    overrides: ToolOverrides,
    /// The drift holds among `overrides` (as stored in `tool_holds`): what `sync_holds` compares with the
    /// database when replicas share one.
    holds: RwLock<std::collections::HashSet<(InstallationId, String)>>,
    state: RwLock<State>,
    reconcile: tokio::sync::Mutex<()>,
    /// Turns to start an instance a configuration added or changed: `reconcile_concurrency` at once across every
    /// apply, whose starts run on after it returns.
    starting: tokio::sync::Semaphore,
    ready_tx: watch::Sender<bool>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// One `resource.limit.exceeded` a minute per (team, resource, instance).
    limit_events: crate::events::Throttle,
    /// Bumped whenever what some caller can see may have changed: the live set, a status, a catalog.
    visibility: std::sync::atomic::AtomicU64,
    /// Which member's lists changed, for the hierarchical router's open sessions.
    view_changes: tokio::sync::broadcast::Sender<ViewChange>,
    /// Bumped by every configuration applied, once the live set is the new one (before its new instances have
    /// started): the long-lived client streams check their credential again then.
    applied: watch::Sender<u64>,
    /// The client streams a server's requests made outside any call can reach, by owner.
    seats: Arc<crate::mcp::transport::relay::Seats>,
    /// What keeps an idle instance awake (a client subscribed to its resources): the idle sweep is told it each
    /// round; room made on demand asks this one (`InstanceManager::keep_awake`).
    keep_awake: RwLock<Option<KeepAwake>>,
}

/// Whether an idle instance must stay awake.
pub type KeepAwake = Arc<dyn Fn(&Instance) -> bool + Send + Sync>;

/// What a tool refresh did: the instances discovered again (and the tools they have now), and those left as
/// they were because they were not running.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RefreshReport {
    pub refreshed: Vec<String>,
    pub tools: usize,
    pub skipped: Vec<(String, crate::model::InstanceStatus)>,
}

impl RefreshReport {
    pub fn to_json(&self) -> Value {
        let skipped: Vec<Value> = self
            .skipped
            .iter()
            .map(|(id, status)| serde_json::json!({"process_id": id, "status": status.as_str()}))
            .collect();
        serde_json::json!({"refreshed": self.refreshed, "tools": self.tools, "skipped": skipped})
    }
}

/// A member's lists (as `/mcp` shows them) changed: an instance of theirs came or went, or a re-discovery
/// changed its resources, or its server announced new prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewChange {
    pub team: TeamId,
    pub user: UserId,
    pub resources: bool,
    pub prompts: bool,
}

impl ViewChange {
    /// The notifications a session of this member is sent.
    pub fn notifications(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.resources {
            out.push(crate::mcp::protocol::notification("notifications/resources/list_changed", None));
        }
        if self.prompts {
            out.push(crate::mcp::protocol::notification("notifications/prompts/list_changed", None));
        }
        out
    }
}

/// List changes kept for a session stream that is behind; one that falls further behind is told everything changed.
const VIEW_CHANGES_BUFFER: usize = 1024;

impl Inner {
    /// Tell the owner's open `/mcp` sessions that their lists changed; nobody listening is fine.
    pub(super) fn view_changed(&self, spec: &InstanceSpec, resources: bool, prompts: bool) {
        if resources || prompts {
            let change = ViewChange { team: spec.team_id.clone(), user: spec.user_id.clone(), resources, prompts };
            let _ = self.view_changes.send(change);
        }
    }

    /// Invalidate every caller's cached view of their visible instances.
    pub(super) fn bump_visibility(&self) {
        self.visibility.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[derive(Default)]
struct State {
    /// The last applied desired state, enabled and disabled entries alike.
    /// Shared with the live instances: one copy of each spec.
    desired: BTreeMap<ProcessId, Arc<InstanceSpec>>,
    /// Enabled instances.
    live: live::Live,
    /// Catalogs from the database, handed to instances as they are created.
    stored: HashMap<ProcessId, Arc<Catalog>>,
    /// Instances removed from the desired state, and when: their stored catalogs are deleted only after
    /// `REMOVAL_GRACE` (`purge_removed`), so a configuration cut short for a moment costs no catalog.
    /// With the spec it had (`None`: a catalog of a previous run the configuration did not name at start): a
    /// catalog is handed back only to the same spec.
    removed: HashMap<ProcessId, (std::time::Instant, Option<Arc<InstanceSpec>>)>,
    /// Installations with no instance left, and since when: their drift holds are released after `REMOVAL_GRACE`.
    uninstalled: HashMap<InstallationId, std::time::Instant>,
    applied_once: bool,
}

/// How long what a removed instance or installation leaves behind (its stored catalog, the installation's drift
/// holds) is kept in case it comes back: a configuration file written half, or a backend answering with part of
/// the team's servers for a moment, must not cost an administrator's holds. Past it, `purge_removed` deletes them.
pub const REMOVAL_GRACE: Duration = Duration::from_secs(10 * 60);

impl InstanceManager {
    /// A manager with no instances yet; catalogs stored by a previous run are loaded.
    pub async fn new(deps: ManagerDeps) -> Result<Self, crate::store::StoreError> {
        let mut stored = deps.store.load_catalogs().await?;
        for catalog in stored.values_mut() {
            lifecycle::publish::count_into(catalog).await;
        }
        let state = State { stored: stored.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(), ..State::default() };
        // Drifted tools an admin has not accepted yet stay held across restarts.
        let overrides = ToolOverrides::default();
        let mut holds = std::collections::HashSet::new();
        for held in deps.store.held_tools().await? {
            let installation = InstallationId(held.installation_id);
            overrides.write().entry(installation.clone()).or_default().insert(held.tool_name.clone(), true);
            holds.insert((installation, held.tool_name));
        }
        let (ready_tx, _) = watch::channel(false);
        let starts_at_once = deps.settings.reconcile_concurrency.max(1);
        let lifecycle = &deps.settings.lifecycle;
        let slots = ProcessSlots::new(lifecycle.max_processes_per_user, lifecycle.max_processes);
        Ok(Self {
            inner: Arc::new(Inner {
                slots,
                overrides,
                holds: RwLock::new(holds),
                deps,
                state: RwLock::new(state),
                reconcile: tokio::sync::Mutex::new(()),
                starting: tokio::sync::Semaphore::new(starts_at_once),
                ready_tx,
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                limit_events: crate::events::Throttle::new(LIMIT_EVENT_WINDOW, 10_000),
                visibility: std::sync::atomic::AtomicU64::new(0),
                view_changes: tokio::sync::broadcast::channel(VIEW_CHANGES_BUFFER).0,
                applied: watch::Sender::new(0),
                seats: Arc::default(),
                keep_awake: RwLock::new(None),
            }),
        })
    }

    /// True once a first desired state has been applied.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.inner.ready_tx.subscribe()
    }

    /// Ready with no desired state applied yet: a managed satellite whose first config fetch failed serves (with
    /// no servers) while it asks again. Nothing stored by a previous run is swept as orphaned until a config
    /// says what exists.
    pub fn ready_before_config(&self) {
        self.inner.ready_tx.send_replace(true);
    }

    /// Whether a desired state was applied (by the first config fetch, a retry of it, or a command).
    pub fn has_applied(&self) -> bool {
        self.inner.state.read().applied_once
    }

    /// Changes whenever the instances some caller can see, their statuses or their catalogs may have
    /// changed; a view of [`InstanceManager::instances_for`] taken at one value is good until it moves.
    pub fn visibility_version(&self) -> u64 {
        self.inner.visibility.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn get(&self, process_id: &ProcessId) -> Option<Arc<Instance>> {
        self.inner.state.read().live.get(process_id).cloned()
    }

    /// The enabled instances of one user in one team (SB §7.2).
    pub fn instances_for(&self, user: &UserId, team: &TeamId) -> Vec<Arc<Instance>> {
        self.inner.state.read().live.of_owner(user, team).to_vec()
    }

    pub fn by_instance_path(&self, path: &str) -> Option<Arc<Instance>> {
        self.inner.state.read().live.by_path(path).cloned()
    }

    /// Every enabled instance, ordered by process id.
    pub fn instances(&self) -> Vec<Arc<Instance>> {
        let mut all: Vec<Arc<Instance>> = self.inner.state.read().live.values().cloned().collect();
        all.sort_by(|a, b| a.spec().process_id.cmp(&b.spec().process_id));
        all
    }

    /// Every configured entry, enabled or not.
    pub fn desired(&self) -> Vec<InstanceSpec> {
        self.inner.state.read().desired.values().map(|spec| InstanceSpec::clone(spec)).collect()
    }

    /// Send a request to an instance: wait for a call slot, wake it from dormancy, forward (retrying
    /// unreachable remote servers), and turn failures and recoveries into status changes (SB §11).
    pub async fn call(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, InstanceError> {
        let result = self.inner.call(instance, method, params, timeout, None);
        let payload = result.instrument(upstream_span(instance, method)).await?;
        crate::mcp::transport::read_payload(payload).map_err(InstanceError::Upstream)
    }

    /// A call whose progress, log messages and requests to the client (sampling, elicitation, roots) go to
    /// `relay`, the client that made it.
    pub async fn call_relayed(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&crate::mcp::transport::Relay>,
    ) -> Result<crate::mcp::payload::Payload, InstanceError> {
        // Boxed: this future is ~7 KB, and the router's futures around it grew by twice that (`forward_once`'s was
        // 14 KB): every proxied call's task, copied whole when spawned, carried it (see the routers' future tests).
        Box::pin(self.inner.call(instance, method, params, timeout, relay))
            .instrument(upstream_span(instance, method))
            .await
    }

    /// A long-lived request (2026-07-28 `subscriptions/listen`): sent to the instance with everything it says
    /// going to `relay`, for as long as `limit` or until the caller drops it (the client closed its stream). It
    /// takes no call slot, so open subscriptions never starve calls, and its failure changes no status; it keeps
    /// the instance awake.
    pub async fn listen(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        limit: Duration,
        relay: &crate::mcp::transport::Relay,
    ) -> Result<crate::mcp::payload::Payload, InstanceError> {
        let _listening = instance.listening();
        let client = self.inner.ensure_connected(instance).await?;
        instance.touch();
        let result = client.request_relayed(method, params, limit, Some(relay)).await;
        instance.touch();
        result.map_err(InstanceError::Upstream)
    }

    /// Pass a client's notification on to the instance (nothing when it has no live connection).
    pub async fn notify(&self, instance: &Arc<Instance>, method: &str, params: Option<Value>) {
        if let Some(client) = instance.client() {
            if let Err(err) = client.notify(method, params).await {
                let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
                warn!(process_id = %instance.spec().process_id, method, error = %error, "forwarding a notification failed");
            }
        }
    }

    /// Make sure the instance has a live connection, respawning it from dormancy (single-flight).
    pub async fn wake(&self, instance: &Arc<Instance>) -> Result<(), InstanceError> {
        self.inner.ensure_connected(instance).await.map(|_| ())
    }

    /// Restart one instance now (SB §9.7 manual restart): stop it, forget its crashes and start again.
    /// The way out of `permanently_failed`.
    pub async fn restart(&self, process_id: &ProcessId) -> Result<(), ManagerError> {
        let instance = self.get(process_id).ok_or_else(|| ManagerError::NotFound(process_id.0.clone()))?;
        self.inner.restart(&instance, "Restart requested").await;
        Ok(())
    }

    /// Connect an instance that waits for re-authorisation afresh, with the credentials held now (BP §6.2's
    /// credential check); nothing when it no longer waits by the time its lifecycle lock is held.
    pub async fn reconnect_waiting_for_reauth(&self, process_id: &ProcessId) -> Result<(), ManagerError> {
        let instance = self.get(process_id).ok_or_else(|| ManagerError::NotFound(process_id.0.clone()))?;
        let reason = "Credential check";
        self.inner.restart_from(&instance, reason, Some(crate::model::InstanceStatus::RequiresReauth)).await;
        Ok(())
    }

    /// BP §6.3 `restart`: every enabled instance of the installation, or only `user`'s. Returns how many.
    pub async fn restart_installation(
        &self,
        installation: &InstallationId,
        user: Option<&UserId>,
    ) -> Result<usize, ManagerError> {
        let targets = self.of_installation(installation, user)?;
        let inner = &self.inner;
        futures::stream::iter(targets.iter())
            .for_each_concurrent(inner.deps.settings.reconcile_concurrency, |instance| async move {
                inner.restart(instance, "Restart requested").await
            })
            .await;
        Ok(targets.len())
    }

    /// BP §6.1.1 `update_tool_status`: switch one tool of an installation for every member; the search index
    /// follows at once. Returns the instances affected.
    pub async fn set_tool_status(&self, installation: &InstallationId, tool: &str, disabled: bool) -> usize {
        if !disabled {
            // Enabled by an admin (accepted, or the backend's update_tool_status): a drift hold on it ends too,
            // in the database first, so a replica's `sync_holds` never sees it released here but held there.
            if let Err(err) = self.inner.deps.store.release_hold(installation.as_str(), tool).await {
                warn!(installation_id = %installation, tool, error = %err, "releasing a stored tool hold failed; it returns at the next start");
            }
            self.inner.holds.write().remove(&(installation.clone(), tool.to_owned()));
        }
        self.inner.overrides.write().entry(installation.clone()).or_default().insert(tool.to_owned(), disabled);
        let affected: Vec<Arc<Instance>> =
            self.instances().into_iter().filter(|i| &i.spec().installation_id == installation).collect();
        for instance in &affected {
            if let Some(catalog) = instance.catalog() {
                self.inner.index(instance, &catalog).await;
            }
        }
        // Views narrowed to a toolset leave disabled tools out: they are rebuilt with the tool back (or gone).
        self.inner.bump_visibility();
        affected.len()
    }

    /// Replicas on one database: make this replica's drift holds what the database says, so a tool another
    /// replica held is held here too, and one accepted on another replica (`POST /api/tools/accept`) is served
    /// here again. Returns how many holds changed.
    pub async fn sync_holds(&self) -> Result<usize, crate::store::StoreError> {
        // This replica's holds first, then the database's: holds and releases are written to the database before
        // memory, so what this replica holds and the database no longer does was released, never just made.
        let here = self.inner.holds.read().clone();
        let stored: std::collections::HashSet<(InstallationId, String)> = self
            .inner
            .deps
            .store
            .held_tools()
            .await?
            .into_iter()
            .map(|h| (InstallationId(h.installation_id), h.tool_name))
            .collect();
        let mut changed = 0;
        for (installation, tool) in here.difference(&stored) {
            info!(installation_id = %installation, tool, "a held tool was accepted on another replica; served again");
            self.set_tool_status(installation, tool, false).await;
            changed += 1;
        }
        for (installation, tool) in stored.difference(&here) {
            info!(installation_id = %installation, tool, "a tool another replica held is held here too");
            self.inner.holds.write().insert((installation.clone(), tool.clone()));
            self.set_tool_status(installation, tool, true).await;
            changed += 1;
        }
        Ok(changed)
    }

    /// A credential check found the server refusing this user's credentials (BP §6.2).
    pub async fn require_reauth(&self, instance: &Arc<Instance>, message: String) {
        self.inner.set_status(instance, crate::model::InstanceStatus::RequiresReauth, Some(message)).await;
    }

    /// BP §6.1.3 `mcp_redeploy`: every instance of the installation stops, its deployment directory goes, and
    /// each starts again (deploying afresh). Returns how many instances there were.
    pub async fn redeploy(&self, installation: &InstallationId) -> Result<usize, ManagerError> {
        let targets = self.of_installation(installation, None)?;
        let inner = &self.inner;
        for instance in &targets {
            inner.halt(instance, "Redeploying from GitHub").await;
        }
        if let (Some(deployer), Some(first)) = (&inner.deps.deployer, targets.first()) {
            deployer.remove(&first.spec().team_id, installation).await;
        }
        futures::stream::iter(targets.iter())
            .for_each_concurrent(inner.deps.settings.reconcile_concurrency, |instance| async move {
                inner.restart(instance, "Redeploying from GitHub").await
            })
            .await;
        Ok(targets.len())
    }

    /// BP §6.3 `kill`: stop the instances of an installation (or one user's) until a restart or config change.
    pub async fn stop_installation(
        &self,
        installation: &InstallationId,
        user: Option<&UserId>,
    ) -> Result<usize, ManagerError> {
        let targets = self.of_installation(installation, user)?;
        for instance in &targets {
            self.inner.halt(instance, "Stopped by command").await;
        }
        Ok(targets.len())
    }

    /// BP §6.1.2 `mcp_recovery`: reconnect and rediscover; true when the instance came back online.
    pub async fn rediscover(&self, instance: &Arc<Instance>) -> bool {
        self.inner.rediscover(instance).await
    }

    /// The enabled instances of an installation, or only `user`'s.
    pub fn of_installation(
        &self,
        installation: &InstallationId,
        user: Option<&UserId>,
    ) -> Result<Vec<Arc<Instance>>, ManagerError> {
        let targets: Vec<Arc<Instance>> = self
            .instances()
            .into_iter()
            .filter(|i| &i.spec().installation_id == installation && user.is_none_or(|u| &i.spec().user_id == u))
            .collect();
        if targets.is_empty() {
            return Err(ManagerError::NoInstallation(installation.0.clone()));
        }
        Ok(targets)
    }

    /// Discover `instances` again now, serving their current tools meanwhile; instances not running are
    /// reported, not started.
    pub async fn refresh_tools(&self, instances: Vec<Arc<Instance>>) -> RefreshReport {
        self.inner.refresh_tools(instances).await
    }

    /// Discover again the online instances whose server asks for it periodically and whose catalog is older
    /// than that period; returns how many.
    pub async fn rediscover_stale(&self) -> usize {
        self.inner.rediscover_stale().await
    }

    /// Stop stdio instances idle past the timeout (SB §9.8), except those `keep_awake` names (a client still
    /// subscribed to what the server announces); returns how many went dormant.
    pub async fn sweep_idle(&self, keep_awake: impl Fn(&Instance) -> bool + Sync) -> usize {
        self.inner.sweep_idle(&keep_awake).await
    }

    /// What keeps an idle instance awake when room is made for a start over the process cap (the idle sweep is
    /// given its own each round).
    pub fn keep_awake(&self, keep_awake: KeepAwake) {
        *self.inner.keep_awake.write() = Some(keep_awake);
    }

    /// Undo, in the background, the resource subscriptions `uris` their holders let go of (`resources/unsubscribe`).
    /// Each is decided when its turn comes, under the instance's subscription lock: one a client holds again by
    /// then stays; with no connection (dormant, failed) only what a restart would ask again is forgotten, so no
    /// server is started to be told. A task of the manager's, awaited at shutdown.
    pub fn unsubscribe_later(&self, instance: Arc<Instance>, uris: Vec<String>, timeout: Duration) {
        if uris.is_empty() {
            return;
        }
        let manager = self.clone();
        self.inner.tasks.spawn(async move {
            for uri in uris {
                let _changing = instance.subscription_lock().await;
                if instance.subscription_held(&uri) {
                    continue;
                }
                if instance.client().is_none() {
                    instance.note_subscription(&uri, false);
                    continue;
                }
                let params = serde_json::json!({ "uri": uri });
                if let Err(err) = manager.call(&instance, "resources/unsubscribe", Some(params), timeout).await {
                    debug!(process_id = %instance.spec().process_id, uri, error = %err, "undoing a subscription no client holds failed");
                }
            }
        });
    }

    /// A client of `process_id`'s endpoint ended (its session expired, was deleted or evicted) still subscribed to
    /// `uris`: its holds go, and what no other client holds is undone upstream (`unsubscribe_later`).
    pub fn release_subscriptions(
        &self,
        process_id: &ProcessId,
        holder: &str,
        mut uris: Vec<String>,
        timeout: Duration,
    ) {
        let Some(instance) = self.get(process_id) else { return };
        uris.retain(|uri| instance.release_subscription(uri, holder) != Release::OthersHold);
        self.unsubscribe_later(instance, uris, timeout);
    }

    /// The client streams on which the servers' requests made outside any call reach their owners' clients.
    pub fn seats(&self) -> &Arc<crate::mcp::transport::relay::Seats> {
        &self.inner.seats
    }

    /// Members' list changes as they happen (the hierarchical router's session streams follow them).
    /// Changes each time a configuration is applied (its users, tokens and instances are then current).
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.inner.applied.subscribe()
    }

    pub fn view_changes(&self) -> tokio::sync::broadcast::Receiver<ViewChange> {
        self.inner.view_changes.subscribe()
    }

    /// The satellite's metrics (the routers count discovers here too).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.deps.metrics
    }

    /// Live stdio children counted against the process caps.
    pub fn processes(&self) -> usize {
        self.inner.slots.in_use()
    }

    /// Stop every instance and background task.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        let all: Vec<Arc<Instance>> = inner.state.write().live.drain();
        futures::stream::iter(all)
            .for_each_concurrent(32, |instance| async move { inner.stop(&instance, StopReason::Shutdown).await })
            .await;
        inner.tasks.close();
        inner.tasks.wait().await;
    }
}

/// The shared reqwest client for remote MCP servers: pooled, with the satellite's user agent, following
/// redirects only within the server's origin (`same_origin_redirects`).
pub fn remote_http_client() -> Result<reqwest::Client, reqwest::Error> {
    outbound_http().redirect(reqwest::redirect::Policy::custom(same_origin_redirects)).build()
}

/// What every outbound client of the satellite shares: its user agent, connect timeout and pool.
fn outbound_http() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(REMOTE_USER_AGENT)
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(90))
}

/// The client for downloads (GitHub tarballs): reqwest's own redirect policy, since GitHub answers a download
/// with a redirect to another origin (`codeload.github.com`); reqwest drops the `Authorization` header there, and
/// the request carries no other credential.
pub fn download_http_client() -> Result<reqwest::Client, reqwest::Error> {
    outbound_http().build()
}

/// Most redirects followed in one request.
const MAX_REDIRECTS: usize = 10;

/// A redirect is followed only within the origin the server's URL names (or from `http` to `https` on the same
/// host): a request carries the server's headers (`X-API-Key`, a bearer token), which reqwest strips on another
/// host only when they are the standard credential headers. A server pointing elsewhere fails the request with
/// a reason that names where it points (not its query, where a key may be).
fn same_origin_redirects(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let Some(first) = attempt.previous().first() else { return attempt.stop() };
    let next = attempt.url();
    let same_origin = next.origin() == first.origin();
    let upgraded = first.scheme() == "http"
        && next.scheme() == "https"
        && next.host_str() == first.host_str()
        && next.port().is_none()
        && first.port().is_none();
    if attempt.previous().len() > MAX_REDIRECTS {
        attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
    } else if same_origin || upgraded {
        attempt.follow()
    } else {
        let elsewhere = next.origin().ascii_serialization();
        attempt.error(format!(
            "the server redirected to another origin ({elsewhere}), which the satellite does not follow with the \
             server's headers; configure that URL if it is the server's"
        ))
    }
}

/// One request to an upstream server, as a span (a child of the client's request span; exported as a trace
/// span when OpenTelemetry is on). Never the arguments: only which server and which method. At `debug`: the
/// satellite's info and warn lines about an instance name it already, and a span built on every call for log
/// lines alone cost about 3% of a call's CPU (docs/performance-history.md, 2026-11-27 10:50).
fn upstream_span(instance: &Instance, method: &str) -> tracing::Span {
    let spec = instance.spec();
    tracing::debug_span!(
        "mcp.upstream",
        server = %spec.server_slug,
        method = %method,
        transport = spec.upstream.transport_name(),
        process_id = %spec.process_id,
    )
}

/// The key under which a member's client streams take seats (`Seats`): an instance's server asks only the
/// clients of the member it belongs to, in its team.
pub fn seat_owner(team: &crate::model::TeamId, user: &crate::model::UserId) -> String {
    format!("{}\u{0}{}", team.0, user.0)
}
