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
mod lifecycle;
pub mod sandbox;

pub use lifecycle::LifecycleSettings;
use lifecycle::{lifecycle, number};

use env::Env;
use file::RawFile;
pub use file::{
    changed_start_only_settings, parse_file, parse_file_at, read_file, read_text, start_only_settings,
    start_only_settings_of, START_ONLY_SECTIONS,
};

mod embedded;
use embedded::embedded;
pub use embedded::{is_instance_token, random_hex, sha256_hex, EmbeddedDefault};

mod managed;
use managed::managed;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// Upstream timeouts and limits.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub handshake_timeout: Duration,
    pub discovery_timeout: Duration,
    pub call_timeout: Duration,
    /// Instances reconciled at once (SB §8 recommends 4).
    pub reconcile_concurrency: usize,
    pub lifecycle: LifecycleSettings,
    /// Hold a drifted tool (called recently, then its description or schema changed) out of discover and
    /// calls until an admin accepts the change (`POST /api/tools/accept`).
    pub hold_drifted_tools: bool,
    /// A tool called within this long before its description or schema changes has drifted.
    pub drift_window: Duration,
}

/// The database the store opens (`DATABASE_URL`).
#[derive(Clone)]
pub struct Database {
    /// A `postgres://` URL (a secret: it may hold the password); `None`: SQLite in the data directory.
    pub url: Option<SecretString>,
    /// Pool size; `None`: the engine's default.
    pub max_connections: Option<u32>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("url", &self.url.as_ref().map(|u| mask_url_password(u.expose_secret())))
            .field("max_connections", &self.max_connections)
            .finish()
    }
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

