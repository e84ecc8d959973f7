//! The environment of a child: the satellite's own minus its settings and secrets, overlaid with the
//! instance's minus the variables that could hijack the child (SB §9.3).

use std::collections::BTreeMap;

use crate::config::env::{Env, OWN_PREFIXES, SECRET_VARIABLES};

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
