//! The watchdog that takes the whole process tree of every server child down with the satellite, even when the
//! satellite is killed with SIGKILL and can clean up nothing itself.
//!
//! Each child runs in its own process group, and `PR_SET_PDEATHSIG` kills the child when the satellite dies; but
//! a child's own children (npx → node, a browser a server started) do not inherit that and would live on. So
//! `satellite serve` starts one small helper, `satellite reaper`, in its own process group, with a pipe to it:
//! the satellite writes `+<pgid>` for every child it spawns and `-<pgid>` once that child's group is gone. When
//! the pipe closes (the satellite exited, however it died), the helper kills every group still listed and exits.
//! A process that left its group (`setsid`) escapes this; the sandboxes (`bubblewrap --die-with-parent`, nsjail)
//! cover that case with their pid namespaces.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::OnceLock;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tracing::{debug, warn};

/// The pipe to the helper, when one runs (only `satellite serve` starts it; in-process uses have none).
static PIPE: OnceLock<Mutex<Option<ChildStdin>>> = OnceLock::new();

/// Start the helper (`exe reaper`). Failing to start it is logged and otherwise ignored: the satellite still
/// kills its children's groups itself whenever it gets the chance.
pub fn start(exe: &Path) {
    let spawned = Command::new(exe)
        .arg("reaper")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(mut child) => {
            let pid = child.id();
            if PIPE.set(Mutex::new(child.stdin.take())).is_ok() {
                debug!(pid, "process-tree watchdog started");
            }
        }
        Err(err) => {
            warn!(error = %err, "the process-tree watchdog did not start; if the satellite is killed with SIGKILL, grandchildren of MCP servers may outlive it")
        }
    }
}

/// A child's process group to kill if the satellite dies.
pub fn register(pgid: u32) {
    send(&format!("+{pgid}\n"));
}

/// That group is gone; forget it (its number may be reused).
pub fn unregister(pgid: u32) {
    send(&format!("-{pgid}\n"));
}

fn send(line: &str) {
    let Some(pipe) = PIPE.get() else { return };
    let mut pipe = pipe.lock();
    if let Some(stdin) = pipe.as_mut() {
        if stdin.write_all(line.as_bytes()).is_err() {
            // The helper is gone: nothing more to tell it.
            *pipe = None;
        }
    }
}

/// The helper itself (`satellite reaper`): follow the list on stdin; at end of input kill every group listed.
pub fn run(input: impl BufRead) {
    let mut groups = BTreeSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (sign, number) = line.split_at(line.len().min(1));
        match (sign, number.trim().parse::<i32>()) {
            ("+", Ok(pgid)) if pgid > 1 => {
                groups.insert(pgid);
            }
            ("-", Ok(pgid)) => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_the_groups_still_listed_when_its_input_ends() {
        let mut child = Command::new("sleep").arg("600").process_group(0).spawn().unwrap();
        let mut gone = Command::new("sleep").arg("600").process_group(0).spawn().unwrap();
        let input = format!("+{}\n+{}\n-{}\nnonsense\n+1\n", child.id(), gone.id(), gone.id());
        run(input.as_bytes());
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "a listed group is killed");
        assert!(gone.try_wait().unwrap().is_none(), "an unlisted group is left alone");
        gone.kill().unwrap();
        gone.wait().unwrap();
    }
}
