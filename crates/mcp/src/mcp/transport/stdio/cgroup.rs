//! A CPU *rate* limit per stdio child: its own cgroup with a CFS quota (`cpu.max` on cgroup v2,
//! `cpu.cfs_quota_us` on v1), so a busy server gets at most `percent` of one core however long it runs, unlike
//! `RLIMIT_CPU`, which is a lifetime budget.
//!
//! The group is made before the spawn, under the satellite's own cgroup (`satellite-<pid>/<n>`), and the child
//! joins it itself between `fork` and `exec` (writing `0`, "the writer", to a pre-opened membership file), so
//! everything it starts is limited with it.
//!
//! On v1 that file is `tasks`, not `cgroup.procs`. Moving a whole process write-locks the kernel's global
//! threadgroup semaphore, which waits for an RCU grace period: 6-27 ms per spawn measured on Linux 6.18, during
//! which the child cannot exec and its server cannot answer. A thread that moves only itself skips that lock, and
//! between fork and exec the child is one thread, so `tasks` moves the whole child in about 0.1 ms. v2 has no such
//! file for a domain group (`cgroup.threads` is for threaded groups) and keeps `cgroup.procs`.
//!
//! The group is removed when the child's owner ends. Where no CPU controller is writable (no cgroup mount, not
//! permitted, cgroup v2 without `cpu` delegated), children run without the limit and the satellite says so once
//! at info level: the limit is best effort, never a reason a server fails to start.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use tracing::{debug, info, warn};

/// The scheduling period the quota is a share of (100 ms, the kernel's default).
const PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    V1,
    V2,
}

#[derive(Debug)]
struct Controller {
    flavor: Flavor,
    /// `satellite-<pid>` under the satellite's own cgroup: the parent of every child's group.
    parent: PathBuf,
}

static CONTROLLER: OnceLock<Option<Controller>> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(1);

/// One child's group, made and configured, with its membership file open for the child to join.
#[derive(Debug)]
pub struct CpuGroup {
    dir: PathBuf,
    join: Option<File>,
}

/// Find the CPU controller and make the satellite's parent group now, so that the first spawn does not: the
/// start calls it on the blocking pool while the store opens. Later calls return at once.
pub fn prepare() {
    CONTROLLER.get_or_init(detect);
}

