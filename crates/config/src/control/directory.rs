//! Who may connect: teams, users with their token hashes and scopes, admin tokens and JWT settings, validated
//! from the standalone file. Used by the client-facing authentication (`auth`).

use std::collections::BTreeMap;

use secrecy::SecretString;

use crate::config::file::{RawTeam, RawUser};
use crate::config::ConfigError;
use crate::model::{TeamId, UserId};

/// Who may connect: teams, users with their token hashes, and JWT settings.
/// Used by the client-facing authentication.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    pub teams: BTreeMap<TeamId, Team>,
    pub users: BTreeMap<UserId, User>,
    pub jwt: Option<JwtSettings>,
    pub authorization_server: Option<String>,
    /// Lowercase hex SHA-256 of the satellite-wide admin tokens (analytics of every team, nothing else).
    pub admin_tokens: Vec<String>,
    /// Each grant's token hash → (user, index in their `tokens`): a token is checked in O(1) whatever the
    /// number of users. Built by [`Directory::index_tokens`]; the first grant of a hash (in user order) wins.
    pub token_index: std::collections::HashMap<String, (UserId, usize)>,
}

impl Directory {
    /// Build `token_index` from the users' grants.
    pub fn index_tokens(mut self) -> Directory {
        let mut index = std::collections::HashMap::new();
        for (user_id, user) in &self.users {
            for (i, grant) in user.tokens.iter().enumerate() {
                index.entry(grant.sha256.clone()).or_insert_with(|| (user_id.clone(), i));
            }
        }
        self.token_index = index;
        self
    }
}

#[derive(Debug, Clone)]
pub struct Team {
    pub slug: String,
    pub name: String,
}

#[derive(Debug, Clone)]
pub struct User {
    pub teams: Vec<TeamId>,
    pub tokens: Vec<TokenGrant>,
    /// A team admin: reads the analytics of the team each of their tokens is for.
    pub admin: bool,
}

/// A bearer token a user may present: for one team, with scopes.
#[derive(Debug, Clone)]
pub struct TokenGrant {
    /// Lowercase hex SHA-256 of the token.
    pub sha256: String,
    pub team: TeamId,
    pub scopes: Vec<String>,
}

