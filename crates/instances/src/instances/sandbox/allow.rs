//! What may be started (SB §9.2): the built-in commands, those the settings add (names, absolute paths or `*`),
//! and the satellite's own executable where it runs its demo server; bare names resolved once at start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracing::debug;

use super::{resolve_in, DEFAULT_ALLOWED_COMMANDS};
use crate::config::SandboxSettings;

/// What may be started.
#[derive(Debug)]
pub(super) struct AllowList {
    pub(super) any: bool,
    /// Lowercase bare names and where they resolved at start (`None`: not installed).
    pub(super) names: BTreeMap<String, Option<PathBuf>>,
    /// Absolute paths allowed exactly as written.
    pub(super) paths: Vec<String>,
    /// The list as configured, for messages.
    pub(super) shown: Vec<String>,
}

impl AllowList {
    /// The built-in commands, the settings' and `extra_allowed`, bare names resolved in `search`.
    pub(super) fn new(settings: &SandboxSettings, extra_allowed: &[PathBuf], search: &[PathBuf]) -> Self {
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
                let resolved = resolve_in(&name, search);
                match &resolved {
                    Some(path) => debug!(command = %name, path = %path.display(), "sandbox: runtime resolved"),
                    // Said once in the start-up summary (`describe`), and as a spawn error when a server needs it.
                    None => debug!(command = %name, "sandbox: allowed command is not installed"),
                }
                allow.names.insert(name, resolved);
            }
            if !allow.shown.contains(&entry) {
                allow.shown.push(entry);
            }
        }
        allow
    }
}
