//! The running side of managed mode: the heartbeat (BP §3), the command
//! poller with its adaptive cadence and de-duplication (BP §4), one worker
//! applying commands in order and posting a terminal result for each
//! (BP §5-§6), config refreshes through the same reconciler the standalone
//! file uses (BP §7), and the event uploader loop (BP §8.3).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use super::client::{BackendClient, BackendError};
use super::dedup::{CommandLedger, Seen, FINISHED_KEPT};
use super::metrics::ProcessMetrics;
use super::polling::{next_delay, PollOutcome, MIN_DELAY};
use super::uploader::{BatchOutcome, SendBatch, Tick, Uploader};
use super::wire::{
    self, Command, CommandKind, CommandResult, CommandsResponse, ConfigureIntent, EventEnvelope, EventsRequest,
    HealthStatus, HeartbeatRequest, McpInstanceStatus, McpStatus, McpStatusSummary, ProcessMetric, ProcessStatus,
    SatelliteStatus, ServerStatusCounts, SystemMetrics, ToolName, Transport,
};
use crate::auth::introspection::TokenIntrospection;
use crate::events::iso;
use crate::instances::InstanceManager;
use crate::model::{tool_path, InstallationId, InstanceStatus, Upstream, UserId};
use crate::store::Store;

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
    pub store: Store,
    /// `DEPLOYSTACK_SATELLITE_URL` as configured, `""` when unset (BP §3.2).
    pub satellite_url: String,
    /// `DEPLOYSTACK_BACKEND_POLLING_INTERVAL`.
    pub idle_poll: Duration,
    pub heartbeat_every: Duration,
    pub event_tick: Duration,
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
pub struct Managed {
    deps: ManagedDeps,
    stats: Arc<Mutex<ManagedStats>>,
    metrics: Arc<Mutex<ProcessMetrics>>,
    url_sent: Arc<std::sync::atomic::AtomicBool>,
}

