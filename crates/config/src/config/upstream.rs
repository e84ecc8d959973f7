//! How the satellite treats the MCP servers behind it: timeouts, reconcile concurrency, tool drift and the
//! instance lifecycle (`lifecycle`).

use std::time::Duration;

use super::env::{self, Env};
use super::file::RawSatellite;
use super::lifecycle::{lifecycle, LifecycleSettings};
use super::values::{count, number, seconds, switch};
use super::ConfigError;

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

pub(super) fn upstream(env: &Env, s: &RawSatellite) -> Result<UpstreamSettings, ConfigError> {
    Ok(UpstreamSettings {
        hold_drifted_tools: switch(env, env::HOLD_DRIFTED_TOOLS, s.hold_drifted_tools, false),
        drift_window: drift_window(env, s)?,
        handshake_timeout: seconds(
            env,
            "satellite.handshake_timeout_seconds",
            env::HANDSHAKE_TIMEOUT,
            s.handshake_timeout_seconds,
            30,
        )?,
        discovery_timeout: seconds(
            env,
            "satellite.discovery_timeout_seconds",
            env::DISCOVERY_TIMEOUT,
            s.discovery_timeout_seconds,
            60,
        )?,
        call_timeout: seconds(env, "satellite.call_timeout_seconds", env::CALL_TIMEOUT, s.call_timeout_seconds, 30)?,
        reconcile_concurrency: count(
            env,
            "satellite.reconcile_concurrency",
            env::RECONCILE_CONCURRENCY,
            s.reconcile_concurrency,
        )?
        .unwrap_or(4),
        lifecycle: lifecycle(env, s)?,
    })
}

/// From 1 to 3650 days (default 30).
fn drift_window(env: &Env, s: &RawSatellite) -> Result<Duration, ConfigError> {
    let (key, var) = ("satellite.drift_window_days", env::DRIFT_WINDOW_DAYS);
    // Zero is let through to the range check, which says what is allowed.
    let days = number(env, key, var, s.drift_window_days, 30u64, true)?;
    if !(1..=3650).contains(&days) {
        return Err(ConfigError::new(key, Some(var), "must be from 1 to 3650 days"));
    }
    Ok(Duration::from_secs(days * 86_400))
}
