//! Assembly: build every component, start the long-lived tasks, and own the
//! shutdown order. The only place where the config source, the instance
//! manager and the HTTP surface meet.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn, Instrument};

use crate::auth::Authenticator;
use crate::config::env::Env;
use crate::config::{self, Config, ConfigError, Mode, StandaloneSource};
use crate::control::standalone::{self, StandaloneConfig};
use crate::http::oauth::ResourceUrls;
use crate::http::session::{SessionTable, SESSION_IDLE};
use crate::http::sse::{SseSessions, SSE_IDLE};
use crate::http::{self, McpDeps, StatusDeps};
use crate::instances::{self, InstanceManager, ManagerDeps};
use crate::mcp::client::ClientOptions;
use crate::router::{HierarchicalRouter, InstanceRouter};
use crate::search::{SearchError, SearchIndex};
use crate::store::{Store, StoreError};

/// Deadlines of the shutdown steps.
const HTTP_DRAIN_DEADLINE: Duration = Duration::from_secs(10);
const INSTANCES_STOP_DEADLINE: Duration = Duration::from_secs(15);
/// `resources/read` budget (SB §9.5: 60 s).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("managed mode (DEPLOYSTACK_BACKEND_URL) is not available in this version; run standalone with --config or no configuration")]
    ManagedUnavailable,
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
}

impl StartError {
    /// Configuration problems exit 64, everything else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            StartError::Config(_) | StartError::ManagedUnavailable => config::EXIT_CONFIG,
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
    server: JoinHandle<()>,
    config_refusals: Arc<AtomicU64>,
}

/// The first desired state, read and validated before anything starts.
pub fn initial_standalone(config: &Config) -> Result<StandaloneConfig, StartError> {
    match &config.mode {
        Mode::Managed(_) => Err(StartError::ManagedUnavailable),
        Mode::Standalone(StandaloneSource::Embedded(demo)) => {
            let exe = std::env::current_exe().map_err(StartError::Exe)?;
            Ok(standalone::embedded(demo, exe))
        }
        Mode::Standalone(StandaloneSource::File { path, .. }) => Ok(standalone::from_file(&config::read_file(path)?)?),
    }
}

impl Satellite {
    /// Open the store, bind the listener, start serving and apply the first configuration in the background.
    pub async fn start(config: Config, env: &Env) -> Result<Satellite, StartError> {
        let first = initial_standalone(&config)?;
        // Before the store: a sandbox config error (exit 64) leaves nothing behind.
        let sandbox = instances::sandbox::SandboxPolicy::for_config(&config, env)?;
        info!("{}", sandbox.describe());
        let store = Store::open(&config.data_dir).await?;
        let search = SearchIndex::new()?;
        let deps = ManagerDeps {
            sandbox: Arc::new(sandbox),
            search: search.clone(),
            settings: config.upstream.clone(),
            client_options: ClientOptions::default(),
            inherited_env: instances::sandbox::inherited_env(env),
            http: instances::remote_http_client()?,
            store: store.clone(),
        };
        let manager = InstanceManager::new(deps).await?;
        let listener =
            http::bind(config.listen).await.map_err(|source| StartError::Bind { addr: config.listen, source })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind { addr: config.listen, source })?;

        let cancel = CancellationToken::new();
        let tasks = TaskTracker::new();
        let status = StatusDeps {
            manager: manager.clone(),
            started: Instant::now(),
            debug_route: config.debug_route,
            show_version: config.show_version,
            show_uptime: config.show_uptime,
            mode: "standalone",
        };
        let stop_http = cancel.child_token();
        let auth = Authenticator::new(first.directory.clone());
        let sessions = Arc::new(SessionTable::default());
        let instance_sessions = Arc::new(SessionTable::default());
        let sse_sessions = Arc::new(SseSessions::default());
        let mcp = McpDeps {
            router: HierarchicalRouter {
                manager: manager.clone(),
                search,
                call_timeout: config.upstream.call_timeout,
                read_timeout: READ_TIMEOUT,
            },
            instance_router: InstanceRouter { call_timeout: config.upstream.call_timeout, read_timeout: READ_TIMEOUT },
            manager: manager.clone(),
            auth: auth.clone(),
            urls: ResourceUrls { public_url: config.public_url.clone() },
            sessions: sessions.clone(),
            instance_sessions: instance_sessions.clone(),
            sse_sessions: sse_sessions.clone(),
        };
        let server = tokio::spawn(http::serve(
            listener,
            status,
            mcp,
            http::stack::HttpLimits {
                max_concurrent_requests: config.max_concurrent_requests,
                request_timeout: config.http_timeout,
            },
            async move { stop_http.cancelled().await },
        ));
        tasks.spawn(sweep_sessions([sessions, instance_sessions], sse_sessions, cancel.child_token()));
        info!(%addr, "satellite listening");

