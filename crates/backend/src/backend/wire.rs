//! The bodies exchanged with the backend (BP §2-§11), as serde types that serialize to exactly the shapes of the
//! JSON Schemas in `proto/` (one schema per body; `tests/wire.rs` checks every type against its schema).
//!
//! Data only: no IO, no clock, no locks. Inbound types tolerate unknown fields (the backend adds some) and
//! values this satellite does not know: an unknown `command_type` becomes [`CommandKind::Unknown`], a known type
//! whose payload does not fit becomes [`CommandKind::Malformed`], so one odd command never fails a whole poll and
//! each still gets its failed result (BP §6.5). Optional fields are omitted when `None`. Credentials are
//! [`Credential`]s, whose `Debug` never shows the value.
//!
//! The config entry type is [`McpServerEntry`] (`control::snapshot`); the event payloads are built by
//! `events::Event`'s constructors and travel here inside [`EventEnvelope`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::control::snapshot::{DesiredState, McpServerEntry};
use crate::events::{Event, EventKind};
use crate::model::{iso, lenient};

/// Request paths under the backend base URL (BP §0.1).
pub mod path {
    pub const HEALTH: &str = "/api/health";
    pub const REGISTER: &str = "/api/satellites/register";
    pub const INTROSPECT: &str = "/api/oauth2/introspect";

    pub fn heartbeat(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/heartbeat")
    }
    /// Without the query; the client adds `last_poll` and `limit` (BP §4.1).
    pub fn commands(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/commands")
    }
    pub fn command_result(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/command-result")
    }
    pub fn config(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/config")
    }
    pub fn events(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/events")
    }
    pub fn tokens_status(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/tokens/status")
    }
    pub fn tokens_retrieve(satellite_id: &str) -> String {
        format!("/api/satellites/{satellite_id}/tokens/retrieve")
    }
    pub fn github_token(satellite_id: &str, installation_id: &str) -> String {
        let installation = url::form_urlencoded::byte_serialize(installation_id.as_bytes()).collect::<String>();
        format!("/api/satellites/{satellite_id}/github-token/{installation}")
    }
}

/// At most this many events per `POST …/events` (BP §8.1, §8.3).
pub const MAX_EVENT_BATCH: usize = 100;

/// A secret on the wire (api key, client bearer token, OAuth token): serialized as the plain string, but its
/// `Debug` shows `***`, so logging a body never prints it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Credential(String);

impl Credential {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(***)")
    }
}

/// An enum whose wire set is open: known values are variants, anything else is kept verbatim in `Other`.
macro_rules! open_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $($variant,)+
            /// A value this satellite does not know, kept as sent.
            Other(String),
        }

        impl $name {
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $wire,)+
                    Self::Other(value) => value,
                }
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                match value.as_str() {
                    $($wire => Self::$variant,)+
                    _ => Self::Other(value),
                }
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.as_str().to_owned()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// A closed enum spelled in snake_case on the wire.
macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $(#[serde(rename = $wire)] $variant,)+
        }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $wire,)+
                }
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------------------
// Common bodies (BP §0)

/// `GET /api/health` answer (`health-response.schema.json`). Only the 2xx matters; `status` is informational.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthResponse {
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// Every non-2xx answer: `{success:false, error, message?, instructions?}` (`error.schema.json`; registration
/// errors, `register-error.schema.json`, carry one of [`RegisterErrorCode`] in `error`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendError {
    #[serde(default)]
    pub success: bool,
    #[serde(default)]
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

impl BackendError {
    pub fn new(error: impl Into<String>) -> Self {
        Self { success: false, error: error.into(), message: None, instructions: None }
    }

    /// The registration error code (BP §2.3), meaningful for answers of `POST /api/satellites/register`.
    pub fn registration_code(&self) -> RegisterErrorCode {
        RegisterErrorCode::from(self.error.clone())
    }
}

/// `{success:true, message}`: the 200 answer of a heartbeat (BP §3.6) and of a command result (BP §5)
/// (`ack-response.schema.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    #[serde(default)]
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

pub type HeartbeatResponse = Ack;
pub type CommandResultResponse = Ack;

