//! One typed constructor per event, and the payload structs that serialise to the backend's `data` shapes
//! (BP §8.5; each checked against its schema in `proto/` by `tests/wire.rs`). No module builds a payload by hand.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::{Event, EventKind};
use crate::model::{iso, ChangeKind, InstanceSpec, InstanceStatus, ToolChange};

impl Event {
    /// `mcp.server.status_changed` (BP §8.5-1), always with the user id.
    pub fn status_changed(
        spec: &InstanceSpec,
        status: InstanceStatus,
        message: Option<&str>,
        at: DateTime<Utc>,
    ) -> Self {
        Self::new(
            EventKind::ServerStatusChanged,
            Some(spec),
            StatusChanged {
                ids: InstanceIds::of(spec),
                status: status.as_str(),
                status_message: message,
                timestamp: iso(at),
            },
        )
    }

    /// `mcp.server.logs` (BP §8.5-2): one batch of one instance's log lines.
    pub fn server_logs(installation_id: &str, team_id: &str, user_id: &str, logs: Vec<ServerLogEntry>) -> Self {
        Self::new(EventKind::ServerLogs, None, ServerLogs { installation_id, team_id, user_id, logs })
    }

    /// `mcp.request.logs` (BP §8.5-3): one batch of an installation's tool calls in one team.
    pub fn request_logs(installation_id: &str, team_id: &str, requests: Vec<RequestLogEntry>) -> Self {
        Self::new(EventKind::RequestLogs, None, RequestLogs { installation_id, team_id, requests })
    }

    /// `mcp.tools.discovered` (BP §8.5-4) after a successful discovery: one entry per tool as
    /// `(original name, description, input schema, token count)`. Descriptions are passed as stored: raw for
    /// every transport, `""` when the server gave none (OQ-10 drops the reference's `[slug] ` decoration).
    pub fn tools_discovered(spec: &InstanceSpec, tools: &[(String, String, Value, usize)]) -> Self {
        let installation_id =
            if spec.installation_id.0.is_empty() { &spec.process_id.0 } else { &spec.installation_id.0 };
        let now = Utc::now();
        let data = ToolsDiscovered {
            installation_id,
            installation_name: &spec.process_id.0,
            team_id: &spec.team_id.0,
            server_slug: &spec.server_slug,
            tool_count: tools.len(),
            total_tokens: tools.iter().map(|t| t.3).sum(),
            tools: tools
                .iter()
                .map(|(name, description, input_schema, token_count)| DiscoveredTool {
                    tool_name: name,
                    description,
                    input_schema,
                    token_count: *token_count,
                })
                .collect(),
            discovered_at: iso(now),
        };
        Event { timestamp: now, ..Self::new(EventKind::ToolsDiscovered, Some(spec), data) }
    }

    /// `mcp.tools.updated` (BP §8.5-5): a re-discovery changed the instance's tools. Besides the names added
    /// and removed (all the backend reads), `updated_tools` names each changed tool with the parts that
    /// changed, and `drifted_tools` those whose description or schema changed after a recent call (§8.2 allows
    /// additional properties).
    pub fn tools_updated(spec: &InstanceSpec, changes: &[ToolChange], drifted: &[&str], total_tools: usize) -> Self {
        let named = |kind: ChangeKind| changes.iter().filter(|c| c.kind == kind).map(|c| c.name.as_str()).collect();
        let updated = changes
            .iter()
            .filter(|c| c.kind == ChangeKind::Updated)
            .map(|c| UpdatedTool { tool_name: &c.name, changed: &c.parts })
            .collect();
        Self::new(
            EventKind::ToolsUpdated,
            Some(spec),
            ToolsUpdated {
                server_id: &spec.installation_id.0,
                server_slug: &spec.server_slug,
                team_id: &spec.team_id.0,
                added_tools: named(ChangeKind::Added),
                removed_tools: named(ChangeKind::Removed),
                updated_tools: updated,
                drifted_tools: drifted,
                total_tools,
            },
        )
    }

    /// `mcp.server.started` (BP §8.5-6): `server_slug` carries the process id, `process_id` the OS pid.
    pub fn started(spec: &InstanceSpec, pid: Option<u32>, spawn_duration_ms: u64) -> Self {
        Self::new(
            EventKind::ServerStarted,
            Some(spec),
            Started {
                ids: ServerIds::of(spec),
                process_id: pid.unwrap_or(0),
                transport: "stdio",
                tool_count: 0,
                spawn_duration_ms,
            },
        )
    }

