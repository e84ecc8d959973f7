//! Per-user instances: the reconciler that moves the live set toward a
//! desired state, instance start (spawn or connect, handshake, discovery),
//! stop, and status tracking. Only this module spawns processes.
//!
//! Reconciles are serialised; within one, instances are stopped and started
//! with bounded parallelism, and each instance's lifecycle lock keeps it from
//! being worked on twice at once. A failed discovery never clears the tools
//! an instance had.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use parking_lot::RwLock;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::config::UpstreamSettings;
use crate::control::{diff, DesiredState, SnapshotDiff};
use crate::discovery;
use crate::mcp::client::{ClientOptions, McpClient};
use crate::mcp::transport::{SseTransport, StdioTransport, StreamableHttpTransport, Transport, UpstreamError};
use crate::model::{Catalog, InstanceSpec, InstanceStatus, ProcessId, TeamId, Upstream, UserId};
use crate::search::{SearchIndex, ToolDoc};
use crate::store::{CatalogOwner, Store};

mod instance;
pub mod sandbox;
pub mod status;

pub use instance::{Instance, InstanceError, StatusEntry};
use status::{status_for, Failure};

/// Sent to remote MCP servers (SB §12.2).
pub const REMOTE_USER_AGENT: &str = "Mozilla/5.0 (compatible; DeployStack-Satellite/1.0; +https://deploystack.io)";
/// Time a stdio child gets to leave after stdin closes, before signals.
const STDIO_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What one reconcile did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    pub added: usize,
    pub removed: usize,
    pub modified: usize,
    pub unchanged: usize,
    pub rejected: usize,
}

/// Everything the manager needs from outside.
pub struct ManagerDeps {
    pub settings: UpstreamSettings,
    pub client_options: ClientOptions,
    /// The environment every stdio child starts from (already stripped of the satellite's own settings).
    pub inherited_env: BTreeMap<String, String>,
    /// Allow-list, argument checks, per-team directories, rlimits and isolation of stdio children.
    pub sandbox: Arc<sandbox::SandboxPolicy>,
    pub http: reqwest::Client,
    pub store: Store,
    /// The tool index; the manager keeps it in step with every catalog it holds.
    pub search: SearchIndex,
}

/// Handle to the instance set; cheap to clone.
#[derive(Clone)]
pub struct InstanceManager {
    inner: Arc<Inner>,
}

struct Inner {
    deps: ManagerDeps,
    state: RwLock<State>,
    reconcile: tokio::sync::Mutex<()>,
    ready_tx: watch::Sender<bool>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct State {
    /// The last applied desired state, enabled and disabled entries alike.
    desired: BTreeMap<ProcessId, InstanceSpec>,
    /// Enabled instances.
    live: HashMap<ProcessId, Arc<Instance>>,
    /// Catalogs from the database, handed to instances as they are created.
    stored: HashMap<ProcessId, Arc<Catalog>>,
    applied_once: bool,
}

impl InstanceManager {
    /// A manager with no instances yet; catalogs stored by a previous run are loaded.
    pub async fn new(deps: ManagerDeps) -> Result<Self, crate::store::StoreError> {
        let stored = deps.store.load_catalogs().await?;
        let state = State { stored: stored.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(), ..State::default() };
        let (ready_tx, _) = watch::channel(false);
        Ok(Self {
            inner: Arc::new(Inner {
                deps,
                state: RwLock::new(state),
                reconcile: tokio::sync::Mutex::new(()),
                ready_tx,
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
            }),
        })
    }

    /// True once a first desired state has been applied.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.inner.ready_tx.subscribe()
    }

    pub fn get(&self, process_id: &ProcessId) -> Option<Arc<Instance>> {
        self.inner.state.read().live.get(process_id).cloned()
    }

    /// The enabled instances of one user in one team (SB §7.2).
    pub fn instances_for(&self, user: &UserId, team: &TeamId) -> Vec<Arc<Instance>> {
        let state = self.inner.state.read();
        let mut found: Vec<Arc<Instance>> =
            state.live.values().filter(|i| &i.spec().user_id == user && &i.spec().team_id == team).cloned().collect();
        found.sort_by(|a, b| a.spec().process_id.cmp(&b.spec().process_id));
        found
    }