wire_enum! {
    /// The transports a satellite serves and an instance uses.
    Transport { Stdio = "stdio", Http = "http", Sse = "sse" }
}

// ---------------------------------------------------------------------------------------------------------
// Registration (BP §2)

/// `POST /api/satellites/register` (`register-request.schema.json`). Never carries `satellite_url` (OQ-2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<Transport>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_info: Option<SystemInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The runtime version; a Rust satellite sends its own, e.g. `rust-satellite/0.1.0` (BP §2.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// Registration 200 (`register-response.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterResponse {
    #[serde(default)]
    pub success: bool,
    pub satellite: RegisteredSatellite,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The registered satellite. Only `id` and `api_key` are required (BP §0 "Tolerant reader"): the real backend
/// answers `{id, name, api_key}`; `satellite_type`, `team_id` and `status` are read when a backend sends them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisteredSatellite {
    pub id: String,
    /// Plaintext only in this answer; the backend keeps a hash.
    pub api_key: Credential,
    /// Defaults to the name the satellite registered with.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub satellite_type: Option<SatelliteType>,
    /// `null` or absent for a global satellite.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

open_enum! {
    /// From the registration token's scope.
    SatelliteType { Global = "global", Team = "team" }
}

open_enum! {
    /// `error` of a registration failure (BP §2.3); every one is fatal.
    RegisterErrorCode {
        RegistrationTokenRequired = "registration_token_required",
        InvalidRegistrationToken = "invalid_registration_token",
        TokenExpired = "token_expired",
        TokenAlreadyUsed = "token_already_used",
        TokenInvalidScope = "token_invalid_scope",
        RegistrationFailed = "registration_failed",
    }
}

// ---------------------------------------------------------------------------------------------------------
// Heartbeat (BP §3)

/// `POST …/heartbeat` (`heartbeat-request.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    pub status: SatelliteStatus,
    pub system_metrics: SystemMetrics,
    /// Legacy HTTP-proxy records (BP §6.3, OQ-55); usually empty, always sent.
    #[serde(default)]
    pub processes: Vec<LegacyProcess>,
    /// Running stdio processes by team id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_by_team: Option<BTreeMap<String, Vec<ProcessMetric>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_status: Option<McpStatus>,
    /// BP §3.5; optional, kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalized_data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Only in the first successful beat of a process lifetime; `""` lets the backend derive it (BP §3.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub satellite_url: Option<String>,
}

impl HeartbeatRequest {
    /// The minimal body that checks stored credentials at startup (BP §3.4).
    pub fn verification(version: &str, memory_usage_mb: u64, uptime_seconds: u64) -> Self {
        Self {
            status: SatelliteStatus::Active,
            system_metrics: SystemMetrics {
                cpu_usage_percent: 0.0,
                memory_usage_mb,
                disk_usage_percent: Some(0.0),
                uptime_seconds: Some(uptime_seconds),
                network_rx_bytes: None,
                network_tx_bytes: None,
            },
            processes: Vec::new(),
            processes_by_team: None,
            mcp_status: None,
            normalized_data: None,
            error_count: Some(0),
            version: Some(version.to_owned()),
            satellite_url: None,
        }
    }
}