    /// `mcp.server.crashed` (BP §8.5-7).
    pub fn crashed(spec: &InstanceSpec, crash: &CrashReport) -> Self {
        Self::new(
            EventKind::ServerCrashed,
            Some(spec),
            Crashed {
                ids: ServerIds::of(spec),
                process_id: crash.pid.unwrap_or(0),
                exit_code: crash.exit_code.unwrap_or(0),
                signal: crash.signal_name(),
                uptime_seconds: crash.uptime_seconds,
                crash_count: crash.crash_count,
                will_restart: crash.will_restart,
            },
        )
    }

    /// `mcp.server.restarted` (BP §8.5-8).
    pub fn restarted(spec: &InstanceSpec, old_pid: Option<u32>, new_pid: Option<u32>, attempt: u32) -> Self {
        Self::new(
            EventKind::ServerRestarted,
            Some(spec),
            Restarted {
                ids: ServerIds::of(spec),
                old_process_id: old_pid.unwrap_or(0),
                new_process_id: new_pid.unwrap_or(0),
                restart_reason: "crash",
                attempt_number: attempt,
            },
        )
    }

    /// `mcp.server.permanently_failed` (BP §8.5-9).
    pub fn permanently_failed(spec: &InstanceSpec, crash: &CrashReport) -> Self {
        Self::new(
            EventKind::ServerPermanentlyFailed,
            Some(spec),
            PermanentlyFailed {
                ids: ServerIds::of(spec),
                total_crashes: crash.crash_count,
                last_error: format!("Exit code: {}, signal: {}", crash.exit_code.unwrap_or(0), crash.signal_name()),
                failed_at: iso(Utc::now()),
            },
        )
    }

    /// `mcp.server.dormant` (BP §8.5-10).
    pub fn dormant(spec: &InstanceSpec, pid: Option<u32>, idle_seconds: u64, last_activity: DateTime<Utc>) -> Self {
        Self::new(
            EventKind::ServerDormant,
            Some(spec),
            Dormant {
                ids: ServerIds::of(spec),
                process_id: pid.unwrap_or(0),
                idle_duration_seconds: idle_seconds,
                last_activity_at: iso(last_activity),
            },
        )
    }

    /// `mcp.server.respawned` (BP §8.5-11).
    pub fn respawned(spec: &InstanceSpec, pid: Option<u32>, dormant_seconds: u64, respawn_ms: u64) -> Self {
        Self::new(
            EventKind::ServerRespawned,
            Some(spec),
            Respawned {
                ids: ServerIds::of(spec),
                process_id: pid.unwrap_or(0),
                dormant_duration_seconds: dormant_seconds,
                respawn_duration_ms: respawn_ms,
            },
        )
    }

    /// `mcp.server.log_rate_limit_exceeded` (BP §8.5-12, with the fields OQ-49 adds).
    pub fn log_rate_limited(spec: &InstanceSpec, dropped: u64, window_seconds: u64, rate_limit: u32) -> Self {
        Self::new(
            EventKind::ServerLogRateLimitExceeded,
            Some(spec),
            LogRateLimited {
                ids: InstanceIds::of(spec),
                installation_name: &spec.process_id.0,
                dropped_count: dropped,
                time_window_seconds: window_seconds,
                rate_limit,
            },
        )
    }

    /// `mcp.client.activity` (BP §8.5-14): one client's requests since the last report.
    pub fn client_activity(activity: &ClientActivity) -> Self {
        Self::new(EventKind::ClientActivity, None, activity)
    }

    /// `mcp.client.connected` (BP §8.5-15): a legacy SSE stream opened.
    pub fn client_connected(connected: &ClientConnected) -> Self {
        Self::new(EventKind::ClientConnected, None, connected)
    }

    /// `mcp.client.disconnected` (BP §8.5-16): a legacy SSE stream ended.
    pub fn client_disconnected(disconnected: &ClientDisconnected) -> Self {
        Self::new(EventKind::ClientDisconnected, None, disconnected)
    }