    pub fn by_instance_path(&self, path: &str) -> Option<Arc<Instance>> {
        let state = self.inner.state.read();
        state.live.values().find(|i| i.spec().instance_path.as_deref() == Some(path)).cloned()
    }

    /// Every enabled instance, ordered by process id.
    pub fn instances(&self) -> Vec<Arc<Instance>> {
        let mut all: Vec<Arc<Instance>> = self.inner.state.read().live.values().cloned().collect();
        all.sort_by(|a, b| a.spec().process_id.cmp(&b.spec().process_id));
        all
    }

    /// Every configured entry, enabled or not.
    pub fn desired(&self) -> Vec<InstanceSpec> {
        self.inner.state.read().desired.values().cloned().collect()
    }

    /// Move the live set to `desired`: stop what was removed or changed, start what was added or changed.
    pub async fn apply(&self, desired: DesiredState) -> ReconcileReport {
        let inner = &self.inner;
        let _serial = inner.reconcile.lock().await;
        let current = inner.state.read().desired.clone();
        let changes: SnapshotDiff = diff(&current, &desired.instances);
        let report = ReconcileReport {
            added: changes.added.len(),
            removed: changes.removed.len(),
            modified: changes.modified.len(),
            unchanged: changes.unchanged.len(),
            rejected: desired.rejected.len(),
        };
        if !changes.is_empty() {
            info!(
                added = report.added,
                removed = report.removed,
                modified = report.modified,
                unchanged = report.unchanged,
                "applying config"
            );
        }

        let retiring: Vec<Arc<Instance>> = {
            let mut state = inner.state.write();
            changes.removed.iter().chain(&changes.modified).filter_map(|id| state.live.remove(id)).collect()
        };
        let concurrency = inner.deps.settings.reconcile_concurrency;
        futures::stream::iter(retiring)
            .for_each_concurrent(concurrency, |instance| async move { inner.stop(&instance).await })
            .await;
        for id in &changes.removed {
            if let Err(err) = inner.deps.store.delete_catalog(id).await {
                warn!(process_id = %id, error = %err, "deleting stored catalog failed");
            }
        }
        for id in changes.removed.iter().chain(&changes.modified) {
            inner.unindex(id).await;
        }

        let starting: Vec<Arc<Instance>> = {
            let mut state = inner.state.write();
            let mut starting = Vec::new();
            for id in changes.added.iter().chain(&changes.modified) {
                let spec = &desired.instances[id];
                if !spec.enabled {
                    continue;
                }
                // A changed instance starts from scratch; an added one may have tools from a previous run.
                let stored = state.stored.remove(id).filter(|_| changes.added.contains(id));
                let instance = Arc::new(Instance::new(spec.clone(), stored));
                state.live.insert(id.clone(), instance.clone());
                starting.push(instance);
            }
            state.desired = desired.instances.clone();
            starting
        };
        for instance in &starting {
            // Tools from a previous run are searchable (when the instance is online) before rediscovery.
            if let Some(catalog) = instance.catalog() {
                inner.index(instance.spec(), &catalog).await;
            }
        }
        futures::stream::iter(starting)
            .for_each_concurrent(concurrency, |instance| async move { inner.start(&instance).await })
            .await;

        let first = !std::mem::replace(&mut inner.state.write().applied_once, true);
        if first {
            // Catalogs of instances that no longer exist would otherwise live forever.
            let orphans: Vec<ProcessId> = inner.state.write().stored.drain().map(|(id, _)| id).collect();
            for id in orphans.iter().filter(|id| !desired.instances.contains_key(*id)) {
                if let Err(err) = inner.deps.store.delete_catalog(id).await {
                    warn!(process_id = %id, error = %err, "deleting orphaned catalog failed");
                }
            }
        }
        inner.ready_tx.send_replace(true);
        report
    }

    /// Stop every instance and background task.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        let all: Vec<Arc<Instance>> = inner.state.write().live.drain().map(|(_, i)| i).collect();
        futures::stream::iter(all).for_each_concurrent(32, |instance| async move { inner.stop(&instance).await }).await;
        inner.tasks.close();
        inner.tasks.wait().await;
    }
}