wire_enum! {
    SatelliteStatus { Active = "active", Degraded = "degraded", Error = "error" }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemMetrics {
    /// Process CPU, 0-100.
    pub cpu_usage_percent: f64,
    /// Resident set size in MB.
    pub memory_usage_mb: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_usage_percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uptime_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_rx_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_tx_bytes: Option<u64>,
}

wire_enum! {
    HealthStatus { Healthy = "healthy", Unhealthy = "unhealthy", Unknown = "unknown" }
}

wire_enum! {
    /// Lifecycle of a stdio process as the heartbeat reports it.
    ProcessStatus {
        Starting = "starting",
        Running = "running",
        Terminating = "terminating",
        Terminated = "terminated",
        Failed = "failed",
        PermanentlyFailed = "permanently_failed",
    }
}

wire_enum! {
    LegacyProcessStatus {
        Pending = "pending",
        Starting = "starting",
        Running = "running",
        Stopping = "stopping",
        Stopped = "stopped",
        Failed = "failed",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegacyProcess {
    pub id: String,
    pub server_name: String,
    pub status: LegacyProcessStatus,
    pub health_status: HealthStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance_metrics: Option<PerformanceMetrics>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PerformanceMetrics {
    pub total_requests: u64,
    pub avg_response_time_ms: f64,
}

/// One running stdio process in `processes_by_team`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessMetric {
    pub installation_id: String,
    /// The process id (config map key).
    pub installation_name: String,
    pub status: ProcessStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub uptime_seconds: u64,
    pub message_count: u64,
    pub error_count: u64,
    pub health_status: HealthStatus,
    pub last_activity: String,
}

/// The runtime snapshot of BP §3.3.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct McpStatus {
    pub summary: McpStatusSummary,
    #[serde(default)]
    pub instances: Vec<McpInstanceStatus>,
    #[serde(default)]
    pub tool_names: Vec<ToolName>,
    pub server_status_counts: ServerStatusCounts,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct McpStatusSummary {
    pub total_instances: u64,
    pub active_instances: u64,
    pub dormant_instances: u64,
    pub total_tools: u64,
    pub online_servers: u64,
    pub offline_servers: u64,
    pub error_servers: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpInstanceStatus {
    pub installation_id: String,
    pub installation_name: String,
    pub instance_id: String,
    pub user_id: String,
    pub team_id: String,
    pub status: ProcessStatus,
    pub transport_type: Transport,
    pub uptime_seconds: u64,
    pub message_count: u64,
    pub error_count: u64,
    pub health_status: HealthStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolName {
    pub namespaced_name: String,
    pub server_slug: String,
    pub transport: Transport,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStatusCounts {
    pub online: u64,
    pub offline: u64,
    pub error: u64,
    pub requires_reauth: u64,
}

// ---------------------------------------------------------------------------------------------------------
// Command polling (BP §4, §6)

/// `GET …/commands` answer (`commands-response.schema.json`). A hint of the wrong shape reads as `None`, and the
/// client falls back to the mode table of BP §4.4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandsResponse {
    /// `null` is none; an element that is not an object cannot be answered (no id) and is left out.
    #[serde(default, deserialize_with = "objects_only")]
    pub commands: Vec<Command>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub polling_mode: Option<PollingMode>,
    /// Seconds until the next poll, as the backend recommends.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub next_poll_interval: Option<u64>,
}

open_enum! {
    /// The backend sends immediate, normal or slow; `error` is the reference's own value.
    PollingMode { Immediate = "immediate", Normal = "normal", Slow = "slow", Error = "error" }
}

open_enum! {
    Priority { Immediate = "immediate", High = "high", Normal = "normal", Low = "low" }
}

/// One command. On the wire `command_type` and `payload` are two fields; here they are one [`CommandKind`].
/// An empty `id` means the backend sent none: such a command cannot be answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "RawCommand", into = "RawCommand")]
pub struct Command {
    pub id: String,
    pub priority: Option<Priority>,
    pub correlation_id: Option<String>,
    pub kind: CommandKind,
}

impl Command {
    pub fn new(id: impl Into<String>, priority: Priority, kind: CommandKind) -> Self {
        Self { id: id.into(), priority: Some(priority), correlation_id: None, kind }
    }
}

/// What a command asks for, by `command_type` (BP §6).
#[derive(Debug, Clone, PartialEq)]
pub enum CommandKind {
    Configure(ConfigurePayload),
    Spawn(SpawnPayload),
    Kill(TargetPayload),
    Restart(RestartPayload),
    HealthCheck(HealthCheckPayload),
    InvalidateUserTokenCache(InvalidateUserTokenCachePayload),
    /// A `command_type` this satellite does not know (BP §6.5): answered `failed`, "Unknown command type: …".
    Unknown {
        command_type: String,
        payload: Value,
    },
    /// A known `command_type` whose payload has fields of the wrong type: answered `failed` with `reason`.
    Malformed {
        command_type: String,
        payload: Value,
        reason: String,
    },
}

impl CommandKind {
    pub fn command_type(&self) -> &str {
        match self {
            CommandKind::Configure(_) => "configure",
            CommandKind::Spawn(_) => "spawn",
            CommandKind::Kill(_) => "kill",
            CommandKind::Restart(_) => "restart",
            CommandKind::HealthCheck(_) => "health_check",
            CommandKind::InvalidateUserTokenCache(_) => "invalidate_user_token_cache",
            CommandKind::Unknown { command_type, .. } | CommandKind::Malformed { command_type, .. } => command_type,
        }
    }

    fn parse(command_type: String, payload: Value) -> Self {
        fn typed<P: DeserializeOwned>(
            command_type: String,
            payload: Value,
            wrap: impl FnOnce(P) -> CommandKind,
        ) -> CommandKind {
            match serde_json::from_value::<P>(payload.clone()) {
                Ok(parsed) => wrap(parsed),
                Err(err) => CommandKind::Malformed { command_type, payload, reason: format!("invalid payload: {err}") },
            }
        }
        // A missing payload is an empty one.
        let payload = if payload.is_null() { Value::Object(Map::new()) } else { payload };
        match command_type.as_str() {
            "configure" => typed(command_type, payload, CommandKind::Configure),
            "spawn" => typed(command_type, payload, CommandKind::Spawn),
            "kill" => typed(command_type, payload, CommandKind::Kill),
            "restart" => typed(command_type, payload, CommandKind::Restart),
            "health_check" => typed(command_type, payload, CommandKind::HealthCheck),
            "invalidate_user_token_cache" => typed(command_type, payload, CommandKind::InvalidateUserTokenCache),
            _ => CommandKind::Unknown { command_type, payload },
        }
    }

    fn payload(&self) -> Value {
        fn json(payload: &impl Serialize) -> Value {
            // Structs of strings, booleans and maps always serialize.
            serde_json::to_value(payload).unwrap_or_else(|_| Value::Object(Map::new()))
        }
        match self {
            CommandKind::Configure(p) => json(p),
            CommandKind::Spawn(p) => json(p),
            CommandKind::Kill(p) => json(p),
            CommandKind::Restart(p) => json(p),
            CommandKind::HealthCheck(p) => json(p),
            CommandKind::InvalidateUserTokenCache(p) => json(p),
            CommandKind::Unknown { payload, .. } | CommandKind::Malformed { payload, .. } => payload.clone(),
        }
    }
}

/// A command as it is on the wire. Every field reads whatever its shape, so one odd command never fails a poll:
/// a numeric id is its text, a `command_type` that is not a string is unknown (answered `failed`).
#[derive(Serialize, Deserialize)]
struct RawCommand {
    #[serde(default, deserialize_with = "text_or_number")]
    id: String,
    #[serde(default, deserialize_with = "text_or_number")]
    command_type: String,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    priority: Option<Priority>,
    #[serde(default)]
    payload: Value,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    correlation_id: Option<String>,
}

/// A string, or a number as its text; anything else (null, an object) is empty.
fn text_or_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(match Option::<Value>::deserialize(deserializer)? {
        Some(Value::String(text)) => text,
        Some(Value::Number(number)) => number.to_string(),
        _ => String::new(),
    })
}

/// The elements of a list that are objects, read as `T`; `null` or a non-list is empty, and an element that is not
/// an object or does not read is left out with a warning.
fn objects_only<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    let Some(Value::Array(items)) = Option::<Value>::deserialize(deserializer)? else { return Ok(Vec::new()) };
    Ok(items
        .into_iter()
        .filter_map(|item| {
            let read = if item.is_object() { serde_json::from_value(item) } else { Err(serde::de::Error::custom("not an object")) };
            read.map_err(|err: serde_json::Error| tracing::warn!(error = %err, "a list element of the backend's answer that cannot be read was left out"))
                .ok()
        })
        .collect())
}

impl From<RawCommand> for Command {
    fn from(raw: RawCommand) -> Self {
        Command {
            id: raw.id,
            priority: raw.priority,
            correlation_id: raw.correlation_id,
            kind: CommandKind::parse(raw.command_type, raw.payload),
        }
    }
}

impl From<Command> for RawCommand {
    fn from(command: Command) -> Self {
        RawCommand {
            payload: command.kind.payload(),
            command_type: command.kind.command_type().to_owned(),
            id: command.id,
            priority: command.priority,
            correlation_id: command.correlation_id,
        }
    }
}

/// Keys any payload may carry (BP §6). Unknown keys are ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CommonPayload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Legacy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_context: Option<TeamContext>,
    /// Legacy `{command, environment?, url?, headers?}`; not acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_config: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TeamContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_slug: Option<String>,
}

/// `configure` (BP §6.1); [`ConfigurePayload::intent`] applies the dispatch order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigurePayload {
    #[serde(flatten)]
    pub common: CommonPayload,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_disabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slug: Option<String>,
    /// `mcp_redeploy` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_sha: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// What a `configure` command does, in the dispatch order of BP §6.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigureIntent {
    /// `action == "update_tool_status"` (§6.1.1).
    UpdateToolStatus,
    /// `event == "mcp_recovery"` (§6.1.2).
    Recovery,
    /// `event == "mcp_redeploy"` (§6.1.3).
    Redeploy,
    /// `event == "mcp_tools_refresh"` (the satellite's extension, docs/decisions.md): discover the running
    /// instances of `installation_id` (of `user_id`), or of every installation without one, again now.
    RefreshTools,
    /// Anything else: fetch the config and reconcile; the event is informational.
    Refresh,
}

impl ConfigurePayload {
    pub fn intent(&self) -> ConfigureIntent {
        if self.action.as_deref() == Some("update_tool_status") {
            return ConfigureIntent::UpdateToolStatus;
        }
        match self.common.event.as_deref() {
            Some("mcp_recovery") => ConfigureIntent::Recovery,
            Some("mcp_redeploy") => ConfigureIntent::Redeploy,
            Some("mcp_tools_refresh") => ConfigureIntent::RefreshTools,
            _ => ConfigureIntent::Refresh,
        }
    }
}

/// Legacy `spawn` (BP §6.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpawnPayload {
    #[serde(flatten)]
    pub common: CommonPayload,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
}

