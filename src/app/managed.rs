//! Managed mode's steps of the start: the backend link, the identity established before anything listens, and
//! the runtime (heartbeat, poller, command worker, event uploader) started once the satellite serves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use super::StartError;
use crate::auth::introspection::{Introspect, Introspected, TokenIntrospection, Verdict};
use crate::auth::Principal;
use crate::backend::client::BackendClient;
use crate::backend::managed::{self, Managed, ManagedDeps};
use crate::backend::metrics::ProcessMetrics;
use crate::backend::monitor::BackendMonitor;
use crate::backend::oauth::{BackendGithub, BackendOAuth};
use crate::backend::startup;
use crate::config::env::Env;
use crate::config::{Config, ManagedSettings, Mode};
use crate::control::standalone::DEFAULT_SCOPES;
use crate::events::Emitter;
use crate::instances::deploy::{DeploySettings, Deployer};
use crate::instances::{self, InstanceManager};
use crate::jobs::{FirstRun, Jobs};
use crate::model::{TeamId, UserId};
use crate::store::{Replicas, Store};

/// Expired introspection results are removed on this period (SB §19).
const INTROSPECTION_SWEEP: Duration = Duration::from_secs(300);
/// Replicas on PostgreSQL, managed: how often the shared credentials are compared with the ones in use.
const IDENTITY_SYNC: Duration = Duration::from_secs(10);

/// Managed mode: the backend client (no IO yet) and the OAuth tokens it serves to remote instances.
pub(super) struct BackendLink {
    pub client: Arc<BackendClient>,
    pub oauth: Arc<BackendOAuth>,
}

impl BackendLink {
    pub(super) fn for_config(config: &Config) -> Result<Option<BackendLink>, StartError> {
        let Mode::Managed(settings) = &config.mode else { return Ok(None) };
        let client = Arc::new(BackendClient::new(&settings.backend_url)?);
        Ok(Some(BackendLink { oauth: Arc::new(BackendOAuth::new(client.clone())), client }))
    }
}

/// Managed mode: GitHub-deployed servers, one directory per installation (SB §9.9).
pub(super) fn deployer(
    config: &Config,
    env: &Env,
    link: Option<&BackendLink>,
) -> Result<Option<Arc<Deployer>>, StartError> {
    let (Mode::Managed(settings), Some(link)) = (&config.mode, link) else { return Ok(None) };
    Ok(Some(Arc::new(Deployer::new(DeploySettings {
        root: settings.deployments_dir.clone().unwrap_or_else(|| config.data_dir.join("deployments")),
        tarball_base: settings.github_tarball_base.clone(),
        http: instances::download_http_client()?,
        tokens: Arc::new(BackendGithub(link.client.clone())),
        search: instances::sandbox::search_dirs(env),
    }))))
}

/// Managed mode: who the satellite is to the backend, and what serving and the runtime need of the backend.
pub(super) struct ManagedParts {
    pub settings: Box<ManagedSettings>,
    pub client: Arc<BackendClient>,
    pub oauth: Arc<BackendOAuth>,
    /// The process metrics the heartbeat reports, counting from the start.
    pub metrics: ProcessMetrics,
    pub introspection: TokenIntrospection,
    /// What the loops last did, for `GET /api/status/backend`.
    pub monitor: Arc<BackendMonitor>,
}

impl ManagedParts {
    /// Managed mode: who we are before anything serves (BP §1); every failure here is fatal.
    pub(super) async fn identify(
        config: &Config,
        link: Option<BackendLink>,
        store: &Store,
        started: Instant,
    ) -> Result<Option<ManagedParts>, StartError> {
        let (Mode::Managed(settings), Some(BackendLink { client, oauth })) = (&config.mode, link) else {
            return Ok(None);
        };
        let mut metrics = ProcessMetrics::new(started);
        startup::identify(
            &client,
            &settings.satellite_name,
            settings.registration_token.as_ref(),
            &settings.persistent_dir,
            store.shared().then_some(&store.replicas()),
            &mut metrics,
        )
        .await?;
        let introspection = TokenIntrospection::new(
            introspector(client.clone()),
            settings.accepted_audiences(&config.public_url),
            settings.token_cache_ttl,
        )
        .stale_for(settings.token_stale_for);
        let monitor = Arc::new(BackendMonitor::new(client.clone(), store.outbox()));
        Ok(Some(ManagedParts { settings: settings.clone(), client, oauth, metrics, introspection, monitor }))
    }