impl Inner {
    async fn start(self: &Arc<Self>, instance: &Arc<Instance>) {
        let span = tracing::info_span!("instance", process_id = %instance.spec().process_id, server = %instance.spec().server_slug);
        async {
            let _lifecycle = instance.lifecycle.lock().await;
            if instance.retired.is_cancelled() {
                return;
            }
            let connecting = match instance.spec().upstream {
                Upstream::Stdio { .. } => "Connecting to MCP server process",
                _ => "Connecting to MCP server",
            };
            self.set_status(instance, InstanceStatus::Connecting, Some(connecting.into())).await;
            let connected = tokio::select! {
                _ = instance.retired.cancelled() => return,
                connected = self.connect(instance.spec()) => connected,
            };
            let client = match connected {
                Ok(client) => Arc::new(client),
                Err(err) => {
                    let (status, message) = status_for(&instance.spec().upstream, &Failure::Connect(&err));
                    self.set_status(instance, status, Some(message)).await;
                    return;
                }
            };
            instance.set_client(client.clone());
            self.watch(instance.clone(), client.clone());
            self.discover_into(instance, &client).await;
        }
        .instrument(span)
        .await
    }

    async fn stop(&self, instance: &Arc<Instance>) {
        instance.retired.cancel();
        let _lifecycle = instance.lifecycle.lock().await;
        if let Some(client) = instance.take_client() {
            client.close().await;
        }
    }

    async fn connect(&self, spec: &InstanceSpec) -> Result<McpClient, UpstreamError> {
        let label = spec.process_id.0.clone();
        let transport =
            match &spec.upstream {
                Upstream::Stdio { .. } => {
                    let launch = self.deps.sandbox.prepare(spec, &self.deps.inherited_env).map_err(|err| {
                        warn!(process_id = %label, error = %err, "mcp server refused by the sandbox");
                        UpstreamError::Spawn(err.to_string())
                    })?;
                    let dropped = &launch.dropped_env;
                    if !dropped.is_empty() {
                        warn!(process_id = %label, dropped = ?dropped, "refused environment variables for mcp server");
                    }
                    Transport::Stdio(StdioTransport::spawn(launch.into_stdio_launch(label, STDIO_CLOSE_GRACE))?)
                }
                Upstream::StreamableHttp { url, headers, .. } => Transport::StreamableHttp(
                    StreamableHttpTransport::new(label, self.deps.http.clone(), url.clone(), headers)?,
                ),
                Upstream::Sse { url, headers, timeout } => Transport::Sse(
                    SseTransport::connect(label, self.deps.http.clone(), url.clone(), headers, *timeout).await?,
                ),
            };
        let mut options = self.deps.client_options.clone();
        options.handshake_timeout = self.deps.settings.handshake_timeout;
        let stderr = match &transport {
            Transport::Stdio(stdio) => Some(stdio.stderr_handle()),
            _ => None,
        };
        McpClient::connect(transport, &options).await.map_err(|err| {
            // The child's stderr usually says why a handshake failed.
            match stderr.and_then(|tail| tail.lines().pop()) {
                Some(last) => err.with_detail(&format!("last stderr line: {last}")),
                None => err,
            }
        })
    }

    /// Run discovery on a connected instance and publish the result.
    async fn discover_into(&self, instance: &Arc<Instance>, client: &Arc<McpClient>) {
        self.set_status(
            instance,
            InstanceStatus::DiscoveringTools,
            Some("Discovering available tools from MCP server".into()),
        )
        .await;
        let request_timeout = self.request_timeout(instance.spec());
        let budget = self.deps.settings.discovery_timeout;
        let discovered = tokio::select! {
            _ = instance.retired.cancelled() => return,
            found = tokio::time::timeout(budget, discovery::discover(client, request_timeout)) => found,
        };
        match discovered {
            Ok(Ok(catalog)) => {
                let catalog = Arc::new(catalog);
                if let Err(err) = self.deps.store.save_catalog(&CatalogOwner::from(instance.spec()), &catalog).await {
                    warn!(process_id = %instance.spec().process_id, error = %err, "saving catalog failed");
                }
                info!(process_id = %instance.spec().process_id, tools = catalog.tools.len(), resources = catalog.resources.len(), "tools discovered");
                self.index(instance.spec(), &catalog).await;
                instance.set_catalog(catalog);
                self.set_status(instance, InstanceStatus::Online, Some("MCP server is online and ready".into())).await;
            }
            Ok(Err(err)) => {
                let (status, message) = status_for(&instance.spec().upstream, &Failure::Discovery(&err));
                self.set_status(instance, status, Some(message)).await;
            }
            Err(_) => {
                let message = format!("Process error: discovery timed out after {}s", budget.as_secs());
                self.set_status(instance, InstanceStatus::Offline, Some(message)).await;
            }
        }
    }