/// `kill` (BP §6.3): `installation_id` or legacy `server_name`, optionally narrowed by `user_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetPayload {
    #[serde(flatten)]
    pub common: CommonPayload,
}

/// `restart` (BP §6.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestartPayload {
    #[serde(flatten)]
    pub common: CommonPayload,
    /// `error_recovery`, `manual_restart` or `config_reload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `health_check` (BP §6.2); no `check_type` means connectivity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthCheckPayload {
    #[serde(flatten)]
    pub common: CommonPayload,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_type: Option<CheckType>,
}

open_enum! {
    CheckType { Connectivity = "connectivity", CredentialValidation = "credential_validation" }
}

/// `invalidate_user_token_cache` (BP §6.4).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InvalidateUserTokenCachePayload {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_email: Option<String>,
}

// ---------------------------------------------------------------------------------------------------------
// Command results (BP §5)

/// `POST …/command-result` (`command-result-request.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandResult {
    pub command_id: String,
    pub status: ResultStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

wire_enum! {
    ResultStatus { Acknowledged = "acknowledged", Executing = "executing", Completed = "completed", Failed = "failed" }
}

impl ResultStatus {
    /// `completed` and `failed` end a command; the backend re-delivers it until one arrives.
    pub fn is_terminal(self) -> bool {
        matches!(self, ResultStatus::Completed | ResultStatus::Failed)
    }
}

