//! The standalone control plane: a TOML file (or the embedded default)
//! expanded into the same `mcp_servers` snapshot the backend sends, one entry
//! per installation and team member, with the three-tier merge of BP §7.4.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::directory::{check_id, check_sha256, jwt_settings, teams, users, CredentialOwners};
pub use super::directory::{Directory, JwtAlgorithm, JwtSettings, Team, TokenGrant, User, DEFAULT_SCOPES};
use super::expand::Member;
pub use super::expand::{merge_args, merge_maps};
use super::snapshot::{DesiredState, McpServerEntry};
use crate::config::file::{Origin, RawFile, RawInstallation, RawServer, RawTeam, RawToolset, RawUser, RawUserInstance};
use crate::config::{not_http_url, parse_http_url, ConfigError, EmbeddedDefault};
use crate::model::toolset::{Configured, ConfiguredToolsets};
use crate::model::{TeamId, Toolset, ToolsetScope, ToolsetSource, UserId};

/// A validated standalone file (empty in managed mode, where the backend is the source).
#[derive(Debug, Clone, Default)]
pub struct StandaloneConfig {
    pub directory: Directory,
    /// `mcp_servers` entries keyed by process id, as the backend would send them.
    pub entries: BTreeMap<String, McpServerEntry>,
    /// `[[toolsets]]` and the users' `default_toolset`.
    pub toolsets: ConfiguredToolsets,
    /// `[[limits]]`: rate limits and quotas on tool calls.
    pub limits: Vec<crate::model::LimitRule>,
}

impl StandaloneConfig {
    pub fn desired_state(&self) -> DesiredState {
        DesiredState::from_entries(&self.entries)
    }
}

/// Validate the team, user and installation parts of a file.
pub fn from_file(raw: &RawFile) -> Result<StandaloneConfig, ConfigError> {
    let teams = teams(&raw.teams)?;
    let mut owners = CredentialOwners::default();
    let users = users(&raw.users, &teams, &mut owners)?;
    let jwt = match &raw.auth.jwt {
        Some(jwt) => Some(jwt_settings(jwt)?),
        None => None,
    };
    let servers = servers(&raw.servers)?;
    let admin_tokens = admin_tokens(&raw.auth.admin_token_sha256, &mut owners)?;
    super::access::check(&raw.access, &teams, &users)?;
    let limits = super::limits::rules(&raw.limits, &teams, &users, &raw.installations)?;
    let entries = entries(raw, &teams, &users, &servers, &mut owners)?;
    let authorization_server = raw.auth.authorization_server.as_deref().map(authorization_server).transpose()?;
    let toolsets = toolsets(raw, &teams, &users)?;
    Ok(StandaloneConfig {
        directory: Directory { teams, users, jwt, authorization_server, admin_tokens, token_index: Default::default() }
            .index_tokens(),
        entries,
        toolsets,
        limits,
    })
}

/// The authorization server advertised in the protected-resource metadata: an http(s) URL, without a trailing `/`.
fn authorization_server(url: &str) -> Result<String, ConfigError> {
    let parsed = parse_http_url(url).ok_or_else(|| not_http_url("auth.authorization_server", None, url))?;
    Ok(parsed.to_string().trim_end_matches('/').to_owned())
}

/// The catalogue by slug, each server checked.
fn servers(raw: &[RawServer]) -> Result<BTreeMap<&str, &RawServer>, ConfigError> {
    let mut servers = BTreeMap::new();
    for (i, server) in raw.iter().enumerate() {
        let key = format!("servers[{i}]");
        check_server(server, &key)?;
        if servers.insert(server.slug.as_str(), server).is_some() {
            return Err(ConfigError::new(
                format!("{key}.slug"),
                None,
                format!("duplicate server slug {:?}", server.slug),
            ));
        }
    }
    Ok(servers)
}

