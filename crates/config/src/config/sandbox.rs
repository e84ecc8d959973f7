//! `[sandbox]` of the standalone file and the `NSJAIL_*` / `SATELLITE_SANDBOX` variables: how stdio children
//! are confined. The policy built from these settings lives in `instances::sandbox`.

use std::path::{Path, PathBuf};

use super::env::{self, Env};
use super::file::RawSandbox;
use super::ConfigError;

/// RLIMIT_AS default. SB §20 says 2048 MB, but V8 reserves about 10 GB of address space for every WebAssembly
/// memory, and Node's own `fetch` (undici) instantiates one: under 2048 MB every `fetch` fails. 16 GB lets Node
/// MCP servers make HTTP calls (docs/decisions.md).
pub const DEFAULT_MEMORY_LIMIT_MB: u64 = 16384;
/// No lifetime CPU budget unless the operator sets one: `RLIMIT_CPU` caps a process's total CPU time, so a busy
/// long-running server would be killed (and counted as crashed) once it had used that much since it started.
pub const DEFAULT_CPU_TIME_LIMIT_SECONDS: u64 = 0;
/// The CPU *rate* limit per stdio server, percent of one core: one busy server cannot take the machine.
pub const DEFAULT_CPU_LIMIT_PERCENT: u64 = 100;
pub const DEFAULT_MAX_PROCESSES: u64 = 1000;
pub const DEFAULT_RLIMIT_NOFILE: u64 = 1024;
pub const DEFAULT_RLIMIT_FSIZE_MB: u64 = 50;
pub const DEFAULT_TMPFS_SIZE: &str = "100M";

/// How stdio children are isolated beyond rlimits, environment and argument checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Isolation {
    /// No namespaces: the child runs as the satellite's user and sees its filesystem and network.
    #[default]
    None,
    /// nsjail with the flags of SB §9.10.
    Nsjail,
    /// bubblewrap with an equivalent set of namespaces and binds.
    Bubblewrap,
}

impl Isolation {
    pub fn as_str(&self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Nsjail => "nsjail",
            Isolation::Bubblewrap => "bubblewrap",
        }
    }
}

/// The validated sandbox settings. A limit of `0` disables that limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSettings {
    pub isolation: Isolation,
    /// Explicit nsjail binary (absolute); `None` searches for `nsjail`.
    pub nsjail_path: Option<PathBuf>,
    /// Explicit bubblewrap binary (absolute); `None` searches for `bwrap`.
    pub bwrap_path: Option<PathBuf>,
    /// What a standalone file adds to the built-in allow-list: bare names, absolute paths, or `*`.
    pub allowed_commands: Vec<String>,
    pub memory_limit_mb: u64,
    pub cpu_time_limit_seconds: u64,
    /// Percent of one core per stdio server through its own cgroup, where one can be made; 0 disables.
    pub cpu_limit_percent: u64,
    pub max_processes: u64,
    pub rlimit_nofile: u64,
    pub rlimit_fsize_mb: u64,
    /// Size of `/tmp` inside nsjail (`100M`).
    pub tmpfs_size: String,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        Self {
            isolation: Isolation::None,
            nsjail_path: None,
            bwrap_path: None,
            allowed_commands: Vec::new(),
            memory_limit_mb: DEFAULT_MEMORY_LIMIT_MB,
            cpu_time_limit_seconds: DEFAULT_CPU_TIME_LIMIT_SECONDS,
            cpu_limit_percent: DEFAULT_CPU_LIMIT_PERCENT,
            max_processes: DEFAULT_MAX_PROCESSES,
            rlimit_nofile: DEFAULT_RLIMIT_NOFILE,
            rlimit_fsize_mb: DEFAULT_RLIMIT_FSIZE_MB,
            tmpfs_size: DEFAULT_TMPFS_SIZE.into(),
        }
    }
}