        let watched = match &config.mode {
            Mode::Standalone(StandaloneSource::File { path, watch_interval }) => Some((path.clone(), *watch_interval)),
            _ => None,
        };
        let config_refusals = Arc::new(AtomicU64::new(0));
        let refusals = config_refusals.clone();
        let apply_manager = manager.clone();
        let watch_cancel = cancel.child_token();
        tasks.spawn(
            async move {
                let report = apply_manager.apply(first.desired_state()).await;
                info!(?report, "initial configuration applied");
                if let Some((path, interval)) = watched {
                    watch_file(path, interval, apply_manager, auth, refusals, watch_cancel).await;
                }
            }
            .instrument(tracing::info_span!("control.standalone")),
        );
        Ok(Satellite { addr, manager, store, cancel, tasks, server, config_refusals })
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

    /// Ordered shutdown: stop accepting and drain HTTP, stop the config watcher, stop instances, close the store.
    /// Returns false when a step missed its deadline.
    pub async fn shutdown(self) -> bool {
        let mut clean = true;
        info!("shutdown: stopping http and background jobs");
        self.cancel.cancel();
        if tokio::time::timeout(HTTP_DRAIN_DEADLINE, self.server).await.is_err() {
            warn!(deadline_s = HTTP_DRAIN_DEADLINE.as_secs(), "shutdown: http drain missed its deadline");
            clean = false;
        }
        self.tasks.close();
        info!("shutdown: stopping instances");
        let stopped = async {
            self.manager.shutdown().await;
            self.tasks.wait().await;
        };
        if tokio::time::timeout(INSTANCES_STOP_DEADLINE, stopped).await.is_err() {
            warn!(deadline_s = INSTANCES_STOP_DEADLINE.as_secs(), "shutdown: stopping instances missed its deadline");
            clean = false;
        }
        info!("shutdown: closing the database");
        self.store.close().await;
        info!(clean, "shutdown complete");
        clean
    }
}

/// Re-read the standalone file when its content changes and apply the difference.
/// A file that does not parse or validate is reported and the last good config stays in force.
async fn watch_file(
    path: PathBuf,
    interval: Duration,
    manager: InstanceManager,
    auth: Authenticator,
    refusals: Arc<AtomicU64>,
    cancel: CancellationToken,
) {
    let mut last = fingerprint(&path);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let current = fingerprint(&path);
        if current == last {
            continue;
        }
        last = current;
        let parsed = config::read_file(&path).and_then(|raw| standalone::from_file(&raw));
        match parsed {
            Ok(next) => {
                auth.replace(next.directory.clone());
                let report = manager.apply(next.desired_state()).await;
                info!(?report, path = %path.display(), "config file change applied");
            }
            Err(err) => {
                refusals.fetch_add(1, Ordering::Relaxed);
                error!(path = %path.display(), error = %err, "config file change refused, keeping the last good config")
            }
        }
    }
}

/// Forget idle sessions every minute (OQ-18).
async fn sweep_sessions(tables: [Arc<SessionTable>; 2], sse: Arc<SseSessions>, cancel: CancellationToken) {
    let mut ticker = tokio::time::interval(Duration::from_secs(60));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let swept: usize = tables.iter().map(|t| t.sweep(SESSION_IDLE)).sum::<usize>() + sse.sweep(SSE_IDLE);
        if swept > 0 {
            info!(swept, "idle mcp sessions expired");
        }
    }
}

fn fingerprint(path: &Path) -> Option<[u8; 32]> {
    std::fs::read(path).ok().map(|bytes| Sha256::digest(&bytes).into())
}