/// Scopes a token has unless it says otherwise.
pub const DEFAULT_SCOPES: [&str; 2] = ["mcp:read", "mcp:tools:execute"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtAlgorithm {
    Hs256,
    Rs256,
    Es256,
}

#[derive(Debug, Clone)]
pub struct JwtSettings {
    pub algorithm: JwtAlgorithm,
    /// The HS256 secret, or the RS256/ES256 public key in PEM.
    pub key: SecretString,
    pub audience: Option<String>,
    pub issuer: Option<String>,
    pub team_claim: String,
}

pub(super) fn teams(raw: &[RawTeam]) -> Result<BTreeMap<TeamId, Team>, ConfigError> {
    let mut teams = BTreeMap::new();
    for (i, team) in raw.iter().enumerate() {
        let key = format!("teams[{i}]");
        check_id(&team.id, &format!("{key}.id"))?;
        let slug = team.slug.clone().unwrap_or_else(|| team.id.clone());
        check_id(&slug, &format!("{key}.slug"))?;
        let entry = Team { slug, name: team.name.clone().unwrap_or_else(|| team.id.clone()) };
        if teams.insert(TeamId(team.id.clone()), entry).is_some() {
            return Err(ConfigError::new(format!("{key}.id"), None, format!("duplicate team id {:?}", team.id)));
        }
    }
    Ok(teams)
}

/// Every credential of a file by its hash (lowercase hex), and whose it is: a user's token, an admin token, a
/// member's instance token. One hash names one owner; otherwise the one token would open what each owner has.
/// The all-zero hash is the shipped examples' placeholder (deploy/): no token hashes to it, so it names nobody.
#[derive(Debug, Default)]
pub(super) struct CredentialOwners(std::collections::HashMap<String, String>);

impl CredentialOwners {
    /// Record `owner` (how a message names it) as the owner of `hash`; `Err` with the owner it already has.
    pub(super) fn claim(&mut self, hash: &str, owner: impl FnOnce() -> String) -> Result<(), String> {
        use std::collections::hash_map::Entry;
        if hash.bytes().all(|b| b == b'0') {
            return Ok(());
        }
        match self.0.entry(hash.to_ascii_lowercase()) {
            Entry::Occupied(first) => Err(first.get().clone()),
            Entry::Vacant(slot) => {
                slot.insert(owner());
                Ok(())
            }
        }
    }
}

/// The users, their tokens' hashes claimed in `owners`.
pub(super) fn users(
    raw: &[RawUser],
    teams: &BTreeMap<TeamId, Team>,
    owners: &mut CredentialOwners,
) -> Result<BTreeMap<UserId, User>, ConfigError> {
    let mut users = BTreeMap::new();
    for (i, user) in raw.iter().enumerate() {
        let key = format!("users[{i}]");
        let entry = user_entry(&key, user, teams, owners)?;
        if users.insert(UserId(user.id.clone()), entry).is_some() {
            return Err(ConfigError::new(format!("{key}.id"), None, format!("duplicate user id {:?}", user.id)));
        }
    }
    Ok(users)
}

/// One user (`key` names it in errors): its teams known, its tokens' grants, its role, its tokens claimed.
fn user_entry(
    key: &str,
    user: &RawUser,
    teams: &BTreeMap<TeamId, Team>,
    owners: &mut CredentialOwners,
) -> Result<User, ConfigError> {
    check_id(&user.id, &format!("{key}.id"))?;
    for team in &user.teams {
        if !teams.contains_key(&TeamId(team.clone())) {
            return Err(ConfigError::new(format!("{key}.teams"), None, format!("unknown team {team:?}")));
        }
    }
    let mut tokens = shorthand_grants(key, user)?;
    tokens.extend(token_grants(key, user)?);
    let admin = match user.role.as_deref() {
        None | Some("member") => false,
        Some("admin") => true,
        Some(other) => {
            return Err(ConfigError::new(
                format!("{key}.role"),
                None,
                format!("unknown role {other:?}: use \"member\" or \"admin\""),
            ))
        }
    };
    for (j, grant) in tokens.iter().enumerate() {
        // Before, the first grant in user order won: one user's token signed in as another, maybe of another team.
        owners.claim(&grant.sha256, || format!("a token of {key} (user {:?})", user.id)).map_err(|first| {
            ConfigError::new(
                format!("{key}.tokens"),
                None,
                format!(
                    "token {j} of user {:?} has the same hash as {first}: a token names one user and one team",
                    user.id
                ),
            )
        })?;
    }
    Ok(User { teams: user.teams.iter().cloned().map(TeamId).collect(), tokens, admin })
}

/// The `token_sha256` shorthand's grants: each for the user's one team, with the default scopes.
fn shorthand_grants(key: &str, user: &RawUser) -> Result<Vec<TokenGrant>, ConfigError> {
    let mut tokens = Vec::new();
    for hash in &user.token_sha256 {
        check_sha256(hash, &format!("{key}.token_sha256"))?;
        let [team] = user.teams.as_slice() else {
            return Err(ConfigError::new(
                format!("{key}.token_sha256"),
                None,
                "the user belongs to several teams: give each token its team in [[users.tokens]]",
            ));
        };
        tokens.push(TokenGrant {
            sha256: hash.to_ascii_lowercase(),
            team: TeamId(team.clone()),
            scopes: default_scopes(),
        });
    }
    Ok(tokens)
}

/// The `[[users.tokens]]` grants: each for one of the user's teams (named, unless the user has one).
fn token_grants(key: &str, user: &RawUser) -> Result<Vec<TokenGrant>, ConfigError> {
    let mut tokens = Vec::new();
    for (j, token) in user.tokens.iter().enumerate() {
        let token_key = format!("{key}.tokens[{j}]");
        check_sha256(&token.sha256, &format!("{token_key}.sha256"))?;
        let team = match (&token.team, user.teams.as_slice()) {
            (Some(team), _) if user.teams.contains(team) => team.clone(),
            (Some(team), _) => {
                return Err(ConfigError::new(
                    format!("{token_key}.team"),
                    None,
                    format!("user is not in team {team:?}"),
                ))
            }
            (None, [only]) => only.clone(),
            (None, _) => {
                return Err(ConfigError::new(format!("{token_key}.team"), None, "required: the user has several teams"))
            }
        };
        let scopes = token.scopes.clone().unwrap_or_else(default_scopes);
        tokens.push(TokenGrant { sha256: token.sha256.to_ascii_lowercase(), team: TeamId(team), scopes });
    }
    Ok(tokens)
}

pub(super) fn default_scopes() -> Vec<String> {
    DEFAULT_SCOPES.iter().map(|s| s.to_string()).collect()
}

pub(super) fn jwt_settings(raw: &crate::config::file::RawJwt) -> Result<JwtSettings, ConfigError> {
    let algorithm = match raw.algorithm.as_str() {
        "HS256" => JwtAlgorithm::Hs256,
        "RS256" => JwtAlgorithm::Rs256,
        "ES256" => JwtAlgorithm::Es256,
        other => {
            return Err(ConfigError::new("auth.jwt.algorithm", None, format!("{other:?} is not HS256, RS256 or ES256")))
        }
    };
    let key = match (algorithm, &raw.secret, &raw.public_key_pem) {
        (JwtAlgorithm::Hs256, Some(secret), None) if secret.len() >= 32 => secret.clone(),
        (JwtAlgorithm::Hs256, Some(_), None) => {
            return Err(ConfigError::new("auth.jwt.secret", None, "an HS256 secret needs at least 32 characters"))
        }
        (JwtAlgorithm::Hs256, _, _) => {
            return Err(ConfigError::new("auth.jwt.secret", None, "HS256 needs secret and no public_key_pem"))
        }
        (_, None, Some(pem)) if pem.contains("BEGIN") => pem.clone(),
        (_, _, _) => {
            return Err(ConfigError::new(
                "auth.jwt.public_key_pem",
                None,
                "RS256/ES256 need a PEM public key and no secret",
            ))
        }
    };
    Ok(JwtSettings {
        algorithm,
        key: SecretString::from(key),
        audience: raw.audience.clone(),
        issuer: raw.issuer.clone(),
        team_claim: raw.team_claim.clone().unwrap_or_else(|| "team".into()),
    })
}

/// Identifiers become part of process ids and URLs: keep them to a safe alphabet.
pub(super) fn check_id(value: &str, key: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(key, None, format!("{value:?} must be 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.'")))
    }
}

pub(super) fn check_sha256(value: &str, key: &str) -> Result<(), ConfigError> {
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ConfigError::new(key, None, "must be a hex sha-256 (64 characters)"))
    }
}