impl Managed {
    pub fn new(deps: ManagedDeps, metrics: ProcessMetrics) -> Self {
        Self {
            deps,
            stats: Arc::default(),
            metrics: Arc::new(Mutex::new(metrics)),
            url_sent: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    pub fn stats(&self) -> Arc<Mutex<ManagedStats>> {
        self.stats.clone()
    }

    /// Fetch the config and reconcile (BP §7); the `configure` result object on success.
    pub async fn refresh_config(deps: &ManagedDeps) -> Result<Value, BackendError> {
        let config = match deps.client.fetch_config().await {
            Ok(config) => config,
            Err(err) => {
                // BP §8.5-19: the failed fetch is an event too, so the dashboard can say why nothing changed.
                let (error_type, status_code) = match &err {
                    BackendError::Status { status: status @ (401 | 403), .. } => ("auth", Some(*status)),
                    BackendError::Status { status, .. } => ("server_error", Some(*status)),
                    BackendError::Decode { .. } => ("server_error", None),
                    BackendError::Network { .. } | BackendError::NotRegistered { .. } => ("network", None),
                };
                let data = json!({"error_type": error_type, "error_message": err.to_string(),
                                  "status_code": status_code, "retry_in": 60});
                crate::events::Emitter::new(deps.store.clone())
                    .emit(crate::events::Event::raw("config.error", data))
                    .await;
                return Err(err);
            }
        };
        let desired = config.desired_state();
        for (key, reason) in &desired.rejected {
            warn!(process_id = %key, reason = %reason, "config entry refused; the others are applied");
        }
        let total = desired.instances.len();
        let enabled = desired.instances.values().filter(|s| s.enabled).count();
        let report = deps.manager.apply(desired).await;
        info!(?report, "backend configuration applied");
        // A user who re-authorised an OAuth server is announced by a configure: connect again with the new token.
        for instance in deps.manager.instances() {
            if instance.spec().requires_oauth && instance.status().status == InstanceStatus::RequiresReauth {
                let _ = deps.manager.restart(&instance.spec().process_id).await;
            }
        }
        Ok(
            json!({"configuration_applied": true, "total_servers": total, "enabled_servers": enabled, "startup_time_ms": 0}),
        )
    }

    /// Start the heartbeat, poller, worker and uploader; they stop when `cancel` is.
    pub fn spawn(&self, tracker: &tokio_util::task::TaskTracker, cancel: CancellationToken) {
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
        tracker.spawn(
            poll_loop(self.deps.clone(), ledger.clone(), tx, self.stats.clone(), cancel.clone())
                .instrument(tracing::info_span!("backend.poll")),
        );
        tracker.spawn(
            worker(self.deps.clone(), ledger, rx, self.stats.clone(), cancel.clone())
                .instrument(tracing::info_span!("backend.commands")),
        );
    }

    /// The uploader over this client.
    pub fn uploader(deps: &ManagedDeps, quota: i64) -> Uploader {
        let client = deps.client.clone();
        let send: SendBatch = Arc::new(move |events: Vec<Value>| {
            let client = client.clone();
            Box::pin(async move { send_events(&client, events).await })
        });
        Uploader::new(deps.store.clone(), send, wire::MAX_EVENT_BATCH, quota)
    }
}

async fn send_events(client: &BackendClient, events: Vec<Value>) -> BatchOutcome {
    let envelopes: Vec<EventEnvelope> = events.into_iter().filter_map(|e| serde_json::from_value(e).ok()).collect();
    let request = match EventsRequest::batch(envelopes) {
        Ok(request) => request,
        Err(err) => return BatchOutcome::Invalid(format!("batch of {} events refused locally", err.0)),
    };
    match client.post_events(&request).await {
        Ok(answer) => BatchOutcome::Accepted {
            failures: answer.failures.iter().map(|f| format!("#{} {}: {}", f.index, f.event_type, f.error)).collect(),
        },
        Err(BackendError::Status { status: 400, message, .. }) => BatchOutcome::Invalid(message),
        Err(BackendError::Status { status: 401, .. }) => BatchOutcome::Unauthorized,
        Err(BackendError::Status { status: 429, .. }) => BatchOutcome::RateLimited,
        Err(err) if err.to_string().to_ascii_lowercase().contains("validation") => {
            BatchOutcome::Invalid(err.to_string())
        }
        Err(err) => BatchOutcome::Failed(err.to_string()),
    }
}

/// Run the uploader every `tick` (plus any 429 backoff) until cancelled, then flush within `flush_deadline`.
pub async fn upload_loop(mut uploader: Uploader, tick: Duration, flush_deadline: Duration, cancel: CancellationToken) {
    loop {
        let wait = tick + uploader.backoff().unwrap_or_default();
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        // Drain what is there now, one batch in flight at a time.
        loop {
            match uploader.tick().await {
                Ok(Tick::Sent(_)) | Ok(Tick::Dropped(_)) if !cancel.is_cancelled() => continue,
                Ok(_) => break,
                Err(err) => {
                    warn!(error = %err, "reading the event outbox failed");
                    break;
                }
            }
        }
    }
    match uploader.flush(flush_deadline).await {
        Ok(left) => info!(left, sent = uploader.stats().sent, "event uploader stopped"),
        Err(err) => warn!(error = %err, "flushing events at shutdown failed"),
    }
}

async fn heartbeat_loop(
    deps: ManagedDeps,
    metrics: Arc<Mutex<ProcessMetrics>>,
    stats: Arc<Mutex<ManagedStats>>,
    url_sent: Arc<std::sync::atomic::AtomicBool>,
    cancel: CancellationToken,
) {
    let every = deps.heartbeat_every;
    let beat = move || {
        let (deps, metrics, stats, url_sent) = (deps.clone(), metrics.clone(), stats.clone(), url_sent.clone());
        async move {
            let first = !url_sent.load(std::sync::atomic::Ordering::Acquire);
            let body = heartbeat_body(&deps, &mut metrics.lock(), first);
            match deps.client.heartbeat(&body).await {
                Ok(_) => {
                    url_sent.store(true, std::sync::atomic::Ordering::Release);
                    stats.lock().heartbeats += 1;
                }
                Err(err) => {
                    stats.lock().heartbeat_failures += 1;
                    warn!(error = %err, "heartbeat failed");
                }
            }
        }
    };
    beat_cadence(every, cancel, beat).await;
}

/// BP §3.1: the first beat at once, then a fixed wall-clock tick that never waits for the previous beat (each
/// beat runs on its own task, bounded by the client's 10 s timeout); a failure changes nothing.
pub async fn beat_cadence<B, F>(every: Duration, cancel: CancellationToken, mut beat: B)
where
    B: FnMut() -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        tokio::spawn(beat());
    }
}

