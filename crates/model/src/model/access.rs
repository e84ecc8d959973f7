//! Access rules over tool paths (issue 76 item 4): which of an instance's tools its user may see and run. One
//! evaluation, [`ToolAccess::allows`], decides both, through `Instance::tool_disabled`, which every listing (discover,
//! the catalog, the instance router's `tools/list`, toolset views) and every call consults.

use std::sync::Arc;

use globset::{GlobSet, GlobSetBuilder};

use super::toolset::{compile, ToolsetDefError};

/// The rules that apply to one instance's user, compiled: a tool path (`server:tool`) is allowed when each rule
/// with an allow list matches it and no rule's deny list does (deny wins; several allow lists narrow together).
/// Patterns are the toolsets' globs over `server:tool` (`github:create_*`; a bare `github` is the whole server).
#[derive(Debug, Clone, Default)]
pub struct ToolAccess {
    /// The patterns as written, for comparing two specs and for showing them.
    allow: Vec<Vec<String>>,
    deny: Vec<String>,
    compiled: Option<Arc<Compiled>>,
}

#[derive(Debug)]
struct Compiled {
    allow: Vec<GlobSet>,
    deny: GlobSet,
}

impl PartialEq for ToolAccess {
    fn eq(&self, other: &Self) -> bool {
        self.allow == other.allow && self.deny == other.deny
    }
}

impl Eq for ToolAccess {}

impl ToolAccess {
    /// Every tool allowed: no rule applies.
    pub fn open() -> ToolAccess {
        ToolAccess::default()
    }

    /// The rules `allow` (one list per rule that has one) and `deny` (every applying rule's, together).
    pub fn new(allow: Vec<Vec<String>>, deny: Vec<String>) -> Result<ToolAccess, ToolsetDefError> {
        if allow.is_empty() && deny.is_empty() {
            return Ok(ToolAccess::open());
        }
        let set = |patterns: &[String]| -> Result<GlobSet, ToolsetDefError> {
            let mut builder = GlobSetBuilder::new();
            for pattern in patterns {
                builder.add(compile(pattern)?);
            }
            builder.build().map_err(|err| ToolsetDefError::BadPattern {
                pattern: patterns.join(", "),
                reason: err.kind().to_string(),
            })
        };
        let compiled =
            Compiled { allow: allow.iter().map(|list| set(list)).collect::<Result<_, _>>()?, deny: set(&deny)? };
        Ok(ToolAccess { allow, deny, compiled: Some(Arc::new(compiled)) })
    }

    /// Whether no rule applies (every tool allowed, nothing to evaluate).
    pub fn is_open(&self) -> bool {
        self.compiled.is_none()
    }

    /// Whether the tool `tool` of the server `server` may be seen and run.
    pub fn allows(&self, server: &str, tool: &str) -> bool {
        let Some(compiled) = &self.compiled else { return true };
        let path = format!("{server}:{tool}");
        !compiled.deny.is_match(&path) && compiled.allow.iter().all(|allowed| allowed.is_match(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(allow: &[&[&str]], deny: &[&str]) -> ToolAccess {
        let owned = |list: &[&str]| list.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        ToolAccess::new(allow.iter().map(|l| owned(l)).collect(), owned(deny)).expect("valid patterns")
    }

    #[test]
    fn deny_wins_and_allow_lists_narrow_together() {
        assert!(access(&[], &[]).allows("github", "delete_repo"), "no rule: open");
        let rules = access(&[&["github:*", "slack"]], &["github:delete_*"]);
        assert!(rules.allows("github", "create_issue"));
        assert!(rules.allows("slack", "post"), "a bare server name is the whole server");
        assert!(!rules.allows("github", "delete_repo"), "deny wins over allow");
        assert!(!rules.allows("notion", "search"), "not in the allow list");
        let narrowed = access(&[&["github:*", "slack:*"], &["github:*"]], &[]);
        assert!(narrowed.allows("github", "x") && !narrowed.allows("slack", "x"), "every allow list must match");
    }

    #[test]
    fn a_bad_pattern_is_refused_and_rules_compare_by_what_was_written() {
        assert!(ToolAccess::new(vec![], vec![":x".into()]).is_err());
        assert!(ToolAccess::new(vec![vec!["a[".into()]], vec![]).is_err());
        assert_eq!(access(&[], &["a:b"]), access(&[], &["a:b"]));
        assert_ne!(access(&[], &["a:b"]), access(&[&["a:b"]], &[]));
        assert!(access(&[], &[]).is_open() && !access(&[], &["a"]).is_open());
    }
}
