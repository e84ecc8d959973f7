//! How one setting is read: its environment variable when set, else its file key, else its default. Each reader
//! names the key and the variable in its error.

use std::str::FromStr;
use std::time::Duration;

use super::env::{self, Env};
use super::ConfigError;

/// A whole number from the environment, else the file, else the default.
pub(super) fn number<T: FromStr + Copy + PartialOrd + Default>(
    env: &Env,
    key: &str,
    var: &'static str,
    file: Option<T>,
    default: T,
    allow_zero: bool,
) -> Result<T, ConfigError> {
    let value = match env::get(env, var) {
        Some(v) => {
            v.parse::<T>().map_err(|_| ConfigError::new(key, Some(var), format!("{v:?} is not a whole number")))?
        }
        None => file.unwrap_or(default),
    };
    if !allow_zero && value <= T::default() {
        return Err(ConfigError::new(key, Some(var), "must be greater than zero"));
    }
    Ok(value)
}

/// Whole seconds greater than zero from the environment, else the file, else the default.
pub(super) fn seconds(
    env: &Env,
    key: &str,
    var: &'static str,
    file: Option<u64>,
    default: u64,
) -> Result<Duration, ConfigError> {
    number(env, key, var, file, default, false).map(Duration::from_secs)
}

/// Whole milliseconds greater than zero from the environment, else the file, else the default.
pub(super) fn millis(
    env: &Env,
    key: &str,
    var: &'static str,
    file: Option<u64>,
    default: u64,
) -> Result<Duration, ConfigError> {
    number(env, key, var, file, default, false).map(Duration::from_millis)
}

/// A count from the environment (refused unless a positive number), else the file's when positive.
pub(super) fn count<T: FromStr + PartialOrd + Default>(
    env: &Env,
    key: &str,
    var: &'static str,
    file: Option<T>,
) -> Result<Option<T>, ConfigError> {
    match env::get(env, var) {
        Some(v) => v
            .parse::<T>()
            .ok()
            .filter(|n| *n > T::default())
            .map(Some)
            .ok_or_else(|| ConfigError::new(key, Some(var), format!("{v:?} is not a positive number"))),
        None => Ok(file.filter(|n| *n > T::default())),
    }
}

/// On when the variable says `true` (any other value is off), else the file's value, else the default.
pub(super) fn switch(env: &Env, var: &str, file: Option<bool>, default: bool) -> bool {
    match env::get(env, var) {
        Some(v) => v == "true",
        None => file.unwrap_or(default),
    }
}