/// The heartbeat of BP §3.2 with the `mcp_status` snapshot of §3.3.
pub fn heartbeat_body(deps: &ManagedDeps, metrics: &mut ProcessMetrics, first: bool) -> HeartbeatRequest {
    let sample = metrics.sample();
    let instances = deps.manager.instances();
    let mut by_team: BTreeMap<String, Vec<ProcessMetric>> = BTreeMap::new();
    let mut running = Vec::new();
    let mut counts = ServerStatusCounts::default();
    let mut tool_names = Vec::new();
    let mut dormant = 0;
    for instance in &instances {
        let spec = instance.spec();
        let status = instance.status().status;
        match status {
            InstanceStatus::Online => counts.online += 1,
            InstanceStatus::Offline => counts.offline += 1,
            InstanceStatus::Error | InstanceStatus::PermanentlyFailed => counts.error += 1,
            InstanceStatus::RequiresReauth => counts.requires_reauth += 1,
            _ => {}
        }
        if instance.is_dormant() {
            dormant += 1;
        }
        let transport = match spec.upstream {
            Upstream::Stdio { .. } => Transport::Stdio,
            Upstream::StreamableHttp { .. } => Transport::Http,
            Upstream::Sse { .. } => Transport::Sse,
        };
        if status.tools_visible() {
            for tool in instance.catalog().iter().flat_map(|c| c.tools.iter()) {
                if !instance.tool_disabled(&tool.name) {
                    tool_names.push(ToolName {
                        namespaced_name: tool_path(&spec.server_slug, &tool.name),
                        server_slug: spec.server_slug.clone(),
                        transport,
                    });
                }
            }
        }
        let Some(pid) = instance.pid() else { continue };
        let uptime = instance.uptime().unwrap_or_default().as_secs();
        let (_, last_activity) = instance.idle();
        by_team.entry(spec.team_id.0.clone()).or_default().push(ProcessMetric {
            installation_id: spec.installation_id.0.clone(),
            installation_name: spec.process_id.0.clone(),
            status: ProcessStatus::Running,
            pid: Some(pid),
            uptime_seconds: uptime,
            message_count: 0,
            error_count: 0,
            health_status: HealthStatus::Unknown,
            last_activity: iso(last_activity),
        });
        running.push(McpInstanceStatus {
            installation_id: spec.installation_id.0.clone(),
            installation_name: spec.process_id.0.clone(),
            instance_id: spec.process_id.0.clone(),
            user_id: spec.user_id.0.clone(),
            team_id: spec.team_id.0.clone(),
            status: ProcessStatus::Running,
            transport_type: Transport::Stdio,
            uptime_seconds: uptime,
            message_count: 0,
            error_count: 0,
            health_status: HealthStatus::Unknown,
            pid: Some(pid),
        });
    }
    let summary = McpStatusSummary {
        total_instances: running.len() as u64,
        active_instances: running.len() as u64,
        dormant_instances: dormant,
        total_tools: tool_names.len() as u64,
        online_servers: counts.online,
        offline_servers: counts.offline,
        error_servers: counts.error,
    };
    HeartbeatRequest {
        status: SatelliteStatus::Active,
        system_metrics: SystemMetrics {
            cpu_usage_percent: sample.cpu_usage_percent,
            memory_usage_mb: sample.memory_usage_mb,
            disk_usage_percent: Some(0.0),
            uptime_seconds: Some(sample.uptime_seconds),
            network_rx_bytes: None,
            network_tx_bytes: None,
        },
        processes: Vec::new(),
        processes_by_team: Some(by_team),
        mcp_status: Some(McpStatus { summary, instances: running, tool_names, server_status_counts: counts }),
        normalized_data: None,
        error_count: Some(0),
        version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        satellite_url: first.then(|| deps.satellite_url.clone()),
    }
}

