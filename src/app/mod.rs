//! Assembly: build every component, start the long-lived tasks, and own the
//! shutdown order. The only place where the config source, the instance
//! manager and the HTTP surface meet.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::auth::introspection::{Introspect, Introspected, TokenIntrospection, Verdict};
use crate::auth::{Authenticator, Principal};
use crate::backend::client::BackendClient;
use crate::backend::managed::{self, Managed, ManagedDeps};
use crate::backend::metrics::ProcessMetrics;
use crate::backend::monitor::BackendMonitor;
use crate::backend::oauth::{BackendGithub, BackendOAuth};
use crate::backend::startup::{self, IdentityError};
use crate::config::env::Env;
use crate::config::{self, Config, ConfigError, Mode, StandaloneSource};
use crate::control::standalone::{self, StandaloneConfig};
use crate::control::standalone::{Directory, DEFAULT_SCOPES};
use crate::events::Emitter;
use crate::http::oauth::ResourceUrls;
use crate::http::session::SessionTable;
use crate::http::sse::SseSessions;
use crate::http::{self, McpDeps, StatusDeps};
use crate::instances::deploy::{DeploySettings, Deployer};
use crate::instances::{self, InstanceManager, ManagerDeps, OAuthTokens};
use crate::jobs::{FirstRun, Jobs};
use crate::logcapture::LogCapture;
use crate::mcp::client::ClientOptions;
use crate::model::{TeamId, UserId};
use crate::router::{HierarchicalRouter, InstanceRouter};
use crate::search::{SearchError, SearchIndex};
use crate::store::{Store, StoreError};

mod file_watch;
pub mod import;
mod maintenance;
pub mod search;
mod shutdown;
pub mod tokens;

use file_watch::{fingerprint, FileWatch};

/// Expired introspection results are removed on this period (SB §19).
const INTROSPECTION_SWEEP: Duration = Duration::from_secs(300);
/// Replicas on PostgreSQL, managed: how often the shared credentials are compared with the ones in use.
const IDENTITY_SYNC: Duration = Duration::from_secs(10);
/// Replicas on PostgreSQL: how often the toolsets stored through the API and the drift holds are read again.
const TOOLSETS_SYNC: Duration = Duration::from_secs(5);
/// `resources/read` budget (SB §9.5: 60 s).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Identity(#[from] IdentityError),
    #[error("cannot open the database: {0}")]
    Store(#[from] StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot build the http client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("cannot locate the satellite executable for the demo server: {0}")]
    Exe(std::io::Error),
    #[error("cannot create the search index: {0}")]
    Search(#[from] SearchError),
    #[error("the semantic search stage: {0}")]
    Semantic(#[from] crate::search::SemanticError),
    #[error("cannot set up the metrics: {0}")]
    Metrics(prometheus::Error),
}

impl StartError {
    /// Configuration problems exit 64, everything else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            StartError::Config(_) => config::EXIT_CONFIG,
            _ => 1,
        }
    }
}

/// A running satellite.
pub struct Satellite {
    addr: SocketAddr,
    manager: InstanceManager,
    store: Store,
    cancel: CancellationToken,
    tasks: TaskTracker,
    jobs: Jobs,
    server: JoinHandle<()>,
    /// How long the HTTP drain waits for requests in flight (`drain_seconds`).
    drain: Duration,
    config_refusals: Arc<AtomicU64>,
    /// The log-capture flusher, stopped (and flushed) after the instances.
    logs_stop: CancellationToken,
    logs_task: JoinHandle<()>,
    /// Managed mode: the heartbeat, poller and command worker (stopped with the jobs).
    pollers: CancellationToken,
    /// Managed mode: the event uploader, stopped (with a last flush) after the logs.
    uploads: CancellationToken,
    upload_task: Option<JoinHandle<()>>,
    /// The clients' activity and the emitter of its report: what came since the last report (every 30 s) is
    /// reported once more at shutdown, after the report job has stopped.
    activity: Arc<crate::activity::ActivityTracker>,
    emitter: Emitter,
}

/// The first desired state, read and validated before anything starts.
pub fn initial_standalone(config: &Config) -> Result<StandaloneConfig, StartError> {
    first_read(config).map(|(first, _)| first)
}

