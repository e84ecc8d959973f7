//! The command worker (BP §5-§6): one command at a time to its terminal result, posted to the backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backend::dedup::CommandLedger;
use crate::backend::wire::{self, Command, CommandKind, CommandResult, ConfigureIntent};
use crate::instances::{policy, Instance};
use crate::model::{InstallationId, InstanceStatus, Upstream, UserId};

use super::{Managed, ManagedDeps, ManagedStats};

pub(super) async fn worker(
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
        // Replicas on one database: the others run it too (`replicas::follow`).
        let replicate = (deps.replicas.shared() && replicated(&command)).then(|| command.clone());
        let result = run_command(&deps, command).await;
        // Stepped down meanwhile (`replicas::leadership`): the backend delivers the command again to the new
        // leader, which records and answers it; this replica does neither.
        if cancel.is_cancelled() && deps.replicas.shared() {
            info!(command_id = %id, "no longer the leader; the command's result is left to the next one");
            return;
        }
        if let Some(command) = replicate {
            signal(&deps, &command).await;
        }
        match &result.error_message {
            Some(error) => {
                warn!(command_id = %id, command_type = %kind, status = result.status.as_str(), error = %error, "backend command failed; its result is reported to the backend")
            }
            None => {
                info!(command_id = %id, command_type = %kind, status = result.status.as_str(), "backend command done")
            }
        }
        stats.lock().commands_run += 1;
        post_result(&deps, &result).await;
        ledger.lock().finish(&id, serde_json::to_value(&result).unwrap_or(Value::Null));
    }
}

/// Recorded commands are kept this long: a replica down longer starts afresh from the configuration anyway.
const SIGNALS_KEPT: chrono::Duration = chrono::Duration::hours(1);

/// Whether the other replicas must run `command` too: it changes the instances or the caches every replica
/// keeps. Health checks only read, and unknown or malformed commands change nothing.
fn replicated(command: &Command) -> bool {
    matches!(
        command.kind,
        CommandKind::Configure(_)
            | CommandKind::Spawn(_)
            | CommandKind::Kill(_)
            | CommandKind::Restart(_)
            | CommandKind::InvalidateUserTokenCache(_)
    )
}

/// Record a command this leader ran, for the other replicas. A failure is logged: the followers then catch up
/// at the next configure.
async fn signal(deps: &ManagedDeps, command: &Command) {
    let Ok(json) = serde_json::to_value(command) else { return };
    let now = chrono::Utc::now();
    let at = crate::model::iso(now);
    let keep_after = crate::model::iso(now - SIGNALS_KEPT);
    if let Err(err) = deps.replicas.push_signal(&deps.replica_id, &json, &at, &keep_after).await {
        warn!(command_id = %command.id, error = %err, "could not record a command for the other replicas");
    }
}

pub(super) async fn post_result(deps: &ManagedDeps, result: &CommandResult) {
    if let Err(err) = deps.client.post_result(result).await {
        // Not retried: the command comes again and the ledger answers it (BP §5).
        warn!(command_id = %result.command_id, error = %err, "posting a command result failed");
    }
}

/// One command to its terminal result (BP §6).
pub async fn run_command(deps: &ManagedDeps, command: Command) -> CommandResult {
    let id = command.id.clone();
    match command.kind {
        CommandKind::Configure(payload) => configure(deps, id, payload).await,
        CommandKind::Restart(payload) => restart(deps, id, &payload.common).await,
        CommandKind::Kill(payload) => kill(deps, id, &payload.common).await,
        CommandKind::Spawn(payload) => spawn(deps, id, payload.common.installation_id).await,
        CommandKind::HealthCheck(payload) if payload.check_type == Some(wire::CheckType::CredentialValidation) => {
            let Some(installation) = payload.common.installation_id.clone() else {
                return CommandResult::failed(id, "installation_id is required for credential validation", None);
            };
            CommandResult::completed(
                id,
                json!({"credential_validation": validate_credentials(deps, &installation).await}),
            )
        }
        CommandKind::HealthCheck(payload) => health_check(deps, id, payload.common.installation_id).await,
        CommandKind::InvalidateUserTokenCache(payload) => invalidate_user_token_cache(deps, id, payload),
        CommandKind::Unknown { command_type, .. } => CommandResult::unknown_type(id, &command_type),
        CommandKind::Malformed { command_type, reason, .. } => {
            CommandResult::failed(id, format!("Invalid {command_type} payload: {reason}"), None)
        }
    }
}