async fn poll_loop(
    deps: ManagedDeps,
    ledger: Arc<Mutex<CommandLedger>>,
    tx: mpsc::Sender<Command>,
    stats: Arc<Mutex<ManagedStats>>,
    cancel: CancellationToken,
) {
    let poll = {
        let client = deps.client.clone();
        move || {
            let client = client.clone();
            async move { client.poll_commands(&iso(Utc::now())).await }
        }
    };
    let handle = |answer: CommandsResponse| {
        let (deps, ledger, tx, stats) = (deps.clone(), ledger.clone(), tx.clone(), stats.clone());
        async move {
            stats.lock().polls += 1;
            let mut immediate = false;
            for command in answer.commands {
                if command.id.is_empty() {
                    warn!(command_type = command.kind.command_type(), "command without an id ignored");
                    continue;
                }
                immediate |= command.priority == Some(wire::Priority::Immediate);
                let seen = ledger.lock().arrive(&command.id);
                match seen {
                    Seen::New => {
                        if tx.send(command).await.is_err() {
                            return None;
                        }
                    }
                    Seen::InFlight => {}
                    Seen::Finished(result) => {
                        stats.lock().results_reposted += 1;
                        if let Ok(result) = serde_json::from_value::<CommandResult>(result) {
                            post_result(&deps, &result).await;
                        }
                    }
                }
            }
            Some(immediate)
        }
    };
    let failures = stats.clone();
    poll_cadence(poll, handle, move || failures.lock().poll_failures += 1, deps.idle_poll, cancel).await;
}