impl CommandResult {
    pub fn completed(command_id: impl Into<String>, result: Value) -> Self {
        Self {
            command_id: command_id.into(),
            status: ResultStatus::Completed,
            result: Some(result),
            error_message: None,
        }
    }

    /// A failure: the text goes to `error_message` and is mirrored into `result.error_message` (OQ-6). A
    /// non-object `result` is kept under `result.result`.
    pub fn failed(command_id: impl Into<String>, message: impl Into<String>, result: Option<Value>) -> Self {
        let message = message.into();
        let mut object = match result {
            Some(Value::Object(object)) => object,
            None | Some(Value::Null) => Map::new(),
            Some(other) => Map::from_iter([("result".to_owned(), other)]),
        };
        object.insert("error_message".into(), Value::String(message.clone()));
        Self {
            command_id: command_id.into(),
            status: ResultStatus::Failed,
            result: Some(Value::Object(object)),
            error_message: Some(message),
        }
    }

    /// "Unknown command type: <type>" (BP §6.5).
    pub fn unknown_type(command_id: impl Into<String>, command_type: &str) -> Self {
        Self::failed(command_id, format!("Unknown command type: {command_type}"), None)
    }
}

// ---------------------------------------------------------------------------------------------------------
// Configuration (BP §7)

/// `GET …/config` answer (`config-response.schema.json`). The entries stay raw JSON, in the backend's order, so
/// one malformed entry is skipped with its reason (BP §7.6) instead of failing the whole answer; each one is an
/// [`McpServerEntry`] once read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigResponse {
    /// Required: an answer without it is refused whole (a config error), never read as "no servers".
    pub mcp_servers: Map<String, Value>,
    /// Informational (OQ-54): read leniently, never acted on.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub satellite_config: Option<SatelliteConfig>,
}

