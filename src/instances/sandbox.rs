//! The sandbox of stdio children (SB §9.2, §9.3, §9.10).
//!
//! `SandboxPolicy` is built once at start from `SandboxSettings` and turns an instance's command, arguments and
//! environment into a `PreparedLaunch`, or refuses it with a one-line `SandboxError`:
//! - the command must be on the allow-list (SB §9.2 names, resolved once to absolute paths; a standalone file
//!   may widen the list with names, absolute paths or `*`; relative paths never pass);
//! - no argument may carry shell metacharacters, `../` or nsjail flags (SB §9.3, always on);
//! - the environment is the satellite's minus its own settings and secrets, overlaid with the instance's minus
//!   the variables that could hijack the child (SB §9.3);
//! - each team gets a working directory (the child's cwd) and a cache directory under
//!   `<data_dir>/sandbox/<team>`;
//! - rlimits from the `NSJAIL_*` settings, and optionally nsjail or bubblewrap namespaces around the child.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use crate::config::env::{Env, OWN_PREFIXES, SECRET_VARIABLES};
use crate::config::{Config, ConfigError, Isolation, Mode, SandboxSettings, StandaloneSource};
use crate::mcp::transport::stderr::StderrSettings;
pub use crate::mcp::transport::ResourceLimits;
use crate::mcp::transport::StdioLaunch;
use crate::model::{InstanceSpec, Upstream};
use crate::secrets;

/// Commands every satellite accepts (SB §9.2), compared case-insensitively after trimming.
pub const DEFAULT_ALLOWED_COMMANDS: [&str; 5] = ["npx", "node", "uvx", "python", "python3"];

/// Arguments may not contain these (SB §9.3).
const FORBIDDEN_ARG_PARTS: [&str; 7] = [";", "&", "|", "`", "$(", "${", "../"];
/// Arguments may not start with these: they would be nsjail flags (SB §9.3).
const FORBIDDEN_ARG_PREFIXES: [&str; 7] =
    ["--user", "--group", "--rlimit", "--mount", "--bindmount", "--cgroup", "--disable"];

/// Host directories mounted read-only inside nsjail and bubblewrap.
const SYSTEM_DIRS: [&str; 6] = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"];
/// Where the team's working directory appears inside nsjail and bubblewrap.
const SANDBOX_WORKDIR: &str = "/workspace";
/// PATH inside nsjail and bubblewrap (SB §9.10).
const SANDBOX_PATH: &str = "/usr/bin:/bin:/usr/local/bin";
/// Longest argument echoed in an error message.
const ARG_ECHO_MAX: usize = 60;

/// Why a stdio instance may not start. Display is one line; `SECURITY:` marks a refusal by policy.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("SECURITY: Rejected command {command:?}: not in the allow-list ({allowed})")]
    CommandNotAllowed { command: String, allowed: String },
    #[error("SECURITY: Rejected command {command:?}: relative paths are never allowed")]
    RelativeCommand { command: String },
    #[error("SECURITY: Rejected argument {index} ({arg:?}): {reason}")]
    Argument { index: usize, arg: String, reason: String },
    #[error("command {command:?} is allowed but not installed (searched $HOME/.local/bin, $HOME/.cargo/bin, $HOME/bin, /usr/local/bin, /usr/bin, /bin, /opt/homebrew/bin and PATH)")]
    NotInstalled { command: String },
    #[error("cannot prepare sandbox directory {}: {source}", .path.display())]
    Directory { path: PathBuf, source: std::io::Error },
    #[error("not a stdio instance")]
    NotStdio,
}

/// Everything needed to spawn one stdio child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedLaunch {
    /// What is executed: the resolved command, or nsjail/bwrap when that isolation is on.
    pub program: PathBuf,
    /// Arguments of `program` (with isolation: the wrapper's flags, then the command and its arguments).
    pub args: Vec<String>,
    /// The resolved MCP server command, absolute.
    pub command: PathBuf,
    /// The child's complete environment.
    pub env: BTreeMap<String, String>,
    /// The team's working directory on the host (the child's cwd, or what is mounted as its cwd).
    pub cwd: PathBuf,
    /// rlimits the satellite sets before exec (nsjail sets its own from its flags, so none then).
    pub limits: ResourceLimits,
    /// Instance environment variables that were refused, by name.
    pub dropped_env: Vec<String>,
}

impl PreparedLaunch {
    pub fn into_stdio_launch(self, label: String, close_grace: Duration, stderr: StderrSettings) -> StdioLaunch {
        StdioLaunch {
            label,
            command: self.program.to_string_lossy().into_owned(),
            args: self.args,
            env: self.env,
            cwd: Some(self.cwd),
            close_grace,
            stderr,
            stderr_sink: None,
            limits: self.limits,
        }
    }
}

/// What may be started.
#[derive(Debug)]
struct AllowList {
    any: bool,
    /// Lowercase bare names and where they resolved at start (`None`: not installed).
    names: BTreeMap<String, Option<PathBuf>>,
    /// Absolute paths allowed exactly as written.
    paths: Vec<String>,
    /// The list as configured, for messages.
    shown: Vec<String>,
}

