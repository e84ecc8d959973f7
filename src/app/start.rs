//! The steps of `Satellite::start`, one per component; each takes only the handles it uses. Managed mode's own
//! steps are in `managed`.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, Instrument};

use super::file_watch::{fingerprint, FileWatch};
use super::maintenance;
use super::managed::{self, BackendLink, ManagedParts};
use super::StartError;
use crate::activity::ActivityTracker;
use crate::analytics::Recorder;
use crate::auth::Authenticator;
use crate::backend::monitor::BackendMonitor;
use crate::config::env::Env;
use crate::config::{self, Config, Mode, StandaloneSource};
use crate::control::standalone::{Directory, StandaloneConfig};
use crate::events::Emitter;
use crate::http::oauth::ResourceUrls;
use crate::http::session::SessionTable;
use crate::http::sse::SseSessions;
use crate::http::{self, McpDeps, StatusDeps};
use crate::instances::sandbox::SandboxPolicy;
use crate::instances::{self, InstanceManager, ManagerDeps, OAuthTokens};
use crate::jobs::{FirstRun, Jobs};
use crate::logcapture::LogCapture;
use crate::mcp::client::ClientOptions;
use crate::metrics::Metrics;
use crate::router::limits::Limits;
use crate::router::{HierarchicalRouter, InstanceRouter};
use crate::search::{SearchError, SearchIndex};
use crate::store::Store;
use crate::toolsets::Toolsets;

/// Replicas on PostgreSQL: how often the toolsets stored through the API and the drift holds are read again.
const TOOLSETS_SYNC: Duration = Duration::from_secs(5);
/// `resources/read` budget (SB §9.5: 60 s).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// What every other component is built on.
pub(super) struct Core {
    /// Allow-list, argument checks, per-team directories, rlimits and isolation of stdio children.
    pub sandbox: Arc<SandboxPolicy>,
    pub metrics: Metrics,
    pub search: SearchIndex,
    pub store: Store,
}

impl Core {
    pub(super) async fn open(config: &Config, env: &Env) -> Result<Core, StartError> {
        // Before the store: a sandbox config error (exit 64) leaves nothing behind.
        let sandbox = SandboxPolicy::for_config(config, env)?;
        info!("{}", sandbox.describe());
        let metrics = Metrics::new().map_err(StartError::Metrics)?;
        // The index (its writer threads, the semantic model when on) is built while the store opens and migrates:
        // neither needs the other, and both stand between the start and the first instance.
        let search = build_index(config, sandbox.limits().cpu_percent.is_some());
        let store = Store::connect_with_reserve(&config.data_dir, &config.database, config.disk_reserve).await?;
        info!(database = %store.describe(), "store");
        let search = search.await.map_err(|err| StartError::Search(SearchError::TaskFailed(err)))??;
        info!(stages = %search.describe_stages(), "tool search");
        Ok(Core { sandbox: Arc::new(sandbox), metrics, search, store })
    }
}

/// The tool index, on the blocking pool. So is the stdio servers' CPU cgroup, which the first spawn would
/// otherwise wait for.
fn build_index(config: &Config, cpu_limits: bool) -> JoinHandle<Result<SearchIndex, StartError>> {
    let (model, cache) = (config.semantic_model.clone(), config.data_dir.join("search"));
    tokio::task::spawn_blocking(move || -> Result<SearchIndex, StartError> {
        if cpu_limits {
            crate::mcp::transport::stdio::prepare_cpu_limits();
        }
        let search = SearchIndex::new()?;
        Ok(match &model {
            Some(model) => search.with_semantic(crate::search::Semantic::load(model, Some(&cache))?),
            None => search,
        })
    })
}

/// The instance manager (no instance yet): in managed mode with the backend's OAuth tokens and deployments.
pub(super) async fn open_manager(
    config: &Config,
    env: &Env,
    core: &Core,
    link: Option<&BackendLink>,
    events: &Emitter,
    logs: &LogCapture,
) -> Result<InstanceManager, StartError> {
    let http = instances::remote_http_client()?;
    let deployer = managed::deployer(config, env, link)?;
    let deps = ManagerDeps {
        oauth: link.map(|link| link.oauth.clone() as Arc<dyn OAuthTokens>),
        sandbox: core.sandbox.clone(),
        search: core.search.clone(),
        settings: config.upstream.clone(),
        client_options: ClientOptions::default(),
        inherited_env: instances::sandbox::inherited_env(env),
        http,
        store: core.store.catalogs(),
        events: events.clone(),
        logs: logs.clone(),
        deployer,
        metrics: core.metrics.clone(),
    };
    Ok(InstanceManager::new(deps).await?)
}

/// The listener and the address it got.
pub(super) async fn bind(listen: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let refused = move |source| StartError::Bind { addr: listen, source };
    let listener = http::bind(listen).await.map_err(refused)?;
    let addr = listener.local_addr().map_err(refused)?;
    Ok((listener, addr))
}

