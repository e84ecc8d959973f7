//! What a stdio child may inherit: the satellite's environment minus its own
//! settings and secrets, overlaid with the instance's environment minus the
//! variables that could hijack the child (SB §9.3).

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

#[cfg(test)]
mod tests {
    use super::*;

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
