//! The standalone file as a configuration source: re-read when its content changes, applied as a difference
//! once the new content has held still for one watch interval (an editor saving in place, `cat >` or a config
//! tool writing it shows half-written content for a moment); a file that is empty, does not parse or does not
//! validate is refused and the last good one stays in force.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tracing::{error, info, warn};

use crate::auth::Authenticator;
use crate::config::{self, ConfigError};
use crate::control::standalone::{self, StandaloneConfig};
use crate::events::{ConfigRefresh, Emitter, Event};
use crate::instances::InstanceManager;

/// Re-reads the standalone file when its content changes and applies the difference.
/// A file that does not parse or validate is reported and the last good config stays in force.
#[derive(Clone)]
pub(super) struct FileWatch {
    pub(super) path: PathBuf,
    pub(super) last: Arc<parking_lot::Mutex<Option<[u8; 32]>>>,
    /// A changed content seen once, applied if the next look finds it unchanged.
    pub(super) pending: Arc<parking_lot::Mutex<Option<[u8; 32]>>>,
    pub(super) manager: InstanceManager,
    pub(super) auth: Authenticator,
    pub(super) toolsets: crate::toolsets::Toolsets,
    pub(super) limits: crate::router::limits::Limits,
    pub(super) refusals: Arc<AtomicU64>,
    pub(super) events: Emitter,
    /// `[satellite]` and `[sandbox]` as the running satellite read them at start.
    pub(super) start_only: Arc<std::collections::BTreeMap<String, toml::Value>>,
    /// The start-only settings last warned about, so an edit is warned about once.
    pub(super) warned: Arc<parking_lot::Mutex<Vec<String>>>,
    /// The file could not be read at the last look: said once, not at every look until it can be again.
    pub(super) unreadable: Arc<std::sync::atomic::AtomicBool>,
}

impl FileWatch {
    pub(super) async fn check(self) -> Result<(), ConfigError> {
        let Some(bytes) = self.read().await else { return Ok(()) };
        let current = fingerprint(&bytes);
        if !self.settled(current) {
            return Ok(());
        }
        match self.parse(bytes) {
            Ok(next) => self.apply(next, current).await,
            Err(err) => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                error!(path = %self.path.display(), error = %err, "config file change refused, keeping the last good config; fix the file (`satellite check-config` shows the same error)");
                // Logged once, here, with what to do: the job runner need not log it again.
            }
        }
        Ok(())
    }

    /// The file's bytes, or `None` when it cannot be read now: out of descriptors, or the file replaced right
    /// now, is not a change; look again next time.
    async fn read(&self) -> Option<Vec<u8>> {
        // Off the runtime's threads: a file on a slow or stalled disk must not hold up requests.
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || config::file::read_bounded(&path))
            .await
            .unwrap_or_else(|err| Err(std::io::Error::other(err.to_string())));
        match read {
            Ok(bytes) => {
                if self.unreadable.swap(false, Ordering::Relaxed) {
                    info!(path = %self.path.display(), "config file readable again");
                }
                Some(bytes)
            }
            Err(err) => {
                // Said once (a file deleted or a mount gone would otherwise warn every second for as long as it
                // lasts).
                if !self.unreadable.swap(true, Ordering::Relaxed) {
                    warn!(path = %self.path.display(), error = %err, "config file unreadable, keeping the current config; check its permissions and the open-file limit");
                }
                None
            }
        }
    }

    /// Whether a file with this fingerprint is a change that has held still for one interval (then it is taken
    /// as the last seen); a half-written file changes again before it is read.
    fn settled(&self, current: [u8; 32]) -> bool {
        if *self.last.lock() == Some(current) {
            *self.pending.lock() = None;
            return false;
        }
        if self.pending.lock().replace(current) != Some(current) {
            // Changed since the last look: wait until it holds still for one interval.
            return false;
        }
        *self.pending.lock() = None;
        *self.last.lock() = Some(current);
        true
    }

    fn parse(&self, bytes: Vec<u8>) -> Result<StandaloneConfig, ConfigError> {
        match String::from_utf8(bytes) {
            Err(_) => Err(ConfigError::new("config file", None, "is not UTF-8 text")),
            Ok(text) if text.trim().is_empty() => Err(ConfigError::new("config file", None, config::file::EMPTY)),
            Ok(text) => {
                self.warn_start_only(&text);
                config::parse_file_at(&text, &self.path).and_then(|raw| standalone::from_file(&raw))
            }
        }
    }

    /// The new directory, toolsets and desired state, applied; the change reported as `config.refreshed`.
    async fn apply(&self, next: StandaloneConfig, current: [u8; 32]) {
        self.auth.replace(next.directory.clone());
        self.toolsets.set_configured(next.toolsets.clone());
        self.limits.replace(next.limits.clone());
        let desired = next.desired_state();
        let refresh = ConfigRefresh::new(
            "file",
            current,
            desired.instances.len(),
            desired.teams_count(),
            desired.rejected.len(),
            0,
        );
        let report = self.manager.apply(desired).await;
        info!(%report, path = %self.path.display(), "config file change applied");
        let refresh = ConfigRefresh { change_detected: report.changed(), ..refresh };
        self.events.emit(Event::config_refreshed(&refresh)).await;
    }

    /// `[satellite]` and `[sandbox]` are read once at start: an edit of them is not applied, and says so once.
    fn warn_start_only(&self, text: &str) {
        // A file that is not TOML is refused as a whole (and said so): nothing to say of its settings.
        let Some(edited) = config::start_only_settings_of(text) else { return };
        let changed = config::changed_start_only_settings(&self.start_only, &edited);
        let mut warned = self.warned.lock();
        if changed.is_empty() || *warned == changed {
            *warned = changed;
            return;
        }
        warn!(
            path = %self.path.display(),
            settings = %changed.join(", "),
            "settings that are read only at start changed in the config file; they take effect when the satellite restarts (the rest of the file is applied now)"
        );
        *warned = changed;
    }
}

pub(super) fn fingerprint(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}
