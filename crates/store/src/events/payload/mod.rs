//! One typed constructor per event, and the payload structs that serialise to the backend's `data` shapes
//! (BP §8.5; each checked against its schema in `proto/` by `tests/wire.rs`). No module builds a payload by hand.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;

use super::{Event, EventKind};
use crate::model::{iso, ChangeKind, InstanceSpec, InstanceStatus, ToolChange, ToolDef};

mod wire;
use wire::{
    ConfigError, Crashed, DiscoveredTool, Dormant, InstanceIds, LogRateLimited, PermanentlyFailed, RequestLogs,
    Respawned, Restarted, SchemaText, ServerIds, ServerLogs, ServerStopped, Started, StatusChanged, ToolExecuted,
    ToolsDiscovered, ToolsUpdated, UpdatedTool,
};

mod inputs;
pub use inputs::{
    AuthFailure, CallOutcome, ClientActivity, ClientConnected, ClientDisconnected, ConfigErrorKind, ConfigRefresh,
    CrashReport, LimitExceeded, LimitedResource, RequestLogEntry, ServerLogEntry, StopReason, ToolExecution,
};

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

    /// `mcp.tools.discovered` (BP §8.5-4) after a successful discovery: one entry per tool, with its count in
    /// `tokens` (the same order). Descriptions are passed as stored: raw for every transport, `""` when the server
    /// gave none (OQ-10 drops the reference's `[slug] ` decoration). Input schemas are copied from the definitions'
    /// compact text (`{}` when the server gave none), never parsed: a large listing's schemas are not all
    /// turned into trees at once.
    pub fn tools_discovered(spec: &InstanceSpec, tools: &[ToolDef], tokens: &[u32]) -> Self {
        let installation_id =
            if spec.installation_id.0.is_empty() { &spec.process_id.0 } else { &spec.installation_id.0 };
        let now = Utc::now();
        let listed: Vec<DiscoveredTool> = tools
            .iter()
            .zip(tokens)
            .map(|(tool, token_count)| DiscoveredTool {
                tool_name: tool.name(),
                description: tool.description(),
                input_schema: SchemaText(tool.input_schema_text()),
                token_count: *token_count,
            })
            .collect();
        let data = ToolsDiscovered {
            installation_id,
            installation_name: &spec.process_id.0,
            team_id: &spec.team_id.0,
            server_slug: &spec.server_slug,
            // Counted from what is listed: a tool without a count is neither listed nor counted.
            tool_count: listed.len(),
            total_tokens: listed.iter().map(|tool| u64::from(tool.token_count)).sum(),
            tools: listed,
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

    /// `mcp.server.stopped` (BP §8.5-13): a running instance, or a dormant one, was stopped on purpose (a `kill`
    /// command, removed or changed in the config, shutdown); `server_name` carries the process id like the other
    /// process events.
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

#[cfg(test)]
mod tests;
