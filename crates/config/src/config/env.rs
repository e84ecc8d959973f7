//! Every environment variable the satellite reads, in one place.
//!
//! The loader takes the environment as a map so tests pass their own and
//! nothing calls `std::env::set_var`.

use std::collections::HashMap;

/// The process environment, or a test's stand-in.
pub type Env = HashMap<String, String>;

pub const PORT: &str = "PORT";
pub const HOST: &str = "HOST";
pub const CONFIG: &str = "SATELLITE_CONFIG";
pub const DATA_DIR: &str = "SATELLITE_DATA_DIR";
pub const DEMO_TOKEN: &str = "SATELLITE_DEMO_TOKEN";
pub const DEMO_INSTANCE_TOKEN: &str = "SATELLITE_DEMO_INSTANCE_TOKEN";
pub const LOG_LEVEL: &str = "LOG_LEVEL";
pub const LOG_FORMAT: &str = "SATELLITE_LOG_FORMAT";
pub const SHOW_DEBUG_ROUTE: &str = "DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE";
pub const SHOW_VERSION: &str = "DEPLOYSTACK_STATUS_SHOW_VERSION";
pub const SHOW_UPTIME: &str = "DEPLOYSTACK_STATUS_SHOW_UPTIME";
/// A bearer token `GET /metrics` requires when set.
pub const METRICS_TOKEN: &str = "SATELLITE_METRICS_TOKEN";
pub const HANDSHAKE_TIMEOUT: &str = "SATELLITE_HANDSHAKE_TIMEOUT_SECONDS";
pub const DISCOVERY_TIMEOUT: &str = "SATELLITE_DISCOVERY_TIMEOUT_SECONDS";
pub const CALL_TIMEOUT: &str = "SATELLITE_CALL_TIMEOUT_SECONDS";
pub const MAX_CONCURRENT_REQUESTS: &str = "SATELLITE_MAX_CONCURRENT_REQUESTS";
pub const MAX_CONCURRENT_REQUESTS_PER_CALLER: &str = "SATELLITE_MAX_CONCURRENT_REQUESTS_PER_CALLER";
pub const MAX_CONNECTIONS: &str = "SATELLITE_MAX_CONNECTIONS";
pub const MAX_STREAMS_PER_CALLER: &str = "SATELLITE_MAX_STREAMS_PER_CALLER";
pub const HTTP_TIMEOUT: &str = "SATELLITE_HTTP_TIMEOUT_SECONDS";
/// Seconds one write to a client may wait for it to read before the connection is cut (default 30).
pub const WRITE_TIMEOUT: &str = "SATELLITE_WRITE_TIMEOUT_SECONDS";
/// Seconds a request body may take to arrive once the satellite waits for it; then 408 (default 30).
pub const BODY_READ_TIMEOUT: &str = "SATELLITE_BODY_READ_TIMEOUT_SECONDS";
pub const DRAIN: &str = "SATELLITE_DRAIN_SECONDS";
pub const ANALYTICS_RETENTION_DAYS: &str = "SATELLITE_ANALYTICS_RETENTION_DAYS";
pub const EVENT_RETENTION_DAYS: &str = "SATELLITE_EVENT_RETENTION_DAYS";
pub const EVENT_RETENTION_MAX: &str = "SATELLITE_EVENT_RETENTION_MAX";
pub const EVENT_RETENTION_MAX_MIB: &str = "SATELLITE_EVENT_RETENTION_MAX_MIB";
/// A directory holding a sentence-embedding model: switches the semantic search stage on.
pub const SEMANTIC_MODEL: &str = "SATELLITE_SEMANTIC_MODEL";
pub const RECONCILE_CONCURRENCY: &str = "SATELLITE_RECONCILE_CONCURRENCY";
pub const CONFIG_WATCH_INTERVAL_MS: &str = "SATELLITE_CONFIG_WATCH_INTERVAL_MS";
pub const IDLE_TIMEOUT: &str = "MCP_PROCESS_IDLE_TIMEOUT_SECONDS";
pub const SPAWN_GRACE: &str = "MCP_PROCESS_SPAWN_GRACE_PERIOD_SECONDS";
pub const IDLE_CHECK_INTERVAL_MS: &str = "SATELLITE_IDLE_CHECK_INTERVAL_MS";
pub const RESTART_BACKOFF_MS: &str = "SATELLITE_RESTART_BACKOFF_MS";
pub const MAX_CALLS_PER_INSTANCE: &str = "SATELLITE_MAX_CALLS_PER_INSTANCE";
pub const CALL_QUEUE_TIMEOUT_MS: &str = "SATELLITE_CALL_QUEUE_TIMEOUT_MS";
pub const MAX_PROCESSES_PER_USER: &str = "SATELLITE_MAX_PROCESSES_PER_USER";
pub const MAX_PROCESSES: &str = "SATELLITE_MAX_PROCESSES";
pub const LOG_RATE_LIMIT: &str = "LOG_RATE_LIMIT_PER_SECOND";
pub const LOG_MAX_LINE: &str = "LOG_MAX_LINE_LENGTH_BYTES";
pub const LOG_RATE_WARNING_MS: &str = "LOG_RATE_LIMIT_WARNING_INTERVAL_MS";
pub const PUBLIC_URL: &str = "DEPLOYSTACK_SATELLITE_URL";
pub const ALLOWED_HOSTS: &str = "SATELLITE_ALLOWED_HOSTS";
pub const ALLOWED_ORIGINS: &str = "SATELLITE_ALLOWED_ORIGINS";
/// `true`: meta-tool answers as 2-space indented JSON (the reference's form); compact otherwise.
pub const PRETTY_RESULTS: &str = "SATELLITE_PRETTY_RESULTS";
/// "true": a called tool whose description or schema changes is held out of discover and calls until an admin
/// accepts the change.
pub const HOLD_DRIFTED_TOOLS: &str = "SATELLITE_HOLD_DRIFTED_TOOLS";
/// Days: a tool called within this long before its description or schema changes has drifted (default 30).
pub const DRIFT_WINDOW_DAYS: &str = "SATELLITE_DRIFT_WINDOW_DAYS";
/// MiB of disk kept in reserve beside the SQLite database, given back when the volume fills (default 8; 0 off).
pub const DISK_RESERVE_MIB: &str = "SATELLITE_DISK_RESERVE_MIB";
/// `postgres://…`: the shared PostgreSQL database of a scale-out deployment (docs/scale-out.md); unset, the
/// embedded SQLite database in the data directory.
pub const DATABASE_URL: &str = "DATABASE_URL";
/// Connections in the database pool (default 8 for PostgreSQL, 4 for SQLite).
pub const DATABASE_MAX_CONNECTIONS: &str = "SATELLITE_DATABASE_MAX_CONNECTIONS";
pub const BACKEND_URL: &str = "DEPLOYSTACK_BACKEND_URL";
pub const SATELLITE_NAME: &str = "DEPLOYSTACK_SATELLITE_NAME";
pub const REGISTRATION_TOKEN: &str = "DEPLOYSTACK_REGISTRATION_TOKEN";
pub const PERSISTENT_DATA_DIR: &str = "DEPLOYSTACK_PERSISTENT_DATA_DIR";
pub const BACKEND_POLLING_INTERVAL: &str = "DEPLOYSTACK_BACKEND_POLLING_INTERVAL";
pub const EVENT_BATCH_INTERVAL_MS: &str = "EVENT_BATCH_INTERVAL_MS";
pub const EVENT_FLUSH_TIMEOUT_MS: &str = "EVENT_FLUSH_TIMEOUT_MS";
pub const HEARTBEAT_INTERVAL_MS: &str = "SATELLITE_HEARTBEAT_INTERVAL_MS";
pub const EVENT_OUTBOX_MAX: &str = "SATELLITE_EVENT_OUTBOX_MAX";
/// MiB the event outbox may take on disk while the backend is away (docs/operations.md).
pub const EVENT_OUTBOX_MAX_MIB: &str = "SATELLITE_EVENT_OUTBOX_MAX_MIB";
/// Milliseconds a replica's claim on a batch of events lasts (docs/scale-out.md).
pub const EVENT_LEASE_MS: &str = "SATELLITE_EVENT_LEASE_MS";
/// Milliseconds a batch of events waits for the backend's answer before it counts as timed out (default 10000).
pub const EVENT_TIMEOUT_MS: &str = "SATELLITE_EVENT_TIMEOUT_MS";
pub const TOKEN_AUDIENCES: &str = "DEPLOYSTACK_TOKEN_AUDIENCES";
/// Seconds an introspected token is trusted without asking again (default 300, BP §10).
pub const TOKEN_CACHE_SECONDS: &str = "SATELLITE_TOKEN_CACHE_SECONDS";
/// Seconds past its last successful check a token keeps working while the backend cannot be asked (default 3600;
/// 0: never).
pub const TOKEN_STALE_SECONDS: &str = "SATELLITE_TOKEN_STALE_SECONDS";
pub const GITHUB_TARBALL_URL: &str = "DEPLOYSTACK_GITHUB_TARBALL_URL";
pub const DEPLOYMENTS_DIR: &str = "DEPLOYSTACK_DEPLOYMENTS_DIR";
/// `none`, `nsjail` or `bubblewrap` (file `sandbox.isolation`).
pub const SANDBOX: &str = "SATELLITE_SANDBOX";
pub const NSJAIL_PATH: &str = "NSJAIL_PATH";
pub const BWRAP_PATH: &str = "SATELLITE_BWRAP_PATH";
pub const NSJAIL_MEMORY_LIMIT_MB: &str = "NSJAIL_MEMORY_LIMIT_MB";
pub const NSJAIL_CPU_TIME_LIMIT_SECONDS: &str = "NSJAIL_CPU_TIME_LIMIT_SECONDS";
pub const CPU_LIMIT_PERCENT: &str = "SATELLITE_CPU_LIMIT_PERCENT";
pub const NSJAIL_MAX_PROCESSES: &str = "NSJAIL_MAX_PROCESSES";
pub const NSJAIL_RLIMIT_NOFILE: &str = "NSJAIL_RLIMIT_NOFILE";
pub const NSJAIL_RLIMIT_FSIZE: &str = "NSJAIL_RLIMIT_FSIZE";
pub const NSJAIL_TMPFS_SIZE: &str = "NSJAIL_TMPFS_SIZE";

/// Variables whose values are secrets: never logged, never passed to MCP server children.
pub const SECRET_VARIABLES: [&str; 4] = [DEMO_TOKEN, DEMO_INSTANCE_TOKEN, REGISTRATION_TOKEN, DATABASE_URL];

/// Prefixes of the satellite's own settings (the sandbox's `NSJAIL_*` included); children never inherit them.
pub const OWN_PREFIXES: [&str; 3] = ["SATELLITE_", "DEPLOYSTACK_", "NSJAIL_"];

/// The process environment as a map (invalid UTF-8 entries are skipped).
pub fn from_process() -> Env {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect()
}

/// A value that is set and not blank.
pub fn get<'a>(env: &'a Env, name: &str) -> Option<&'a str> {
    env.get(name).map(String::as_str).map(str::trim).filter(|v| !v.is_empty())
}
