//! What the satellite tells its operator: the log level and format, the debug route's default, and the token
//! `GET /metrics` asks for.

use secrecy::SecretString;

use super::env::{self, Env};
use super::file::RawSatellite;
use super::values::switch;
use super::ConfigError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// The log level (default `info`) and format (default `pretty`), each from the environment, else the file.
pub(super) fn logging(env: &Env, s: &RawSatellite) -> Result<(String, LogFormat), ConfigError> {
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
    let log_format = match env::get(env, env::LOG_FORMAT).map(str::to_owned).or_else(|| s.log_format.clone()).as_deref()
    {
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
    Ok((log_level, log_format))
}

/// The MCP debug route: on by default for the embedded demo only.
pub(super) fn debug_route(env: &Env, s: &RawSatellite, embedded_default: bool) -> bool {
    switch(env, env::SHOW_DEBUG_ROUTE, s.debug_route, embedded_default)
}

/// The bearer token `GET /metrics` needs, from the environment only: it is a secret.
pub(super) fn metrics_token(env: &Env) -> Option<SecretString> {
    env::get(env, env::METRICS_TOKEN).filter(|t| !t.is_empty()).map(|t| SecretString::from(t.to_owned()))
}