/// `configure` (BP §6.1), by its intent.
async fn configure(deps: &ManagedDeps, id: String, payload: wire::ConfigurePayload) -> CommandResult {
    match payload.intent() {
        ConfigureIntent::Recovery => {
            let Some(installation) = payload.common.installation_id.clone() else {
                return CommandResult::failed(id, "installation_id is required for mcp_recovery", None);
            };
            recover(deps, id, InstallationId::from(installation.as_str())).await
        }
        ConfigureIntent::UpdateToolStatus => update_tool_status(deps, id, &payload).await,
        ConfigureIntent::Redeploy => redeploy(deps, id, payload.common.installation_id).await,
        ConfigureIntent::RefreshTools => refresh_tools(deps, id, &payload.common).await,
        // Anything else: a full refresh.
        _ => match Managed::refresh_config(deps).await {
            Ok(result) => CommandResult::completed(id, result),
            Err(err) => CommandResult::failed(id, err.to_string(), None),
        },
    }
}

/// `configure` with `action: update_tool_status` (BP §6.1.1).
async fn update_tool_status(deps: &ManagedDeps, id: String, payload: &wire::ConfigurePayload) -> CommandResult {
    let (Some(installation), Some(tool), Some(disabled)) =
        (payload.common.installation_id.clone(), payload.tool_name.clone(), payload.is_disabled)
    else {
        return CommandResult::failed(id, "Missing required fields: installation_id, tool_name, or is_disabled", None);
    };
    let n = deps.manager.set_tool_status(&InstallationId::from(installation.as_str()), &tool, disabled).await;
    let state = if disabled { "disabled" } else { "enabled" };
    CommandResult::completed(
        id,
        json!({"tool_name": tool, "is_disabled": disabled,
               "message": format!("Tool {tool} {state} for {n} instances of installation {installation}")}),
    )
}

/// `configure` with `event: mcp_redeploy`. BP §6.1.3: the config first (the commit may have moved), then every
/// instance deploys afresh.
async fn redeploy(deps: &ManagedDeps, id: String, installation: Option<String>) -> CommandResult {
    let Some(installation) = installation else {
        return CommandResult::failed(id, "installation_id is required for mcp_redeploy", None);
    };
    if let Err(err) = Managed::refresh_config(deps).await {
        return CommandResult::failed(id, err.to_string(), None);
    }
    let began = Instant::now();
    match deps.manager.redeploy(&InstallationId::from(installation.as_str())).await {
        Ok(n) => {
            let failed = not_online(deps, &installation);
            let result = json!({"installation_id": installation, "instances": n,
                                "redeploy_time_ms": began.elapsed().as_millis() as u64, "failed": failed});
            if failed.is_empty() {
                CommandResult::completed(id, result)
            } else {
                CommandResult::failed(id, "redeploy failed for some instances", Some(result))
            }
        }
        Err(err) => CommandResult::failed(id, err.to_string(), None),
    }
}

/// The instances of `installation` that are not online, as a redeploy reports them.
fn not_online(deps: &ManagedDeps, installation: &str) -> Vec<Value> {
    let instances = deps.manager.of_installation(&InstallationId::from(installation), None);
    instances
        .iter()
        .flatten()
        .filter(|i| i.state() != InstanceStatus::Online)
        .map(|i| {
            json!({"instance": i.spec().process_id.0, "status": i.state().as_str(),
                        "message": i.status().message})
        })
        .collect()
}

