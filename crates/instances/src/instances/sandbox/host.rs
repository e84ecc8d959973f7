//! The host side of the sandbox: where commands are found, the per-team directories, the system directories
//! mounted into a namespace, and the runtime's cache environment.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{HostDir, SandboxError, SANDBOX_PATH, SYSTEM_DIRS};
use crate::config::env::Env;
use crate::config::{ConfigError, Isolation, SandboxSettings};

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

pub(super) fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The nsjail or bwrap binary the settings' isolation needs: the configured path, which must be executable, or the
/// first found in `search`. Not found is a config error.
pub(super) fn isolation_binary(settings: &SandboxSettings, search: &[PathBuf]) -> Result<PathBuf, ConfigError> {
    let (explicit, name, key, var) = match settings.isolation {
        Isolation::Nsjail => (&settings.nsjail_path, "nsjail", "sandbox.nsjail_path", crate::config::env::NSJAIL_PATH),
        _ => (&settings.bwrap_path, "bwrap", "sandbox.bwrap_path", crate::config::env::BWRAP_PATH),
    };
    match explicit {
        Some(path) if is_executable(path) => Ok(path.clone()),
        Some(path) => Err(ConfigError::new(key, Some(var), format!("{} is not an executable file", path.display()))),
        None => resolve_in(name, search).ok_or_else(|| {
            ConfigError::new(
                "sandbox.isolation",
                Some(crate::config::env::SANDBOX),
                format!(
                    "{} isolation needs `{name}`, which is not installed (or set {var})",
                    settings.isolation.as_str()
                ),
            )
        }),
    }
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

pub(super) fn create_private_dir(dir: &Path) -> Result<(), SandboxError> {
    let fail = |source| SandboxError::Directory { path: dir.to_owned(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)
}

pub(super) fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_owned();
    }
    std::env::current_dir().map(|cwd| cwd.join(path)).unwrap_or_else(|_| path.to_owned())
}

pub(super) fn host_dirs() -> Vec<HostDir> {
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
pub(super) fn runtime_of(command: &Path) -> &'static str {
    let name = command.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    match name.as_str() {
        "npx" | "node" | "npm" => "node",
        "uvx" | "uv" | "python" | "python3" | "pip" | "pip3" => "python",
        _ => "mcp",
    }
}

/// The environment a runtime starts from inside nsjail/bubblewrap (SB §9.10).
pub(super) fn runtime_env(runtime: &str) -> BTreeMap<String, String> {
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