/// Who may connect: the backend's introspection in managed mode, the directory of the first configuration in
/// standalone mode.
pub(super) fn authenticator(managed: Option<&ManagedParts>, first: &StandaloneConfig) -> Authenticator {
    match managed {
        Some(parts) => Authenticator::with_introspection(Directory::default(), parts.introspection.clone()),
        None => Authenticator::new(first.directory.clone()),
    }
}

/// What the HTTP front door serves with.
pub(super) struct FrontDoor<'a> {
    pub config: &'a Config,
    pub started: Instant,
    pub manager: &'a InstanceManager,
    pub store: &'a Store,
    pub search: SearchIndex,
    pub auth: &'a Authenticator,
    pub analytics: &'a Recorder,
    pub events: &'a Emitter,
    pub toolsets: &'a Toolsets,
    pub limits: &'a Limits,
    /// Managed mode: what the backend loops last did.
    pub monitor: Option<Arc<BackendMonitor>>,
}

/// The front door, serving: what the upkeep jobs and the shutdown need of it.
pub(super) struct Served {
    /// Ends once the drain (`cancel`) has let the requests in flight finish.
    pub server: JoinHandle<()>,
    pub sessions: SessionTables,
    pub activity: Arc<ActivityTracker>,
}

/// The session tables of `/mcp`, of the instance endpoints and of the legacy SSE transport.
pub(super) struct SessionTables {
    pub mcp: Arc<SessionTable>,
    pub instances: Arc<SessionTable>,
    pub sse: Arc<SseSessions>,
}

impl FrontDoor<'_> {
    /// Serve on `listener` until `cancel`; the tasks it starts are on `tasks`.
    pub(super) fn serve(
        self,
        listener: TcpListener,
        jobs: &Jobs,
        tasks: &TaskTracker,
        cancel: &CancellationToken,
    ) -> Served {
        let status = self.status(jobs);
        let stop_http = cancel.child_token();
        let sessions = SessionTables::open(self.manager, self.config.upstream.call_timeout);
        sessions.close_streams_on(stop_http.clone(), tasks);
        let activity = Arc::new(ActivityTracker::default());
        let limits = http_limits(self.config);
        let guard = http::guard::HostGuard::new(self.config.allowed_hosts.clone(), self.config.allowed_origins.clone());
        let mcp = self.mcp(&sessions, &activity, tasks);
        let server =
            tokio::spawn(http::serve(listener, status, mcp, limits, guard, async move { stop_http.cancelled().await }));
        Served { server, sessions, activity }
    }

    /// `/status`, `/metrics`, the health checks and the analytics API.
    fn status(&self, jobs: &Jobs) -> StatusDeps {
        let config = self.config;
        StatusDeps {
            jobs: jobs.clone(),
            manager: self.manager.clone(),
            started: self.started,
            debug_route: config.debug_route,
            show_version: config.show_version,
            show_uptime: config.show_uptime,
            mode: if self.monitor.is_some() { "managed" } else { "standalone" },
            backend: self.monitor.clone(),
            metrics_token: config.metrics_token.clone().map(Arc::new),
            analytics: http::analytics::AnalyticsDeps {
                sums: self.store.analytics_sums(),
                catalogs: self.store.catalogs(),
                outbox: self.store.outbox(),
                volume: self.store.volume(),
                recorder: self.analytics.clone(),
                auth: self.auth.clone(),
                manager: self.manager.clone(),
            },
        }
    }

    /// `/mcp`, the instance endpoints and the legacy SSE transport.
    fn mcp(self, sessions: &SessionTables, activity: &Arc<ActivityTracker>, tasks: &TaskTracker) -> McpDeps {
        let (config, manager, analytics) = (self.config, self.manager, self.analytics);
        McpDeps {
            routing: http::Routing {
                router: HierarchicalRouter {
                    manager: manager.clone(),
                    search: self.search,
                    call_timeout: config.upstream.call_timeout,
                    read_timeout: READ_TIMEOUT,
                    analytics: analytics.clone(),
                    views: Default::default(),
                    schemas: Default::default(),
                    summaries: Default::default(),
                    pretty: config.pretty_results,
                    limits: self.limits.clone(),
                },
                instance_router: InstanceRouter {
                    manager: manager.clone(),
                    call_timeout: config.upstream.call_timeout,
                    read_timeout: READ_TIMEOUT,
                    analytics: analytics.clone(),
                    limits: self.limits.clone(),
                },
                toolsets: self.toolsets.clone(),
                manager: manager.clone(),
            },
            gate: http::Gate {
                auth: self.auth.clone(),
                audit: Arc::new(http::AuthAudit::new(self.events.clone())),
                urls: ResourceUrls { public_url: config.public_url.clone() },
            },
            sessions: http::Sessions {
                mcp: sessions.mcp.clone(),
                instances: sessions.instances.clone(),
                legacy: sessions.sse.clone(),
            },
            places: http::callers::Places {
                requests: http::callers::CallerLimits::new(config.max_concurrent_requests_per_caller),
                streams: http::callers::CallerLimits::new(config.max_streams_per_caller),
            },
            background: http::Background {
                activity: activity.clone(),
                events: self.events.clone(),
                tasks: tasks.clone(),
            },
        }
    }
}

