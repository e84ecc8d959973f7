//! Configuration: defaults < config file < environment < command-line flags.
//!
//! `load` reads the `[satellite]` section of the standalone file (if any), the
//! environment map and the flags, and validates them into one `Config`. Every
//! failure is one `ConfigError` line naming the file key and the variable.
//! The rest of the file (teams, users, installations) is the local control
//! plane and is read by `control::standalone`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{json, Value};
use url::Url;

pub mod env;
pub mod file;
mod file_rules;
mod lifecycle;
mod listen;
mod mode;
pub mod sandbox;
mod storage;
mod telemetry;
mod upstream;
mod values;

pub use lifecycle::LifecycleSettings;
pub use mode::{Mode, StandaloneSource};
pub use storage::{mask_url_password, Database};
pub use telemetry::LogFormat;
pub use upstream::UpstreamSettings;
use values::{millis, number, seconds, switch};

use env::Env;
use file::RawFile;
pub use file::{
    changed_start_only_settings, parse_file, parse_file_at, read_file, read_text, start_only_settings,
    start_only_settings_of, START_ONLY_SECTIONS,
};

mod embedded;
pub use embedded::{is_instance_token, random_hex, sha256_hex, EmbeddedDefault};

mod managed;
pub use managed::{ManagedSettings, BACKEND_AUDIENCE, GITHUB_TARBALL_BASE};
pub use sandbox::{Isolation, SandboxSettings};

/// Exit code for a bad configuration (EX_USAGE).
pub const EXIT_CONFIG: i32 = 64;

pub const DEFAULT_PORT: u16 = 3001;
pub const DEFAULT_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// One configuration problem: where it is, which variable overrides it, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid config {}: {message}", where_(.key, .env))]
pub struct ConfigError {
    /// Dotted path in the config file, e.g. `satellite.port` or `installations[1].server`.
    pub key: String,
    /// The environment variable that sets the same value, when there is one.
    pub env: Option<&'static str>,
    pub message: String,
}

fn where_(key: &str, env: &Option<&'static str>) -> String {
    match env {
        Some(env) => format!("{env}/{key}"),
        None => key.to_owned(),
    }
}

impl ConfigError {
    pub fn new(key: impl Into<String>, env: Option<&'static str>, message: impl Into<String>) -> Self {
        Self { key: key.into(), env, message: message.into() }
    }
}

/// Command-line overrides; `None` means "not given".
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub host: Option<IpAddr>,
    pub port: Option<u16>,
    pub data_dir: Option<PathBuf>,
}

/// A URL the configuration refused, as its error message may show it: without userinfo, query or fragment (an
/// API key often rides in them), and a value that is no URL at all only when nothing in it looks like a credential.
pub fn url_for_message(raw: &str) -> String {
    match url::Url::parse(raw) {
        // "user:pass@host/mcp" parses as scheme "user" with an opaque path: nothing to take out of it.
        Ok(mut parsed) if !parsed.cannot_be_a_base() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            parsed.set_fragment(None);
            format!("{:?}", parsed.as_str())
        }
        _ if raw.contains(['@', '?', '=', ':']) => "the value given (not shown: it may hold a credential)".into(),
        _ => format!("{raw:?}"),
    }
}

/// `text` as a URL, when it is an http(s) one.
pub(crate) fn parse_http_url(text: &str) -> Option<Url> {
    Url::parse(text).ok().filter(|u| matches!(u.scheme(), "http" | "https"))
}

/// Why `raw` is refused where an http(s) URL belongs, showing it as [`url_for_message`] does.
pub(crate) fn not_http_url(key: impl Into<String>, var: Option<&'static str>, raw: &str) -> ConfigError {
    ConfigError::new(key, var, format!("{} is not an http(s) url", url_for_message(raw)))
}