/// The first desired state and, for a file, the text it was read from: the watcher compares later edits with
/// exactly that text, so an edit made while the satellite starts is still seen as one.
fn first_read(config: &Config) -> Result<(StandaloneConfig, Option<String>), StartError> {
    match &config.mode {
        Mode::Managed(_) => Ok((StandaloneConfig::default(), None)),
        Mode::Standalone(StandaloneSource::Embedded(demo)) => {
            let exe = std::env::current_exe().map_err(StartError::Exe)?;
            Ok((standalone::embedded(demo, exe)?, None))
        }
        Mode::Standalone(StandaloneSource::File { path, .. }) => {
            let text = config::read_text(path)?;
            Ok((standalone::from_file(&config::parse_file_at(&text, path)?)?, Some(text)))
        }
    }
}

impl Satellite {
    /// Open the store, bind the listener, start serving and apply the first configuration in the background.
    pub async fn start(config: Config, env: &Env) -> Result<Satellite, StartError> {
        let started = Instant::now();
        let (first, first_text) = first_read(&config)?;
        // Before the store: a sandbox config error (exit 64) leaves nothing behind.
        let sandbox = instances::sandbox::SandboxPolicy::for_config(&config, env)?;
        info!("{}", sandbox.describe());
        let metrics = crate::metrics::Metrics::new().map_err(StartError::Metrics)?;
        // The index (its writer threads, the semantic model when on) is built while the store opens and migrates:
        // neither needs the other, and both stand between the start and the first instance.
        // So is the stdio servers' CPU cgroup, which the first spawn would otherwise wait for.
        let (model, cache) = (config.semantic_model.clone(), config.data_dir.join("search"));
        let cpu_limits = sandbox.limits().cpu_percent.is_some();
        let search = tokio::task::spawn_blocking(move || -> Result<SearchIndex, StartError> {
            if cpu_limits {
                crate::mcp::transport::stdio::prepare_cpu_limits();
            }
            let search = SearchIndex::new()?;
            Ok(match &model {
                Some(model) => search.with_semantic(crate::search::Semantic::load(model, Some(&cache))?),
                None => search,
            })
        });
        let store = Store::connect_with_reserve(&config.data_dir, &config.database, config.disk_reserve).await?;
        info!(database = %store.describe(), "store");
        let search = search.await.map_err(|err| StartError::Search(SearchError::TaskFailed(err)))??;
        info!(stages = %search.describe_stages(), "tool search");
        let toolsets = crate::toolsets::Toolsets::load(store.clone(), first.toolsets.clone()).await?;
        let emitter = Emitter::new(store.clone());
        let logs = LogCapture::new(emitter.clone());
        // Managed mode: the backend client (no IO yet) and the OAuth tokens it serves to remote instances.
        let backend_client = match &config.mode {
            Mode::Managed(settings) => Some(Arc::new(BackendClient::new(&settings.backend_url)?)),
            Mode::Standalone(_) => None,
        };
        let oauth = backend_client.clone().map(|client| Arc::new(BackendOAuth::new(client)));
        // Managed mode: GitHub-deployed servers, one directory per installation (SB §9.9).
        let remote_http = instances::remote_http_client()?;
        let deployer = match (&config.mode, &backend_client) {
            (Mode::Managed(settings), Some(client)) => Some(Arc::new(Deployer::new(DeploySettings {
                root: settings.deployments_dir.clone().unwrap_or_else(|| config.data_dir.join("deployments")),
                tarball_base: settings.github_tarball_base.clone(),
                http: instances::download_http_client()?,
                tokens: Arc::new(BackendGithub(client.clone())),
                search: instances::sandbox::search_dirs(env),
            }))),
            _ => None,
        };
        let deps = ManagerDeps {
            oauth: oauth.clone().map(|o| o as Arc<dyn OAuthTokens>),
            sandbox: Arc::new(sandbox),
            search: search.clone(),
            settings: config.upstream.clone(),
            client_options: ClientOptions::default(),
            inherited_env: instances::sandbox::inherited_env(env),
            http: remote_http,
            store: store.clone(),
            events: emitter.clone(),
            logs: logs.clone(),
            deployer,
            metrics: metrics.clone(),
        };
        let manager = InstanceManager::new(deps).await?;
        // Managed mode: who we are before anything serves (BP §1); every failure here is fatal.
        let backend = match (&config.mode, backend_client) {
            (Mode::Managed(settings), Some(client)) => {
                let mut metrics = ProcessMetrics::new(started);
                startup::identify(
                    &client,
                    &settings.satellite_name,
                    settings.registration_token.as_ref(),
                    &settings.persistent_dir,
                    store.shared().then_some(&store),
                    &mut metrics,
                )
                .await?;
                let introspection = TokenIntrospection::new(
                    introspector(client.clone()),
                    settings.accepted_audiences(&config.public_url),
                    settings.token_cache_ttl,
                )
                .stale_for(settings.token_stale_for);
                let monitor = Arc::new(BackendMonitor::new(client.clone(), store.clone()));
                Some((settings.clone(), client, metrics, introspection, monitor))
            }
            _ => None,
        };
        let listener =
            http::bind(config.listen).await.map_err(|source| StartError::Bind { addr: config.listen, source })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind { addr: config.listen, source })?;

        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let jobs = Jobs::new();
        let auth = match &backend {
            Some((_, _, _, introspection, _)) => {
                Authenticator::with_introspection(Directory::default(), introspection.clone())
            }
            None => Authenticator::new(first.directory.clone()),
        };
        let analytics = crate::analytics::Recorder::new(crate::router::meta::COST);
        let status = StatusDeps {
            jobs: jobs.clone(),
            manager: manager.clone(),
            started,
            debug_route: config.debug_route,
            show_version: config.show_version,
            show_uptime: config.show_uptime,
            mode: if backend.is_some() { "managed" } else { "standalone" },
            backend: backend.as_ref().map(|(.., monitor)| monitor.clone()),
            metrics_token: config.metrics_token.clone().map(Arc::new),
            analytics: http::analytics::AnalyticsDeps {
                store: store.clone(),
                recorder: analytics.clone(),
                auth: auth.clone(),
                manager: manager.clone(),
            },
        };
        let stop_http = cancel.child_token();
        let sessions = Arc::new(SessionTable::default());
        let instance_sessions = Arc::new(SessionTable::default());
        // A client that goes without unsubscribing lets go of its subscriptions with its session.
        let (releasing, call_timeout) = (manager.clone(), config.upstream.call_timeout);
        instance_sessions.on_end(move |ended| {
            if let Some(process_id) = http::session::owned_instance(&ended.owner) {
                releasing.release_subscriptions(&process_id, &ended.id, ended.subscriptions, call_timeout);
            }
        });
        let sse_sessions = Arc::new(SseSessions::default());
        // Streams meant to stay open (GET streams, legacy SSE, subscriptions) end as soon as the drain begins,
        // so they never hold it: only requests in flight get the drain's time.
        let (closing, tables, legacy) =
            (stop_http.clone(), [sessions.clone(), instance_sessions.clone()], sse_sessions.clone());
        tasks.spawn(async move {
            closing.cancelled().await;
            tables.iter().for_each(|table| table.close_streams());
            legacy.close_streams();
        });
        let activity = Arc::new(crate::activity::ActivityTracker::default());
        let mcp = McpDeps {
            router: HierarchicalRouter {
                manager: manager.clone(),
                search,
                call_timeout: config.upstream.call_timeout,
                read_timeout: READ_TIMEOUT,
                analytics: analytics.clone(),
                views: Default::default(),
                schemas: Default::default(),
                summaries: Default::default(),
                pretty: config.pretty_results,
            },
            instance_router: InstanceRouter {
                manager: manager.clone(),
                call_timeout: config.upstream.call_timeout,
                read_timeout: READ_TIMEOUT,
                analytics: analytics.clone(),
            },
            manager: manager.clone(),
            auth: auth.clone(),
            urls: ResourceUrls { public_url: config.public_url.clone() },
            callers: crate::http::callers::CallerLimits::new(config.max_concurrent_requests_per_caller),
            streams: crate::http::callers::CallerLimits::new(config.max_streams_per_caller),
            sessions: sessions.clone(),
            instance_sessions: instance_sessions.clone(),
            sse_sessions: sse_sessions.clone(),
            activity: activity.clone(),
            events: emitter.clone(),
            tasks: tasks.clone(),
            audit: Arc::new(http::AuthAudit::new(emitter.clone())),
            toolsets: toolsets.clone(),
        };
        let server = tokio::spawn(http::serve(
            listener,
            status,
            mcp,
            http::stack::HttpLimits {
                max_concurrent_requests: config.max_concurrent_requests,
                request_timeout: config.http_timeout,
                max_connections: config.max_connections,
                header_read_timeout: http::stack::HEADER_READ_TIMEOUT,
                write_timeout: config.write_timeout,
            },
            http::guard::HostGuard::new(config.allowed_hosts.clone(), config.allowed_origins.clone()),
            async move { stop_http.cancelled().await },
        ));
        maintenance::schedule(maintenance::Maintenance {
            jobs: &jobs,
            config: &config,
            manager: &manager,
            store: &store,
            events: &emitter,
            activity: activity.clone(),
            sessions: [sessions, instance_sessions],
            sse_sessions,
        });
        info!(%addr, "satellite listening");

