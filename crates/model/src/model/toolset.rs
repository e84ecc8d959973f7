//! Toolsets (issue 17): a named subset of a caller's tools, chosen per session, that limits what
//! `discover_mcp_tools` finds and `execute_mcp_tool` runs. A toolset is a list of patterns over tool paths
//! (`server:tool`): `github` (every tool of the server), `github:create_issue` (one tool), or a glob in either
//! part (`github:*_issue`, `*:read_*`). Pure data and matching; where toolsets are kept is `toolsets`.

use std::fmt;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// Names a client may not give a toolset: `all` selects no toolset (overriding a default), `default` is the API
/// path of the caller's default.
pub const RESERVED_NAMES: [&str; 2] = ["all", "default"];

/// Longest toolset name, pattern and description accepted.
pub const MAX_NAME_LEN: usize = 64;
pub const MAX_PATTERN_LEN: usize = 256;
pub const MAX_DESCRIPTION_LEN: usize = 1024;
/// Patterns one toolset may hold.
pub const MAX_PATTERNS: usize = 256;

/// Who a toolset belongs to: one member (their own), or the whole team (defined by a team admin).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolsetScope {
    User,
    Team,
}

impl ToolsetScope {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolsetScope::User => "user",
            ToolsetScope::Team => "team",
        }
    }
}

/// Where a toolset was defined: the standalone config file (read-only through the API) or the API (stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolsetSource {
    Config,
    Api,
}

impl ToolsetSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolsetSource::Config => "config",
            ToolsetSource::Api => "api",
        }
    }
}

/// Why a toolset definition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolsetDefError {
    #[error("a toolset name is 1-{MAX_NAME_LEN} characters of letters, digits, '-', '_' and '.', starting with a letter or digit; got {0:?}")]
    BadName(String),
    #[error("{0:?} is reserved (\"all\" selects every tool, \"default\" is the default's API path)")]
    ReservedName(String),
    #[error("a toolset needs at least one pattern (an empty toolset would show no tools)")]
    NoPatterns,
    #[error("at most {MAX_PATTERNS} patterns per toolset")]
    TooManyPatterns,
    #[error("pattern {pattern:?} is not valid: {reason}")]
    BadPattern { pattern: String, reason: String },
    #[error("a description is at most {MAX_DESCRIPTION_LEN} characters")]
    LongDescription,
}

/// A toolset of the standalone config file, with whom it is for.
#[derive(Debug, Clone)]
pub struct Configured {
    /// `None`: every team.
    pub team: Option<crate::model::TeamId>,
    /// `Some`: this member's own; `None`: the team's.
    pub user: Option<crate::model::UserId>,
    pub toolset: std::sync::Arc<Toolset>,
}

/// What the config file says about toolsets: the toolsets and each user's default.
#[derive(Debug, Clone, Default)]
pub struct ConfiguredToolsets {
    pub toolsets: Vec<Configured>,
    pub defaults: std::collections::BTreeMap<crate::model::UserId, String>,
}

impl ConfiguredToolsets {
    /// The toolset `name` as `user` of `team` sees it: their own first, then the team's.
    pub fn find(
        &self,
        team: &crate::model::TeamId,
        user: &crate::model::UserId,
        name: &str,
    ) -> Option<&std::sync::Arc<Toolset>> {
        let for_team = |c: &&Configured| c.team.as_ref().is_none_or(|t| t == team) && c.toolset.name == name;
        let own = self.toolsets.iter().filter(for_team).find(|c| c.user.as_ref() == Some(user));
        own.or_else(|| self.toolsets.iter().filter(for_team).find(|c| c.user.is_none())).map(|c| &c.toolset)
    }

    /// Whether the file has a toolset `name` that a member of `team` sees: the team's, and with `Some(user)`
    /// that user's own too (another member's own does not count). A toolset stored through the API may not
    /// take such a name.
    pub fn names_in_team(&self, team: &crate::model::TeamId, user: Option<&crate::model::UserId>, name: &str) -> bool {
        self.toolsets.iter().any(|c| {
            c.team.as_ref().is_none_or(|t| t == team)
                && c.toolset.name == name
                && (c.user.is_none() || c.user.as_ref() == user)
        })
    }
}

/// A validated toolset.
#[derive(Clone)]
pub struct Toolset {
    pub name: String,
    pub description: Option<String>,
    /// The patterns as written, in order.
    pub patterns: Vec<String>,
    pub scope: ToolsetScope,
    pub source: ToolsetSource,
    matcher: GlobSet,
}

impl fmt::Debug for Toolset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toolset")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("source", &self.source)
            .field("patterns", &self.patterns)
            .finish()
    }
}

