//! Rate limits and quotas on tool calls (issue 76 item 1), as rules: whose calls a rule counts (team, user,
//! installation, tool patterns over the resolved `server:tool`), how (a rate with a burst, a quota per day or
//! month) and whose counter a call takes from (each user's own, or one for the whole team).

use std::time::Duration;

use globset::{GlobSet, GlobSetBuilder};

use super::toolset::{compile, ToolsetDefError};
use super::InstanceSpec;

/// So many calls per window, with room for a burst of `burst` at once (a token bucket that refills evenly).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub calls: u32,
    pub per: Duration,
    pub burst: u32,
}

/// The calendar period a quota counts in (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Day,
    Month,
}

/// So many calls per calendar day or month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub calls: u64,
    pub per: Period,
}

/// Whose counter a call takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitScope {
    /// Each user has their own (the default).
    #[default]
    User,
    /// The whole team shares one.
    Team,
}

/// One rule, its patterns compiled.
#[derive(Debug, Clone)]
pub struct LimitRule {
    /// How refusals, metrics and events name it: the file's `name`, else `limits[i]`.
    pub name: String,
    pub team: Option<String>,
    pub user: Option<String>,
    pub installation: Option<String>,
    tools: Option<GlobSet>,
    pub rate: Option<Rate>,
    pub quota: Option<Quota>,
    pub scope: LimitScope,
}

impl LimitRule {
    /// A rule; `tools` are the toolsets' patterns over `server:tool` (none: every tool).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        (team, user, installation): (Option<String>, Option<String>, Option<String>),
        tools: &[String],
        rate: Option<Rate>,
        quota: Option<Quota>,
        scope: LimitScope,
    ) -> Result<LimitRule, ToolsetDefError> {
        let tools = match tools {
            [] => None,
            patterns => {
                let mut set = GlobSetBuilder::new();
                for pattern in patterns {
                    set.add(compile(pattern)?);
                }
                Some(set.build().map_err(|err| ToolsetDefError::BadPattern {
                    pattern: patterns.join(", "),
                    reason: err.kind().to_string(),
                })?)
            }
        };
        Ok(LimitRule { name, team, user, installation, tools, rate, quota, scope })
    }

    /// Whether a call of `tool` on the instance `spec` counts under this rule.
    pub fn counts(&self, spec: &InstanceSpec, tool: &str) -> bool {
        self.team.as_deref().is_none_or(|t| t == spec.team_id.as_str())
            && self.user.as_deref().is_none_or(|u| u == spec.user_id.as_str())
            && self.installation.as_deref().is_none_or(|i| i == spec.installation_id.as_str())
            && self.tools.as_ref().is_none_or(|tools| tools.is_match(format!("{}:{tool}", spec.server_slug)))
    }

    /// The counter a call on `spec` takes from: the team's, or the team's and user's.
    pub fn counter(&self, spec: &InstanceSpec) -> String {
        match self.scope {
            LimitScope::Team => spec.team_id.as_str().to_owned(),
            LimitScope::User => format!("{}/{}", spec.team_id.as_str(), spec.user_id.as_str()),
        }
    }
}