        let watched = match &config.mode {
            Mode::Standalone(StandaloneSource::File { path, watch_interval }) => Some((path.clone(), *watch_interval)),
            _ => None,
        };
        let config_refusals = Arc::new(AtomicU64::new(0));
        if let Some((path, interval)) = watched {
            let text = first_text.unwrap_or_default();
            let start_only = config::start_only_settings(&text);
            let watcher = FileWatch {
                last: Arc::new(parking_lot::Mutex::new(Some(fingerprint(text.as_bytes())))),
                pending: Arc::new(parking_lot::Mutex::new(None)),
                path,
                manager: manager.clone(),
                auth,
                toolsets: toolsets.clone(),
                refusals: config_refusals.clone(),
                events: emitter.clone(),
                start_only: Arc::new(start_only),
                warned: Default::default(),
                unreadable: Default::default(),
            };
            jobs.every("config-file-watch", interval, FirstRun::AfterOnePeriod, move || watcher.clone().check());
        }
        if store.shared() {
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
        let pollers = CancellationToken::new();
        // Written until the requests have drained (shutdown step 2), then flushed before the database closes.
        analytics.spawn_writer(store.clone(), &tasks, pollers.clone());
        let uploads = CancellationToken::new();
        let mut upload_task = None;
        match backend {
            None => {
                let apply_manager = manager.clone();
                tasks.spawn(
                    async move {
                        let report = apply_manager.apply(first.desired_state()).await;
                        info!(%report, "initial configuration applied");
                    }
                    .instrument(tracing::info_span!("control.standalone")),
                );
            }
            Some((settings, client, metrics, introspection, monitor)) => {
                let deps = ManagedDeps {
                    client,
                    manager: manager.clone(),
                    introspection: introspection.clone(),
                    oauth: oauth.clone(),
                    store: store.clone(),
                    events: emitter.clone(),
                    monitor,
                    satellite_url: settings.satellite_url.clone(),
                    idle_poll: settings.poll_idle,
                    heartbeat_every: settings.heartbeat_interval,
                    event_tick: settings.event_interval,
                    replica_id: format!("{:016x}", rand::random::<u64>()),
                    config_stale: Arc::default(),
                };
                deps.monitor.set_replica_id(&deps.replica_id);
                let uploader = Managed::uploader(&deps, settings.outbox_max, settings.event_lease)
                    .with_byte_quota(settings.outbox_max_bytes)
                    .with_timeout(settings.event_timeout);
                upload_task = Some(tokio::spawn(
                    managed::upload_loop(
                        uploader,
                        settings.event_interval,
                        settings.event_flush_timeout,
                        uploads.clone(),
                    )
                    .instrument(tracing::info_span!("backend.events")),
                ));
                if store.shared() {
                    // Another replica that had to register again revoked the key this one holds: adopt the new one.
                    let (client, store, name) = (deps.client.clone(), store.clone(), settings.satellite_name.clone());
                    jobs.every("shared-identity-sync", IDENTITY_SYNC, FirstRun::AfterOnePeriod, move || {
                        let (client, store, name) = (client.clone(), store.clone(), name.clone());
                        async move { startup::adopt_shared(&client, &store, &name).await }
                    });
                }
                let runtime = Managed::new(deps.clone(), metrics);
                let (loops, token) = (tasks.clone(), pollers.clone());
                tasks.spawn(
                    async move {
                        runtime.note_signals().await;
                        // BP §1 step 8: the heartbeat starts now; steps 9-10: the config once (a failure starts
                        // with no servers), then polling and commands.
                        runtime.spawn(&loops, token.clone());
                        // Any fetch that fails (this first one, a command's) is tried again until one is applied.
                        loops.spawn(
                            managed::resync_config(deps.clone(), token.clone())
                                .instrument(tracing::info_span!("backend.config_retry")),
                        );
                        match Managed::refresh_config(&deps).await {
                            Ok(result) => info!(%result, "initial backend configuration applied"),
                            Err(err) => {
                                warn!(error = %err, "initial config fetch failed; serving no servers until a retry succeeds");
                                // Not an empty config applied: that would sweep every catalog the last run stored.
                                deps.manager.ready_before_config();
                            }
                        }
                        runtime.configured();
                    }
                    .instrument(tracing::info_span!("control.backend")),
                );
                jobs.every("introspection-cache-sweep", INTROSPECTION_SWEEP, FirstRun::AfterOnePeriod, move || {
                    let swept = introspection.sweep();
                    if swept > 0 {
                        info!(swept, "expired introspection results removed");
                    }
                    std::future::ready(Ok::<(), std::convert::Infallible>(()))
                });
            }
        }
        let logs_stop = CancellationToken::new();
        let logs_task = tokio::spawn(logs.run(logs_stop.clone()));
        Ok(Satellite {
            addr,
            manager,
            store,
            cancel,
            tasks,
            jobs,
            server,
            drain: config.drain,
            config_refusals,
            logs_stop,
            logs_task,
            pollers,
            uploads,
            upload_task,
            activity,
            emitter,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn manager(&self) -> &InstanceManager {
        &self.manager
    }

    /// How many edits of the standalone file were refused (did not parse or validate).
    pub fn config_refusals(&self) -> u64 {
        self.config_refusals.load(Ordering::Relaxed)
    }

    /// The database (the event outbox and status history live there).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Counters of the background jobs.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }
}

/// Token introspection through the backend (BP §10), mapped to the satellite's principal.
fn introspector(client: Arc<BackendClient>) -> Introspect {
    Arc::new(move |token: String| {
        let client = client.clone();
        Box::pin(async move {
            match client.introspect(&token).await {
                Ok(answer) if answer.active => match (answer.sub, answer.team_id) {
                    (Some(user), Some(team)) => {
                        // Every introspected caller is an OAuth client and is tracked (SB §17); a backend that
                        // names no client gets "unknown" (docs/decisions.md).
                        // An empty client id names no client (BP §8.5-14 requires one): as if none were given.
                        let client_id = answer.client_id.filter(|id| !id.trim().is_empty());
                        let client_id = Some(client_id.unwrap_or_else(|| "unknown".to_owned()));
                        Verdict::Active(Introspected {
                            principal: Principal {
                                user: UserId::from(user.as_str()),
                                team: TeamId::from(team.as_str()),
                                // An answer without `scope` carries the backend's standard grant (docs/decisions.md).
                                scopes: match answer.scope {
                                    Some(scope) => scope.split_whitespace().map(str::to_owned).collect(),
                                    None => DEFAULT_SCOPES.map(String::from).to_vec(),
                                },
                                client_id: client_id.clone(),
                                role: crate::auth::Role::from_team_role(answer.team_role.as_deref()),
                            },
                            audience: answer
                                .aud
                                .as_ref()
                                .map(|aud| aud.names().into_iter().map(str::to_owned).collect()),
                            client_id,
                        })
                    }
                    _ => Verdict::Inactive(Some("Token validation failed: no user or team".into())),
                },
                Ok(answer) => Verdict::Inactive(answer.error_description),
                Err(err) => Verdict::Unavailable(err.to_string()),
            }
        })
    })
}