/// A host directory of `SYSTEM_DIRS` as found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostDir {
    Dir(&'static str),
    /// A symlink such as `/bin -> usr/bin` (merged /usr): recreated as the same symlink inside.
    Symlink(&'static str, PathBuf),
}

/// What the argv builders need besides the instance: pure data, so they are unit-testable.
#[derive(Debug, Clone)]
struct Layout {
    binary: PathBuf,
    system: Vec<HostDir>,
    uid: u32,
    gid: u32,
    tmpfs_size: String,
}

/// The sandbox of every stdio child; built once at start.
#[derive(Debug)]
pub struct SandboxPolicy {
    settings: SandboxSettings,
    allow: AllowList,
    search: Vec<PathBuf>,
    /// Names resolved after start (only with `*`).
    late: Mutex<HashMap<String, Option<PathBuf>>>,
    limits: ResourceLimits,
    /// `<data_dir>/sandbox`, absolute.
    root: PathBuf,
    /// The nsjail or bubblewrap setup, when that isolation is on.
    layout: Option<Layout>,
}

impl SandboxPolicy {
    /// The policy for a loaded config: the embedded default also allows the satellite's own executable (it runs
    /// `satellite demo-server`); a standalone file adds its `[sandbox] allowed_commands`; managed mode gets the
    /// built-in list only.
    pub fn for_config(config: &Config, env: &Env) -> Result<Self, ConfigError> {
        let mut extra = Vec::new();
        if let Mode::Standalone(StandaloneSource::Embedded(_)) = &config.mode {
            let exe = std::env::current_exe().map_err(|err| {
                ConfigError::new(
                    "sandbox.allowed_commands",
                    None,
                    format!("cannot locate the satellite executable: {err}"),
                )
            })?;
            extra.push(exe);
        }
        Self::new(&config.sandbox, env, &config.data_dir, &extra)
    }

    /// `env` is the satellite's environment (HOME and PATH for command resolution); `extra_allowed` are absolute
    /// paths allowed besides the settings. Fails when the chosen isolation's binary cannot be found.
    pub fn new(
        settings: &SandboxSettings,
        env: &Env,
        data_dir: &Path,
        extra_allowed: &[PathBuf],
    ) -> Result<Self, ConfigError> {
        let search = search_dirs(env);
        // The isolation binary first: a missing one is a config error, reported before anything is logged.
        let root = absolute(data_dir).join("sandbox");
        let layout = match settings.isolation {
            Isolation::None => None,
            Isolation::Nsjail | Isolation::Bubblewrap => {
                let (explicit, name, key, var) = match settings.isolation {
                    Isolation::Nsjail => {
                        (&settings.nsjail_path, "nsjail", "sandbox.nsjail_path", crate::config::env::NSJAIL_PATH)
                    }
                    _ => (&settings.bwrap_path, "bwrap", "sandbox.bwrap_path", crate::config::env::BWRAP_PATH),
                };
                let binary = match explicit {
                    Some(path) if is_executable(path) => path.clone(),
                    Some(path) => {
                        return Err(ConfigError::new(
                            key,
                            Some(var),
                            format!("{} is not an executable file", path.display()),
                        ))
                    }
                    None => resolve_in(name, &search).ok_or_else(|| {
                        ConfigError::new(
                            "sandbox.isolation",
                            Some(crate::config::env::SANDBOX),
                            format!(
                                "{} isolation needs `{name}`, which is not installed (or set {var})",
                                settings.isolation.as_str()
                            ),
                        )
                    })?,
                };
                Some(Layout {
                    binary,
                    system: host_dirs(),
                    uid: nix::unistd::getuid().as_raw(),
                    gid: nix::unistd::getgid().as_raw(),
                    tmpfs_size: settings.tmpfs_size.clone(),
                })
            }
        };
        let mut allow = AllowList { any: false, names: BTreeMap::new(), paths: Vec::new(), shown: Vec::new() };
        let entries = DEFAULT_ALLOWED_COMMANDS
            .iter()
            .map(|s| s.to_string())
            .chain(settings.allowed_commands.iter().cloned())
            .chain(extra_allowed.iter().map(|p| p.to_string_lossy().into_owned()));
        for entry in entries {
            let entry = entry.trim().to_owned();
            if entry == "*" {
                allow.any = true;
            } else if Path::new(&entry).is_absolute() {
                allow.paths.push(entry.clone());
            } else {
                let name = entry.to_ascii_lowercase();
                let resolved = resolve_in(&name, &search);
                match &resolved {
                    Some(path) => debug!(command = %name, path = %path.display(), "sandbox: runtime resolved"),
                    None => warn!(command = %name, "sandbox: allowed command is not installed"),
                }
                allow.names.insert(name, resolved);
            }
            if !allow.shown.contains(&entry) {
                allow.shown.push(entry);
            }
        }

        let mb = |v: u64| (v > 0).then(|| v.saturating_mul(1024 * 1024));
        let limits = ResourceLimits {
            address_space_bytes: mb(settings.memory_limit_mb),
            cpu_seconds: (settings.cpu_time_limit_seconds > 0).then_some(settings.cpu_time_limit_seconds),
            processes: (settings.max_processes > 0).then_some(settings.max_processes),
            open_files: (settings.rlimit_nofile > 0).then_some(settings.rlimit_nofile),
            file_size_bytes: mb(settings.rlimit_fsize_mb),
        };
        Ok(Self { settings: settings.clone(), allow, search, late: Mutex::new(HashMap::new()), limits, root, layout })
    }

    pub fn isolation(&self) -> Isolation {
        self.settings.isolation
    }

    pub fn limits(&self) -> ResourceLimits {
        self.limits
    }

    /// The base of the per-team directories, `<data_dir>/sandbox`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The team's working directory (the child's cwd) and cache directory.
    pub fn team_dirs(&self, team: &str) -> (PathBuf, PathBuf) {
        let base = self.root.join(team_dir_name(team));
        (base.join("work"), base.join("cache"))
    }

    /// One line for the start-up log: the isolation, the limits, and what is not isolated.
    pub fn describe(&self) -> String {
        let s = &self.settings;
        let limit = |v: u64, unit: &str| if v == 0 { "off".to_owned() } else { format!("{v}{unit}") };
        let limits = format!(
            "address space {}, cpu {}, processes per uid {}, open files {}, file size {}",
            limit(s.memory_limit_mb, " MB"),
            limit(s.cpu_time_limit_seconds, " s"),
            limit(s.max_processes, ""),
            limit(s.rlimit_nofile, ""),
            limit(s.rlimit_fsize_mb, " MB"),
        );
        let commands = if self.allow.any { "any command".to_owned() } else { self.allow.shown.join(", ") };
        let (isolated, not_isolated) = match (&self.layout, s.isolation) {
            (Some(layout), Isolation::Nsjail) => (
                format!(
                    "nsjail ({}): own mount, pid, ipc, uts and user namespaces, read-only system dirs",
                    layout.binary.display()
                ),
                "network shared, /etc readable, no cgroup memory or pid limit",
            ),
            (Some(layout), _) => (
                format!(
                    "bubblewrap ({}): own mount, pid, ipc, uts and user namespaces, read-only system dirs",
                    layout.binary.display()
                ),
                "network shared, /etc readable, no cgroup memory or pid limit",
            ),
            (None, _) => (
                "none: own process group, dies with the satellite".to_owned(),
                "same uid as the satellite, same network, whole filesystem visible, same pid namespace",
            ),
        };
        format!(
            "sandbox: isolation {isolated}; rlimits: {limits}; sanitised env and args; commands: {commands}; per-team dirs under {}; NOT isolated: {not_isolated}",
            self.root.display()
        )
    }

    /// Check an instance and build its launch; creates the team's directories (mode 0700) on demand.
    pub fn prepare(
        &self,
        spec: &InstanceSpec,
        inherited_env: &BTreeMap<String, String>,
    ) -> Result<PreparedLaunch, SandboxError> {
        let Upstream::Stdio { command, args, env: instance_env } = &spec.upstream else {
            return Err(SandboxError::NotStdio);
        };
        let command = self.check_command(command)?;
        check_args(args)?;
        let (work, cache) = self.team_dirs(&spec.team_id.0);
        for dir in [&work, &cache] {
            create_private_dir(dir)?;
        }
        match &self.layout {
            None => {
                let (mut env, dropped_env) = child_env(inherited_env, instance_env);
                for var in ["XDG_CACHE_HOME", "npm_config_cache", "UV_CACHE_DIR"] {
                    if !instance_env.contains_key(var) {
                        env.insert(var.into(), cache.to_string_lossy().into_owned());
                    }
                }
                Ok(PreparedLaunch {
                    program: command.clone(),
                    args: args.clone(),
                    command,
                    env,
                    cwd: work,
                    limits: self.limits,
                    dropped_env,
                })
            }
            Some(layout) => {
                // Nothing of the satellite's environment is inherited (SB §9.1): the runtime's env, then the
                // instance's, sanitised.
                let runtime = runtime_of(&command);
                let (env, dropped_env) = child_env(&runtime_env(runtime), instance_env);
                let host = TeamMounts {
                    work: &work,
                    cache: &cache,
                    hostname: format!("mcp-{}", team_dir_name(&spec.team_id.0)),
                };
                let (args, limits) = match self.settings.isolation {
                    Isolation::Nsjail => {
                        (nsjail_args(layout, &self.settings, &host, runtime, &command, args), ResourceLimits::default())
                    }
                    _ => (bwrap_args(layout, &host, runtime, &command, args), self.limits),
                };
                Ok(PreparedLaunch {
                    program: layout.binary.clone(),
                    args,
                    command,
                    env,
                    cwd: work,
                    limits,
                    dropped_env,
                })
            }
        }
    }

    /// The absolute path to execute, or why the command is refused.
    fn check_command(&self, command: &str) -> Result<PathBuf, SandboxError> {
        let trimmed = command.trim();
        if Path::new(trimmed).is_absolute() {
            if self.allow.any || self.allow.paths.iter().any(|p| p == trimmed) {
                return Ok(PathBuf::from(trimmed));
            }
            return Err(self.not_allowed(trimmed));
        }
        if trimmed.contains('/') || trimmed == "." || trimmed == ".." {
            return Err(SandboxError::RelativeCommand { command: trimmed.to_owned() });
        }
        let name = trimmed.to_ascii_lowercase();
        let resolved = match self.allow.names.get(&name) {
            Some(resolved) => resolved.clone(),
            None if self.allow.any && !name.is_empty() => {
                self.late.lock().entry(name.clone()).or_insert_with(|| resolve_in(&name, &self.search)).clone()
            }
            None => return Err(self.not_allowed(trimmed)),
        };
        resolved.ok_or(SandboxError::NotInstalled { command: name })
    }

    fn not_allowed(&self, command: &str) -> SandboxError {
        SandboxError::CommandNotAllowed { command: command.to_owned(), allowed: self.allow.shown.join(", ") }
    }
}

/// Refuse arguments that could reach a shell, climb out of a directory, or pass flags to nsjail (SB §9.3).
pub fn check_args(args: &[String]) -> Result<(), SandboxError> {
    for (i, arg) in args.iter().enumerate() {
        let reason = if arg == "--" {
            Some("is '--'".to_owned())
        } else if let Some(part) = FORBIDDEN_ARG_PARTS.iter().find(|p| arg.contains(*p)) {
            Some(format!("contains '{part}'"))
        } else {
            FORBIDDEN_ARG_PREFIXES.iter().find(|p| arg.starts_with(*p)).map(|p| format!("starts with '{p}'"))
        };
        if let Some(reason) = reason {
            return Err(SandboxError::Argument { index: i + 1, arg: echo_arg(arg), reason });
        }
    }
    Ok(())
}

/// An argument as shown in messages: masked when it looks like a credential, cut when long.
fn echo_arg(arg: &str) -> String {
    if secrets::looks_secret(arg) {
        return secrets::mask(arg);
    }
    if arg.chars().count() > ARG_ECHO_MAX {
        let head: String = arg.chars().take(ARG_ECHO_MAX).collect();
        return format!("{head}...");
    }
    arg.to_owned()
}

/// Where commands are looked for, in order (SB §9.2): `$HOME/.local/bin`, `$HOME/.cargo/bin`, `$HOME/bin`,
/// `/usr/local/bin`, `/usr/bin`, `/bin`, `/opt/homebrew/bin`, then each absolute `PATH` entry.
pub fn search_dirs(env: &Env) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(home) = env.get("HOME").filter(|h| Path::new(h).is_absolute()) {
        for sub in [".local/bin", ".cargo/bin", "bin"] {
            dirs.push(Path::new(home).join(sub));
        }
    }
    for dir in ["/usr/local/bin", "/usr/bin", "/bin", "/opt/homebrew/bin"] {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(path) = env.get("PATH") {
        for dir in path.split(':').filter(|d| Path::new(d).is_absolute()) {
            let dir = PathBuf::from(dir);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// The first `dir/name` that is an executable file.
pub fn resolve_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|dir| dir.join(name)).find(|path| is_executable(path))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A directory name for a team id (an arbitrary string): its `[A-Za-z0-9_-]` characters (at most 32), a dash,
/// and 8 hex characters of its SHA-256, so it is never `..`, never contains `/`, and distinct ids stay distinct.
pub fn team_dir_name(team: &str) -> String {
    let kept: String = team.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').take(32).collect();
    let hash = Sha256::digest(team.as_bytes());
    let mut name = if kept.is_empty() { "team".to_owned() } else { kept };
    name.push('-');
    for byte in &hash[..4] {
        let _ = write!(name, "{byte:02x}");
    }
    name
}

fn create_private_dir(dir: &Path) -> Result<(), SandboxError> {
    let fail = |source| SandboxError::Directory { path: dir.to_owned(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_owned();
    }
    std::env::current_dir().map(|cwd| cwd.join(path)).unwrap_or_else(|_| path.to_owned())
}

fn host_dirs() -> Vec<HostDir> {
    SYSTEM_DIRS
        .iter()
        .filter_map(|dir| {
            let meta = std::fs::symlink_metadata(dir).ok()?;
            if meta.file_type().is_symlink() {
                Some(HostDir::Symlink(dir, std::fs::read_link(dir).ok()?))
            } else if meta.is_dir() {
                Some(HostDir::Dir(dir))
            } else {
                None
            }
        })
        .collect()
}

/// The runtime a command belongs to, for its home directory and environment inside nsjail/bubblewrap.
fn runtime_of(command: &Path) -> &'static str {
    let name = command.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    match name.as_str() {
        "npx" | "node" | "npm" => "node",
        "uvx" | "uv" | "python" | "python3" | "pip" | "pip3" => "python",
        _ => "mcp",
    }
}

/// The environment a runtime starts from inside nsjail/bubblewrap (SB §9.10).
fn runtime_env(runtime: &str) -> BTreeMap<String, String> {
    let home = format!("/home/{runtime}");
    let mut env = BTreeMap::from([("HOME".to_owned(), home.clone()), ("PATH".to_owned(), SANDBOX_PATH.to_owned())]);
    let extra: &[(&str, String)] = match runtime {
        "node" => &[
            ("NPM_CONFIG_CACHE", format!("{home}/.npm")),
            ("NPM_CONFIG_PREFIX", format!("{home}/.npm-global")),
            ("NPM_CONFIG_UPDATE_NOTIFIER", "false".into()),
            ("NO_UPDATE_NOTIFIER", "1".into()),
        ],
        "python" => &[
            ("UV_CACHE_DIR", format!("{home}/.cache/uv")),
            ("UV_TOOL_DIR", format!("{home}/.local/bin")),
            ("PYTHONUNBUFFERED", "1".into()),
            ("UV_NO_UPDATE_NOTIFIER", "1".into()),
        ],
        _ => &[],
    };
    for (k, v) in extra {
        env.insert((*k).to_owned(), v.clone());
    }
    env
}

/// The team's host directories and the sandbox hostname.
struct TeamMounts<'a> {
    work: &'a Path,
    cache: &'a Path,
    hostname: String,
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
fn nsjail_args(
    layout: &Layout,
    s: &SandboxSettings,
    team: &TeamMounts<'_>,
    runtime: &str,
    command: &Path,
    args: &[String],
) -> Vec<String> {
    let limit = |v: u64| if v == 0 { "max".to_owned() } else { v.to_string() };
    let mut argv: Vec<String> = vec![
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
    ];
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
        "--cwd".into(),
        SANDBOX_WORKDIR.into(),
    ]);
    if let Some((source, target)) = command_outside_system(command) {
        argv.extend(["-R".into(), format!("{}:{}", source.display(), target.display())]);
    }
    for dev in ["/dev/null", "/dev/urandom", "/dev/zero"] {
        argv.extend(["-B".into(), dev.into()]);
    }
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

/// bubblewrap's equivalent of the nsjail flags: read-only system dirs, fresh /proc, /dev and /tmp, the team's
/// cache as the runtime's home and its work dir as cwd, every namespace but the network. rlimits are set by the
/// satellite on bwrap itself and inherited by the child.
fn bwrap_args(layout: &Layout, team: &TeamMounts<'_>, runtime: &str, command: &Path, args: &[String]) -> Vec<String> {
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
    argv.extend(["--chdir".into(), SANDBOX_WORKDIR.into(), "--".into(), path_str(command)]);
    argv.extend(args.iter().cloned());
    argv
}

/// Instance variables that are always dropped (case-insensitive), SB §9.3.
pub const ENV_BLOCKLIST: [&str; 33] = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "LD_SHOW_AUXV",
    "LD_DYNAMIC_WEAK",
    "NODE_OPTIONS",
    "NODE_REPL_EXTERNAL_MODULE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_PATH",
    "NODE_REDIRECT_WARNINGS",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONWARNINGS",
    "PYTHONDEBUG",
    "PYTHONINSPECT",
    "PYTHONUSERSITE",
    "PYTHONEXECUTABLE",
    "PYTHONHASHSEED",
    "BASH_ENV",
    "ENV",
    "ZDOTDIR",
    "SHELL",
    "PATH",
    "HOME",
    "TMPDIR",
    "TMP",
    "TEMP",
    "IFS",
    "DYLD_INSERT_LIBRARIES",
];

/// The part of the satellite's own environment every child starts from.
pub fn inherited_env(parent: &Env) -> BTreeMap<String, String> {
    parent
        .iter()
        .filter(|(k, _)| !OWN_PREFIXES.iter().any(|p| k.starts_with(p)) && !SECRET_VARIABLES.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The child's full environment, and the instance variables that were dropped.
pub fn child_env(
    inherited: &BTreeMap<String, String>,
    instance: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut env = inherited.clone();
    let mut dropped = Vec::new();
    for (key, value) in instance {
        let upper = key.to_ascii_uppercase();
        let refused = ENV_BLOCKLIST.contains(&upper.as_str())
            || OWN_PREFIXES.iter().any(|p| upper.starts_with(p))
            || key.is_empty()
            || key.contains('=')
            || key.contains('\0')
            || value.contains('\0');
        if refused {
            dropped.push(key.clone());
        } else {
            env.insert(key.clone(), value.clone());
        }
    }
    (env, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{InstallationId, ProcessId, SecretNames, TeamId, UserId};

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn executable(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A policy whose HOME and PATH point into a temporary directory.
    fn policy(dir: &Path, settings: SandboxSettings, extra: &[PathBuf]) -> SandboxPolicy {
        let env: Env = [
            ("HOME".to_owned(), dir.join("home").to_string_lossy().into_owned()),
            ("PATH".to_owned(), dir.join("path").to_string_lossy().into_owned()),
        ]
        .into();
        SandboxPolicy::new(&settings, &env, &dir.join("data"), extra).unwrap()
    }

    fn spec(team: &str, command: &str, args: &[&str], env: &[(&str, &str)]) -> InstanceSpec {
        InstanceSpec {
            process_id: ProcessId("p".into()),
            installation_id: InstallationId("i".into()),
            installation_name: "i".into(),
            team_id: TeamId(team.into()),
            team_slug: team.into(),
            user_id: UserId("u".into()),
            server_name: "s".into(),
            server_slug: "s".into(),
            upstream: Upstream::Stdio {
                command: command.into(),
                args: strings(args),
                env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            },
            enabled: true,
            instance_path: None,
            instance_token_hash: None,
            requires_oauth: false,
            request_logging_enabled: true,
            secrets: SecretNames::default(),
            disabled_tools: Default::default(),
        }
    }

    #[test]
    fn every_forbidden_argument_pattern_is_refused() {
        let bad = [
            ("--", "is '--'"),
            ("a;b", "contains ';'"),
            ("a&b", "contains '&'"),
            ("a|b", "contains '|'"),
            ("`id`", "contains '`'"),
            ("$(id)", "contains '$('"),
            ("${HOME}", "contains '${'"),
            ("../etc/hosts", "contains '../'"),
            ("x/../y", "contains '../'"),
            ("--user=0", "starts with '--user'"),
            ("--group", "starts with '--group'"),
            ("--rlimit_as", "starts with '--rlimit'"),
            ("--mount", "starts with '--mount'"),
            ("--bindmount=/:/x", "starts with '--bindmount'"),
            ("--cgroup_mem_max", "starts with '--cgroup'"),
            ("--disable_no_new_privs", "starts with '--disable'"),
        ];
        for (arg, reason) in bad {
            let err = check_args(&strings(&["ok", arg])).unwrap_err();
            assert_eq!(err.to_string(), format!("SECURITY: Rejected argument 2 ({arg:?}): {reason}"));
        }
        let err = check_args(&strings(&["-y", "pkg", "a;b"])).unwrap_err();
        assert_eq!(err.to_string(), r#"SECURITY: Rejected argument 3 ("a;b"): contains ';'"#);
    }

    #[test]
    fn harmless_arguments_pass() {
        let ok = ["--port=3", "a/b", "https://x?a=1", "-y", "@scope/pkg@1.2.3", "/abs/path", "..", "$HOME", "a-b"];
        check_args(&strings(&ok)).unwrap();
        check_args(&[]).unwrap();
    }

    #[test]
    fn refused_arguments_never_echo_a_credential_or_a_long_value() {
        let err = check_args(&strings(&["--token=abcdef;x"])).unwrap_err().to_string();
        assert!(!err.contains("abcdef"), "{err}");
        assert!(err.contains("--t*****"), "{err}");
        let long = format!("{};", "a".repeat(200));
        let err = check_args(&[long]).unwrap_err().to_string();
        assert!(err.len() < 140, "{err}");
    }

    #[test]
    fn search_order_is_home_dirs_then_system_dirs_then_path() {
        let env: Env =
            [("HOME".to_owned(), "/h".to_owned()), ("PATH".to_owned(), "/p:/usr/bin:rel:/q".to_owned())].into();
        let dirs: Vec<String> = search_dirs(&env).iter().map(|d| d.to_string_lossy().into_owned()).collect();
        assert_eq!(
            dirs,
            [
                "/h/.local/bin",
                "/h/.cargo/bin",
                "/h/bin",
                "/usr/local/bin",
                "/usr/bin",
                "/bin",
                "/opt/homebrew/bin",
                "/p",
                "/q"
            ]
        );
    }

    #[test]
    fn resolution_takes_the_first_executable_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let dirs = vec![home.join(".local/bin"), home.join(".cargo/bin"), home.join("bin"), dir.path().join("path")];
        executable(&dir.path().join("path/sb-tool"));
        assert_eq!(resolve_in("sb-tool", &dirs), Some(dir.path().join("path/sb-tool")));
        executable(&home.join("bin/sb-tool"));
        assert_eq!(resolve_in("sb-tool", &dirs), Some(home.join("bin/sb-tool")));
        // Not executable: skipped.
        std::fs::create_dir_all(home.join(".local/bin")).unwrap();
        std::fs::write(home.join(".local/bin/sb-tool"), "x").unwrap();
        assert_eq!(resolve_in("sb-tool", &dirs), Some(home.join("bin/sb-tool")));
        executable(&home.join(".cargo/bin/sb-tool"));
        assert_eq!(resolve_in("sb-tool", &dirs), Some(home.join(".cargo/bin/sb-tool")));
        assert_eq!(resolve_in("sb-missing", &dirs), None);
    }

    #[test]
    fn default_allow_list_is_case_insensitive_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        for name in DEFAULT_ALLOWED_COMMANDS {
            executable(&dir.path().join("home/.local/bin").join(name));
        }
        let p = policy(dir.path(), SandboxSettings::default(), &[]);
        for name in ["npx", " NPX ", "Node", "uvx", "python", "PYTHON3\t"] {
            let resolved = p.check_command(name).unwrap();
            assert_eq!(resolved, dir.path().join("home/.local/bin").join(name.trim().to_ascii_lowercase()));
        }
        let err = p.check_command("bash").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"SECURITY: Rejected command "bash": not in the allow-list (npx, node, uvx, python, python3)"#
        );
        assert!(matches!(p.check_command("/usr/bin/node"), Err(SandboxError::CommandNotAllowed { .. })));
        assert!(matches!(p.check_command("./node"), Err(SandboxError::RelativeCommand { .. })));
        assert!(matches!(p.check_command("bin/node"), Err(SandboxError::RelativeCommand { .. })));
        assert!(matches!(p.check_command("npm"), Err(SandboxError::CommandNotAllowed { .. })));
    }

    #[test]
    fn an_allowed_but_missing_runtime_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let settings = SandboxSettings { allowed_commands: strings(&["sb-not-installed"]), ..Default::default() };
        let p = policy(dir.path(), settings, &[]);
        let err = p.check_command("sb-not-installed").unwrap_err();
        assert!(matches!(err, SandboxError::NotInstalled { .. }), "{err}");
        assert!(!err.to_string().starts_with("SECURITY"), "{err}");
    }

    #[test]
    fn a_file_widens_with_names_absolute_paths_and_star() {
        let dir = tempfile::tempdir().unwrap();
        executable(&dir.path().join("path/deno"));
        let settings =
            SandboxSettings { allowed_commands: strings(&["Deno", "/opt/mcp/server"]), ..Default::default() };
        let p = policy(dir.path(), settings, &[PathBuf::from("/opt/satellite")]);
        assert_eq!(p.check_command("deno").unwrap(), dir.path().join("path/deno"));
        assert_eq!(p.check_command("/opt/mcp/server").unwrap(), PathBuf::from("/opt/mcp/server"));
        assert_eq!(p.check_command("/opt/satellite").unwrap(), PathBuf::from("/opt/satellite"));
        // Exactly: a sibling or a path that merely normalises to it is refused.
        assert!(matches!(p.check_command("/opt/mcp/other"), Err(SandboxError::CommandNotAllowed { .. })));
        assert!(matches!(p.check_command("/opt/mcp/../mcp/server"), Err(SandboxError::CommandNotAllowed { .. })));
        let err = p.check_command("bash").unwrap_err().to_string();
        assert!(err.ends_with("(npx, node, uvx, python, python3, Deno, /opt/mcp/server, /opt/satellite)"), "{err}");

        executable(&dir.path().join("path/sb-anything"));
        let any = policy(dir.path(), SandboxSettings { allowed_commands: strings(&["*"]), ..Default::default() }, &[]);
        assert_eq!(any.check_command("sb-anything").unwrap(), dir.path().join("path/sb-anything"));
        assert_eq!(any.check_command("/any/where").unwrap(), PathBuf::from("/any/where"));
        assert!(matches!(any.check_command("./sb-anything"), Err(SandboxError::RelativeCommand { .. })));
        assert!(matches!(any.check_command(".."), Err(SandboxError::RelativeCommand { .. })));
    }

    #[test]
    fn team_directory_names_are_path_safe_and_distinct() {
        for team in ["../x", "a/b", "..", ".", "", "/", "x\0y", "ünïcode", &"t".repeat(300)] {
            let name = team_dir_name(team);
            assert!(!name.contains('/') && !name.starts_with('.') && name.len() <= 41, "{team:?} -> {name:?}");
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{name}");
        }
        assert!(team_dir_name("../x").starts_with("x-"));
        assert!(team_dir_name("a/b").starts_with("ab-"));
        assert_ne!(team_dir_name("a/b"), team_dir_name("ab"));
        assert_eq!(team_dir_name("acme"), team_dir_name("acme"));
    }

    #[test]
    fn prepare_without_isolation_sets_dirs_env_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        executable(&dir.path().join("home/.local/bin/node"));
        let settings = SandboxSettings { rlimit_nofile: 99, memory_limit_mb: 0, ..Default::default() };
        let p = policy(dir.path(), settings, &[]);
        let inherited = BTreeMap::from([("PATH".to_owned(), "/bin".to_owned()), ("LANG".to_owned(), "C".to_owned())]);
        let s = spec("../evil", "node", &["server.js"], &[("LD_PRELOAD", "/x.so"), ("UV_CACHE_DIR", "/mine")]);
        let launch = p.prepare(&s, &inherited).unwrap();
        let (work, cache) = p.team_dirs("../evil");
        assert!(work.starts_with(dir.path().join("data/sandbox")) && work.ends_with("work"));
        assert_eq!(launch.cwd, work);
        assert_eq!(launch.program, dir.path().join("home/.local/bin/node"));
        assert_eq!(launch.args, ["server.js"]);
        for d in [&work, &cache] {
            assert_eq!(std::fs::metadata(d).unwrap().permissions().mode() & 0o777, 0o700);
        }
        assert_eq!(launch.env["XDG_CACHE_HOME"], cache.to_string_lossy());
        assert_eq!(launch.env["npm_config_cache"], cache.to_string_lossy());
        assert_eq!(launch.env["UV_CACHE_DIR"], "/mine", "the instance's own setting wins");
        assert_eq!(launch.env["LANG"], "C");
        assert!(!launch.env.contains_key("LD_PRELOAD"));
        assert_eq!(launch.dropped_env, ["LD_PRELOAD"]);
        assert_eq!(launch.limits.open_files, Some(99));
        assert_eq!(launch.limits.address_space_bytes, None, "0 disables");
        assert_eq!(launch.limits.file_size_bytes, Some(50 * 1024 * 1024));
        assert!(p.describe().contains("isolation none"), "{}", p.describe());
        assert!(p.describe().contains("NOT isolated: same uid"), "{}", p.describe());

        let refused = p.prepare(&spec("t", "bash", &[], &[]), &inherited).unwrap_err();
        assert!(refused.to_string().starts_with("SECURITY: Rejected command \"bash\""));
        let refused = p.prepare(&spec("t", "node", &["x;rm -rf /"], &[]), &inherited).unwrap_err();
        assert_eq!(refused.to_string(), r#"SECURITY: Rejected argument 1 ("x;rm -rf /"): contains ';'"#);
    }

    fn layout() -> Layout {
        Layout {
            binary: PathBuf::from("/usr/bin/wrapper"),
            system: vec![
                HostDir::Dir("/usr"),
                HostDir::Symlink("/bin", PathBuf::from("usr/bin")),
                HostDir::Dir("/etc"),
            ],
            uid: 1000,
            gid: 1001,
            tmpfs_size: "100M".into(),
        }
    }

    /// True when `needle` occurs in `argv` as consecutive elements.
    fn has(argv: &[String], needle: &[&str]) -> bool {
        argv.windows(needle.len()).any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
    }

    #[test]
    fn nsjail_argv_follows_the_spec() {
        let team =
            TeamMounts { work: Path::new("/d/t/work"), cache: Path::new("/d/t/cache"), hostname: "mcp-t".into() };
        let settings = SandboxSettings { memory_limit_mb: 0, ..Default::default() };
        let argv =
            nsjail_args(&layout(), &settings, &team, "node", Path::new("/usr/bin/node"), &strings(&["s.js", "-v"]));
        for needle in [
            &["-Mo", "--proc_rw", "--user", "1000", "--group", "1001"][..],
            &["--rlimit_as", "max", "--rlimit_cpu", "60", "--rlimit_nproc", "1000"],
            &["--rlimit_nofile", "1024", "--rlimit_fsize", "50", "--time_limit", "0"],
            &["-R", "/usr"],
            &["-s", "usr/bin:/bin"],
            &["-R", "/etc"],
            &["-m", "none:/tmp:tmpfs:size=100M"],
            &["-B", "/d/t/cache:/home/node"],
            &["-B", "/d/t/work:/workspace", "--cwd", "/workspace"],
            &["-B", "/dev/null", "-B", "/dev/urandom", "-B", "/dev/zero"],
            &["-s", "/proc/self/fd:/dev/fd"],
            &["--disable_clone_newnet", "--disable_clone_newcgroup", "--disable_no_new_privs"],
            &["--hostname", "mcp-t", "--keep_env"],
        ] {
            assert!(has(&argv, needle), "{needle:?} missing from {argv:?}");
        }
        assert_eq!(argv[argv.len() - 4..], strings(&["--", "/usr/bin/node", "s.js", "-v"]));
        // A command outside the system dirs is mounted read-only where it is.
        let argv = nsjail_args(&layout(), &settings, &team, "mcp", Path::new("/nonexistent/tool"), &[]);
        assert!(has(&argv, &["-R", "/nonexistent/tool:/nonexistent/tool"]), "{argv:?}");
    }

    #[test]
    fn bubblewrap_argv_binds_system_dirs_read_only_and_unshares_all_but_network() {
        let team =
            TeamMounts { work: Path::new("/d/t/work"), cache: Path::new("/d/t/cache"), hostname: "mcp-t".into() };
        let argv = bwrap_args(&layout(), &team, "python", Path::new("/usr/bin/python3"), &strings(&["-m", "srv"]));
        for needle in [
            &["--die-with-parent", "--new-session", "--unshare-all", "--share-net"][..],
            &["--hostname", "mcp-t"],
            &["--ro-bind", "/usr", "/usr"],
            &["--symlink", "usr/bin", "/bin"],
            &["--ro-bind", "/etc", "/etc"],
            &["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"],
            &["--bind", "/d/t/cache", "/home/python"],
            &["--bind", "/d/t/work", "/workspace"],
            &["--chdir", "/workspace"],
        ] {
            assert!(has(&argv, needle), "{needle:?} missing from {argv:?}");
        }
        assert_eq!(argv[argv.len() - 4..], strings(&["--", "/usr/bin/python3", "-m", "srv"]));
        let argv = bwrap_args(&layout(), &team, "mcp", Path::new("/nonexistent/tool"), &[]);
        assert!(has(&argv, &["--ro-bind", "/nonexistent/tool", "/nonexistent/tool"]), "{argv:?}");
    }

    #[test]
    fn runtime_environment_inside_a_namespace_inherits_nothing() {
        let env = runtime_env("node");
        assert_eq!(env["HOME"], "/home/node");
        assert_eq!(env["PATH"], SANDBOX_PATH);
        assert_eq!(env["NPM_CONFIG_CACHE"], "/home/node/.npm");
        assert_eq!(runtime_env("python")["UV_CACHE_DIR"], "/home/python/.cache/uv");
        assert_eq!(runtime_of(Path::new("/usr/bin/npx")), "node");
        assert_eq!(runtime_of(Path::new("/x/uvx")), "python");
        assert_eq!(runtime_of(Path::new("/x/satellite")), "mcp");
    }

    #[test]
    fn a_missing_isolation_binary_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();
        let env: Env =
            [("HOME".to_owned(), "/nonexistent".to_owned()), ("PATH".to_owned(), "/nonexistent".to_owned())].into();
        let settings = SandboxSettings {
            isolation: Isolation::Nsjail,
            nsjail_path: Some(PathBuf::from("/nonexistent/nsjail")),
            ..Default::default()
        };
        let err = SandboxPolicy::new(&settings, &env, dir.path(), &[]).unwrap_err();
        assert_eq!(err.key, "sandbox.nsjail_path");
        assert!(!err.to_string().contains('\n'));
        executable(&dir.path().join("bin/bwrap"));
        let settings = SandboxSettings {
            isolation: Isolation::Bubblewrap,
            bwrap_path: Some(dir.path().join("bin/bwrap")),
            ..Default::default()
        };
        let p = SandboxPolicy::new(&settings, &env, dir.path(), &[]).unwrap();
        assert!(p.describe().starts_with("sandbox: isolation bubblewrap"), "{}", p.describe());
    }

    #[test]
    fn satellite_secrets_never_reach_children() {
        let parent: Env =
            [("PATH", "/bin"), ("SATELLITE_DEMO_TOKEN", "s"), ("DEPLOYSTACK_REGISTRATION_TOKEN", "r"), ("LANG", "C")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        let inherited = inherited_env(&parent);
        assert_eq!(inherited.keys().collect::<Vec<_>>(), ["LANG", "PATH"]);
    }

    #[test]
    fn hijacking_variables_are_dropped_case_insensitively() {
        let inherited = BTreeMap::from([("PATH".to_owned(), "/bin".to_owned())]);
        let instance = BTreeMap::from([
            ("ld_preload".to_owned(), "/evil.so".to_owned()),
            ("NODE_OPTIONS".to_owned(), "--require x".to_owned()),
            ("PATH".to_owned(), "/evil".to_owned()),
            ("API_KEY".to_owned(), "k".to_owned()),
            ("SATELLITE_X".to_owned(), "y".to_owned()),
        ]);
        let (env, dropped) = child_env(&inherited, &instance);
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["API_KEY"], "k");
        assert!(!env.contains_key("ld_preload"));
        assert_eq!(dropped, ["NODE_OPTIONS", "PATH", "SATELLITE_X", "ld_preload"]);
    }
}
