//! The wire shapes of events' `data` (BP §8.5), private to `payload`: each constructor fills one.

use super::*;

/// Whose instance an event is about: installation, team and user (BP §8.5-1, -12).
#[derive(Serialize)]
pub(super) struct InstanceIds<'a> {
    pub(super) installation_id: &'a str,
    pub(super) team_id: &'a str,
    pub(super) user_id: &'a str,
}

impl<'a> InstanceIds<'a> {
    pub(super) fn of(spec: &'a InstanceSpec) -> Self {
        Self { installation_id: &spec.installation_id.0, team_id: &spec.team_id.0, user_id: &spec.user_id.0 }
    }
}

#[derive(Serialize)]
pub(super) struct StatusChanged<'a> {
    #[serde(flatten)]
    pub(super) ids: InstanceIds<'a>,
    pub(super) status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) status_message: Option<&'a str>,
    pub(super) timestamp: String,
}

#[derive(Serialize)]
pub(super) struct ServerLogs<'a> {
    pub(super) installation_id: &'a str,
    pub(super) team_id: &'a str,
    pub(super) user_id: &'a str,
    pub(super) logs: Vec<ServerLogEntry>,
}

#[derive(Serialize)]
pub(super) struct RequestLogs<'a> {
    pub(super) installation_id: &'a str,
    pub(super) team_id: &'a str,
    pub(super) requests: Vec<RequestLogEntry>,
}

#[derive(Serialize)]
pub(super) struct ToolsDiscovered<'a> {
    pub(super) installation_id: &'a str,
    pub(super) installation_name: &'a str,
    pub(super) team_id: &'a str,
    pub(super) server_slug: &'a str,
    pub(super) tool_count: usize,
    pub(super) total_tokens: u64,
    pub(super) tools: Vec<DiscoveredTool<'a>>,
    pub(super) discovered_at: String,
}

#[derive(Serialize)]
pub(super) struct DiscoveredTool<'a> {
    pub(super) tool_name: &'a str,
    pub(super) description: &'a str,
    pub(super) input_schema: SchemaText<'a>,
    pub(super) token_count: u32,
}

/// An input schema as its definition writes it; `{}` when there is none.
pub(super) struct SchemaText<'a>(pub(super) Option<&'a serde_json::value::RawValue>);

impl Serialize for SchemaText<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        match self.0 {
            Some(text) => text.serialize(serializer),
            None => serializer.serialize_map(Some(0))?.end(),
        }
    }
}

#[derive(Serialize)]
pub(super) struct ToolsUpdated<'a> {
    pub(super) server_id: &'a str,
    pub(super) server_slug: &'a str,
    pub(super) team_id: &'a str,
    pub(super) added_tools: Vec<&'a str>,
    pub(super) removed_tools: Vec<&'a str>,
    pub(super) updated_tools: Vec<UpdatedTool<'a>>,
    pub(super) drifted_tools: &'a [&'a str],
    pub(super) total_tools: usize,
}

#[derive(Serialize)]
pub(super) struct UpdatedTool<'a> {
    pub(super) tool_name: &'a str,
    pub(super) changed: &'a [String],
}

/// The identity fields the process events share (BP §8.5-6..11).
#[derive(Serialize)]
pub(super) struct ServerIds {
    pub(super) server_id: String,
    pub(super) server_slug: String,
    pub(super) team_id: String,
    pub(super) user_id: String,
}

impl ServerIds {
    pub(super) fn of(spec: &InstanceSpec) -> Self {
        Self {
            server_id: spec.installation_id.0.clone(),
            server_slug: spec.process_id.0.clone(),
            team_id: spec.team_id.0.clone(),
            user_id: spec.user_id.0.clone(),
        }
    }
}

#[derive(Serialize)]
pub(super) struct Started {
    #[serde(flatten)]
    pub(super) ids: ServerIds,
    pub(super) process_id: u32,
    pub(super) transport: &'static str,
    pub(super) tool_count: u32,
    pub(super) spawn_duration_ms: u64,
}

#[derive(Serialize)]
pub(super) struct Crashed {
    #[serde(flatten)]
    pub(super) ids: ServerIds,
    pub(super) process_id: u32,
    pub(super) exit_code: i32,
    pub(super) signal: String,
    pub(super) uptime_seconds: u64,
    pub(super) crash_count: u32,
    pub(super) will_restart: bool,
}

#[derive(Serialize)]
pub(super) struct Restarted {
    #[serde(flatten)]
    pub(super) ids: ServerIds,
    pub(super) old_process_id: u32,
    pub(super) new_process_id: u32,
    pub(super) restart_reason: &'static str,
    pub(super) attempt_number: u32,
}

#[derive(Serialize)]
pub(super) struct PermanentlyFailed {
    #[serde(flatten)]
    pub(super) ids: ServerIds,
    pub(super) total_crashes: u32,
    pub(super) last_error: String,
    pub(super) failed_at: String,
}

#[derive(Serialize)]
pub(super) struct Dormant {
    #[serde(flatten)]
    pub(super) ids: ServerIds,
    pub(super) process_id: u32,
    pub(super) idle_duration_seconds: u64,
    pub(super) last_activity_at: String,
}

#[derive(Serialize)]
pub(super) struct Respawned {
    #[serde(flatten)]
    pub(super) ids: ServerIds,
    pub(super) process_id: u32,
    pub(super) dormant_duration_seconds: u64,
    pub(super) respawn_duration_ms: u64,
}

#[derive(Serialize)]
pub(super) struct LogRateLimited<'a> {
    #[serde(flatten)]
    pub(super) ids: InstanceIds<'a>,
    pub(super) installation_name: &'a str,
    pub(super) dropped_count: u64,
    pub(super) time_window_seconds: u64,
    pub(super) rate_limit: u32,
}

#[derive(Serialize)]
pub(super) struct ServerStopped<'a> {
    pub(super) server_id: &'a str,
    pub(super) server_name: &'a str,
    pub(super) server_slug: &'a str,
    pub(super) team_id: &'a str,
    pub(super) user_id: &'a str,
    pub(super) reason: StopReason,
}

#[derive(Serialize)]
pub(super) struct ToolExecuted<'a> {
    pub(super) tool_name: &'a str,
    pub(super) server_id: &'a str,
    pub(super) team_id: &'a str,
    pub(super) duration_ms: u64,
    pub(super) success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error_message: Option<&'a str>,
    pub(super) user_id: &'a str,
    pub(super) installation_name: &'a str,
    pub(super) server_slug: &'a str,
    pub(super) outcome: CallOutcome,
    pub(super) request_bytes: usize,
    pub(super) response_bytes: usize,
}

#[derive(Serialize)]
pub(super) struct ConfigError<'a> {
    pub(super) error_type: ConfigErrorKind,
    pub(super) error_message: &'a str,
    pub(super) status_code: Option<u16>,
    pub(super) retry_in: u64,
}