/// The satellite-wide admin tokens' hashes (lowercase), each claimed in `owners`: an admin token that is also a
/// user's or an instance's would open every team's analytics to whoever holds the other.
fn admin_tokens(raw: &[String], owners: &mut CredentialOwners) -> Result<Vec<String>, ConfigError> {
    let mut admin_tokens = Vec::new();
    for (i, hash) in raw.iter().enumerate() {
        let key = format!("auth.admin_token_sha256[{i}]");
        check_sha256(hash, &key)?;
        owners.claim(hash, || format!("the admin token {key}")).map_err(|first| {
            ConfigError::new(&key, None, format!("has the same hash as {first}: a token names one owner"))
        })?;
        admin_tokens.push(hash.to_ascii_lowercase());
    }
    Ok(admin_tokens)
}

/// The `mcp_servers` entries of every installation, one per installation and team member, keyed by process id.
fn entries(
    raw: &RawFile,
    teams: &BTreeMap<TeamId, Team>,
    users: &BTreeMap<UserId, User>,
    servers: &BTreeMap<&str, &RawServer>,
    owners: &mut CredentialOwners,
) -> Result<BTreeMap<String, McpServerEntry>, ConfigError> {
    let mut entries = BTreeMap::new();
    let mut paths = BTreeSet::new();
    let mut installation_ids = BTreeSet::new();
    for (i, installation) in raw.installations.iter().enumerate() {
        let key = format!("installations[{i}]");
        // Part of process ids, paths and events: an id the snapshot would skip must not stop the file's other entries.
        check_id(&installation.id, &format!("{key}.id"))?;
        if !installation_ids.insert(installation.id.as_str()) {
            return Err(ConfigError::new(
                format!("{key}.id"),
                None,
                format!("duplicate installation id {:?}", installation.id),
            ));
        }
        let (team_id, team, server) = installation_refs(installation, &key, teams, users, servers)?;
        for (user_id, user) in users.iter().filter(|(_, u)| u.teams.contains(&team_id)) {
            let user_tier = installation.users.get(user_id.as_str());
            let member = Member { server, installation, team_id: &team_id, team, user_id, tier: user_tier, key: &key };
            let (process_id, mut entry) = member.expand()?;
            entry.access = super::access::for_member(&raw.access, &team_id, user_id, user.admin);
            if let Some(path) = &entry.instance_path {
                if !paths.insert(path.clone()) {
                    return Err(ConfigError::new(
                        format!("{key}.users.{user_id}.instance_path"),
                        None,
                        format!("instance path {path:?} is used twice"),
                    ));
                }
            }
            // Ids joined by '-' can meet ("u-1" + "i1", "u" + "1-i1"): one would silently replace the other.
            if entries.contains_key(&process_id.0) {
                return Err(ConfigError::new(
                    format!("{key}.id"),
                    None,
                    format!("the instance of {user_id} is named {:?}, like another instance: rename one", process_id.0),
                ));
            }
            claim_instance_token(owners, &raw.origin, installation, user_id, user_tier, &key)?;
            entries.insert(process_id.0, entry);
        }
    }
    Ok(entries)
}

/// What an installation names, looked up: its team and server; every user it has a tier for must be a member.
fn installation_refs<'a>(
    installation: &RawInstallation,
    key: &str,
    teams: &'a BTreeMap<TeamId, Team>,
    users: &BTreeMap<UserId, User>,
    servers: &BTreeMap<&str, &'a RawServer>,
) -> Result<(TeamId, &'a Team, &'a RawServer), ConfigError> {
    let team_id = TeamId(installation.team.clone());
    let Some(team) = teams.get(&team_id) else {
        return Err(ConfigError::new(format!("{key}.team"), None, format!("unknown team {:?}", installation.team)));
    };
    let Some(server) = servers.get(installation.server.as_str()) else {
        return Err(ConfigError::new(
            format!("{key}.server"),
            None,
            format!("unknown server {:?}", installation.server),
        ));
    };
    for user_id in installation.users.keys() {
        let member = users.get(&UserId(user_id.clone())).is_some_and(|u| u.teams.contains(&team_id));
        if !member {
            return Err(ConfigError::new(
                format!("{key}.users.{user_id}"),
                None,
                format!("user {user_id:?} is not a member of team {:?}", installation.team),
            ));
        }
    }
    Ok((team_id, team, server))
}