/// The validated configuration of one satellite process.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Which database holds the satellite's state: SQLite in `data_dir`, or a shared PostgreSQL.
    pub database: Database,
    pub log_level: String,
    pub log_format: LogFormat,
    pub debug_route: bool,
    /// Meta-tool answers as 2-space indented JSON (the reference's form) instead of compact JSON.
    pub pretty_results: bool,
    pub show_version: bool,
    pub show_uptime: bool,
    /// `GET /metrics` needs this bearer token when set (environment only: it is a secret).
    pub metrics_token: Option<SecretString>,
    pub upstream: UpstreamSettings,
    /// HTTP requests handled at once; more are refused with 503.
    pub max_concurrent_requests: usize,
    /// Of those, how many one authenticated caller may hold at once; more are refused with 429 (`http::callers`).
    pub max_concurrent_requests_per_caller: usize,
    /// Open client connections at most; past it the satellite stops accepting until one closes.
    pub max_connections: usize,
    /// Long-lived streams one authenticated caller may hold open at once; more are refused with 429
    /// (`http::callers`). Each holds a connection, so one caller must not hold them all.
    pub max_streams_per_caller: usize,
    /// Deadline of one HTTP request until its response starts.
    pub http_timeout: Duration,
    /// How long one write of an answer may wait for a client that stopped reading; then its connection is cut.
    pub write_timeout: Duration,
    /// How long a request body may take to arrive once the satellite waits for it; then 408 and the connection
    /// closed.
    pub body_read_timeout: Duration,
    /// Bytes kept in reserve on the SQLite data volume for when it fills (`SATELLITE_DISK_RESERVE_MIB`, default 8;
    /// 0 off).
    pub disk_reserve: u64,
    /// How long shutdown waits for requests in flight before the servers are stopped (default 10 s).
    pub drain: Duration,
    /// How long analytics rows (listings, discovers, calls) are kept (default 90 days).
    pub analytics_retention: Duration,
    /// Standalone: how long and how many events the local history keeps, pruned hourly (default 7 days and
    /// 100,000). In managed mode the outbox is the queue to the backend and is bounded by its quota instead.
    pub event_retention: Duration,
    pub event_retention_max: u64,
    /// Standalone: the most the local history may take on disk (default 256 MiB), held every 10 s.
    pub event_retention_max_bytes: u64,
    /// The sentence-embedding model of the semantic search stage; `None`: lexical search only.
    pub semantic_model: Option<PathBuf>,
    /// Public base URL of the satellite (no `/mcp`), used in OAuth metadata and `WWW-Authenticate`.
    pub public_url: String,
    /// Host names requests may name, `None` for any (SATELLITE_ALLOWED_HOSTS; default: the loopback names and
    /// the public URL's host when bound to loopback, any otherwise).
    pub allowed_hosts: Option<Vec<String>>,
    /// Origins browsers may send, `None` for any (SATELLITE_ALLOWED_ORIGINS; default: the public URL's origin
    /// and any localhost origin).
    pub allowed_origins: Option<Vec<String>>,
    pub mode: Mode,
    /// How stdio children are confined (`[sandbox]`, `SATELLITE_SANDBOX`, `NSJAIL_*`).
    pub sandbox: SandboxSettings,
    /// How often client activity is reported (SB §17: 30 s).
    pub activity_interval: Duration,
}

impl Config {
    /// Build and validate from the file named by the flags or the environment, the environment, and the flags.
    pub fn load(env: &Env, flags: &Flags) -> Result<Config, ConfigError> {
        let path = flags.config.clone().or_else(|| env::get(env, env::CONFIG).map(PathBuf::from));
        let raw = match &path {
            Some(path) => read_file(path)?,
            None => RawFile::default(),
        };
        Self::build(env, flags, path, &raw)
    }

    /// Reads the groups of settings in a fixed order, so of several bad settings the same one is reported first.
    fn build(env: &Env, flags: &Flags, path: Option<PathBuf>, raw: &RawFile) -> Result<Config, ConfigError> {
        let s = &raw.satellite;
        let (host, port) = listen::address(env, flags, s)?;
        let data_dir = storage::data_dir(env, flags, s);
        let (log_level, log_format) = telemetry::logging(env, s)?;
        let upstream = upstream::upstream(env, s)?;
        let mode = mode::select(env, s, path)?;
        let debug_route = telemetry::debug_route(env, s, mode::is_embedded(&mode));
        let access = listen::access(env, s, host, port)?;
        let limits = listen::http_limits(env, s)?;
        let disk_reserve = storage::disk_reserve(env)?;
        let drain = seconds(env, "satellite.drain_seconds", env::DRAIN, s.drain_seconds, 10)?;
        let retention = storage::retention(env, s)?;
        mode::refuse_exposed_demo(&mode, host)?;
        let semantic_model = semantic_model(env, s)?;
        let database = storage::database(env)?;
        Ok(Config {
            listen: SocketAddr::new(host, port),
            data_dir,
            database,
            log_level,
            log_format,
            debug_route,
            pretty_results: switch(env, env::PRETTY_RESULTS, s.pretty_results, false),
            show_version: env::get(env, env::SHOW_VERSION) != Some("false"),
            show_uptime: env::get(env, env::SHOW_UPTIME) != Some("false"),
            metrics_token: telemetry::metrics_token(env),
            upstream,
            max_concurrent_requests: limits.max_concurrent_requests,
            max_concurrent_requests_per_caller: limits.max_concurrent_requests_per_caller,
            max_connections: limits.max_connections,
            max_streams_per_caller: limits.max_streams_per_caller,
            http_timeout: limits.http_timeout,
            write_timeout: limits.write_timeout,
            body_read_timeout: limits.body_read_timeout,
            disk_reserve,
            drain,
            analytics_retention: retention.analytics,
            event_retention: retention.events,
            event_retention_max: retention.events_max,
            event_retention_max_bytes: retention.events_max_bytes,
            semantic_model,
            public_url: access.public_url,
            allowed_hosts: access.allowed_hosts,
            allowed_origins: access.allowed_origins,
            mode,
            sandbox: sandbox::settings(env, &raw.sandbox)?,
            activity_interval: Duration::from_secs(30),
        })
    }

