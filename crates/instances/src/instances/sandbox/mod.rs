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

use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::env::Env;
use crate::config::{Config, ConfigError, Isolation, Mode, SandboxSettings, StandaloneSource};
use crate::mcp::transport::stderr::StderrSettings;
pub use crate::mcp::transport::ResourceLimits;
use crate::mcp::transport::StdioLaunch;
use crate::model::{InstanceSpec, Upstream};
use crate::secrets;

mod allow;
mod argv;
mod env;
mod host;

use allow::AllowList;
use argv::{bwrap_args, nsjail_args, TeamMounts};
pub use env::{child_env, inherited_env, ENV_BLOCKLIST};
use host::{absolute, create_private_dir, host_dirs, isolation_binary, runtime_env, runtime_of};
pub use host::{resolve_in, search_dirs, team_dir_name};

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
            junk: Default::default(),
            junk_lines: None,
            limits: self.limits,
            secrets: Vec::new(),
            asker: None,
        }
    }
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

/// What `prepare` checked and made of an instance, for its launch.
struct Launch<'a> {
    /// The command, resolved.
    command: PathBuf,
    args: &'a [String],
    instance_env: &'a BTreeMap<String, String>,
    /// The team's working and cache directories, made.
    work: PathBuf,
    cache: PathBuf,
    /// The GitHub deployment the command runs from.
    app: Option<&'a Path>,
}