    /// `mcp.server.stopped` (BP §8.5-13): a running instance was stopped on purpose (a `kill` command, removed
    /// or changed in the config, shutdown); `server_name` carries the process id like the other process events.
    pub fn server_stopped(spec: &InstanceSpec, reason: StopReason) -> Self {
        Self::new(
            EventKind::ServerStopped,
            Some(spec),
            ServerStopped {
                server_id: &spec.installation_id.0,
                server_name: &spec.process_id.0,
                server_slug: &spec.server_slug,
                team_id: &spec.team_id.0,
                user_id: &spec.user_id.0,
                reason,
            },
        )
    }

    /// `mcp.tool.executed` (BP §8.5-17): one `tools/call` that reached an instance.
    pub fn tool_executed(spec: &InstanceSpec, call: &ToolExecution) -> Self {
        Self::new(
            EventKind::ToolExecuted,
            Some(spec),
            ToolExecuted {
                tool_name: &call.tool_path,
                server_id: &spec.installation_id.0,
                team_id: &spec.team_id.0,
                duration_ms: call.duration_ms,
                success: call.outcome == CallOutcome::Success,
                error_message: call.error_message.as_deref(),
                user_id: &spec.user_id.0,
                installation_name: &spec.process_id.0,
                server_slug: &spec.server_slug,
                outcome: call.outcome,
                request_bytes: call.request_bytes,
                response_bytes: call.response_bytes,
            },
        )
    }

    /// `config.refreshed` (BP §8.5-18): a configuration was fetched (or read) and applied.
    pub fn config_refreshed(refresh: &ConfigRefresh) -> Self {
        Self::new(EventKind::ConfigRefreshed, None, refresh)
    }

    /// `security.auth.failed` (BP §8.5-20): a caller was refused; never the token, at most its hash prefix.
    pub fn auth_failed(failure: &AuthFailure) -> Self {
        Self::new(EventKind::SecurityAuthFailed, None, failure)
    }

    /// `resource.limit.exceeded` (BP §8.5-21): a cap refused work.
    pub fn limit_exceeded(limit: &LimitExceeded) -> Self {
        Self::new(EventKind::ResourceLimitExceeded, None, limit)
    }

    /// `config.error` (BP §8.5-19): fetching the configuration failed.
    pub fn config_error(kind: ConfigErrorKind, message: &str, status_code: Option<u16>, retry_in: u64) -> Self {
        Self::new(
            EventKind::ConfigError,
            None,
            ConfigError { error_type: kind, error_message: message, status_code, retry_in },
        )
    }
}

/// Why a running instance was stopped (`mcp.server.stopped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A `kill` command.
    Killed,
    /// Its entry left the configuration.
    Removed,
    /// Its entry changed; a new instance replaces it.
    Replaced,
    /// The satellite is shutting down.
    Shutdown,
}

/// How one tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    Success,
    /// The tool answered with `isError: true`.
    ToolError,
    /// The call failed: a JSON-RPC error, a timeout, the server unreachable.
    Failed,
}

/// One tool call, for `mcp.tool.executed`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolExecution {
    /// `slug:tool`.
    pub tool_path: String,
    pub duration_ms: u64,
    pub outcome: CallOutcome,
    pub error_message: Option<String>,
    pub request_bytes: usize,
    pub response_bytes: usize,
}

/// A configuration that was applied (BP §8.5-18).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigRefresh {
    /// The first 12 hex digits of the SHA-256 of the configuration.
    pub config_hash: String,
    pub server_count: usize,
    pub teams_count: usize,
    pub change_detected: bool,
    pub fetch_duration_ms: u64,
    /// `backend` or `file`.
    pub source: &'static str,
    pub rejected_count: usize,
}

impl ConfigRefresh {
    /// The refresh of a configuration whose SHA-256 is `digest`: `servers` instances in `teams` teams,
    /// `rejected` entries refused, fetched in `fetch_ms`. `change_detected` is the caller's once it is applied.
    pub fn new(
        source: &'static str,
        digest: [u8; 32],
        servers: usize,
        teams: usize,
        rejected: usize,
        fetch_ms: u64,
    ) -> Self {
        Self {
            config_hash: hex::encode(&digest[..6]),
            server_count: servers,
            teams_count: teams,
            change_detected: false,
            fetch_duration_ms: fetch_ms,
            source,
            rejected_count: rejected,
        }
    }
}

