//! The standalone file's `[[access]]` rules (issue 76 item 4): checked once, then the rules naming each member
//! given to that member's instances (`McpServerEntry::access`, compiled into `model::ToolAccess`).

use std::collections::BTreeMap;

use super::directory::User;
use super::snapshot::EntryAccess;
use crate::config::file::RawAccessRule;
use crate::config::ConfigError;
use crate::model::{TeamId, ToolAccess, UserId};

/// Refuse a rule that names no known team or user, an unknown role, or a pattern that is not valid.
pub(super) fn check(
    rules: &[RawAccessRule],
    teams: &BTreeMap<TeamId, impl Sized>,
    users: &BTreeMap<UserId, User>,
) -> Result<(), ConfigError> {
    for (i, rule) in rules.iter().enumerate() {
        let key = format!("access[{i}]");
        let refuse = |field: &str, reason: String| Err(ConfigError::new(format!("{key}.{field}"), None, reason));
        if let Some(team) = rule.team.as_deref().filter(|t| !teams.contains_key(&TeamId(t.to_string()))) {
            return refuse("team", format!("no team {team:?} in the file"));
        }
        if let Some(user) = rule.user.as_deref().filter(|u| !users.contains_key(&UserId(u.to_string()))) {
            return refuse("user", format!("no user {user:?} in the file"));
        }
        if let Some(role) = rule.role.as_deref().filter(|r| !matches!(*r, "member" | "admin")) {
            return refuse("role", format!("{role:?} is not a role: member or admin"));
        }
        if rule.allow.is_none() && rule.deny.is_empty() {
            return refuse("deny", "the rule allows and denies nothing: give allow, deny or both".into());
        }
        let allow = rule.allow.iter().cloned().collect();
        if let Err(err) = ToolAccess::new(allow, rule.deny.clone()) {
            return refuse("allow", err.to_string());
        }
    }
    Ok(())
}

/// The rules naming `user` (of `team`, an admin or not), together; `None` when none does.
pub(super) fn for_member(rules: &[RawAccessRule], team: &TeamId, user: &UserId, admin: bool) -> Option<EntryAccess> {
    let role = if admin { "admin" } else { "member" };
    let naming = rules.iter().filter(|rule| {
        rule.team.as_deref().is_none_or(|t| t == team.as_str())
            && rule.user.as_deref().is_none_or(|u| u == user.as_str())
            && rule.role.as_deref().is_none_or(|r| r == role)
    });
    let mut access = EntryAccess::default();
    for rule in naming {
        access.allow.extend(rule.allow.iter().cloned());
        access.deny.extend(rule.deny.iter().cloned());
    }
    (!access.allow.is_empty() || !access.deny.is_empty()).then_some(access)
}