/// `configure` with `event: mcp_tools_refresh`: the running instances of the installation (of the user), or
/// of every installation without one, discover their tools again.
async fn refresh_tools(deps: &ManagedDeps, id: String, common: &wire::CommonPayload) -> CommandResult {
    let installation = common.installation_id.as_deref().map(InstallationId::from);
    let user = common.user_id.as_deref().map(UserId::from);
    let instances: Vec<_> = deps
        .manager
        .instances()
        .into_iter()
        .filter(|i| installation.as_ref().is_none_or(|id| &i.spec().installation_id == id))
        .filter(|i| user.as_ref().is_none_or(|id| &i.spec().user_id == id))
        .collect();
    if instances.is_empty() && installation.is_some() {
        return CommandResult::completed(
            id,
            json!({"message": "Server not found on this satellite", "installation_id": common.installation_id}),
        );
    }
    CommandResult::completed(id, deps.manager.refresh_tools(instances).await.to_json())
}

/// `restart` (BP §6.3).
async fn restart(deps: &ManagedDeps, id: String, common: &wire::CommonPayload) -> CommandResult {
    let (installation, user, named) = match named_installation(deps, common, "restart") {
        Ok(target) => target,
        Err(reason) => return CommandResult::failed(id, reason, None),
    };
    match deps.manager.restart_installation(&installation, user.as_ref()).await {
        Ok(n) => CommandResult::completed(
            id,
            json!({"process_id": installation.0, "server_name": named, "server_url": "", "restart_time_ms": 0, "instances": n}),
        ),
        Err(err) => CommandResult::failed(id, err.to_string(), None),
    }
}

/// `kill` (BP §6.3).
async fn kill(deps: &ManagedDeps, id: String, common: &wire::CommonPayload) -> CommandResult {
    let (installation, user, named) = match named_installation(deps, common, "kill") {
        Ok(target) => target,
        Err(reason) => return CommandResult::failed(id, reason, None),
    };
    match deps.manager.stop_installation(&installation, user.as_ref()).await {
        Ok(n) => CommandResult::completed(
            id,
            json!({"process_id": installation.0, "server_name": named, "shutdown_time_ms": 0, "instances": n}),
        ),
        Err(err) => CommandResult::failed(id, err.to_string(), None),
    }
}