/// An instance token opens one instance of one member: its hash is claimed in `owners`, and a hash a user token,
/// an admin token or another instance's token has already is refused, naming the file, the line and both owners.
/// Before, the one `ds_inst_` token opened every instance that had it, each with its own member's secrets.
fn claim_instance_token(
    owners: &mut CredentialOwners,
    origin: &Origin,
    installation: &RawInstallation,
    user_id: &UserId,
    tier: Option<&RawUserInstance>,
    key: &str,
) -> Result<(), ConfigError> {
    let Some(token) = tier.and_then(|u| u.instance_token_sha256.as_ref()) else { return Ok(()) };
    let token_key = format!("{key}.users.{user_id}.instance_token_sha256");
    let place = origin.place(token.span().start);
    let this = format!("the instance token of user {:?} in installation {:?}", user_id.0, installation.id);
    let at = |place: &Option<String>| place.as_ref().map(|p| format!(" ({p})")).unwrap_or_default();
    owners.claim(token.get_ref(), || format!("{this}{}", at(&place))).map_err(|first| {
        let message = format!(
            "{this} has the same hash as {first}: a token opens one instance of one user (make one for each: \
             `satellite token new --instance`)"
        );
        match &place {
            Some(place) => ConfigError::new(token_key.as_str(), None, format!("{place}: {message}")),
            None => ConfigError::new(token_key.as_str(), None, message),
        }
    })
}

/// `[[toolsets]]` validated (names, patterns, whom each is for) and every `default_toolset` resolved in each of
/// its user's teams.
fn toolsets(
    raw: &RawFile,
    teams: &BTreeMap<TeamId, Team>,
    users: &BTreeMap<UserId, User>,
) -> Result<ConfiguredToolsets, ConfigError> {
    let mut out = ConfiguredToolsets::default();
    let mut seen = BTreeSet::new();
    for (i, toolset) in raw.toolsets.iter().enumerate() {
        let key = format!("toolsets[{i}]");
        let (team, user) = toolset_owner(&key, toolset, teams, users)?;
        if !seen.insert((team.clone(), user.clone(), toolset.name.clone())) {
            return Err(ConfigError::new(
                format!("{key}.name"),
                None,
                format!("toolset {:?} is defined twice for the same team and user", toolset.name),
            ));
        }
        let scope = if user.is_some() { ToolsetScope::User } else { ToolsetScope::Team };
        let built = Toolset::new(
            &toolset.name,
            toolset.description.clone(),
            toolset.tools.clone(),
            scope,
            ToolsetSource::Config,
        )
        .map_err(|err| ConfigError::new(key, None, err.to_string()))?;
        out.toolsets.push(Configured { team, user, toolset: std::sync::Arc::new(built) });
    }
    resolve_default_toolsets(&raw.users, &mut out)?;
    Ok(out)
}

/// Whom a toolset is for: a known team (none: every team) and a user (none: the whole team) who is in it.
fn toolset_owner(
    key: &str,
    toolset: &RawToolset,
    teams: &BTreeMap<TeamId, Team>,
    users: &BTreeMap<UserId, User>,
) -> Result<(Option<TeamId>, Option<UserId>), ConfigError> {
    let team = toolset.team.as_ref().map(|t| TeamId(t.clone()));
    if let Some(team) = &team {
        if !teams.contains_key(team) {
            return Err(ConfigError::new(format!("{key}.team"), None, format!("unknown team {team:?}")));
        }
    }
    let user = toolset.user.as_ref().map(|u| UserId(u.clone()));
    if let Some(user) = &user {
        let member = users.get(user).is_some_and(|u| team.as_ref().is_none_or(|t| u.teams.contains(t)));
        if !member {
            return Err(ConfigError::new(
                format!("{key}.user"),
                None,
                format!("unknown user {user:?}, or not a member of the toolset's team"),
            ));
        }
    }
    Ok((team, user))
}

/// Each user's `default_toolset`, which must name a toolset in every one of the user's teams.
fn resolve_default_toolsets(users: &[RawUser], out: &mut ConfiguredToolsets) -> Result<(), ConfigError> {
    for (i, user) in users.iter().enumerate() {
        let Some(name) = &user.default_toolset else { continue };
        let id = UserId(user.id.clone());
        for team in &user.teams {
            if out.find(&TeamId(team.clone()), &id, name).is_none() {
                return Err(ConfigError::new(
                    format!("users[{i}].default_toolset"),
                    None,
                    format!("no toolset {name:?} in [[toolsets]] for this user in team {team:?}"),
                ));
            }
        }
        out.defaults.insert(id, name.clone());
    }
    Ok(())
}

