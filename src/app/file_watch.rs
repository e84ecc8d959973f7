//! The standalone file as a configuration source: re-read when its content changes, applied as a difference;
//! a file that does not parse or validate is refused and the last good one stays in force.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tracing::{error, info};

use crate::auth::Authenticator;
use crate::config::{self, ConfigError};
use crate::control::standalone;
use crate::events::{ConfigRefresh, Emitter, Event};
use crate::instances::InstanceManager;

/// Re-reads the standalone file when its content changes and applies the difference.
/// A file that does not parse or validate is reported and the last good config stays in force.
#[derive(Clone)]
pub(super) struct FileWatch {
    pub(super) path: PathBuf,
    pub(super) last: Arc<parking_lot::Mutex<Option<[u8; 32]>>>,
    pub(super) manager: InstanceManager,
    pub(super) auth: Authenticator,
    pub(super) refusals: Arc<AtomicU64>,
    pub(super) events: Emitter,
}

impl FileWatch {
    pub(super) async fn check(self) -> Result<(), ConfigError> {
        let current = fingerprint(&self.path);
        if std::mem::replace(&mut *self.last.lock(), current) == current {
            return Ok(());
        }
        let parsed = config::read_file(&self.path).and_then(|raw| standalone::from_file(&raw));
        match parsed {
            Ok(next) => {
                self.auth.replace(next.directory.clone());
                let desired = next.desired_state();
                let refresh = ConfigRefresh::new(
                    "file",
                    current.unwrap_or_default(),
                    desired.instances.len(),
                    desired.teams_count(),
                    desired.rejected.len(),
                    0,
                );
                let report = self.manager.apply(desired).await;
                info!(?report, path = %self.path.display(), "config file change applied");
                let refresh = ConfigRefresh { change_detected: report.changed(), ..refresh };
                self.events.emit(Event::config_refreshed(&refresh)).await;
                Ok(())
            }
            Err(err) => {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                error!(path = %self.path.display(), error = %err, "config file change refused, keeping the last good config");
                Err(err)
            }
        }
    }
}

pub(super) fn fingerprint(path: &Path) -> Option<[u8; 32]> {
    std::fs::read(path).ok().map(|bytes| Sha256::digest(&bytes).into())
}