impl CpuGroup {
    /// A new group limited to `percent` of one core, or `None` where the limit cannot be applied.
    pub fn create(percent: u32) -> Option<CpuGroup> {
        let controller = CONTROLLER.get_or_init(detect).as_ref()?;
        let dir = controller.parent.join(NEXT.fetch_add(1, Ordering::Relaxed).to_string());
        match make_group(controller.flavor, &dir, percent) {
            Ok(join) => Some(CpuGroup { dir, join: Some(join) }),
            Err(err) => {
                warn!(dir = %dir.display(), error = %err, "cannot make a cpu cgroup; this server runs without the cpu limit");
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }

    /// The descriptor the child joins through (open until [`CpuGroup::spawned`]).
    pub fn join_fd(&self) -> Option<RawFd> {
        self.join.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The child exists (and has joined): the parent's copy of the descriptor is no longer needed.
    pub fn spawned(&mut self) {
        self.join = None;
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        // Empty once the child and its group are gone; a process that escaped the group kill keeps it (and is
        // still limited), and the next start of the satellite clears what is left.
        if let Err(err) = std::fs::remove_dir(&self.dir) {
            debug!(dir = %self.dir.display(), error = %err, "cpu cgroup not removed");
        }
    }
}

/// Runs in the forked child, still a single thread: joins the group by writing `0`, which the kernel reads as
/// the writing thread (on v2's `cgroup.procs`, its process). Async-signal-safe: one write of a constant.
pub(super) fn join_in_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: `fd` is the open membership file of the group (CLOEXEC, so exec closes it); write is
    // async-signal-safe and reads one byte of a static.
    let written = unsafe { nix::libc::write(fd, b"0".as_ptr().cast(), 1) };
    if written < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn make_group(flavor: Flavor, dir: &Path, percent: u32) -> std::io::Result<File> {
    std::fs::create_dir(dir)?;
    let quota = PERIOD_US * u64::from(percent.max(1)) / 100;
    match flavor {
        Flavor::V2 => write(&dir.join("cpu.max"), &format!("{quota} {PERIOD_US}"))?,
        Flavor::V1 => {
            write(&dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
            write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
    }
    OpenOptions::new().write(true).open(dir.join(membership_file(flavor)))
}

/// The file a single-threaded child joins through (see the module's doc for why v1 uses `tasks`).
fn membership_file(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::V1 => "tasks",
        Flavor::V2 => "cgroup.procs",
    }
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    OpenOptions::new().write(true).open(path)?.write_all(value.as_bytes())
}

/// Finds a writable CPU controller for the satellite's own cgroup and makes `satellite-<pid>` in it.
fn detect() -> Option<Controller> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let found = find_v1(&cgroups, &mountinfo).or_else(|| find_v2(&cgroups, &mountinfo));
    let Some((flavor, own)) = found else {
        info!("no cpu cgroup controller; stdio servers run without a cpu rate limit");
        return None;
    };
    clear_stale(&own);
    let parent = own.join(format!("satellite-{}", std::process::id()));
    let made = std::fs::create_dir_all(&parent).and_then(|()| match flavor {
        // v2: a group's controllers for its children must be enabled in its `cgroup.subtree_control`.
        Flavor::V2 => write(&parent.join("cgroup.subtree_control"), "+cpu"),
        Flavor::V1 => Ok(()),
    });
    match made {
        Ok(()) => {
            debug!(dir = %parent.display(), "stdio servers get a cpu rate limit through cgroups");
            Some(Controller { flavor, parent })
        }
        Err(err) => {
            info!(dir = %parent.display(), error = %err, "cpu cgroup not writable; stdio servers run without a cpu rate limit");
            let _ = std::fs::remove_dir(&parent);
            None
        }
    }
}

/// Removes `satellite-<pid>` groups of satellites that are gone (killed before they could clean up).
fn clear_stale(own: &Path) {
    let Ok(entries) = std::fs::read_dir(own) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("satellite-").and_then(|p| p.parse::<u32>().ok()) else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        for child in std::fs::read_dir(entry.path()).into_iter().flatten().flatten() {
            if child.path().is_dir() {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// cgroup v1: the hierarchy line naming `cpu` and the mount of that hierarchy.
fn find_v1(cgroups: &str, mountinfo: &str) -> Option<(Flavor, PathBuf)> {
    let path = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "cpu").then(|| path.to_owned())
    })?;
    let (root, mount) = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut fields = right.split_whitespace();
        let (fstype, _, options) = (fields.next()?, fields.next()?, fields.next()?);
        let left: Vec<&str> = left.split_whitespace().collect();
        (fstype == "cgroup" && options.split(',').any(|o| o == "cpu")).then(|| (left[3].to_owned(), left[4].to_owned()))
    })?;
    Some((Flavor::V1, under(&mount, &root, &path)?))
}

/// cgroup v2: the unified line (`0::/path`) and a cgroup2 mount whose group offers the `cpu` controller.
fn find_v2(cgroups: &str, mountinfo: &str) -> Option<(Flavor, PathBuf)> {
    let path = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let left: Vec<&str> = left.split_whitespace().collect();
        let own = under(left.get(4)?, left.get(3)?, path)?;
        let controllers = std::fs::read_to_string(own.join("cgroup.controllers")).ok()?;
        controllers.split_whitespace().any(|c| c == "cpu").then_some((Flavor::V2, own))
    })
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount` whose mount shows group `root`.
fn under(mount: &str, root: &str, path: &str) -> Option<PathBuf> {
    let relative = path.strip_prefix(root).unwrap_or(path).trim_start_matches('/');
    let dir = Path::new(mount).join(relative);
    dir.is_dir().then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_v1_cpu_hierarchy_and_the_groups_directory() {
        let cgroups = "4:memory:/x\n2:cpuacct:/\n1:cpu:/\n0::/\n";
        let mountinfo = "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n\
                         31 25 0:27 / /sys/fs/cgroup/cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpuacct\n";
        // The directory must exist to be chosen; "/" under the mount point of a tempdir stands in for it.
        let tmp = tempfile::tempdir().unwrap();
        let mountinfo = mountinfo.replace("/sys/fs/cgroup/cpu ", &format!("{} ", tmp.path().display()));
        assert_eq!(find_v1(cgroups, &mountinfo), Some((Flavor::V1, tmp.path().to_path_buf())));
        assert_eq!(find_v1("0::/\n", &mountinfo), None, "no cpu hierarchy named");
    }

    #[test]
    fn a_child_joins_as_the_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("tasks");
        let handle = File::create(&file).unwrap();
        join_in_child(handle.as_raw_fd()).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "0", "0 names the writer, whatever its pid");
        assert_eq!(membership_file(Flavor::V1), "tasks", "v1: the thread moves itself, no global lock");
        assert_eq!(membership_file(Flavor::V2), "cgroup.procs", "v2 domain groups have no per-thread file");
    }

    /// A group the child cannot join (its file went read-only, or the group vanished) is an error the spawn
    /// passes over: the server runs unlimited rather than not at all.
    #[test]
    fn a_join_that_cannot_be_written_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("tasks");
        std::fs::write(&file, "").unwrap();
        let read_only = File::open(&file).unwrap();
        assert!(join_in_child(read_only.as_raw_fd()).is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "", "nothing written");
    }
}