impl Toolset {
    /// Validate a definition: the name, at least one pattern, each pattern a glob over `server:tool`.
    pub fn new(
        name: &str,
        description: Option<String>,
        patterns: Vec<String>,
        scope: ToolsetScope,
        source: ToolsetSource,
    ) -> Result<Toolset, ToolsetDefError> {
        check_name(name)?;
        let description = description.map(|d| d.trim().to_owned()).filter(|d| !d.is_empty());
        if description.as_ref().is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_LEN) {
            return Err(ToolsetDefError::LongDescription);
        }
        let patterns: Vec<String> = patterns.into_iter().map(|p| p.trim().to_owned()).collect();
        if patterns.is_empty() {
            return Err(ToolsetDefError::NoPatterns);
        }
        if patterns.len() > MAX_PATTERNS {
            return Err(ToolsetDefError::TooManyPatterns);
        }
        let mut builder = GlobSetBuilder::new();
        for pattern in &patterns {
            builder.add(compile(pattern)?);
        }
        let matcher = builder.build().map_err(|err| ToolsetDefError::BadPattern {
            pattern: patterns.join(", "),
            reason: err.kind().to_string(),
        })?;
        Ok(Toolset { name: name.to_owned(), description, patterns, scope, source, matcher })
    }

    /// Whether the tool `name` of the server `slug` is in this toolset.
    pub fn matches(&self, slug: &str, tool: &str) -> bool {
        self.matcher.is_match(crate::model::tool_path(slug, tool))
    }
}

/// A toolset name is a short identifier a user types into a URL.
pub fn check_name(name: &str) -> Result<(), ToolsetDefError> {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !well_formed {
        return Err(ToolsetDefError::BadName(name.to_owned()));
    }
    if RESERVED_NAMES.iter().any(|r| r.eq_ignore_ascii_case(name)) {
        return Err(ToolsetDefError::ReservedName(name.to_owned()));
    }
    Ok(())
}

/// One pattern as a glob over `server:tool`; a pattern without `:` names a whole server (`server:*`).
pub(crate) fn compile(pattern: &str) -> Result<globset::Glob, ToolsetDefError> {
    let bad = |reason: &str| ToolsetDefError::BadPattern { pattern: pattern.to_owned(), reason: reason.to_owned() };
    if pattern.is_empty() {
        return Err(bad("it is empty"));
    }
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(bad("it is longer than 256 characters"));
    }
    if pattern.chars().any(char::is_control) {
        return Err(bad("it contains a control character"));
    }
    let full = match pattern.split_once(':') {
        Some(("", _)) => return Err(bad("the server part before ':' is empty")),
        Some((_, "")) => return Err(bad("the tool part after ':' is empty")),
        Some(_) => pattern.to_owned(),
        None => format!("{pattern}:*"),
    };
    GlobBuilder::new(&full)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map_err(|err| bad(&err.kind().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(patterns: &[&str]) -> Result<Toolset, ToolsetDefError> {
        Toolset::new(
            "t",
            None,
            patterns.iter().map(|p| p.to_string()).collect(),
            ToolsetScope::User,
            ToolsetSource::Api,
        )
    }

    #[test]
    fn patterns_name_servers_tools_and_globs() -> Result<(), ToolsetDefError> {
        let toolset = set(&["github", "demo:echo", "*:read_*", "fs:list_?"])?;
        assert!(toolset.matches("github", "create_issue"), "a bare server name covers all its tools");
        assert!(toolset.matches("demo", "echo"));
        assert!(!toolset.matches("demo", "echo_twice"), "a tool name is matched whole");
        assert!(!toolset.matches("demo", "add"));
        assert!(toolset.matches("files", "read_file"), "a glob in the server part");
        assert!(toolset.matches("fs", "list_a"));
        assert!(!toolset.matches("fs", "list_ab"));
        assert!(!toolset.matches("githubx", "create_issue"), "a server name is matched whole");
        Ok(())
    }

    #[test]
    fn definitions_that_would_show_nothing_or_cannot_be_typed_are_refused() {
        assert_eq!(set(&[]).err(), Some(ToolsetDefError::NoPatterns));
        assert!(matches!(set(&[""]).err(), Some(ToolsetDefError::BadPattern { .. })));
        assert!(matches!(set(&[":x"]).err(), Some(ToolsetDefError::BadPattern { .. })));
        assert!(matches!(set(&["x:"]).err(), Some(ToolsetDefError::BadPattern { .. })));
        assert!(matches!(set(&["a:[b"]).err(), Some(ToolsetDefError::BadPattern { .. })));
        for name in ["", "-a", "a b", "a/b", &"x".repeat(65)] {
            assert!(matches!(check_name(name), Err(ToolsetDefError::BadName(_))), "{name:?}");
        }
        assert!(matches!(check_name("ALL"), Err(ToolsetDefError::ReservedName(_))));
        assert_eq!(check_name("code-review.v2_x"), Ok(()));
    }
}