/// The built-in configuration: one team, the user `demo`, and the bundled demo server over stdio.
pub fn embedded(demo: &EmbeddedDefault, satellite_exe: PathBuf) -> Result<StandaloneConfig, ConfigError> {
    let raw = RawFile {
        teams: vec![RawTeam { id: "demo-team".into(), slug: Some("demo".into()), name: Some("Demo team".into()) }],
        users: vec![RawUser {
            id: "demo".into(),
            teams: vec!["demo-team".into()],
            token_sha256: vec![demo.demo_token_hash()],
            tokens: vec![],
            // The one user of the demo is its admin, so `/admin` opens with the demo token.
            role: Some("admin".into()),
            default_toolset: None,
        }],
        servers: vec![demo_server(satellite_exe)],
        installations: vec![demo_installation(demo)],
        ..RawFile::default()
    };
    // Built from valid parts; an error here (e.g. an executable path the file format cannot hold) is reported.
    from_file(&raw)
}

/// The demo server: this executable's `demo-server` subcommand over stdio.
fn demo_server(satellite_exe: PathBuf) -> RawServer {
    RawServer {
        slug: "demo".into(),
        name: Some("Demo".into()),
        transport: "stdio".into(),
        command: Some(satellite_exe.to_string_lossy().into_owned()),
        args: vec!["demo-server".into()],
        env: BTreeMap::new(),
        url: None,
        headers: BTreeMap::new(),
        timeout_ms: None,
        requires_oauth: false,
        secret_env: vec![],
        secret_headers: vec![],
        secret_query: vec![],
        tools: vec![],
        rediscover_seconds: None,
    }
}

/// The demo team's installation of the demo server; the demo user's instance opens with the demo instance token.
fn demo_installation(demo: &EmbeddedDefault) -> RawInstallation {
    let mut users = BTreeMap::new();
    users.insert(
        "demo".to_owned(),
        RawUserInstance {
            instance_path: Some("demo".into()),
            instance_token_sha256: Some(toml::Spanned::new(0..0, demo.instance_token_hash())),
            enabled: true,
            ..Default::default()
        },
    );
    RawInstallation {
        id: "demo".into(),
        team: "demo-team".into(),
        server: "demo".into(),
        name: Some("Demo".into()),
        enabled: true,
        request_logging: true,
        disabled_tools: vec![],
        args: vec![],
        env: BTreeMap::new(),
        headers: BTreeMap::new(),
        query: BTreeMap::new(),
        users,
    }
}

fn check_server(server: &RawServer, key: &str) -> Result<(), ConfigError> {
    check_id(&server.slug, &format!("{key}.slug"))?;
    let mut declared = std::collections::HashSet::new();
    for (i, tool) in server.tools.iter().enumerate() {
        let name =
            crate::model::ToolDef::from_listing(tool).map(|t| t.name().to_owned()).filter(|n| !n.trim().is_empty());
        let Some(name) = name else {
            return Err(ConfigError::new(format!("{key}.tools[{i}]"), None, "must be a table with a `name`"));
        };
        if !declared.insert(name.clone()) {
            return Err(ConfigError::new(format!("{key}.tools[{i}]"), None, format!("duplicate tool {name:?}")));
        }
    }
    match server.transport.as_str() {
        "stdio" => {
            if server.command.as_deref().map(str::trim).unwrap_or("").is_empty() {
                return Err(ConfigError::new(format!("{key}.command"), None, "a stdio server needs a command"));
            }
        }
        "http" | "sse" => {
            let url = server.url.as_deref().unwrap_or("");
            if parse_http_url(url).is_none() {
                return Err(not_http_url(format!("{key}.url"), None, url));
            }
        }
        other => {
            return Err(ConfigError::new(
                format!("{key}.transport"),
                None,
                format!("{other:?} is not stdio, http or sse"),
            ))
        }
    }
    if server.timeout_ms == Some(0) {
        return Err(ConfigError::new(format!("{key}.timeout_ms"), None, "must be greater than zero"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "standalone_tests.rs"]
mod tests;
