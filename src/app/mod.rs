//! Assembly: build every component, start the long-lived tasks, and own the
//! shutdown order. The only place where the config source, the instance
//! manager and the HTTP surface meet. `Satellite::start` only wires: one step per component, each step in
//! `start` (managed mode's in `managed`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use crate::backend::startup::IdentityError;
use crate::config::env::Env;
use crate::config::{self, Config, ConfigError, Mode, StandaloneSource};
use crate::control::standalone::{self, StandaloneConfig};
use crate::events::Emitter;
use crate::instances::InstanceManager;
use crate::jobs::Jobs;
use crate::logcapture::LogCapture;
use crate::search::SearchError;
use crate::store::{Store, StoreError};

mod file_watch;
pub mod import;
mod maintenance;
mod managed;
pub mod search;
mod shutdown;
mod start;
pub mod tokens;

use managed::{BackendLink, ManagedParts};
use start::{Core, FrontDoor};

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
    /// One step per component, in this order.
    pub async fn start(config: Config, env: &Env) -> Result<Satellite, StartError> {
        let started = Instant::now();
        let (first, first_text) = first_read(&config)?;
        let core = Core::open(&config, env).await?;
        let toolsets = crate::toolsets::Toolsets::load(core.store.toolsets(), first.toolsets.clone()).await?;
        let limits = crate::router::limits::Limits::new(
            first.limits.clone(),
            core.store.limit_usage(),
            Some(core.metrics.clone()),
        );
        let emitter = Emitter::new(core.store.outbox(), core.store.statuses());
        let logs = LogCapture::new(emitter.clone());
        let link = BackendLink::for_config(&config)?;
        let manager = start::open_manager(&config, env, &core, link.as_ref(), &emitter, &logs).await?;
        let managed = ManagedParts::identify(&config, link, &core.store, started).await?;
        let (listener, addr) = start::bind(config.listen).await?;
        let (cancel, tasks, jobs) = (CancellationToken::new(), TaskTracker::new(), Jobs::new());
        let auth = start::authenticator(managed.as_ref(), &first);
        let analytics = crate::analytics::Recorder::new(crate::router::meta::COST);
        let served = FrontDoor {
            config: &config,
            started,
            manager: &manager,
            store: &core.store,
            search: core.search,
            auth: &auth,
            analytics: &analytics,
            events: &emitter,
            toolsets: &toolsets,
            limits: &limits,
            monitor: managed.as_ref().map(|parts| parts.monitor.clone()),
        }
        .serve(listener, &jobs, &tasks, &cancel);
        served.schedule_upkeep(&jobs, &config, &manager, &core.store, &emitter);
        info!(%addr, "satellite listening");
        let rules = start::FileRules { toolsets: toolsets.clone(), limits };
        let config_refusals = start::watch_config_file(&config, first_text, &jobs, &manager, auth, rules, &emitter);
        start::sync_replicas(&core.store, &jobs, &toolsets, &manager);
        let (pollers, uploads) = (CancellationToken::new(), CancellationToken::new());
        // Written until the requests have drained (shutdown step 2), then flushed before the database closes.
        analytics.spawn_writer(core.store.analytics_rows(), &tasks, pollers.clone());
        let upload_task = match managed {
            None => {
                start::apply_standalone(first, &manager, &tasks);
                None
            }
            Some(parts) => {
                let deps = parts.deps(&manager, &core.store, &emitter);
                Some(managed::start(parts, deps, &jobs, &tasks, &pollers, &uploads))
            }
        };
        let logs_stop = CancellationToken::new();
        let logs_task = tokio::spawn(logs.run(logs_stop.clone()));
        Ok(Satellite {
            addr,
            manager,
            store: core.store,
            cancel,
            tasks,
            jobs,
            server: served.server,
            drain: config.drain,
            config_refusals,
            logs_stop,
            logs_task,
            pollers,
            uploads,
            upload_task,
            activity: served.activity,
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
