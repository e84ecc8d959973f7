//! The instance lifecycle settings (SB §9.6-§9.8): restart backoff, dormancy, call and process limits, stderr
//! capture, each from the file's `[satellite]` key or its environment variable.

use std::time::Duration;

use super::env::{self, Env};
use super::values::{millis, number};
use super::{file, ConfigError};

/// Restart policy, idle dormancy, limits and stderr capture of instances (SB §9.6-§9.8).
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleSettings {
    /// Idle time after which a stdio instance goes dormant; `None` never (`0` in the environment).
    pub idle_timeout: Option<Duration>,
    /// No dormancy before a process is this old.
    pub spawn_grace: Duration,
    pub idle_check_interval: Duration,
    /// Waits before the 1st, 2nd and later automatic restarts after a crash.
    pub restart_backoff: Vec<Duration>,
    /// Calls one instance serves at once; more wait in a queue.
    pub max_calls_per_instance: usize,
    /// How long a call waits for a free slot before it is refused.
    pub call_queue_timeout: Duration,
    pub max_processes_per_user: usize,
    pub max_processes: usize,
    /// stderr lines accepted per process per second.
    pub log_rate_limit: u32,
    pub log_max_line_bytes: usize,
    pub log_rate_warning_interval: Duration,
}

impl Default for LifecycleSettings {
    fn default() -> Self {
        Self {
            idle_timeout: Some(Duration::from_secs(180)),
            spawn_grace: Duration::from_secs(60),
            idle_check_interval: Duration::from_secs(30),
            restart_backoff: vec![Duration::from_secs(1), Duration::from_secs(5), Duration::from_secs(15)],
            max_calls_per_instance: 16,
            call_queue_timeout: Duration::from_secs(10),
            max_processes_per_user: 25,
            max_processes: 500,
            log_rate_limit: 20,
            log_max_line_bytes: 1024,
            log_rate_warning_interval: Duration::from_secs(60),
        }
    }
}

/// Read in a fixed order, so of several bad settings the same one is reported first.
pub(super) fn lifecycle(env: &Env, s: &file::RawSatellite) -> Result<LifecycleSettings, ConfigError> {
    let d = LifecycleSettings::default();
    let idle = number(env, "satellite.idle_timeout_seconds", env::IDLE_TIMEOUT, s.idle_timeout_seconds, 180u64, true)?;
    let backoff = restart_backoff(env, s)?;
    let log_max_line_bytes = log_max_line_bytes(env, s)?;
    let grace = number(env, "satellite.spawn_grace_seconds", env::SPAWN_GRACE, s.spawn_grace_seconds, 60, true)?;
    let (key, var) = ("satellite.idle_check_interval_ms", env::IDLE_CHECK_INTERVAL_MS);
    let idle_check_interval = millis(env, key, var, s.idle_check_interval_ms, 30_000)?;
    let (key, var) = ("satellite.max_calls_per_instance", env::MAX_CALLS_PER_INSTANCE);
    let max_calls_per_instance = number(env, key, var, s.max_calls_per_instance, d.max_calls_per_instance, false)?;
    let (key, var) = ("satellite.call_queue_timeout_ms", env::CALL_QUEUE_TIMEOUT_MS);
    let call_queue_timeout = millis(env, key, var, s.call_queue_timeout_ms, 10_000)?;
    let (key, var) = ("satellite.max_processes_per_user", env::MAX_PROCESSES_PER_USER);
    let max_processes_per_user = number(env, key, var, s.max_processes_per_user, d.max_processes_per_user, false)?;
    let (key, var) = ("satellite.max_processes", env::MAX_PROCESSES);
    let max_processes = number(env, key, var, s.max_processes, d.max_processes, false)?;
    let (key, var) = ("satellite.log_rate_limit_per_second", env::LOG_RATE_LIMIT);
    let log_rate_limit = number(env, key, var, s.log_rate_limit_per_second, 20, false)?;
    let (key, var) = ("satellite.log_rate_limit_warning_interval_ms", env::LOG_RATE_WARNING_MS);
    let log_rate_warning_interval = millis(env, key, var, s.log_rate_limit_warning_interval_ms, 60_000)?;
    Ok(LifecycleSettings {
        idle_timeout: (idle > 0).then(|| Duration::from_secs(idle)),
        spawn_grace: Duration::from_secs(grace),
        idle_check_interval,
        restart_backoff: backoff.into_iter().map(Duration::from_millis).collect(),
        max_calls_per_instance,
        call_queue_timeout,
        max_processes_per_user,
        max_processes,
        log_rate_limit,
        log_max_line_bytes,
        log_rate_warning_interval,
    })
}

/// Milliseconds before the 1st, 2nd and later restarts after a crash; at least one.
fn restart_backoff(env: &Env, s: &file::RawSatellite) -> Result<Vec<u64>, ConfigError> {
    let backoff = match env::get(env, env::RESTART_BACKOFF_MS) {
        Some(v) => {
            v.split(',').map(|part| part.trim().parse::<u64>()).collect::<Result<Vec<u64>, _>>().map_err(|_| {
                ConfigError::new(
                    "satellite.restart_backoff_ms",
                    Some(env::RESTART_BACKOFF_MS),
                    format!("{v:?} is not a comma-separated list of milliseconds"),
                )
            })?
        }
        None => s.restart_backoff_ms.clone().unwrap_or_else(|| vec![1000, 5000, 15000]),
    };
    if backoff.is_empty() {
        return Err(ConfigError::new(
            "satellite.restart_backoff_ms",
            Some(env::RESTART_BACKOFF_MS),
            "needs at least one wait",
        ));
    }
    Ok(backoff)
}

/// Bytes of a stderr line kept, the rest cut (default 1024); under 16 counts as 16.
fn log_max_line_bytes(env: &Env, s: &file::RawSatellite) -> Result<usize, ConfigError> {
    let bytes = number(
        env,
        "satellite.log_max_line_length_bytes",
        env::LOG_MAX_LINE,
        s.log_max_line_length_bytes,
        1024,
        false,
    )?;
    Ok(bytes.max(16))
}