    /// What the backend loops share.
    pub(super) fn deps(&self, manager: &InstanceManager, store: &Store, events: &Emitter) -> ManagedDeps {
        let settings = &self.settings;
        ManagedDeps {
            client: self.client.clone(),
            manager: manager.clone(),
            introspection: self.introspection.clone(),
            oauth: Some(self.oauth.clone()),
            replicas: store.replicas(),
            outbox: store.outbox(),
            events: events.clone(),
            monitor: self.monitor.clone(),
            satellite_url: settings.satellite_url.clone(),
            idle_poll: settings.poll_idle,
            heartbeat_every: settings.heartbeat_interval,
            event_tick: settings.event_interval,
            replica_id: format!("{:016x}", rand::random::<u64>()),
            config_stale: Arc::default(),
        }
    }
}

/// Start the managed runtime once the satellite serves: the event uploader (its task returned, stopped by
/// `uploads`), the shared-identity job of replicas, the heartbeat, poller and command worker (stopped by
/// `pollers`) after the first configuration, and the introspection cache sweep.
pub(super) fn start(
    parts: ManagedParts,
    deps: ManagedDeps,
    jobs: &Jobs,
    tasks: &TaskTracker,
    pollers: &CancellationToken,
    uploads: &CancellationToken,
) -> JoinHandle<()> {
    let ManagedParts { settings, metrics, introspection, .. } = parts;
    deps.monitor.set_replica_id(&deps.replica_id);
    let upload_task = spawn_uploader(&deps, &settings, uploads.clone());
    if deps.replicas.shared() {
        sync_shared_identity(jobs, &deps.client, &deps.replicas, &settings.satellite_name);
    }
    let runtime = Managed::new(deps.clone(), metrics);
    tasks.spawn(run(runtime, deps, tasks.clone(), pollers.clone()).instrument(tracing::info_span!("control.backend")));
    sweep_introspection(jobs, introspection);
    upload_task
}

/// The uploader draining the event outbox, until `uploads` (with a last flush).
fn spawn_uploader(deps: &ManagedDeps, settings: &ManagedSettings, uploads: CancellationToken) -> JoinHandle<()> {
    let uploader = Managed::uploader(deps, settings.outbox_max, settings.event_lease)
        .with_byte_quota(settings.outbox_max_bytes)
        .with_timeout(settings.event_timeout);
    tokio::spawn(
        managed::upload_loop(uploader, settings.event_interval, settings.event_flush_timeout, uploads)
            .instrument(tracing::info_span!("backend.events")),
    )
}

/// Another replica that had to register again revoked the key this one holds: adopt the new one.
fn sync_shared_identity(jobs: &Jobs, client: &Arc<BackendClient>, replicas: &Replicas, name: &str) {
    let (client, replicas, name) = (client.clone(), replicas.clone(), name.to_owned());
    jobs.every("shared-identity-sync", IDENTITY_SYNC, FirstRun::AfterOnePeriod, move || {
        let (client, replicas, name) = (client.clone(), replicas.clone(), name.clone());
        async move { startup::adopt_shared(&client, &replicas, &name).await }
    });
}

/// The backend loops and the first configuration, in the background (the satellite already serves).
async fn run(runtime: Managed, deps: ManagedDeps, loops: TaskTracker, token: CancellationToken) {
    runtime.note_signals().await;
    // BP §1 step 8: the heartbeat starts now; steps 9-10: the config once (a failure starts
    // with no servers), then polling and commands.
    runtime.spawn(&loops, token.clone());
    // Any fetch that fails (this first one, a command's) is tried again until one is applied.
    loops.spawn(
        managed::resync_config(deps.clone(), token.clone()).instrument(tracing::info_span!("backend.config_retry")),
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

/// Expired introspection results leave the cache on a period (SB §19).
fn sweep_introspection(jobs: &Jobs, introspection: TokenIntrospection) {
    jobs.every("introspection-cache-sweep", INTROSPECTION_SWEEP, FirstRun::AfterOnePeriod, move || {
        let swept = introspection.sweep();
        if swept > 0 {
            info!(swept, "expired introspection results removed");
        }
        std::future::ready(Ok::<(), std::convert::Infallible>(()))
    });
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