/// Environment wins over the file, the file over the defaults. Read in a fixed order, so of several bad settings
/// the same one is reported first.
pub fn settings(env: &Env, raw: &RawSandbox) -> Result<SandboxSettings, ConfigError> {
    let isolation = isolation(env, raw)?;
    let tmpfs_size = tmpfs_size(env, raw)?;
    check_allowed_commands(&raw.allowed_commands)?;
    let nsjail_path = binary(env, "sandbox.nsjail_path", env::NSJAIL_PATH, &raw.nsjail_path)?;
    let bwrap_path = binary(env, "sandbox.bwrap_path", env::BWRAP_PATH, &raw.bwrap_path)?;
    let (key, var) = ("sandbox.memory_limit_mb", env::NSJAIL_MEMORY_LIMIT_MB);
    let memory_limit_mb = limit(env, key, var, raw.memory_limit_mb, DEFAULT_MEMORY_LIMIT_MB)?;
    let (key, var) = ("sandbox.cpu_time_limit_seconds", env::NSJAIL_CPU_TIME_LIMIT_SECONDS);
    let cpu_time_limit_seconds = limit(env, key, var, raw.cpu_time_limit_seconds, DEFAULT_CPU_TIME_LIMIT_SECONDS)?;
    let (key, var) = ("sandbox.cpu_limit_percent", env::CPU_LIMIT_PERCENT);
    let cpu_limit_percent = limit(env, key, var, raw.cpu_limit_percent, DEFAULT_CPU_LIMIT_PERCENT)?;
    let (key, var) = ("sandbox.max_processes", env::NSJAIL_MAX_PROCESSES);
    let max_processes = limit(env, key, var, raw.max_processes, DEFAULT_MAX_PROCESSES)?;
    let (key, var) = ("sandbox.rlimit_nofile", env::NSJAIL_RLIMIT_NOFILE);
    let rlimit_nofile = limit(env, key, var, raw.rlimit_nofile, DEFAULT_RLIMIT_NOFILE)?;
    let (key, var) = ("sandbox.rlimit_fsize_mb", env::NSJAIL_RLIMIT_FSIZE);
    let rlimit_fsize_mb = limit(env, key, var, raw.rlimit_fsize_mb, DEFAULT_RLIMIT_FSIZE_MB)?;
    Ok(SandboxSettings {
        isolation,
        nsjail_path,
        bwrap_path,
        allowed_commands: raw.allowed_commands.iter().map(|c| c.trim().to_owned()).collect(),
        memory_limit_mb,
        cpu_time_limit_seconds,
        cpu_limit_percent,
        max_processes,
        rlimit_nofile,
        rlimit_fsize_mb,
        tmpfs_size,
    })
}

fn isolation(env: &Env, raw: &RawSandbox) -> Result<Isolation, ConfigError> {
    match env::get(env, env::SANDBOX).map(str::to_owned).or_else(|| raw.isolation.clone()).as_deref() {
        None | Some("none") => Ok(Isolation::None),
        Some("nsjail") => Ok(Isolation::Nsjail),
        Some("bubblewrap") => Ok(Isolation::Bubblewrap),
        Some(other) => Err(ConfigError::new(
            "sandbox.isolation",
            Some(env::SANDBOX),
            format!("{other:?} is not one of none, nsjail, bubblewrap"),
        )),
    }
}

/// A size such as `100M`: digits with an optional K, M or G.
fn tmpfs_size(env: &Env, raw: &RawSandbox) -> Result<String, ConfigError> {
    let tmpfs_size = env::get(env, env::NSJAIL_TMPFS_SIZE)
        .map(str::to_owned)
        .or_else(|| raw.tmpfs_size.clone())
        .unwrap_or_else(|| DEFAULT_TMPFS_SIZE.into());
    let valid_size = tmpfs_size.strip_suffix(['K', 'M', 'G', 'k', 'm', 'g']).unwrap_or(&tmpfs_size);
    if valid_size.is_empty() || !valid_size.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::new(
            "sandbox.tmpfs_size",
            Some(env::NSJAIL_TMPFS_SIZE),
            format!("{tmpfs_size:?} is not a size such as 100M"),
        ));
    }
    Ok(tmpfs_size)
}

/// Each entry is `*`, an absolute path or a bare command name (file only: it widens what children may run).
fn check_allowed_commands(entries: &[String]) -> Result<(), ConfigError> {
    for (index, entry) in entries.iter().enumerate() {
        let entry = entry.trim();
        let key = format!("sandbox.allowed_commands[{index}]");
        if entry == "*" || Path::new(entry).is_absolute() {
            continue;
        }
        if entry.contains('/') || entry == "." || entry == ".." {
            return Err(ConfigError::new(
                key,
                None,
                format!("{entry:?} is a relative path; use a bare command name or an absolute path"),
            ));
        }
        if entry.is_empty() || !entry.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b)) {
            return Err(ConfigError::new(key, None, format!("{entry:?} is not a command name")));
        }
    }
    Ok(())
}