/// The sandbox of every stdio child; built once at start.
#[derive(Debug)]
pub struct SandboxPolicy {
    settings: SandboxSettings,
    allow: AllowList,
    search: Vec<PathBuf>,
    /// Names resolved after start (only with `*`).
    late: Mutex<HashMap<String, PathBuf>>,
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
            Isolation::Nsjail | Isolation::Bubblewrap => Some(Layout {
                binary: isolation_binary(settings, &search)?,
                system: host_dirs(),
                uid: nix::unistd::getuid().as_raw(),
                gid: nix::unistd::getgid().as_raw(),
                tmpfs_size: settings.tmpfs_size.clone(),
            }),
        };
        let allow = AllowList::new(settings, extra_allowed, &search);
        let limits = resource_limits(settings);
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
        let commands = if self.allow.any {
            "any command".to_owned()
        } else {
            let shown = self.allow.shown.iter().map(|entry| match self.allow.names.get(&entry.to_ascii_lowercase()) {
                Some(None) => format!("{entry} (not installed)"),
                _ => entry.clone(),
            });
            shown.collect::<Vec<_>>().join(", ")
        };
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

    /// What `prepare` would refuse of a stdio instance, without creating anything (`satellite check-config`).
    /// Other transports pass.
    pub fn check(&self, spec: &InstanceSpec) -> Result<(), SandboxError> {
        let Upstream::Stdio { command, args, .. } = &spec.upstream else { return Ok(()) };
        self.check_command(command)?;
        check_args(args)
    }

    /// Check an instance and build its launch; creates the team's directories (mode 0700) on demand.
    /// `app`: the GitHub deployment the command runs from (SB §9.9): commands inside it are allowed, it is the
    /// child's cwd, and with isolation it is mounted read-only at the same path.
    pub fn prepare(
        &self,
        spec: &InstanceSpec,
        inherited_env: &BTreeMap<String, String>,
        app: Option<&Path>,
    ) -> Result<PreparedLaunch, SandboxError> {
        let Upstream::Stdio { command, args, env: instance_env } = &spec.upstream else {
            return Err(SandboxError::NotStdio);
        };
        let command = match app {
            Some(app) if Path::new(command).is_absolute() && Path::new(command).starts_with(app) => {
                PathBuf::from(command)
            }
            _ => self.check_command(command)?,
        };
        check_args(args)?;
        let (work, cache) = self.team_dirs(&spec.team_id.0);
        for dir in [&work, &cache] {
            create_private_dir(dir)?;
        }
        let launch = Launch { command, args, instance_env, work, cache, app };
        Ok(match &self.layout {
            None => self.direct(launch, inherited_env),
            Some(layout) => self.isolated(layout, launch, &spec.team_id.0),
        })
    }

    /// A launch without isolation: the child runs the command itself, in the team's working directory (or the
    /// deployment's), from the satellite's environment, with its caches in the team's cache directory.
    fn direct(&self, launch: Launch<'_>, inherited_env: &BTreeMap<String, String>) -> PreparedLaunch {
        let Launch { command, args, instance_env, work, cache, app } = launch;
        let (mut env, dropped_env) = child_env(inherited_env, instance_env);
        for var in ["XDG_CACHE_HOME", "npm_config_cache", "UV_CACHE_DIR"] {
            if !instance_env.contains_key(var) {
                env.insert(var.into(), cache.to_string_lossy().into_owned());
            }
        }
        PreparedLaunch {
            program: command.clone(),
            args: args.to_vec(),
            command,
            env,
            cwd: app.map(Path::to_path_buf).unwrap_or(work),
            limits: self.limits,
            dropped_env,
        }
    }

    /// A launch inside nsjail or bubblewrap (`layout`), with `team`'s directories mounted.
    fn isolated(&self, layout: &Layout, launch: Launch<'_>, team: &str) -> PreparedLaunch {
        let Launch { command, args, instance_env, work, cache, app } = launch;
        // Nothing of the satellite's environment is inherited (SB §9.1): the runtime's env, then the
        // instance's, sanitised.
        let runtime = runtime_of(&command);
        let (env, dropped_env) = child_env(&runtime_env(runtime), instance_env);
        let host = TeamMounts { work: &work, cache: &cache, app, hostname: format!("mcp-{}", team_dir_name(team)) };
        let (args, limits) = match self.settings.isolation {
            Isolation::Nsjail => {
                (nsjail_args(layout, &self.settings, &host, runtime, &command, args), ResourceLimits::default())
            }
            _ => (bwrap_args(layout, &host, runtime, &command, args), self.limits),
        };
        PreparedLaunch { program: layout.binary.clone(), args, command, env, cwd: work, limits, dropped_env }
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
        let allowed = match self.allow.names.get(&name) {
            Some(Some(path)) => return Ok(path.clone()),
            Some(None) => true,
            None => self.allow.any && !name.is_empty(),
        };
        if !allowed {
            return Err(self.not_allowed(trimmed));
        }
        if let Some(path) = self.late.lock().get(&name) {
            return Ok(path.clone());
        }
        // Not found when last looked for, or never looked for: look now, so a runtime installed after the start (or
        // missing for a moment during an upgrade) is found. Only a command found is remembered.
        let path =
            resolve_in(&name, &self.search).ok_or_else(|| SandboxError::NotInstalled { command: name.clone() })?;
        self.late.lock().insert(name, path.clone());
        Ok(path)
    }

    fn not_allowed(&self, command: &str) -> SandboxError {
        SandboxError::CommandNotAllowed { command: command.to_owned(), allowed: self.allow.shown.join(", ") }
    }
}

/// The rlimits of the `NSJAIL_*` settings (0: none).
fn resource_limits(settings: &SandboxSettings) -> ResourceLimits {
    let mb = |v: u64| (v > 0).then(|| v.saturating_mul(1024 * 1024));
    ResourceLimits {
        address_space_bytes: mb(settings.memory_limit_mb),
        cpu_seconds: (settings.cpu_time_limit_seconds > 0).then_some(settings.cpu_time_limit_seconds),
        processes: (settings.max_processes > 0).then_some(settings.max_processes),
        open_files: (settings.rlimit_nofile > 0).then_some(settings.rlimit_nofile),
        file_size_bytes: mb(settings.rlimit_fsize_mb),
        cpu_percent: (settings.cpu_limit_percent > 0)
            .then(|| u32::try_from(settings.cpu_limit_percent).unwrap_or(u32::MAX)),
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

#[cfg(test)]
mod tests;