impl ConfigResponse {
    /// An answer built from typed entries, keyed by process id, in the given order.
    pub fn from_entries<K: Into<String>>(entries: impl IntoIterator<Item = (K, McpServerEntry)>) -> Self {
        let mcp_servers = entries
            .into_iter()
            // An entry of strings, numbers and maps always serializes.
            .map(|(key, entry)| (key.into(), serde_json::to_value(entry).unwrap_or(Value::Null)))
            .collect();
        Self { mcp_servers, satellite_config: None }
    }

    /// Each entry, read as an [`McpServerEntry`] or the reason it cannot be.
    pub fn entries(&self) -> impl Iterator<Item = (&str, Result<McpServerEntry, String>)> + '_ {
        self.mcp_servers.iter().map(|(key, raw)| {
            let entry =
                serde_json::from_value::<McpServerEntry>(raw.clone()).map_err(|err| format!("malformed entry: {err}"));
            (key.as_str(), entry)
        })
    }

    /// The validated desired state (BP §7.6): invalid entries are skipped with their reason.
    pub fn desired_state(&self) -> DesiredState {
        DesiredState::from_raw_entries(&self.mcp_servers)
    }
}

/// The informational `satellite_config` block; every part optional, each read leniently.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SatelliteConfig {
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub polling_intervals: Option<PollingIntervals>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_limits: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_settings: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Value>,
}

/// Seconds; a fallback for the polling policy of BP §4.4.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PollingIntervals {
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub normal: Option<u64>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub immediate: Option<u64>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub error_backoff_max: Option<u64>,
}

// ---------------------------------------------------------------------------------------------------------
// Events (BP §8)

/// `POST …/events` (`events-request.schema.json`): 1 to [`MAX_EVENT_BATCH`] envelopes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventsRequest {
    pub events: Vec<EventEnvelope>,
}

/// A batch outside 1..=100 events; never sent (BP §8.3: the local guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event batch holds 1 to {MAX_EVENT_BATCH} events, not {0}")]
pub struct BatchSizeError(pub usize);

impl EventsRequest {
    pub fn batch(events: Vec<EventEnvelope>) -> Result<Self, BatchSizeError> {
        if events.is_empty() || events.len() > MAX_EVENT_BATCH {
            return Err(BatchSizeError(events.len()));
        }
        Ok(Self { events })
    }
}

/// One event on the wire: registry name, emission time, payload object (BP §8.1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventEnvelope {
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub timestamp: String,
    pub data: Map<String, Value>,
}

impl EventEnvelope {
    /// The envelope of an event whose payload serialised; the reason otherwise.
    pub fn of(event: &Event) -> Result<Self, String> {
        let text = event.data.as_deref().map_err(Clone::clone)?;
        let data = serde_json::from_str(text).map_err(|err| format!("payload is not a JSON object: {err}"))?;
        Ok(Self { kind: event.kind, timestamp: iso(event.timestamp), data })
    }
}