/// A refused caller (BP §8.5-20). Rate-limited per source by the caller of `Event::auth_failed`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuthFailure {
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    pub ip_address: String,
    /// `mcp`, `instance` or `sse`.
    pub endpoint: &'static str,
    /// The first 8 hex digits of the SHA-256 of the presented token, when one was presented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_sha256_prefix: Option<String>,
    /// Failures from the same source not reported since the last event (rate limit).
    pub suppressed_count: u64,
}

/// Which cap refused work (`resource.limit.exceeded`'s `resource_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitedResource {
    /// The process caps, per user or in total.
    Processes,
    /// An instance's concurrent call slots.
    CallSlots,
    /// The event outbox quota.
    EventOutbox,
}

impl LimitedResource {
    /// The wire name (`resource_type`), also used in log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitedResource::Processes => "processes",
            LimitedResource::CallSlots => "call_slots",
            LimitedResource::EventOutbox => "event_outbox",
        }
    }
}

/// A cap that refused work (BP §8.5-21). `team_id` is `*` for the satellite's own resources (the outbox).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitExceeded {
    pub team_id: String,
    pub resource_type: LimitedResource,
    pub current_value: u64,
    pub limit_value: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installation_id: Option<String>,
    pub message: String,
    /// Refusals of the same kind not reported since the last event (rate limit).
    pub suppressed_count: u64,
}

/// What the supervisor knows about one crash.
#[derive(Debug, Clone, PartialEq)]
pub struct CrashReport {
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub uptime_seconds: u64,
    pub crash_count: u32,
    pub will_restart: bool,
}

impl CrashReport {
    /// `SIGKILL`-style name, or `"none"`.
    pub fn signal_name(&self) -> String {
        match self.signal {
            None => "none".into(),
            Some(n) => nix::sys::signal::Signal::try_from(n).map(|s| s.as_str().to_owned()).unwrap_or(n.to_string()),
        }
    }
}

/// One line of an instance's server log (BP §9.1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerLogEntry {
    pub level: String,
    pub message: String,
    pub timestamp: String,
}

/// One captured tool call (BP §9.2).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestLogEntry {
    pub user_id: String,
    pub tool_name: String,
    pub tool_params: Value,
    pub response_time_ms: u64,
    pub success: bool,
    pub timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_response: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

/// One client's activity since the last report (BP §8.5-14, SB §17).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientActivity {
    pub user_id: String,
    pub team_id: String,
    pub oauth_client_id: String,
    pub auth_type: String,
    pub auth_identifier: String,
    pub client_name: String,
    pub user_agent: String,
    pub ip_address: String,
    pub request_count: u64,
    pub tool_call_count: u64,
    pub last_activity_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// A legacy SSE stream opened (BP §8.5-15).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientConnected {
    pub session_id: String,
    pub client_type: &'static str,
    pub user_agent: String,
    pub team_id: String,
    pub transport: &'static str,
    pub ip_address: String,
}

/// A legacy SSE stream ended (BP §8.5-16).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientDisconnected {
    pub session_id: String,
    pub team_id: String,
    pub connection_duration_seconds: u64,
    pub tool_execution_count: u64,
    pub disconnect_reason: &'static str,
}

/// `config.error`'s `error_type` (BP §8.5-19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigErrorKind {
    Auth,
    ServerError,
    Network,
}

/// Whose instance an event is about: installation, team and user (BP §8.5-1, -12).
#[derive(Serialize)]
struct InstanceIds<'a> {
    installation_id: &'a str,
    team_id: &'a str,
    user_id: &'a str,
}

impl<'a> InstanceIds<'a> {
    fn of(spec: &'a InstanceSpec) -> Self {
        Self { installation_id: &spec.installation_id.0, team_id: &spec.team_id.0, user_id: &spec.user_id.0 }
    }
}

#[derive(Serialize)]
struct StatusChanged<'a> {
    #[serde(flatten)]
    ids: InstanceIds<'a>,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_message: Option<&'a str>,
    timestamp: String,
}

#[derive(Serialize)]
struct ServerLogs<'a> {
    installation_id: &'a str,
    team_id: &'a str,
    user_id: &'a str,
    logs: Vec<ServerLogEntry>,
}

