//! Where the satellite keeps its state: the data directory, the database, the disk reserve beside it, and how
//! long analytics and events are kept.

use std::path::PathBuf;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::env::{self, Env};
use super::file::RawSatellite;
use super::values::number;
use super::{ConfigError, Flags};

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

/// The flag, else the environment, else the file, else `./data`.
pub(super) fn data_dir(env: &Env, flags: &Flags, s: &RawSatellite) -> PathBuf {
    flags
        .data_dir
        .clone()
        .or_else(|| env::get(env, env::DATA_DIR).map(PathBuf::from))
        .or_else(|| s.data_dir.as_ref().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("./data"))
}

/// The database from the environment only (its URL is a secret and may hold the password).
pub(super) fn database(env: &Env) -> Result<Database, ConfigError> {
    Ok(Database { url: database_url(env)?, max_connections: pool_size(env)? })
}

fn database_url(env: &Env) -> Result<Option<SecretString>, ConfigError> {
    match env::get(env, env::DATABASE_URL).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) if v.starts_with("postgres://") || v.starts_with("postgresql://") => {
            if url::Url::parse(v).is_err() {
                return Err(ConfigError::new("database_url", Some(env::DATABASE_URL), "is not a URL"));
            }
            Ok(Some(SecretString::from(v.to_owned())))
        }
        Some(_) => Err(ConfigError::new(
            "database_url",
            Some(env::DATABASE_URL),
            "must be a postgres:// (or postgresql://) URL; unset it for the embedded SQLite database",
        )),
    }
}

fn pool_size(env: &Env) -> Result<Option<u32>, ConfigError> {
    match env::get(env, env::DATABASE_MAX_CONNECTIONS) {
        None => Ok(None),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ConfigError::new(
                "database_max_connections",
                Some(env::DATABASE_MAX_CONNECTIONS),
                format!("{v:?} is not a whole number greater than zero"),
            )),
        },
    }
}

/// Bytes kept in reserve on the data volume: `SATELLITE_DISK_RESERVE_MIB` (environment only), default 8 MiB.
pub(super) fn disk_reserve(env: &Env) -> Result<u64, ConfigError> {
    let mib = number(env, "disk_reserve_mib", env::DISK_RESERVE_MIB, None, 8u64, true)?;
    Ok(mib.saturating_mul(1024 * 1024))
}

/// How long analytics rows are kept, and how long and how much of the local event history.
pub(super) struct Retention {
    pub analytics: Duration,
    pub events: Duration,
    pub events_max: u64,
    pub events_max_bytes: u64,
}

pub(super) fn retention(env: &Env, s: &RawSatellite) -> Result<Retention, ConfigError> {
    let analytics_days = number(
        env,
        "satellite.analytics_retention_days",
        env::ANALYTICS_RETENTION_DAYS,
        s.analytics_retention_days,
        90u64,
        false,
    )?;
    let event_days =
        number(env, "satellite.event_retention_days", env::EVENT_RETENTION_DAYS, s.event_retention_days, 7u64, false)?;
    let events_max = number(
        env,
        "satellite.event_retention_max",
        env::EVENT_RETENTION_MAX,
        s.event_retention_max,
        100_000u64,
        false,
    )?;
    let events_max_mib = number(
        env,
        "satellite.event_retention_max_mib",
        env::EVENT_RETENTION_MAX_MIB,
        s.event_retention_max_mib,
        256u64,
        false,
    )?;
    Ok(Retention {
        analytics: Duration::from_secs(analytics_days.saturating_mul(86_400)),
        events: Duration::from_secs(event_days.saturating_mul(86_400)),
        events_max,
        events_max_bytes: events_max_mib.saturating_mul(1024 * 1024),
    })
}