    async fn index(&self, spec: &InstanceSpec, catalog: &Catalog) {
        let docs = catalog
            .tools
            .iter()
            .filter(|tool| !spec.disabled_tools.contains(&tool.name))
            .map(|tool| ToolDoc {
                process_id: spec.process_id.0.clone(),
                server_slug: spec.server_slug.clone(),
                tool_name: tool.name.clone(),
                description: tool.description.clone(),
                input_schema: tool.input_schema.clone(),
            })
            .collect();
        if let Err(err) = self.deps.search.replace_instance(&spec.process_id.0, docs).await {
            warn!(process_id = %spec.process_id, error = %err, "indexing tools failed");
        }
    }

    async fn unindex(&self, id: &ProcessId) {
        if let Err(err) = self.deps.search.remove_instance(&id.0).await {
            warn!(process_id = %id, error = %err, "removing tools from the index failed");
        }
    }

    fn request_timeout(&self, spec: &InstanceSpec) -> Duration {
        match &spec.upstream {
            Upstream::Stdio { .. } => self.deps.settings.call_timeout,
            Upstream::StreamableHttp { timeout, .. } | Upstream::Sse { timeout, .. } => *timeout,
        }
    }

    /// Follow a stdio child: mark the instance when it dies, rediscover when its tool list changes.
    fn watch(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>) {
        let Transport::Stdio(stdio) = client.transport() else { return };
        let mut notifications = stdio.subscribe();
        let inner = self.clone();
        let span = tracing::info_span!("instance.watch", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let Transport::Stdio(stdio) = client.transport() else { return };
                loop {
                    tokio::select! {
                        biased;
                        _ = instance.retired.cancelled() => return,
                        _ = inner.shutdown.cancelled() => return,
                        exit = stdio.exited() => {
                            if instance.retired.is_cancelled() {
                                return;
                            }
                            let mut message = format!("Process error: {}", exit.describe());
                            if let Some(last) = stdio.stderr_tail().last() {
                                message.push_str(&format!("; last stderr line: {last}"));
                            }
                            inner.set_status(&instance, InstanceStatus::Offline, Some(message)).await;
                            return;
                        }
                        note = notifications.recv() => match note {
                            Ok(note) if note.get("method").and_then(Value::as_str) == Some("notifications/tools/list_changed") => {
                                let _lifecycle = instance.lifecycle.lock().await;
                                if instance.retired.is_cancelled() {
                                    return;
                                }
                                info!("tool list changed upstream, rediscovering");
                                inner.discover_into(&instance, &client).await;
                            }
                            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                // The owner task is gone; the exit branch reports it.
                                stdio.exited().await;
                            }
                        },
                    }
                }
            }
            .instrument(span),
        );
    }

    async fn set_status(&self, instance: &Instance, status: InstanceStatus, message: Option<String>) {
        let entry = instance.set_status(status, message);
        let spec = instance.spec();
        match status {
            InstanceStatus::Error
            | InstanceStatus::Offline
            | InstanceStatus::RequiresReauth
            | InstanceStatus::PermanentlyFailed => {
                warn!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, message = ?entry.message, "instance status changed")
            }
            _ => {
                info!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, "instance status changed")
            }
        }
        if let Err(err) = self.deps.store.record_status(spec, status, entry.message.as_deref(), entry.updated_at).await
        {
            warn!(process_id = %spec.process_id, error = %err, "recording status failed");
        }
    }
}

/// The shared reqwest client for remote MCP servers: pooled, with the satellite's user agent.
pub fn remote_http_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .user_agent(REMOTE_USER_AGENT)
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(90))
        .build()
}