#[derive(Serialize)]
struct RequestLogs<'a> {
    installation_id: &'a str,
    team_id: &'a str,
    requests: Vec<RequestLogEntry>,
}

#[derive(Serialize)]
struct ToolsDiscovered<'a> {
    installation_id: &'a str,
    installation_name: &'a str,
    team_id: &'a str,
    server_slug: &'a str,
    tool_count: usize,
    total_tokens: usize,
    tools: Vec<DiscoveredTool<'a>>,
    discovered_at: String,
}

#[derive(Serialize)]
struct DiscoveredTool<'a> {
    tool_name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    token_count: usize,
}

#[derive(Serialize)]
struct ToolsUpdated<'a> {
    server_id: &'a str,
    server_slug: &'a str,
    team_id: &'a str,
    added_tools: Vec<&'a str>,
    removed_tools: Vec<&'a str>,
    updated_tools: Vec<UpdatedTool<'a>>,
    drifted_tools: &'a [&'a str],
    total_tools: usize,
}

#[derive(Serialize)]
struct UpdatedTool<'a> {
    tool_name: &'a str,
    changed: &'a [String],
}

/// The identity fields the process events share (BP §8.5-6..11).
#[derive(Serialize)]
struct ServerIds {
    server_id: String,
    server_slug: String,
    team_id: String,
    user_id: String,
}

impl ServerIds {
    fn of(spec: &InstanceSpec) -> Self {
        Self {
            server_id: spec.installation_id.0.clone(),
            server_slug: spec.process_id.0.clone(),
            team_id: spec.team_id.0.clone(),
            user_id: spec.user_id.0.clone(),
        }
    }
}

#[derive(Serialize)]
struct Started {
    #[serde(flatten)]
    ids: ServerIds,
    process_id: u32,
    transport: &'static str,
    tool_count: u32,
    spawn_duration_ms: u64,
}

#[derive(Serialize)]
struct Crashed {
    #[serde(flatten)]
    ids: ServerIds,
    process_id: u32,
    exit_code: i32,
    signal: String,
    uptime_seconds: u64,
    crash_count: u32,
    will_restart: bool,
}

#[derive(Serialize)]
struct Restarted {
    #[serde(flatten)]
    ids: ServerIds,
    old_process_id: u32,
    new_process_id: u32,
    restart_reason: &'static str,
    attempt_number: u32,
}

#[derive(Serialize)]
struct PermanentlyFailed {
    #[serde(flatten)]
    ids: ServerIds,
    total_crashes: u32,
    last_error: String,
    failed_at: String,
}

#[derive(Serialize)]
struct Dormant {
    #[serde(flatten)]
    ids: ServerIds,
    process_id: u32,
    idle_duration_seconds: u64,
    last_activity_at: String,
}

#[derive(Serialize)]
struct Respawned {
    #[serde(flatten)]
    ids: ServerIds,
    process_id: u32,
    dormant_duration_seconds: u64,
    respawn_duration_ms: u64,
}

#[derive(Serialize)]
struct LogRateLimited<'a> {
    #[serde(flatten)]
    ids: InstanceIds<'a>,
    installation_name: &'a str,
    dropped_count: u64,
    time_window_seconds: u64,
    rate_limit: u32,
}

#[derive(Serialize)]
struct ServerStopped<'a> {
    server_id: &'a str,
    server_name: &'a str,
    server_slug: &'a str,
    team_id: &'a str,
    user_id: &'a str,
    reason: StopReason,
}

#[derive(Serialize)]
struct ToolExecuted<'a> {
    tool_name: &'a str,
    server_id: &'a str,
    team_id: &'a str,
    duration_ms: u64,
    success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_message: Option<&'a str>,
    user_id: &'a str,
    installation_name: &'a str,
    server_slug: &'a str,
    outcome: CallOutcome,
    request_bytes: usize,
    response_bytes: usize,
}

#[derive(Serialize)]
struct ConfigError<'a> {
    error_type: ConfigErrorKind,
    error_message: &'a str,
    status_code: Option<u16>,
    retry_in: u64,
}

#[cfg(test)]
#[path = "payload_tests.rs"]
mod tests;