/// A database URL with its passwords replaced by `***`, for logs: the userinfo one and the query's `password` and
/// `sslpassword` (sqlx reads both places).
pub fn mask_url_password(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else { return "[unparseable url]".into() };
    if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
        return "[unparseable url]".into();
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let secret = matches!(key.as_ref(), "password" | "sslpassword");
                (key.into_owned(), if secret { "***".to_owned() } else { value.into_owned() })
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// Where the desired state comes from.
#[derive(Debug, Clone)]
pub enum Mode {
    Standalone(StandaloneSource),
    /// Managed by a DeployStack-compatible backend (`DEPLOYSTACK_BACKEND_URL`).
    Managed(Box<ManagedSettings>),
}

#[derive(Debug, Clone)]
pub enum StandaloneSource {
    /// A TOML file, re-read when it changes.
    File { path: PathBuf, watch_interval: Duration },
    /// The built-in demo configuration.
    Embedded(EmbeddedDefault),
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

    fn build(env: &Env, flags: &Flags, path: Option<PathBuf>, raw: &RawFile) -> Result<Config, ConfigError> {
        let s = &raw.satellite;
        let host = match (flags.host, env::get(env, env::HOST), &s.host) {
            (Some(host), _, _) => host,
            (None, Some(v), _) => parse_ip(v, "satellite.host", Some(env::HOST))?,
            (None, None, Some(v)) => parse_ip(v, "satellite.host", Some(env::HOST))?,
            (None, None, None) => DEFAULT_HOST,
        };
        let port = match (flags.port, env::get(env, env::PORT)) {
            (Some(port), _) => port,
            (None, Some(v)) => v.parse::<u16>().map_err(|_| {
                ConfigError::new("satellite.port", Some(env::PORT), format!("{v:?} is not a port number"))
            })?,
            (None, None) => s.port.unwrap_or(DEFAULT_PORT),
        };
        let data_dir = flags
            .data_dir
            .clone()
            .or_else(|| env::get(env, env::DATA_DIR).map(PathBuf::from))
            .or_else(|| s.data_dir.as_ref().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("./data"));
        let log_level = env::get(env, env::LOG_LEVEL)
            .map(str::to_owned)
            .or_else(|| s.log_level.clone())
            .unwrap_or_else(|| "info".into());
        if !matches!(log_level.as_str(), "trace" | "debug" | "info" | "warn" | "error" | "fatal") {
            return Err(ConfigError::new(
                "satellite.log_level",
                Some(env::LOG_LEVEL),
                format!("{log_level:?} is not one of trace, debug, info, warn, error, fatal"),
            ));
        }
        let log_format =
            match env::get(env, env::LOG_FORMAT).map(str::to_owned).or_else(|| s.log_format.clone()).as_deref() {
                None | Some("pretty") => LogFormat::Pretty,
                Some("json") => LogFormat::Json,
                Some(other) => {
                    return Err(ConfigError::new(
                        "satellite.log_format",
                        Some(env::LOG_FORMAT),
                        format!("{other:?} is not pretty or json"),
                    ))
                }
            };
        let seconds =
            |key: &str, var: &'static str, file: Option<u64>, default: u64| -> Result<Duration, ConfigError> {
                let value = match env::get(env, var) {
                    Some(v) => v
                        .parse::<u64>()
                        .map_err(|_| ConfigError::new(key, Some(var), format!("{v:?} is not a whole number")))?,
                    None => file.unwrap_or(default),
                };
                if value == 0 {
                    return Err(ConfigError::new(key, Some(var), "must be greater than zero"));
                }
                Ok(Duration::from_secs(value))
            };
        let upstream = UpstreamSettings {
            hold_drifted_tools: match env::get(env, env::HOLD_DRIFTED_TOOLS) {
                Some(v) => v == "true",
                None => s.hold_drifted_tools.unwrap_or(false),
            },
            drift_window: {
                let (key, var) = ("satellite.drift_window_days", env::DRIFT_WINDOW_DAYS);
                let days = match env::get(env, var) {
                    Some(v) => v
                        .parse::<u64>()
                        .map_err(|_| ConfigError::new(key, Some(var), format!("{v:?} is not a whole number")))?,
                    None => s.drift_window_days.unwrap_or(30),
                };
                if !(1..=3650).contains(&days) {
                    return Err(ConfigError::new(key, Some(var), "must be from 1 to 3650 days"));
                }
                Duration::from_secs(days * 86_400)
            },
            handshake_timeout: seconds(
                "satellite.handshake_timeout_seconds",
                env::HANDSHAKE_TIMEOUT,
                s.handshake_timeout_seconds,
                30,
            )?,
            discovery_timeout: seconds(
                "satellite.discovery_timeout_seconds",
                env::DISCOVERY_TIMEOUT,
                s.discovery_timeout_seconds,
                60,
            )?,
            call_timeout: seconds("satellite.call_timeout_seconds", env::CALL_TIMEOUT, s.call_timeout_seconds, 30)?,
            reconcile_concurrency: match env::get(env, env::RECONCILE_CONCURRENCY) {
                Some(v) => v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    ConfigError::new(
                        "satellite.reconcile_concurrency",
                        Some(env::RECONCILE_CONCURRENCY),
                        format!("{v:?} is not a positive number"),
                    )
                })?,
                None => s.reconcile_concurrency.filter(|n| *n > 0).unwrap_or(4),
            },
            lifecycle: lifecycle(env, s)?,
        };

        let backend_url = env::get(env, env::BACKEND_URL);
        let mode = match (backend_url, &path) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "mode",
                    Some(env::BACKEND_URL),
                    "a backend url and a standalone config file exclude each other; set one",
                ))
            }
            (Some(url), None) => Mode::Managed(Box::new(managed(env, url)?)),
            (None, Some(path)) => {
                let ms = match env::get(env, env::CONFIG_WATCH_INTERVAL_MS) {
                    Some(v) => v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        ConfigError::new(
                            "satellite.config_watch_interval_ms",
                            Some(env::CONFIG_WATCH_INTERVAL_MS),
                            format!("{v:?} is not a positive number"),
                        )
                    })?,
                    None => s.config_watch_interval_ms.filter(|n| *n > 0).unwrap_or(1000),
                };
                Mode::Standalone(StandaloneSource::File {
                    path: path.clone(),
                    watch_interval: Duration::from_millis(ms),
                })
            }
            (None, None) => Mode::Standalone(StandaloneSource::Embedded(embedded(env)?)),
        };
        let embedded_default = matches!(mode, Mode::Standalone(StandaloneSource::Embedded(_)));
        let debug_route = match env::get(env, env::SHOW_DEBUG_ROUTE) {
            Some(v) => v == "true",
            None => s.debug_route.unwrap_or(embedded_default),
        };
        let public_url = match env::get(env, env::PUBLIC_URL).map(str::to_owned).or_else(|| s.public_url.clone()) {
            Some(url) => Url::parse(&url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .map(|_| url.trim_end_matches('/').to_owned())
                .ok_or_else(|| {
                    ConfigError::new(
                        "satellite.public_url",
                        Some(env::PUBLIC_URL),
                        format!("{} is not an http(s) url", url_for_message(&url)),
                    )
                })?,
            None => format!("http://localhost:{port}"),
        };
        let list = |var: &'static str, file: &Option<Vec<String>>| -> Option<Vec<String>> {
            let items: Vec<String> = match env::get(env, var) {
                Some(v) => v.split(',').map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()).collect(),
                None => file.iter().flatten().map(|s| s.trim().to_ascii_lowercase()).collect(),
            };
            (!items.is_empty()).then_some(items)
        };
        let public = Url::parse(&public_url).ok();
        let public_host =
            public.as_ref().and_then(|u| u.host_str()).map(|h| h.trim_matches(['[', ']']).to_ascii_lowercase());
        let allowed_hosts = match list(env::ALLOWED_HOSTS, &s.allowed_hosts) {
            Some(hosts) if hosts.iter().any(|h| h == "*") => None,
            Some(hosts) => Some(hosts),
            None if host.is_loopback() => {
                let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
                hosts.extend(public_host.clone());
                Some(hosts)
            }
            None => None,
        };
        let allowed_origins = match list(env::ALLOWED_ORIGINS, &s.allowed_origins) {
            Some(origins) if origins.iter().any(|o| o == "*") => None,
            Some(origins) => Some(origins),
            None => Some(public.map(|u| u.origin().ascii_serialization()).into_iter().collect()),
        };
        // A count from the environment (refused unless a positive number), else the file's when positive.
        let count = |key: &str, var: &'static str, file: Option<usize>| -> Result<Option<usize>, ConfigError> {
            match env::get(env, var) {
                Some(v) => v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| ConfigError::new(key, Some(var), format!("{v:?} is not a positive number"))),
                None => Ok(file.filter(|n| *n > 0)),
            }
        };
        let max_concurrent_requests =
            count("satellite.max_concurrent_requests", env::MAX_CONCURRENT_REQUESTS, s.max_concurrent_requests)?
                .unwrap_or(1024);
        let max_concurrent_requests_per_caller = count(
            "satellite.max_concurrent_requests_per_caller",
            env::MAX_CONCURRENT_REQUESTS_PER_CALLER,
            s.max_concurrent_requests_per_caller,
        )?
        .unwrap_or((max_concurrent_requests / 8).max(1));
        let max_connections = count("satellite.max_connections", env::MAX_CONNECTIONS, s.max_connections)?
            .unwrap_or_else(default_max_connections);
        let max_streams_per_caller =
            count("satellite.max_streams_per_caller", env::MAX_STREAMS_PER_CALLER, s.max_streams_per_caller)?
                .unwrap_or((max_connections / 8).max(1));
        let http_timeout = seconds("satellite.http_timeout_seconds", env::HTTP_TIMEOUT, s.http_timeout_seconds, 120)?;
        let write_timeout =
            seconds("satellite.write_timeout_seconds", env::WRITE_TIMEOUT, s.write_timeout_seconds, 30)?;
        let disk_reserve = match env::get(env, env::DISK_RESERVE_MIB) {
            Some(v) => v.parse::<u64>().map_err(|_| {
                ConfigError::new(
                    "disk_reserve_mib",
                    Some(env::DISK_RESERVE_MIB),
                    format!("{v:?} is not a whole number"),
                )
            })?,
            None => 8,
        }
        .saturating_mul(1024 * 1024);
        let drain = seconds("satellite.drain_seconds", env::DRAIN, s.drain_seconds, 10)?;
        let retention_days = seconds(
            "satellite.analytics_retention_days",
            env::ANALYTICS_RETENTION_DAYS,
            s.analytics_retention_days,
            90,
        )?;
        let event_days = number(
            env,
            "satellite.event_retention_days",
            env::EVENT_RETENTION_DAYS,
            s.event_retention_days,
            7u64,
            false,
        )?;
        let event_retention_max = number(
            env,
            "satellite.event_retention_max",
            env::EVENT_RETENTION_MAX,
            s.event_retention_max,
            100_000u64,
            false,
        )?;
        let event_retention_max_mib = number(
            env,
            "satellite.event_retention_max_mib",
            env::EVENT_RETENTION_MAX_MIB,
            s.event_retention_max_mib,
            256u64,
            false,
        )?;
        // The demo's tokens are printed to the terminal: fine on this machine, not on an address others reach
        // (a container listening on 0.0.0.0 with its log shipped somewhere). There, the operator names them.
        if let Mode::Standalone(StandaloneSource::Embedded(demo)) = &mode {
            if !host.is_loopback() && (demo.demo_token_generated || demo.instance_token_generated) {
                return Err(ConfigError::new(
                    "satellite.host",
                    Some(env::HOST),
                    format!(
                        "the embedded demo default would listen on {host}, beyond this machine, with generated tokens; \
                         set {} and {} to tokens of your own, give a config file ({}), or listen on 127.0.0.1",
                        env::DEMO_TOKEN,
                        env::DEMO_INSTANCE_TOKEN,
                        env::CONFIG
                    ),
                ));
            }
        }
        let semantic_model = env::get(env, env::SEMANTIC_MODEL)
            .or(s.semantic_model.as_deref())
            .filter(|v| !v.trim().is_empty())
            .map(PathBuf::from);
        if semantic_model.is_some() && !cfg!(feature = "semantic") {
            return Err(ConfigError::new(
                "satellite.semantic_model",
                Some(env::SEMANTIC_MODEL),
                "this satellite was built without the `semantic` cargo feature; rebuild with it or unset the model",
            ));
        }
        let database = Database {
            url: match env::get(env, env::DATABASE_URL).filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(v) if v.starts_with("postgres://") || v.starts_with("postgresql://") => {
                    if url::Url::parse(v).is_err() {
                        return Err(ConfigError::new("database_url", Some(env::DATABASE_URL), "is not a URL"));
                    }
                    Some(SecretString::from(v.to_owned()))
                }
                Some(_) => {
                    return Err(ConfigError::new(
                        "database_url",
                        Some(env::DATABASE_URL),
                        "must be a postgres:// (or postgresql://) URL; unset it for the embedded SQLite database",
                    ))
                }
            },
            max_connections: match env::get(env, env::DATABASE_MAX_CONNECTIONS) {
                None => None,
                Some(v) => match v.parse::<u32>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        return Err(ConfigError::new(
                            "database_max_connections",
                            Some(env::DATABASE_MAX_CONNECTIONS),
                            format!("{v:?} is not a whole number greater than zero"),
                        ))
                    }
                },
            },
        };
        Ok(Config {
            database,
            semantic_model,
            drain,
            analytics_retention: Duration::from_secs(retention_days.as_secs().saturating_mul(86_400)),
            event_retention: Duration::from_secs(event_days.saturating_mul(86_400)),
            event_retention_max,
            event_retention_max_bytes: event_retention_max_mib.saturating_mul(1024 * 1024),
            max_concurrent_requests,
            max_concurrent_requests_per_caller,
            max_connections,
            max_streams_per_caller,
            http_timeout,
            write_timeout,
            disk_reserve,
            public_url,
            allowed_hosts,
            allowed_origins,
            listen: SocketAddr::new(host, port),
            data_dir,
            log_level,
            log_format,
            debug_route,
            pretty_results: match env::get(env, env::PRETTY_RESULTS) {
                Some(v) => v == "true",
                None => s.pretty_results.unwrap_or(false),
            },
            show_version: env::get(env, env::SHOW_VERSION) != Some("false"),
            show_uptime: env::get(env, env::SHOW_UPTIME) != Some("false"),
            metrics_token: env::get(env, env::METRICS_TOKEN)
                .filter(|t| !t.is_empty())
                .map(|t| SecretString::from(t.to_owned())),
            upstream,
            mode,
            sandbox: sandbox::settings(env, &raw.sandbox)?,
            activity_interval: Duration::from_secs(30),
        })
    }

    /// The effective configuration with every secret redacted, for `check-config` and the start-up log.
    pub fn redacted(&self) -> Value {
        let mode = match &self.mode {
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
        };
        json!({
            "listen": self.listen.to_string(),
            "data_dir": self.data_dir,
            "database": match &self.database.url {
                Some(url) => json!({"engine": "postgres", "url": mask_url_password(url.expose_secret()),
                                    "max_connections": self.database.max_connections}),
                None => json!({"engine": "sqlite", "max_connections": self.database.max_connections}),
            },
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
            "drain_seconds": self.drain.as_secs(),
            "analytics_retention_days": self.analytics_retention.as_secs() / 86_400,
            "event_retention_days": self.event_retention.as_secs() / 86_400,
            "event_retention_max": self.event_retention_max,
            "event_retention_max_mib": self.event_retention_max_bytes / (1024 * 1024),
            "semantic_model": self.semantic_model.as_ref().map(|p| p.display().to_string()),
            "mode": mode,
            "sandbox": {
                "isolation": self.sandbox.isolation.as_str(),
                "allowed_commands": self.sandbox.allowed_commands,
                "memory_limit_mb": self.sandbox.memory_limit_mb,
                "cpu_time_limit_seconds": self.sandbox.cpu_time_limit_seconds,
                "cpu_limit_percent": self.sandbox.cpu_limit_percent,
                "max_processes": self.sandbox.max_processes,
                "rlimit_nofile": self.sandbox.rlimit_nofile,
                "rlimit_fsize_mb": self.sandbox.rlimit_fsize_mb,
            },
        })
    }
}

/// Half the process's open-file limit (the other half stays for server processes, the database and the config
/// file), so strangers holding connections can never take the descriptors the satellite itself needs.
fn default_max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map(|(soft, _)| soft);
    match soft {
        Ok(soft) if soft != nix::sys::resource::RLIM_INFINITY => (soft / 2).clamp(64, 100_000) as usize,
        _ => 10_000,
    }
}

fn parse_ip(value: &str, key: &str, var: Option<&'static str>) -> Result<IpAddr, ConfigError> {
    value.parse().map_err(|_| ConfigError::new(key, var, format!("{value:?} is not an ip address")))
}

#[cfg(test)]
mod tests;
