//! Where the desired state comes from: a DeployStack-compatible backend, a standalone file, or the built-in demo.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::embedded::{embedded, EmbeddedDefault};
use super::env::{self, Env};
use super::file::RawSatellite;
use super::managed::{managed, ManagedSettings};
use super::values::count;
use super::ConfigError;

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

/// A backend URL selects managed mode, a config file standalone mode, neither the embedded demo; not both.
pub(super) fn select(env: &Env, s: &RawSatellite, path: Option<PathBuf>) -> Result<Mode, ConfigError> {
    match (env::get(env, env::BACKEND_URL), path) {
        (Some(_), Some(_)) => Err(ConfigError::new(
            "mode",
            Some(env::BACKEND_URL),
            "a backend url and a standalone config file exclude each other; set one",
        )),
        (Some(url), None) => Ok(Mode::Managed(Box::new(managed(env, url)?))),
        (None, Some(path)) => {
            let ms = count(
                env,
                "satellite.config_watch_interval_ms",
                env::CONFIG_WATCH_INTERVAL_MS,
                s.config_watch_interval_ms,
            )?
            .unwrap_or(1000);
            Ok(Mode::Standalone(StandaloneSource::File { path, watch_interval: Duration::from_millis(ms) }))
        }
        (None, None) => Ok(Mode::Standalone(StandaloneSource::Embedded(embedded(env)?))),
    }
}

pub(super) fn is_embedded(mode: &Mode) -> bool {
    matches!(mode, Mode::Standalone(StandaloneSource::Embedded(_)))
}

/// The demo's tokens are printed to the terminal: fine on this machine, not on an address others reach
/// (a container listening on 0.0.0.0 with its log shipped somewhere). There, the operator names them.
pub(super) fn refuse_exposed_demo(mode: &Mode, host: IpAddr) -> Result<(), ConfigError> {
    if let Mode::Standalone(StandaloneSource::Embedded(demo)) = mode {
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
    Ok(())
}