/// Events 200 (`events-response.schema.json`). A 2xx removes the batch even when some events failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EventsResponse {
    #[serde(default)]
    pub success: bool,
    #[serde(default)]
    pub processed: u64,
    #[serde(default)]
    pub failed: u64,
    #[serde(default)]
    pub event_ids: Vec<String>,
    /// Present only when non-empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<EventFailure>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventFailure {
    /// Position in the batch.
    pub index: usize,
    #[serde(rename = "type")]
    pub event_type: String,
    pub error: String,
}

// ---------------------------------------------------------------------------------------------------------
// Introspection (BP §10)

/// `POST /api/oauth2/introspect` (`introspect-request.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntrospectRequest {
    /// The MCP client's bearer token.
    pub token: Credential,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_team_id: Option<String>,
}

/// Introspection 200 (`introspect-response.schema.json`), active or not. Fields of the wrong shape read as
/// `None`; the satellite then refuses the token rather than the backend's whole answer failing to parse.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IntrospectResponse {
    #[serde(default)]
    pub active: bool,
    /// The user id.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Space-separated scopes.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Not read leniently: an `aud` of another shape is still an audience, one that names nothing (OQ-14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<Audience>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub team_name: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub team_role: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub team_permissions: Option<Vec<String>>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub error_description: Option<String>,
}

impl IntrospectResponse {
    pub fn inactive(error: &str, description: &str) -> Self {
        Self {
            active: false,
            error: Some(error.to_owned()),
            error_description: Some(description.to_owned()),
            ..Self::default()
        }
    }

    /// `scope` split on spaces.
    pub fn scopes(&self) -> Vec<&str> {
        self.scope.as_deref().map(|s| s.split_whitespace().collect()).unwrap_or_default()
    }

    /// Every audience value, none when `aud` is absent.
    pub fn audiences(&self) -> Vec<&str> {
        self.aud.as_ref().map(Audience::names).unwrap_or_default()
    }
}

/// `aud` is a string or an array of strings; anything else (an array holding other values, an object) is kept
/// as it came and names only the strings it holds at its top level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
    Other(Value),
}

