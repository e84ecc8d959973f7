//! The data directory's lock: one satellite per data directory. An exclusive advisory lock (`flock`) on
//! `satellite.lock` in it, taken by `satellite serve` at start and held for the process's life, with the holder's
//! pid written in the file for the one that finds it taken. The kernel drops the lock with the process, however it
//! ends, so a lock file left by a killed satellite blocks nothing.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "satellite.lock";

/// Why the data directory's lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another process holds it: the satellite must not start.
    #[error("the data directory {dir} is in use by another satellite{}; stop it, or give this one its own data \
             directory (--data-dir, SATELLITE_DATA_DIR)", .holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default())]
    Busy { dir: String, holder: Option<u32> },
    /// The lock cannot be had here (a read-only or full volume with no lock file yet, a filesystem without
    /// `flock`): the satellite runs without it.
    #[error("cannot lock the data directory {dir}: {reason}")]
    Unavailable { dir: String, reason: String },
}

/// The data directory's lock, held until dropped (or the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: Flock<File>,
    path: PathBuf,
}

impl DataDirLock {
    /// Take the lock of `data_dir` (created if missing), without waiting, and write this process's pid in it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, DirLockError> {
        let dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned());
        let unavailable = |reason: String| DirLockError::Unavailable { dir: dir.display().to_string(), reason };
        std::fs::create_dir_all(&dir).map_err(|err| unavailable(err.to_string()))?;
        let path = dir.join(LOCK_FILE);
        // Read-only is enough to lock: a lock file left on a volume mounted read-only since still keeps two
        // satellites apart (the pid is then not written).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .or_else(|_| File::open(&path))
            .map_err(|err| unavailable(format!("{}: {err}", path.display())))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut file) => {
                write_pid(&mut file);
                Ok(DataDirLock { _file: file, path })
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                Err(DirLockError::Busy { dir: dir.display().to_string(), holder: holder(&path) })
            }
            Err((_, errno)) => Err(unavailable(format!("{}: {errno}", path.display()))),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// This process's pid, alone in the lock file. A volume that takes no write (full, read-only) leaves the file as it
/// was: the lock holds all the same, only the pid said to a second satellite may be stale or missing.
fn write_pid(file: &mut File) {
    let _ = file.set_len(0).and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()));
}

/// The pid the holder wrote, if it did.
fn holder(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = DataDirLock::acquire(&data).expect("the first lock");
        assert_eq!(std::fs::read_to_string(first.path()).unwrap(), format!("{}\n", std::process::id()));
        // flock locks belong to the open file: a second open in this very process is refused as another's would be.
        let err = DataDirLock::acquire(&data).unwrap_err();
        assert!(matches!(&err, DirLockError::Busy { holder: Some(pid), .. } if *pid == std::process::id()), "{err}");
        let text = err.to_string();
        assert!(text.contains(&data.display().to_string()) && text.contains("(pid "), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
        drop(first);
        DataDirLock::acquire(&data).expect("free again once the first is dropped");
    }

    #[test]
    fn a_holder_that_wrote_no_pid_is_named_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        std::fs::write(first.path(), "").unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, DirLockError::Busy { holder: None, .. }), "{err}");
        assert!(!err.to_string().contains("pid"), "{err}");
    }
}
