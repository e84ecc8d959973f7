//! The standalone file's governance tables, `[[access]]` and `[[limits]]` (docs/governance.md), as read; checked
//! and compiled in `control::access` and `control::limits`.

use schemars::JsonSchema;
use serde::Deserialize;

/// An access rule: the tools the members it names may see and run. A member is named by every selector given
/// (`team`, `role`, `user`; none given: everyone). A tool is allowed when each rule naming the member that has an
/// `allow` list matches it, and no rule naming the member denies it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAccessRule {
    /// The team whose members the rule names (every team when absent).
    pub team: Option<String>,
    /// `member` or `admin`: the role the rule names (every role when absent).
    pub role: Option<String>,
    /// The user the rule names (every user when absent).
    pub user: Option<String>,
    /// When given, only tools matching one of these patterns are allowed by this rule.
    pub allow: Option<Vec<String>>,
    /// Tools matching any of these patterns are denied, whatever an allow list says.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A limit on tool calls: the calls it counts (every selector given must match: `team`, `user`, `installation`,
/// and one of `tools`, patterns over the resolved `server:tool`), as a `rate`, a `quota`, or both.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    /// How refusals, metrics and events name the rule (default `limits[i]`).
    pub name: Option<String>,
    pub team: Option<String>,
    pub user: Option<String>,
    pub installation: Option<String>,
    /// Patterns over `server:tool` (every tool when absent).
    #[serde(default)]
    pub tools: Vec<String>,
    pub rate: Option<RawRate>,
    pub quota: Option<RawQuota>,
    /// Whose counter a call takes from: `user` (each user their own, the default) or `team` (one for the team).
    pub scope: Option<String>,
}

/// `calls` per `per_seconds`, in bursts of at most `burst` (default `calls`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRate {
    pub calls: u32,
    pub per_seconds: u64,
    pub burst: Option<u32>,
}

/// `calls` per calendar `per` (`day` or `month`, UTC).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawQuota {
    pub calls: u64,
    pub per: String,
}
