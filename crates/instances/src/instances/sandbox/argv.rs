//! The argument vectors of the isolation tools: nsjail and bubblewrap around a child, with the team's
//! directories mounted and the system directories read-only (SB §9.10).

use std::path::{Path, PathBuf};

use super::{HostDir, Layout, SANDBOX_WORKDIR, SYSTEM_DIRS};
use crate::config::SandboxSettings;

/// The team's host directories and the sandbox hostname.
pub(super) struct TeamMounts<'a> {
    pub(super) work: &'a Path,
    pub(super) cache: &'a Path,
    /// A GitHub deployment: mounted read-only at its own path and made the cwd.
    pub(super) app: Option<&'a Path>,
    pub(super) hostname: String,
}

/// The command itself, when it lives outside the read-only system directories (e.g. `$HOME/.local/bin/uvx`):
/// mounted read-only at the same path so the absolute path still works inside.
fn command_outside_system(command: &Path) -> Option<(PathBuf, &Path)> {
    if SYSTEM_DIRS.iter().any(|dir| command.starts_with(dir)) {
        return None;
    }
    let source = std::fs::canonicalize(command).unwrap_or_else(|_| command.to_owned());
    Some((source, command))
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// nsjail flags of SB §9.10 (with the team's work dir as `/workspace` instead of a GitHub checkout at `/app`).
/// The environment is passed with `--keep_env`, never on the command line, where any local user could read it.
pub(super) fn nsjail_args(
    layout: &Layout,
    s: &SandboxSettings,
    team: &TeamMounts<'_>,
    runtime: &str,
    command: &Path,
    args: &[String],
) -> Vec<String> {
    let mut argv = nsjail_identity_and_limits(layout, s);
    argv.extend(nsjail_mounts(layout, team, runtime, command));
    argv.extend([
        "-s".into(),
        "/proc/self/fd:/dev/fd".into(),
        "--disable_clone_newnet".into(),
        "--disable_clone_newcgroup".into(),
        "--disable_no_new_privs".into(),
        "--hostname".into(),
        team.hostname.clone(),
        "--keep_env".into(),
        "--".into(),
        path_str(command),
    ]);
    argv.extend(args.iter().cloned());
    argv
}

/// nsjail's mode, the child's uid and gid, and its rlimits from the settings (0: `max`); no time limit.
fn nsjail_identity_and_limits(layout: &Layout, s: &SandboxSettings) -> Vec<String> {
    let limit = |v: u64| if v == 0 { "max".to_owned() } else { v.to_string() };
    vec![
        "-Mo".into(),
        "--proc_rw".into(),
        "--user".into(),
        layout.uid.to_string(),
        "--group".into(),
        layout.gid.to_string(),
        "--rlimit_as".into(),
        limit(s.memory_limit_mb),
        "--rlimit_cpu".into(),
        limit(s.cpu_time_limit_seconds),
        "--rlimit_nproc".into(),
        limit(s.max_processes),
        "--rlimit_nofile".into(),
        limit(s.rlimit_nofile),
        "--rlimit_fsize".into(),
        limit(s.rlimit_fsize_mb),
        "--time_limit".into(),
        "0".into(),
    ]
}

/// nsjail's mounts: the system directories read-only, a private /tmp, the team's cache as the runtime's home and
/// its work dir at `/workspace`, a deployment read-only as cwd, the command when it lives elsewhere, and the few
/// devices a runtime needs.
fn nsjail_mounts(layout: &Layout, team: &TeamMounts<'_>, runtime: &str, command: &Path) -> Vec<String> {
    let mut argv = Vec::new();
    for dir in &layout.system {
        match dir {
            HostDir::Dir(dir) => argv.extend(["-R".into(), (*dir).to_owned()]),
            HostDir::Symlink(dir, target) => argv.extend(["-s".into(), format!("{}:{dir}", target.display())]),
        }
    }
    argv.extend([
        "-m".into(),
        format!("none:/tmp:tmpfs:size={}", layout.tmpfs_size),
        "-B".into(),
        format!("{}:/home/{runtime}", team.cache.display()),
        "-B".into(),
        format!("{}:{SANDBOX_WORKDIR}", team.work.display()),
    ]);
    match team.app {
        Some(app) => {
            argv.extend(["-R".into(), format!("{}:{}", app.display(), app.display()), "--cwd".into(), path_str(app)])
        }
        None => argv.extend(["--cwd".into(), SANDBOX_WORKDIR.into()]),
    }
    if let Some((source, target)) = command_outside_system(command) {
        argv.extend(["-R".into(), format!("{}:{}", source.display(), target.display())]);
    }
    for dev in ["/dev/null", "/dev/urandom", "/dev/zero"] {
        argv.extend(["-B".into(), dev.into()]);
    }
    argv
}

/// bubblewrap's equivalent of the nsjail flags: read-only system dirs, fresh /proc, /dev and /tmp, the team's
/// cache as the runtime's home and its work dir as cwd, every namespace but the network. rlimits are set by the
/// satellite on bwrap itself and inherited by the child.
pub(super) fn bwrap_args(
    layout: &Layout,
    team: &TeamMounts<'_>,
    runtime: &str,
    command: &Path,
    args: &[String],
) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "--die-with-parent".into(),
        "--new-session".into(),
        "--unshare-all".into(),
        "--share-net".into(),
        "--hostname".into(),
        team.hostname.clone(),
    ];
    for dir in &layout.system {
        match dir {
            HostDir::Dir(dir) => argv.extend(["--ro-bind".into(), (*dir).to_owned(), (*dir).to_owned()]),
            HostDir::Symlink(dir, target) => argv.extend(["--symlink".into(), path_str(target), (*dir).to_owned()]),
        }
    }
    argv.extend([
        "--proc".into(),
        "/proc".into(),
        "--dev".into(),
        "/dev".into(),
        "--tmpfs".into(),
        "/tmp".into(),
        "--bind".into(),
        path_str(team.cache),
        format!("/home/{runtime}"),
        "--bind".into(),
        path_str(team.work),
        SANDBOX_WORKDIR.into(),
    ]);
    if let Some((source, target)) = command_outside_system(command) {
        argv.extend(["--ro-bind".into(), path_str(&source), path_str(target)]);
    }
    let cwd = match team.app {
        Some(app) => {
            argv.extend(["--ro-bind".into(), path_str(app), path_str(app)]);
            path_str(app)
        }
        None => SANDBOX_WORKDIR.into(),
    };
    argv.extend(["--chdir".into(), cwd, "--".into(), path_str(command)]);
    argv.extend(args.iter().cloned());
    argv
}