/// Legacy `spawn` (BP §6.3).
async fn spawn(deps: &ManagedDeps, id: String, installation: Option<String>) -> CommandResult {
    // Instances are config-driven: a spawn is answered from the current config after a refresh.
    if let Err(err) = Managed::refresh_config(deps).await {
        return CommandResult::failed(id, err.to_string(), None);
    }
    let installation = installation.unwrap_or_default();
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

/// `health_check` for connectivity (BP §6.2): `tools/list` on each remote instance (of the installation).
async fn health_check(deps: &ManagedDeps, id: String, installation: Option<String>) -> CommandResult {
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
            "status": instance.state().as_str(),
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

/// `invalidate_user_token_cache` (BP §6.4).
fn invalidate_user_token_cache(
    deps: &ManagedDeps,
    id: String,
    payload: wire::InvalidateUserTokenCachePayload,
) -> CommandResult {
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
        if let Some((error, reauth)) = check_credentials(deps, instance).await {
            needs_reauth |= reauth;
            errors.push(error);
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

/// One remote instance's credentials, checked with `tools/list`: `None` when they work, else the error and whether
/// the instance waits for re-authorisation (a refusal of the credentials puts it there).
async fn check_credentials(deps: &ManagedDeps, instance: &Arc<Instance>) -> Option<(String, bool)> {
    if instance.state() == InstanceStatus::RequiresReauth {
        return reconnect_for_check(deps, instance).await;
    }
    // BP §6.2: the configured timeout (the config's `timeout`, else the default the upstream was given).
    let timeout = match &instance.spec().upstream {
        Upstream::StreamableHttp { timeout, .. } | Upstream::Sse { timeout, .. } => *timeout,
        Upstream::Stdio { .. } => Duration::from_secs(15),
    };
    let err = deps.manager.call(instance, "tools/list", Some(json!({})), timeout).await.err()?;
    let text = err.to_string();
    let refused = err.upstream().is_some_and(policy::refuses_credentials);
    if refused && instance.state() != InstanceStatus::RequiresReauth {
        deps.manager.require_reauth(instance, text.clone()).await;
    }
    Some((text, refused))
}

/// An instance waiting for re-authorisation has no connection left to ask on: connect afresh with the credentials
/// held now (the user may have re-authorised). Success brings the instance back `online` (OQ-8: the one case that
/// announces it); a refusal leaves it waiting for re-authorisation. As [`check_credentials`] answers.
async fn reconnect_for_check(deps: &ManagedDeps, instance: &Instance) -> Option<(String, bool)> {
    let _ = deps.manager.reconnect_waiting_for_reauth(&instance.spec().process_id).await;
    let now = instance.status();
    let message = || now.message.clone().unwrap_or_else(|| format!("instance is {}", now.status.as_str()));
    match now.status {
        InstanceStatus::Online => None,
        InstanceStatus::RequiresReauth => Some((message(), true)),
        _ => Some((message(), false)),
    }
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
    // Instances a kill stopped are left stopped (a restart starts them), and named so the backend knows why.
    let mut stopped = Vec::new();
    let mut tools = 0;
    for instance in &remote {
        if instance.is_halted() {
            stopped.push(json!({"server_name": instance.spec().process_id.0, "status": instance.state().as_str(),
                                "message": "stopped by a kill command; a restart starts it again"}));
        } else if deps.manager.rediscover(instance).await {
            tools += instance.catalog().map_or(0, |c| c.tools.len());
        } else {
            failed.push(
                json!({"server_name": instance.spec().process_id.0, "resulting_status": instance.state().as_str()}),
            );
        }
    }
    let result = json!({"installation_id": installation.0, "server_name": remote[0].spec().server_slug,
                        "tools_discovered": tools, "discovery_time_ms": began.elapsed().as_millis() as u64, "failed": failed,
                        "stopped": stopped});
    if failed.is_empty() {
        CommandResult::completed(id, result)
    } else {
        CommandResult::failed(id, "re-discovery failed for some instances", Some(result))
    }
}

/// The installation (and user) a `kill` or `restart` names (BP §6.3), with the name to report: its
/// `installation_id`, or the legacy `server_name`, read as an instance's process id (the config key, one user's
/// instance) or as a server's name or slug (within `team_id` when the payload gives one). A `user_id` narrows
/// either; a name that fits instances of several installations is refused, so nothing unmeant is stopped.
fn named_installation(
    deps: &ManagedDeps,
    common: &wire::CommonPayload,
    verb: &str,
) -> Result<(InstallationId, Option<UserId>, String), String> {
    let user = common.user_id.as_deref().map(UserId::from);
    if let Some(installation) = &common.installation_id {
        return Ok((InstallationId::from(installation.as_str()), user, installation.clone()));
    }
    let Some(name) = common.server_name.as_deref().filter(|n| !n.is_empty()) else {
        return Err(format!("installation_id (or the legacy server_name) is required for {verb}"));
    };
    let instances = deps.manager.instances();
    if let Some(instance) = instances.iter().find(|i| i.spec().process_id.as_str() == name) {
        let spec = instance.spec();
        return Ok((spec.installation_id.clone(), user.or_else(|| Some(spec.user_id.clone())), name.to_owned()));
    }
    let team = common.team_id.as_deref().or(common.team_context.as_ref().and_then(|t| t.team_id.as_deref()));
    let mut installations: Vec<InstallationId> = instances
        .iter()
        .map(|i| i.spec())
        .filter(|spec| spec.server_name == name || spec.server_slug == name)
        .filter(|spec| team.is_none_or(|team| spec.team_id.as_str() == team))
        .map(|spec| spec.installation_id.clone())
        .collect();
    installations.sort();
    installations.dedup();
    match installations.as_slice() {
        [] => Err(format!("no server named {name} on this satellite")),
        [installation] => Ok((installation.clone(), user, name.to_owned())),
        several => {
            Err(format!("server_name {name} names {} installations; send installation_id for {verb}", several.len()))
        }
    }
}