/// The cadence of BP §4.4 around any poll: the first poll at once, then the backend's hint (2-300 s), 2 s after
/// a poll that brought an immediate command, doubling to 300 s while polls fail. `handle` returns whether an
/// immediate command came, or `None` to stop.
pub async fn poll_cadence<P, PF, H, HF>(
    mut poll: P,
    mut handle: H,
    mut on_failure: impl FnMut(),
    idle: Duration,
    cancel: CancellationToken,
) where
    P: FnMut() -> PF,
    PF: std::future::Future<Output = Result<CommandsResponse, BackendError>>,
    H: FnMut(CommandsResponse) -> HF,
    HF: std::future::Future<Output = Option<bool>>,
{
    let mut delay = MIN_DELAY;
    loop {
        let started = tokio::time::Instant::now();
        delay = match poll().await {
            Ok(answer) => {
                let mode = answer.polling_mode.as_ref().map(|m| m.as_str().to_owned());
                let hint = answer.next_poll_interval.map(|n| n as i64);
                let Some(immediate) = handle(answer).await else { return };
                if immediate {
                    MIN_DELAY
                } else {
                    next_delay(&PollOutcome::Ok { mode, hint_seconds: hint }, delay, idle)
                }
            }
            Err(err) => {
                on_failure();
                if err.status() == Some(401) {
                    warn!(error = %err, "API key rejected while polling commands");
                } else {
                    warn!(error = %err, "polling commands failed");
                }
                next_delay(&PollOutcome::Failed, delay, idle)
            }
        };
        let wait = delay.saturating_sub(started.elapsed());
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn worker(
    deps: ManagedDeps,
    ledger: Arc<Mutex<CommandLedger>>,
    mut rx: mpsc::Receiver<Command>,
    stats: Arc<Mutex<ManagedStats>>,
    cancel: CancellationToken,
) {
    loop {
        let command = tokio::select! {
            _ = cancel.cancelled() => return,
            command = rx.recv() => match command { Some(c) => c, None => return },
        };
        let id = command.id.clone();
        let kind = command.kind.command_type().to_owned();
        let result = run_command(&deps, command).await;
        info!(command_id = %id, command_type = %kind, status = ?result.status, error = ?result.error_message, "command done");
        stats.lock().commands_run += 1;
        post_result(&deps, &result).await;
        ledger.lock().finish(&id, serde_json::to_value(&result).unwrap_or(Value::Null));
    }
}

async fn post_result(deps: &ManagedDeps, result: &CommandResult) {
    if let Err(err) = deps.client.post_result(result).await {
        // Not retried: the command comes again and the ledger answers it (BP §5).
        warn!(command_id = %result.command_id, error = %err, "posting a command result failed");
    }
}

/// One command to its terminal result (BP §6).
pub async fn run_command(deps: &ManagedDeps, command: Command) -> CommandResult {
    let id = command.id.clone();
    match command.kind {
        CommandKind::Configure(payload) => match payload.intent() {
            ConfigureIntent::Recovery => {
                let Some(installation) = payload.common.installation_id.clone() else {
                    return CommandResult::failed(id, "installation_id is required for mcp_recovery", None);
                };
                recover(deps, id, InstallationId::from(installation.as_str())).await
            }
            ConfigureIntent::UpdateToolStatus => {
                let (Some(installation), Some(tool), Some(disabled)) =
                    (payload.common.installation_id.clone(), payload.tool_name.clone(), payload.is_disabled)
                else {
                    return CommandResult::failed(
                        id,
                        "Missing required fields: installation_id, tool_name, or is_disabled",
                        None,
                    );
                };
                let n =
                    deps.manager.set_tool_status(&InstallationId::from(installation.as_str()), &tool, disabled).await;
                let state = if disabled { "disabled" } else { "enabled" };
                CommandResult::completed(
                    id,
                    json!({"tool_name": tool, "is_disabled": disabled,
                           "message": format!("Tool {tool} {state} for {n} instances of installation {installation}")}),
                )
            }
            // Redeploy (GitHub deployments are not supported here) and anything else: a full refresh.
            _ => match Managed::refresh_config(deps).await {
                Ok(result) => CommandResult::completed(id, result),
                Err(err) => CommandResult::failed(id, err.to_string(), None),
            },
        },
        CommandKind::Restart(payload) => {
            let Some(installation) = payload.common.installation_id.clone() else {
                return CommandResult::failed(id, "installation_id is required for restart", None);
            };
            let user = payload.common.user_id.as_deref().map(UserId::from);
            match deps.manager.restart_installation(&InstallationId::from(installation.as_str()), user.as_ref()).await {
                Ok(n) => CommandResult::completed(
                    id,
                    json!({"process_id": installation, "server_name": installation, "server_url": "", "restart_time_ms": 0, "instances": n}),
                ),
                Err(err) => CommandResult::failed(id, err.to_string(), None),
            }
        }
        CommandKind::Kill(payload) => {
            let Some(installation) = payload.common.installation_id.clone() else {
                return CommandResult::failed(id, "installation_id is required for kill", None);
            };
            let user = payload.common.user_id.as_deref().map(UserId::from);
            match deps.manager.stop_installation(&InstallationId::from(installation.as_str()), user.as_ref()).await {
                Ok(n) => CommandResult::completed(
                    id,
                    json!({"process_id": installation, "server_name": installation, "shutdown_time_ms": 0, "instances": n}),
                ),
                Err(err) => CommandResult::failed(id, err.to_string(), None),
            }
        }
        CommandKind::Spawn(payload) => {
            // Instances are config-driven: a spawn is answered from the current config after a refresh.
            if let Err(err) = Managed::refresh_config(deps).await {
                return CommandResult::failed(id, err.to_string(), None);
            }
            let installation = payload.common.installation_id.unwrap_or_default();
            let running = deps
                .manager
                .of_installation(&InstallationId::from(installation.as_str()), None)
                .map(|list| list.iter().filter_map(|i| i.pid()).collect::<Vec<_>>())
                .unwrap_or_default();
            CommandResult::completed(
                id,
                json!({"process_id": installation, "server_type": "stdio", "pids": running, "startup_time_ms": 0}),
            )
        }
        CommandKind::HealthCheck(payload) if payload.check_type == Some(wire::CheckType::CredentialValidation) => {
            let Some(installation) = payload.common.installation_id.clone() else {
                return CommandResult::failed(id, "installation_id is required for credential validation", None);
            };
            CommandResult::completed(
                id,
                json!({"credential_validation": validate_credentials(deps, &installation).await}),
            )
        }
        CommandKind::HealthCheck(payload) => {
            let installation = payload.common.installation_id.clone();
            let targets: Vec<_> = deps
                .manager
                .instances()
                .into_iter()
                .filter(|i| installation.as_deref().is_none_or(|id| i.spec().installation_id.0 == id))
                .filter(|i| !matches!(i.spec().upstream, Upstream::Stdio { .. }))
                .collect();
            let mut results = Vec::new();
            for instance in &targets {
                let began = Instant::now();
                let answer = deps.manager.call(instance, "tools/list", Some(json!({})), Duration::from_secs(15)).await;
                results.push(json!({
                    "server_name": instance.spec().process_id.0,
                    "status": instance.status().status.as_str(),
                    "health_status": if answer.is_ok() { "healthy" } else { "unhealthy" },
                    "response_time_ms": began.elapsed().as_millis() as u64,
                }));
            }
            let healthy = results.iter().filter(|r| r["health_status"] == "healthy").count();
            CommandResult::completed(
                id,
                json!({"health_check_results": results, "total_servers": targets.len(), "healthy_servers": healthy}),
            )
        }
        CommandKind::InvalidateUserTokenCache(payload) => {
            let Some(user) = payload.user_id.clone() else {
                return CommandResult::failed(id, "user_id is required for user token cache invalidation", None);
            };
            let user_id = UserId::from(user.as_str());
            let n = deps.introspection.invalidate_user(&user_id)
                + deps.oauth.as_ref().map_or(0, |oauth| oauth.invalidate_user(&user_id));
            CommandResult::completed(
                id,
                json!({"user_id": user, "user_email": payload.user_email, "invalidated_count": n,
                       "message": format!("Invalidated {n} cached tokens")}),
            )
        }
        CommandKind::Unknown { command_type, .. } => CommandResult::unknown_type(id, &command_type),
        CommandKind::Malformed { command_type, reason, .. } => {
            CommandResult::failed(id, format!("Invalid {command_type} payload: {reason}"), None)
        }
    }
}

/// BP §6.2 `credential_validation`: `tools/list` on each remote instance of the installation; a refusal of
/// the credentials makes that user's instance `requires_reauth`.
async fn validate_credentials(deps: &ManagedDeps, installation: &str) -> Value {
    let Ok(instances) = deps.manager.of_installation(&InstallationId::from(installation), None) else {
        return json!({"installation_id": installation, "valid": false,
                      "error": "Server configuration not found on this satellite"});
    };
    if instances.iter().all(|i| matches!(i.spec().upstream, Upstream::Stdio { .. })) {
        return json!({"installation_id": installation, "valid": true, "skipped": true, "reason": "stdio_transport"});
    }
    let began = Instant::now();
    let mut errors = Vec::new();
    let mut needs_reauth = false;
    for instance in instances.iter().filter(|i| !matches!(i.spec().upstream, Upstream::Stdio { .. })) {
        match deps.manager.call(instance, "tools/list", Some(json!({})), Duration::from_secs(15)).await {
            Ok(_) => {}
            Err(err) => {
                let text = err.to_string();
                let lower = text.to_ascii_lowercase();
                let auth = lower.contains("401")
                    || lower.contains("403")
                    || ["auth", "unauthorized", "forbidden", "token", "credentials"].iter().any(|w| lower.contains(w));
                if auth {
                    needs_reauth = true;
                    if instance.status().status != InstanceStatus::RequiresReauth {
                        deps.manager.require_reauth(instance, text.clone()).await;
                    }
                }
                errors.push(text);
            }
        }
    }
    let mut result = json!({"installation_id": installation, "valid": errors.is_empty(),
                            "response_time_ms": began.elapsed().as_millis() as u64});
    if let Some(first) = errors.first() {
        result["error"] = json!(first);
    }
    if needs_reauth {
        result["needs_reauth"] = json!(true);
    }
    result
}

async fn recover(deps: &ManagedDeps, id: String, installation: InstallationId) -> CommandResult {
    let Ok(instances) = deps.manager.of_installation(&installation, None) else {
        return CommandResult::completed(
            id,
            json!({"message": "Server not found on this satellite", "installation_id": installation.0}),
        );
    };
    let remote: Vec<_> =
        instances.into_iter().filter(|i| !matches!(i.spec().upstream, Upstream::Stdio { .. })).collect();
    if remote.is_empty() {
        return CommandResult::completed(
            id,
            json!({"message": "stdio servers do not require recovery re-discovery", "installation_id": installation.0}),
        );
    }
    let began = Instant::now();
    let mut failed = Vec::new();
    let mut tools = 0;
    for instance in &remote {
        if deps.manager.rediscover(instance).await {
            tools += instance.catalog().map_or(0, |c| c.tools.len());
        } else {
            failed.push(json!({"server_name": instance.spec().process_id.0, "resulting_status": instance.status().status.as_str()}));
        }
    }
    let result = json!({"installation_id": installation.0, "server_name": remote[0].spec().server_slug,
                        "tools_discovered": tools, "discovery_time_ms": began.elapsed().as_millis() as u64, "failed": failed});
    if failed.is_empty() {
        CommandResult::completed(id, result)
    } else {
        CommandResult::failed(id, "re-discovery failed for some instances", Some(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn answer(mode: &str, hint: Option<u64>) -> Result<CommandsResponse, BackendError> {
        Ok(serde_json::from_value(json!({"commands": [], "polling_mode": mode, "next_poll_interval": hint})).unwrap())
    }

    fn failed() -> Result<CommandsResponse, BackendError> {
        Err(BackendError::Network { endpoint: "commands", reason: "refused".into() })
    }

    /// With paused time: the gaps between polls follow the hints, the fallback table and the failure backoff.
    #[tokio::test(start_paused = true)]
    async fn polls_follow_the_hints_and_back_off_on_failure() {
        let script: VecDeque<Result<CommandsResponse, BackendError>> = VecDeque::from([
            answer("immediate", Some(2)),
            answer("normal", Some(10)),
            answer("slow", None),
            failed(),
            failed(),
            failed(),
            answer("normal", Some(30)),
            answer("slow", Some(60)),
        ]);
        let script = Arc::new(Mutex::new(script));
        let times = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (s, t, c) = (script.clone(), times.clone(), cancel.clone());
        let poll = move || {
            t.lock().push((tokio::time::Instant::now() - start).as_secs());
            let next = s.lock().pop_front();
            if next.is_none() {
                c.cancel();
            }
            async move { next.unwrap_or_else(|| answer("slow", Some(60))) }
        };
        poll_cadence(poll, |_| async { Some(false) }, || {}, Duration::from_secs(45), cancel).await;
        let times = times.lock().clone();
        let gaps: Vec<u64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        // hint 2, hint 10, no hint + slow = idle 45, failures 90, 180, 300 (capped), hint 30, hint 60.
        assert_eq!(gaps, [2, 10, 45, 90, 180, 300, 30, 60]);
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_tick_every_thirty_seconds_even_when_one_is_slow() {
        let times = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (t, c) = (times.clone(), cancel.clone());
        let beat = move || {
            let mut times = t.lock();
            times.push((tokio::time::Instant::now() - start).as_secs());
            if times.len() == 4 {
                c.cancel();
            }
            let slow = times.len() == 1;
            async move {
                // The first beat hangs for 25 s; the next still goes on time.
                if slow {
                    tokio::time::sleep(Duration::from_secs(25)).await;
                }
            }
        };
        beat_cadence(Duration::from_secs(30), cancel, beat).await;
        assert_eq!(*times.lock(), [0, 30, 60, 90]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_command_brings_the_next_poll_within_two_seconds() {
        let polls = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (p, c) = (polls.clone(), cancel.clone());
        let poll = move || {
            let mut polls = p.lock();
            polls.push((tokio::time::Instant::now() - start).as_secs());
            if polls.len() == 3 {
                c.cancel();
            }
            async { answer("slow", Some(60)) }
        };
        let mut first = true;
        let handle = move |_| {
            let immediate = std::mem::replace(&mut first, false);
            async move { Some(immediate) }
        };
        poll_cadence(poll, handle, || {}, Duration::from_secs(60), cancel).await;
        assert_eq!(*polls.lock(), [0, 2, 62]);
    }
}
