//! What callers hand the event constructors: reasons, outcomes and reports, in the satellite's own terms.

use super::*;

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
    /// Where the connection came from (a proxy's address, behind one).
    pub ip_address: String,
    /// The address the request's `X-Forwarded-For` or `X-Real-IP` names, when it names one: what a proxy says of
    /// its client, or what any client chose to write there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded_for: Option<String>,
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
    /// A rate limit or quota on tool calls (`[[limits]]`).
    ToolCalls,
}

impl LimitedResource {
    /// The wire name (`resource_type`), also used in log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitedResource::Processes => "processes",
            LimitedResource::CallSlots => "call_slots",
            LimitedResource::EventOutbox => "event_outbox",
            LimitedResource::ToolCalls => "tool_calls",
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

/// One captured tool call (BP §9.2). The arguments and the answer are JSON text (masked), written into the event
/// as they are.
#[derive(Debug, Clone, Serialize)]
pub struct RequestLogEntry {
    pub user_id: String,
    pub tool_name: String,
    /// An object; `{}` when the call had no arguments as an object (`None`).
    #[serde(serialize_with = "object_or_empty")]
    pub tool_params: Option<Box<RawValue>>,
    pub response_time_ms: u64,
    pub success: bool,
    pub timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_response: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

fn object_or_empty<S: serde::Serializer>(object: &Option<Box<RawValue>>, serializer: S) -> Result<S::Ok, S::Error> {
    match object {
        Some(object) => object.serialize(serializer),
        None => serde::ser::SerializeMap::end(serializer.serialize_map(Some(0))?),
    }
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