    /// The effective configuration with every secret redacted, for `check-config` and the start-up log.
    pub fn redacted(&self) -> Value {
        json!({
            "listen": self.listen.to_string(),
            "data_dir": self.data_dir,
            "database": self.redacted_database(),
            "log_level": self.log_level,
            "log_format": match self.log_format { LogFormat::Pretty => "pretty", LogFormat::Json => "json" },
            "debug_route": self.debug_route,
            "pretty_results": self.pretty_results,
            "public_url": self.public_url,
            "allowed_hosts": self.allowed_hosts.clone().unwrap_or_else(|| vec!["*".into()]),
            "allowed_origins": self.allowed_origins.clone().unwrap_or_else(|| vec!["*".into()]),
            "handshake_timeout_seconds": self.upstream.handshake_timeout.as_secs(),
            "discovery_timeout_seconds": self.upstream.discovery_timeout.as_secs(),
            "call_timeout_seconds": self.upstream.call_timeout.as_secs(),
            "reconcile_concurrency": self.upstream.reconcile_concurrency,
            "idle_timeout_seconds": self.upstream.lifecycle.idle_timeout.map_or(0, |d| d.as_secs()),
            "spawn_grace_seconds": self.upstream.lifecycle.spawn_grace.as_secs(),
            "max_calls_per_instance": self.upstream.lifecycle.max_calls_per_instance,
            "max_processes_per_user": self.upstream.lifecycle.max_processes_per_user,
            "max_processes": self.upstream.lifecycle.max_processes,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_concurrent_requests_per_caller": self.max_concurrent_requests_per_caller,
            "max_connections": self.max_connections,
            "max_streams_per_caller": self.max_streams_per_caller,
            "http_timeout_seconds": self.http_timeout.as_secs(),
            "write_timeout_seconds": self.write_timeout.as_secs(),
            "body_read_timeout_seconds": self.body_read_timeout.as_secs(),
            "drain_seconds": self.drain.as_secs(),
            "analytics_retention_days": self.analytics_retention.as_secs() / 86_400,
            "event_retention_days": self.event_retention.as_secs() / 86_400,
            "event_retention_max": self.event_retention_max,
            "event_retention_max_mib": self.event_retention_max_bytes / (1024 * 1024),
            "semantic_model": self.semantic_model.as_ref().map(|p| p.display().to_string()),
            "mode": self.redacted_mode(),
            "sandbox": self.redacted_sandbox(),
        })
    }

    /// The database engine and pool size; a PostgreSQL URL without its passwords.
    fn redacted_database(&self) -> Value {
        match &self.database.url {
            Some(url) => json!({"engine": "postgres", "url": mask_url_password(url.expose_secret()),
                                "max_connections": self.database.max_connections}),
            None => json!({"engine": "sqlite", "max_connections": self.database.max_connections}),
        }
    }

    /// Where the desired state comes from; the demo's tokens and the registration token only as `[redacted]`.
    fn redacted_mode(&self) -> Value {
        match &self.mode {
            Mode::Standalone(StandaloneSource::File { path, watch_interval }) => json!({
                "kind": "standalone", "config_file": path, "watch_interval_ms": watch_interval.as_millis() as u64,
            }),
            Mode::Standalone(StandaloneSource::Embedded(_)) => json!({
                "kind": "standalone", "config_file": null, "embedded_default": true,
                "demo_token": "[redacted]", "demo_instance_token": "[redacted]",
            }),
            Mode::Managed(m) => json!({
                "kind": "managed", "backend_url": m.backend_url.as_str(), "satellite_name": m.satellite_name,
                "registration_token": m.registration_token.as_ref().map(|_| "[redacted]"),
            }),
        }
    }

    fn redacted_sandbox(&self) -> Value {
        json!({
            "isolation": self.sandbox.isolation.as_str(),
            "allowed_commands": self.sandbox.allowed_commands,
            "memory_limit_mb": self.sandbox.memory_limit_mb,
            "cpu_time_limit_seconds": self.sandbox.cpu_time_limit_seconds,
            "cpu_limit_percent": self.sandbox.cpu_limit_percent,
            "max_processes": self.sandbox.max_processes,
            "rlimit_nofile": self.sandbox.rlimit_nofile,
            "rlimit_fsize_mb": self.sandbox.rlimit_fsize_mb,
        })
    }
}

/// The semantic search stage's model directory from the environment, else the file; blank is none.
fn semantic_model(env: &Env, s: &file::RawSatellite) -> Result<Option<PathBuf>, ConfigError> {
    let model = env::get(env, env::SEMANTIC_MODEL)
        .or(s.semantic_model.as_deref())
        .filter(|v| !v.trim().is_empty())
        .map(PathBuf::from);
    if model.is_some() && !cfg!(feature = "semantic") {
        return Err(ConfigError::new(
            "satellite.semantic_model",
            Some(env::SEMANTIC_MODEL),
            "this satellite was built without the `semantic` cargo feature; rebuild with it or unset the model",
        ));
    }
    Ok(model)
}

#[cfg(test)]
mod tests;