/// An explicit binary, which must be an absolute path; `None`: the sandbox searches for it.
fn binary(env: &Env, key: &str, var: &'static str, file: &Option<String>) -> Result<Option<PathBuf>, ConfigError> {
    match env::get(env, var).map(str::to_owned).or_else(|| file.clone()) {
        None => Ok(None),
        Some(path) if Path::new(&path).is_absolute() => Ok(Some(PathBuf::from(path))),
        Some(path) => Err(ConfigError::new(key, Some(var), format!("{path:?} is not an absolute path"))),
    }
}

/// A limit in whole units from the environment, else the file, else the default; 0 disables it.
fn limit(env: &Env, key: &str, var: &'static str, file: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    match env::get(env, var) {
        Some(v) => v.parse::<u64>().map_err(|_| {
            ConfigError::new(key, Some(var), format!("{v:?} is not a whole number (0 disables the limit)"))
        }),
        None => Ok(file.unwrap_or(default)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)], file: &str) -> Result<SandboxSettings, ConfigError> {
        let env: Env = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let raw = super::super::parse_file(file)?;
        settings(&env, &raw.sandbox)
    }

    #[test]
    fn defaults_file_and_env_precedence() {
        let s = parse(&[], "").unwrap();
        assert_eq!(s, SandboxSettings::default());
        let s = parse(&[], "[sandbox]\nrlimit_nofile = 77\nisolation = \"bubblewrap\"\n").unwrap();
        assert_eq!((s.rlimit_nofile, s.isolation), (77, Isolation::Bubblewrap));
        let s =
            parse(&[("NSJAIL_RLIMIT_NOFILE", "88"), ("SATELLITE_SANDBOX", "none")], "[sandbox]\nrlimit_nofile = 77\n")
                .unwrap();
        assert_eq!((s.rlimit_nofile, s.isolation), (88, Isolation::None));
        let s = parse(&[("NSJAIL_MEMORY_LIMIT_MB", "0")], "").unwrap();
        assert_eq!(s.memory_limit_mb, 0, "0 disables, it is not an error");
    }

    #[test]
    fn errors_are_one_line_naming_key_and_variable() {
        let err = parse(&[("SATELLITE_SANDBOX", "docker")], "").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config SATELLITE_SANDBOX/sandbox.isolation: \"docker\" is not one of none, nsjail, bubblewrap"
        );
        let err = parse(&[("NSJAIL_MAX_PROCESSES", "lots")], "").unwrap_err();
        assert!(err.to_string().starts_with("invalid config NSJAIL_MAX_PROCESSES/sandbox.max_processes:"), "{err}");
        let err = parse(&[("NSJAIL_PATH", "bin/nsjail")], "").unwrap_err();
        assert_eq!(err.key, "sandbox.nsjail_path");
        let err = parse(&[], "[sandbox]\nallowed_commands = [\"node\", \"./bin/server\"]\n").unwrap_err();
        assert_eq!(err.key, "sandbox.allowed_commands[1]");
        assert!(err.message.contains("relative path"), "{err}");
        let err = parse(&[], "[sandbox]\nallowed_commands = [\"a b\"]\n").unwrap_err();
        assert!(err.message.contains("not a command name"), "{err}");
        let err = parse(&[], "[sandbox]\nallowd_commands = []\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `allowd_commands`"), "{err}");
        let err = parse(&[("NSJAIL_TMPFS_SIZE", "lots")], "").unwrap_err();
        assert_eq!(err.env, Some(env::NSJAIL_TMPFS_SIZE));
    }

    #[test]
    fn widening_accepts_names_absolute_paths_and_star() {
        let s = parse(&[], "[sandbox]\nallowed_commands = [\" Deno \", \"/opt/bin/server\", \"*\"]\n").unwrap();
        assert_eq!(s.allowed_commands, ["Deno", "/opt/bin/server", "*"]);
    }
}
