//! A reserve of disk space on the data volume of the embedded SQLite database (issue 73). A file of zeros,
//! `satellite.reserve` ([`DEFAULT_RESERVE_BYTES`], `SATELLITE_DISK_RESERVE_MIB`), made beside the database when the
//! volume has room for it and as much again, and given back when the volume fills:
//!
//! - at start, when the database cannot be opened (SQLite needs a few pages for its WAL index), so a satellite
//!   restarted on a full volume starts instead of exiting;
//! - while running, when the volume's free space falls under the reserve's size (a check every few seconds), so what
//!   the satellite holds (events, analytics rows) is written and nothing is lost when it stops;
//! - made again once the volume has room for it twice over.
//!
//! What a full volume does is said once per change in the log and in `/readyz` (`degraded.storage`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{error, info, warn};

/// The reserve's size unless configured.
pub const DEFAULT_RESERVE_BYTES: u64 = 8 * 1024 * 1024;

/// The reserve's file name in the data directory.
pub const RESERVE_FILE: &str = "satellite.reserve";

/// The reserve of one data directory.
#[derive(Debug)]
pub struct Reserve {
    path: PathBuf,
    bytes: u64,
    /// The volume was found full: the reserve was given back (or could not be made) and not made again since.
    full: AtomicBool,
}

impl Reserve {
    /// The reserve of `data_dir` (made by [`Reserve::keep`]); `bytes` zero turns it off.
    pub fn new(data_dir: &Path, bytes: u64) -> Reserve {
        Reserve { path: data_dir.join(RESERVE_FILE), bytes, full: AtomicBool::new(false) }
    }

    /// Whether the volume was found full and has not had room for the reserve since.
    pub fn volume_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Make the reserve if it is missing and the volume has room for it twice over. True when it exists now.
    pub fn keep(&self) -> bool {
        if self.bytes == 0 {
            return false;
        }
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() >= self.bytes) {
            return true;
        }
        if free_bytes(&self.path).is_none_or(|free| free < 2 * self.bytes) {
            return false;
        }
        match self.write() {
            Ok(()) => {
                if self.full.swap(false, Ordering::Relaxed) {
                    info!(path = %self.path.display(), mib = self.bytes >> 20, "data volume has room again: disk reserve made again");
                }
                true
            }
            Err(err) => {
                // Half a reserve is worse than none: it would be counted as made.
                let _ = std::fs::remove_file(&self.path);
                warn!(path = %self.path.display(), error = %err, "the disk reserve could not be made");
                false
            }
        }
    }

    fn write(&self) -> std::io::Result<()> {
        let mut file = std::fs::File::create(&self.path)?;
        let zeros = vec![0u8; 1 << 20];
        let mut left = self.bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            file.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        file.sync_all()
    }

    /// Give the reserve's space back to the volume, saying why. True when there was one to give.
    pub fn release(&self, why: &str) -> bool {
        let existed = std::fs::remove_file(&self.path).is_ok();
        // Said once per filling, and only when there was a reserve to give: a volume that refuses even that (read
        // only) is said by the store.
        if !self.full.swap(true, Ordering::Relaxed) && existed {
            let free = free_bytes(&self.path).unwrap_or(0);
            error!(path = %self.path.display(), released_mib = self.bytes >> 20, free_bytes = free,
                   "data volume full ({why}): the disk reserve was given back so what the satellite holds can be written; free space on the volume");
        }
        existed
    }

    /// The periodic check: give the reserve back when the volume's free space falls under its size, make it again
    /// when there is room twice over.
    pub fn check(&self) {
        if self.bytes == 0 {
            return;
        }
        match free_bytes(&self.path) {
            Some(free) if free < self.bytes && !self.volume_full() => {
                self.release("free space under the reserve's size");
            }
            Some(_) => {
                self.keep();
            }
            None => {}
        }
    }
}

/// Free bytes for an unprivileged writer on the volume holding `path` (its parent directory is asked).
fn free_bytes(path: &Path) -> Option<u64> {
    let dir = path.parent()?;
    let stats = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(stats.blocks_available() as u64 * stats.fragment_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_made_given_back_and_made_again() {
        let dir = tempfile::tempdir().expect("dir");
        let reserve = Reserve::new(dir.path(), 64 * 1024);
        assert!(reserve.keep(), "room for it");
        assert_eq!(std::fs::metadata(dir.path().join(RESERVE_FILE)).map(|m| m.len()).ok(), Some(64 * 1024));
        assert!(reserve.release("a test"));
        assert!(reserve.volume_full() && !dir.path().join(RESERVE_FILE).exists());
        assert!(!reserve.release("again"), "nothing left to give");
        reserve.check();
        assert!(!reserve.volume_full(), "room again: made again");
        assert!(dir.path().join(RESERVE_FILE).exists());
        let off = Reserve::new(dir.path(), 0);
        assert!(!off.keep());
    }
}
