//! The standalone file's `[[limits]]` (issue 76 item 1), checked and compiled into `model::LimitRule`s.

use std::collections::BTreeMap;
use std::time::Duration;

use super::directory::User;
use crate::config::file::{RawInstallation, RawLimit};
use crate::config::ConfigError;
use crate::model::{LimitRule, LimitScope, Period, Quota, Rate, TeamId, UserId};

/// Every rule, or the first that names what the file does not have or asks for what cannot be counted.
pub(super) fn rules(
    raw: &[RawLimit],
    teams: &BTreeMap<TeamId, impl Sized>,
    users: &BTreeMap<UserId, User>,
    installations: &[RawInstallation],
) -> Result<Vec<LimitRule>, ConfigError> {
    let mut names = std::collections::BTreeSet::new();
    raw.iter().enumerate().map(|(i, limit)| rule(i, limit, teams, users, installations, &mut names)).collect()
}

fn rule(
    i: usize,
    limit: &RawLimit,
    teams: &BTreeMap<TeamId, impl Sized>,
    users: &BTreeMap<UserId, User>,
    installations: &[RawInstallation],
    names: &mut std::collections::BTreeSet<String>,
) -> Result<LimitRule, ConfigError> {
    let key = format!("limits[{i}]");
    let refuse = |field: &str, reason: String| ConfigError::new(format!("{key}.{field}"), None, reason);
    let name = limit.name.clone().unwrap_or_else(|| key.clone());
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(refuse("name", "a rule's name is 1-64 printable characters".into()));
    }
    if !names.insert(name.clone()) {
        return Err(refuse("name", format!("{name:?} names two rules")));
    }
    if let Some(team) = limit.team.as_deref().filter(|t| !teams.contains_key(&TeamId(t.to_string()))) {
        return Err(refuse("team", format!("no team {team:?} in the file")));
    }
    if let Some(user) = limit.user.as_deref().filter(|u| !users.contains_key(&UserId(u.to_string()))) {
        return Err(refuse("user", format!("no user {user:?} in the file")));
    }
    if let Some(id) = limit.installation.as_deref().filter(|id| !installations.iter().any(|i| i.id == *id)) {
        return Err(refuse("installation", format!("no installation {id:?} in the file")));
    }
    let rate = rate_of(limit).map_err(|reason| refuse("rate", reason))?;
    let quota = quota_of(limit).map_err(|reason| refuse("quota.per", reason))?;
    if rate.is_none() && quota.is_none() {
        return Err(refuse("rate", "the rule limits nothing: give a rate, a quota or both".into()));
    }
    let scope = match limit.scope.as_deref() {
        None | Some("user") => LimitScope::User,
        Some("team") => LimitScope::Team,
        Some(other) => return Err(refuse("scope", format!("{other:?} is not a scope: user or team"))),
    };
    let selectors = (limit.team.clone(), limit.user.clone(), limit.installation.clone());
    LimitRule::new(name, selectors, &limit.tools, rate, quota, scope).map_err(|err| refuse("tools", err.to_string()))
}

/// The rule's rate, if it has one; every number at least 1.
fn rate_of(limit: &RawLimit) -> Result<Option<Rate>, String> {
    let Some(rate) = &limit.rate else { return Ok(None) };
    if rate.calls == 0 || rate.per_seconds == 0 || rate.burst == Some(0) {
        return Err("calls, per_seconds and burst are at least 1".into());
    }
    let per = Duration::from_secs(rate.per_seconds);
    Ok(Some(Rate { calls: rate.calls, per, burst: rate.burst.unwrap_or(rate.calls) }))
}

/// The rule's quota, if it has one, per `day` or `month`.
fn quota_of(limit: &RawLimit) -> Result<Option<Quota>, String> {
    let Some(quota) = &limit.quota else { return Ok(None) };
    let per = match quota.per.as_str() {
        "day" => Period::Day,
        "month" => Period::Month,
        other => return Err(format!("{other:?} is not a period: day or month")),
    };
    Ok(Some(Quota { calls: quota.calls, per }))
}