impl Audience {
    /// The audiences it names (maybe none).
    pub fn names(&self) -> Vec<&str> {
        match self {
            Audience::One(one) => vec![one.as_str()],
            Audience::Many(many) => many.iter().map(String::as_str).collect(),
            Audience::Other(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
            Audience::Other(_) => Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// OAuth tokens of remote MCP servers (BP §11)

/// `POST …/tokens/status` and `…/tokens/retrieve` (`oauth-token-request.schema.json`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OAuthTokenRequest {
    pub installation_id: String,
    pub user_id: String,
    pub team_id: String,
}

/// tokens/status 200 (`oauth-token-status-response.schema.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OAuthTokenStatus {
    #[serde(default)]
    pub exists: bool,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub expired: Option<bool>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub can_refresh: Option<bool>,
}

/// tokens/retrieve 200 (`oauth-token-retrieve-response.schema.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OAuthToken {
    pub access_token: Credential,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<Credential>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_type: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

// ---------------------------------------------------------------------------------------------------------
// GitHub installation token (BP §12)

/// `GET …/github-token/{installation_id}` 200: the token that downloads the repository tarball.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GithubToken {
    pub token: Credential,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OQ-14: an `aud` that is present names what it holds, maybe nothing; only an absent one (or `null`) is none.
    #[test]
    fn an_audience_of_any_shape_is_present() {
        let aud = |raw: Value| serde_json::from_value::<IntrospectResponse>(json!({"active": true, "aud": raw}));
        let names = |raw: Value| aud(raw).map(|r| r.aud.map(|a| a.names().join(","))).map_err(|e| e.to_string());
        assert_eq!(names(json!("a")), Ok(Some("a".into())));
        assert_eq!(names(json!(["a", "b"])), Ok(Some("a,b".into())));
        assert_eq!(names(json!([])), Ok(Some(String::new())));
        assert_eq!(names(json!(["a", 7])), Ok(Some("a".into())));
        assert_eq!(names(json!({"x": 1})), Ok(Some(String::new())));
        assert_eq!(names(Value::Null), Ok(None));
    }
    use serde_json::json;

    /// A value written another way that means the same is read as meant (BP §0): a poll hint of `5.0` (an integer
    /// to JSON Schema) or `"7"`. Before, the hint was dropped and polls came at the default cadence.
    #[test]
    fn numbers_with_a_fraction_and_booleans_in_strings_are_read_as_meant() -> Result<(), serde_json::Error> {
        let poll: CommandsResponse = serde_json::from_value(json!({"commands": [], "next_poll_interval": 5.0}))?;
        assert_eq!(poll.next_poll_interval, Some(5));
        let poll: CommandsResponse = serde_json::from_value(json!({"commands": [], "next_poll_interval": "7"}))?;
        assert_eq!(poll.next_poll_interval, Some(7));
        for unreadable in [json!(5.5), json!(-1), json!("soon"), json!(1e30)] {
            let poll: CommandsResponse =
                serde_json::from_value(json!({"commands": [], "next_poll_interval": unreadable}))?;
            assert_eq!(poll.next_poll_interval, None, "{unreadable}");
        }
        Ok(())
    }

    #[test]
    fn an_unknown_command_type_is_kept_not_refused() {
        let poll: CommandsResponse = serde_json::from_value(json!({
            "commands": [
                {"id": "c1", "command_type": "update", "priority": "normal", "payload": {"x": 1}},
                {"id": "c2", "command_type": "configure", "priority": "urgent", "payload": {"event": "mcp_recovery",
                 "installation_id": "i"}, "extra": true},
                {"id": "c3", "command_type": "configure", "priority": "high", "payload": {"is_disabled": "yes"}}
            ],
            "polling_mode": "turbo", "next_poll_interval": "soon", "unknown": 1
        }))
        .unwrap();
        assert_eq!(poll.polling_mode, Some(PollingMode::Other("turbo".into())));
        assert_eq!(poll.next_poll_interval, None);
        assert_eq!(
            poll.commands[0].kind,
            CommandKind::Unknown { command_type: "update".into(), payload: json!({"x": 1}) }
        );
        assert_eq!(poll.commands[1].priority, Some(Priority::Other("urgent".into())));
        let CommandKind::Configure(configure) = &poll.commands[1].kind else { panic!("{:?}", poll.commands[1]) };
        assert_eq!(configure.intent(), ConfigureIntent::Recovery);
        let CommandKind::Malformed { command_type, reason, .. } = &poll.commands[2].kind else {
            panic!("{:?}", poll.commands[2])
        };
        assert_eq!(command_type, "configure");
        assert!(reason.starts_with("invalid payload: invalid type: string \"yes\""), "{reason}");
        // And back to the same wire shape.
        let again = serde_json::to_value(&poll.commands[0]).unwrap();
        assert_eq!(again, json!({"id": "c1", "command_type": "update", "priority": "normal", "payload": {"x": 1}}));
    }

    #[test]
    fn a_failed_result_mirrors_its_message() {
        let result = CommandResult::unknown_type("c1", "update");
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({"command_id": "c1", "status": "failed", "error_message": "Unknown command type: update",
                   "result": {"error_message": "Unknown command type: update"}})
        );
    }

    #[test]
    fn credentials_never_show_in_debug() {
        let token = IntrospectRequest { token: Credential::new("very-secret"), expected_team_id: None };
        assert!(!format!("{token:?}").contains("very-secret"));
        assert_eq!(serde_json::to_value(&token).unwrap(), json!({"token": "very-secret"}));
    }

    #[test]
    fn batches_hold_one_to_a_hundred_events() {
        let one = EventEnvelope { kind: EventKind::ConfigError, timestamp: "t".into(), data: Map::new() };
        assert_eq!(EventsRequest::batch(vec![]), Err(BatchSizeError(0)));
        assert_eq!(EventsRequest::batch(vec![one.clone(); 101]), Err(BatchSizeError(101)));
        assert_eq!(EventsRequest::batch(vec![one; 100]).map(|b| b.events.len()), Ok(100));
    }
}