impl Served {
    /// The upkeep jobs (`maintenance`): some of them look after the sessions and the activity the front door keeps.
    pub(super) fn schedule_upkeep(
        &self,
        jobs: &Jobs,
        config: &Config,
        manager: &InstanceManager,
        store: &Store,
        events: &Emitter,
    ) {
        maintenance::schedule(maintenance::Maintenance {
            jobs,
            config,
            manager,
            store,
            events,
            activity: self.activity.clone(),
            sessions: [self.sessions.mcp.clone(), self.sessions.instances.clone()],
            sse_sessions: self.sessions.sse.clone(),
        });
    }
}

impl SessionTables {
    fn open(manager: &InstanceManager, call_timeout: Duration) -> SessionTables {
        let (mcp, instances) = (Arc::new(SessionTable::default()), Arc::new(SessionTable::default()));
        // A client that goes without unsubscribing lets go of its subscriptions with its session.
        let releasing = manager.clone();
        instances.on_end(move |ended| {
            if let Some(process_id) = http::session::owned_instance(&ended.owner) {
                releasing.release_subscriptions(&process_id, &ended.id, ended.subscriptions, call_timeout);
            }
        });
        SessionTables { mcp, instances, sse: Arc::new(SseSessions::default()) }
    }

    /// Streams meant to stay open (GET streams, legacy SSE, subscriptions) end as soon as the drain begins,
    /// so they never hold it: only requests in flight get the drain's time.
    fn close_streams_on(&self, closing: CancellationToken, tasks: &TaskTracker) {
        let (tables, legacy) = ([self.mcp.clone(), self.instances.clone()], self.sse.clone());
        tasks.spawn(async move {
            closing.cancelled().await;
            tables.iter().for_each(|table| table.close_streams());
            legacy.close_streams();
        });
    }
}

fn http_limits(config: &Config) -> http::stack::HttpLimits {
    http::stack::HttpLimits {
        max_concurrent_requests: config.max_concurrent_requests,
        request_timeout: config.http_timeout,
        max_connections: config.max_connections,
        header_read_timeout: http::stack::HEADER_READ_TIMEOUT,
        write_timeout: config.write_timeout,
        body_read_timeout: config.body_read_timeout,
    }
}

/// Standalone from a file: the `config-file-watch` job applies its edits. Returns the count of edits refused.
/// What a standalone file says of tools beyond its instances, applied anew when the file changes.
pub(super) struct FileRules {
    pub toolsets: Toolsets,
    pub limits: Limits,
}

pub(super) fn watch_config_file(
    config: &Config,
    first_text: Option<String>,
    jobs: &Jobs,
    manager: &InstanceManager,
    auth: Authenticator,
    rules: FileRules,
    events: &Emitter,
) -> Arc<AtomicU64> {
    let refusals = Arc::new(AtomicU64::new(0));
    let Mode::Standalone(StandaloneSource::File { path, watch_interval }) = &config.mode else { return refusals };
    let text = first_text.unwrap_or_default();
    let start_only = config::start_only_settings(&text);
    let watcher = FileWatch {
        last: Arc::new(parking_lot::Mutex::new(Some(fingerprint(text.as_bytes())))),
        pending: Arc::new(parking_lot::Mutex::new(None)),
        path: path.clone(),
        manager: manager.clone(),
        auth,
        toolsets: rules.toolsets,
        limits: rules.limits,
        refusals: refusals.clone(),
        events: events.clone(),
        start_only: Arc::new(start_only),
        warned: Default::default(),
        unreadable: Default::default(),
    };
    jobs.every("config-file-watch", *watch_interval, FirstRun::AfterOnePeriod, move || watcher.clone().check());
    refusals
}

/// Replicas on PostgreSQL: the `toolsets-sync` and `holds-sync` jobs.
pub(super) fn sync_replicas(store: &Store, jobs: &Jobs, toolsets: &Toolsets, manager: &InstanceManager) {
    if !store.shared() {
        return;
    }
    // Replicas share the database: toolsets another replica wrote reach this one within seconds.
    let toolsets = toolsets.clone();
    jobs.every("toolsets-sync", TOOLSETS_SYNC, FirstRun::AfterOnePeriod, move || {
        let toolsets = toolsets.clone();
        async move { toolsets.refresh().await }
    });
    // ... and so do drift holds another replica made or an admin accepted on another replica.
    let holds = manager.clone();
    jobs.every("holds-sync", TOOLSETS_SYNC, FirstRun::AfterOnePeriod, move || {
        let holds = holds.clone();
        async move { holds.sync_holds().await.map(|_| ()) }
    });
}

/// Standalone: the first configuration, applied in the background (the satellite already serves).
pub(super) fn apply_standalone(first: StandaloneConfig, manager: &InstanceManager, tasks: &TaskTracker) {
    let manager = manager.clone();
    tasks.spawn(
        async move {
            let report = manager.apply(first.desired_state()).await;
            info!(%report, "initial configuration applied");
        }
        .instrument(tracing::info_span!("control.standalone")),
    );
}
