//! Who is calling: bearer tokens from the standalone directory (stored as
//! SHA-256, compared in constant time), JWTs verified locally, and instance
//! tokens for the instance router. Produces a `Principal` (user + team +
//! scopes); every request is authenticated again, sessions are not credentials.
//! Managed mode's OAuth introspection plugs in behind `Authenticator`.

use std::sync::Arc;

use jsonwebtoken::{decode, Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use secrecy::ExposeSecret;
use serde::Deserialize;
use subtle::ConstantTimeEq;

pub mod introspection;
mod principal;

pub use principal::{AuthError, Principal, Role, SCOPE_EXECUTE, SCOPE_READ};

use crate::config::sha256_hex;
use crate::control::standalone::{Directory, JwtAlgorithm, JwtSettings, DEFAULT_SCOPES};
use crate::model::{InstanceSpec, TeamId, UserId};

/// What an admin may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminScope {
    /// A satellite admin token: every team.
    AllTeams,
    /// A team admin: this team only.
    Team(TeamId),
}

/// Why an instance-router request was refused (SB §6.1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceAuthError {
    #[error("Instance not found")]
    NotFound,
    #[error("Missing or invalid token format")]
    BadFormat,
    #[error("Instance authentication not configured")]
    NotConfigured,
    #[error("Invalid token")]
    Invalid,
}

/// Authenticates bearer tokens against the current directory; the directory is swapped on config reloads.
#[derive(Clone)]
pub struct Authenticator {
    directory: Arc<RwLock<Arc<Directory>>>,
    /// Managed mode: tokens the directory does not know are checked with the control plane (BP §10).
    introspection: Option<introspection::TokenIntrospection>,
}

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Option<Vec<String>>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

impl Authenticator {
    pub fn new(directory: Directory) -> Self {
        Self { directory: Arc::new(RwLock::new(Arc::new(directory))), introspection: None }
    }

    /// An authenticator that falls back to token introspection for tokens the directory does not know.
    pub fn with_introspection(directory: Directory, introspection: introspection::TokenIntrospection) -> Self {
        Self { directory: Arc::new(RwLock::new(Arc::new(directory))), introspection: Some(introspection) }
    }

    /// Authenticate a request: locally first (static tokens, JWTs), then by introspection when configured.
    pub async fn authenticate_request(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        match (self.authenticate(authorization), &self.introspection) {
            (Err(AuthError::Invalid(_)), Some(introspection)) => {
                let token = bearer(authorization).ok_or(AuthError::Missing)?;
                introspection.authenticate(token).await
            }
            (outcome, _) => outcome,
        }
    }

    /// Whether `authorization` still authenticates, for a long-lived stream it opened: refused only when it is
    /// known to be (revoked, expired, its user gone), not when the control plane cannot be asked just now.
    pub async fn recheck(&self, authorization: &str) -> Recheck {
        match (self.authenticate(Some(authorization)), &self.introspection) {
            (Ok(principal), _) => Recheck::Admitted(principal),
            (Err(AuthError::Invalid(_)), Some(introspection)) => {
                let Some(token) = bearer(Some(authorization)) else { return Recheck::Refused };
                match introspection.verdict(token).await {
                    Ok(principal) => Recheck::Admitted(principal),
                    Err(introspection::Refusal::Refused(_)) => Recheck::Refused,
                    Err(introspection::Refusal::Unavailable(_)) => Recheck::Unknown,
                }
            }
            (Err(_), _) => Recheck::Refused,
        }
    }

    /// Whose analytics the caller may read: a satellite admin token opens every team, a team admin their own
    /// team; any other valid caller is refused with `NotAdmin` (403), an unknown token with `Invalid` (401).
    pub async fn authenticate_admin(&self, authorization: Option<&str>) -> Result<AdminScope, AuthError> {
        let token = bearer(authorization).ok_or(AuthError::Missing)?;
        let hash = sha256_hex(token);
        let directory = self.directory();
        let global = directory.admin_tokens.iter().fold(false, |found, admin| {
            let equal: bool = admin.as_bytes().ct_eq(hash.as_bytes()).into();
            found | equal
        });
        if global {
            return Ok(AdminScope::AllTeams);
        }
        let principal = self.authenticate_request(authorization).await?;
        match principal.role {
            Role::TeamAdmin => Ok(AdminScope::Team(principal.team)),
            Role::Member => Err(AuthError::NotAdmin),
        }
    }

    /// Managed mode: the introspection cache's (hits, misses, stale answers) so far.
    pub fn introspection_counts(&self) -> Option<(u64, u64, u64)> {
        self.introspection.as_ref().map(|i| {
            let (hits, misses) = i.cache_counts();
            (hits, misses, i.stale_answers())
        })
    }

    /// Managed mode: since when the control plane could not check tokens, while it cannot.
    pub fn introspection_outage(&self) -> Option<introspection::Outage> {
        self.introspection.as_ref().and_then(|i| i.outage())
    }

    pub fn replace(&self, directory: Directory) {
        *self.directory.write() = Arc::new(directory);
    }

    pub fn directory(&self) -> Arc<Directory> {
        self.directory.read().clone()
    }

    /// Authenticate an `Authorization` header value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        let token = bearer(authorization).ok_or(AuthError::Missing)?;
        let directory = self.directory();
        // A static token may contain dots too: it is tried first, and a JWT-shaped token it does not know is
        // then verified as a JWT.
        match (static_token(&directory, token), directory.jwt.as_ref()) {
            (Err(_), Some(jwt)) if looks_like_jwt(token) => verify_jwt(&directory, jwt, token),
            (outcome, _) => outcome,
        }
    }
}

/// What a credential checked again says of its caller.
#[derive(Debug)]
pub enum Recheck {
    Admitted(Principal),
    Refused,
    /// It could not be checked now (the control plane unreachable): taken as still valid until it can be.
    Unknown,
}

/// The token of a `Bearer` header (scheme case-insensitive).
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3
}

/// Look the token's SHA-256 up in the directory's index: O(1) in the number of users. A hash-table lookup's
/// timing depends on the hash of the presented token, never on the token itself, and finding a token whose hash
/// shares a prefix with a stored one is a preimage search: nothing about a stored token leaks. The final
/// comparison is constant-time all the same.
fn static_token(directory: &Directory, token: &str) -> Result<Principal, AuthError> {
    let hash = sha256_hex(token);
    let invalid = || AuthError::Invalid("Token validation failed".into());
    let (user_id, index) = directory.token_index.get(&hash).ok_or_else(invalid)?;
    let user = directory.users.get(user_id).ok_or_else(invalid)?;
    let grant = user.tokens.get(*index).ok_or_else(invalid)?;
    let equal: bool = grant.sha256.as_bytes().ct_eq(hash.as_bytes()).into();
    if !equal {
        return Err(invalid());
    }
    Ok(Principal {
        user: user_id.clone(),
        team: grant.team.clone(),
        scopes: grant.scopes.clone(),
        client_id: None,
        role: if user.admin { Role::TeamAdmin } else { Role::Member },
    })
}

/// Seconds a JWT's `exp` may have passed, or its `nbf` be still ahead, and the token be accepted.
const JWT_LEEWAY_SECS: u64 = 60;

fn verify_jwt(directory: &Directory, jwt: &JwtSettings, token: &str) -> Result<Principal, AuthError> {
    let claims = verified_claims(jwt, token)?;
    principal_of(directory, jwt, claims)
}

fn invalid_jwt(why: &str) -> AuthError {
    AuthError::Invalid(format!("Invalid token: {why}"))
}

/// The claims of a token the configured key signed, within its validity, for this satellite's audience and the
/// configured issuer.
fn verified_claims(jwt: &JwtSettings, token: &str) -> Result<Claims, AuthError> {
    let (algorithm, key) = match jwt.algorithm {
        JwtAlgorithm::Hs256 => (Algorithm::HS256, DecodingKey::from_secret(jwt.key.expose_secret().as_bytes())),
        JwtAlgorithm::Rs256 => (
            Algorithm::RS256,
            DecodingKey::from_rsa_pem(jwt.key.expose_secret().as_bytes())
                .map_err(|_| invalid_jwt("verification key unusable"))?,
        ),
        JwtAlgorithm::Es256 => (
            Algorithm::ES256,
            DecodingKey::from_ec_pem(jwt.key.expose_secret().as_bytes())
                .map_err(|_| invalid_jwt("verification key unusable"))?,
        ),
    };
    let data = decode::<Claims>(token, &key, &validation(jwt, algorithm))
        .map_err(|err| invalid_jwt(&err.kind_description()))?;
    let claims = data.claims;
    // A token names its user: an empty `sub` names nobody.
    if claims.sub.trim().is_empty() {
        return Err(invalid_jwt("empty sub claim"));
    }
    // With no audience configured, a token that names one must name the satellite (SB §5.5, OQ-14): one the
    // same issuer minted for another service is not a key to this one. No `aud` at all is accepted.
    if jwt.audience.is_none() && !names_the_satellite(claims.rest.get("aud")) {
        return Err(invalid_jwt("wrong audience (set [auth.jwt] audience to the one this token names)"));
    }
    Ok(claims)
}

/// What jsonwebtoken checks of a token: `exp` and `nbf` (with leeway), and the configured audience and issuer.
fn validation(jwt: &JwtSettings, algorithm: Algorithm) -> Validation {
    let mut validation = Validation::new(algorithm);
    validation.validate_nbf = true;
    // Clocks drift: `exp` and `nbf` are read with a minute's leeway (jsonwebtoken's default, kept on purpose and
    // written down in docs/decisions.md).
    validation.leeway = JWT_LEEWAY_SECS;
    // jsonwebtoken checks `aud` and `iss` only when a token carries them: a configured audience or issuer is
    // one the token must name, so it must carry the claim. Before, a token without it was accepted.
    let mut required = vec!["exp", "sub"];
    match &jwt.audience {
        Some(audience) => {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        None => validation.validate_aud = false,
    }
    if let Some(issuer) = &jwt.issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    validation.set_required_spec_claims(&required);
    validation
}

/// The caller a verified token names: a user of the directory (401 `invalid_token` otherwise) in a team of the
/// directory that the user is a member of (403 otherwise), as a static token is. Before, the issuer's word made
/// a session for any `sub` and any declared team.
fn principal_of(directory: &Directory, jwt: &JwtSettings, claims: Claims) -> Result<Principal, AuthError> {
    let team = claims
        .rest
        .get(&jwt.team_claim)
        .and_then(|v| v.as_str())
        .ok_or_else(|| invalid_jwt(&format!("missing {} claim", jwt.team_claim)))?;
    let team = TeamId(team.to_owned());
    if !directory.teams.contains_key(&team) {
        return Err(invalid_jwt("unknown team"));
    }
    let user = UserId(claims.sub);
    let member = directory.users.get(&user).ok_or_else(|| invalid_jwt("unknown user"))?;
    if !member.teams.contains(&team) {
        return Err(AuthError::NotMember);
    }
    let scopes = match (claims.scope, claims.scp) {
        (Some(scope), _) => scope.split_whitespace().map(str::to_owned).collect(),
        (None, Some(scp)) => scp,
        (None, None) => DEFAULT_SCOPES.iter().map(|s| s.to_string()).collect(),
    };
    let role = Role::from_team_role(claims.rest.get("team_role").and_then(|v| v.as_str()));
    Ok(Principal { user, team, scopes, client_id: None, role })
}

/// Whether a JWT's `aud` (absent, a string or an array) admits it here when no audience is configured: absent, or
/// naming `deploystack:mcp:satellite`.
fn names_the_satellite(aud: Option<&serde_json::Value>) -> bool {
    use serde_json::Value;
    let ours = |v: &Value| v.as_str() == Some(crate::config::BACKEND_AUDIENCE);
    match aud {
        None | Some(Value::Null) => true,
        Some(Value::Array(values)) => values.iter().any(ours),
        Some(value) => ours(value),
    }
}

trait KindDescription {
    fn kind_description(&self) -> String;
}

impl KindDescription for jsonwebtoken::errors::Error {
    fn kind_description(&self) -> String {
        use jsonwebtoken::errors::ErrorKind;
        match self.kind() {
            ErrorKind::ExpiredSignature => "expired".into(),
            ErrorKind::ImmatureSignature => "not yet valid".into(),
            ErrorKind::InvalidAudience => "wrong audience".into(),
            ErrorKind::InvalidIssuer => "wrong issuer".into(),
            ErrorKind::InvalidSignature => "bad signature".into(),
            ErrorKind::InvalidAlgorithm => "unexpected algorithm".into(),
            ErrorKind::MissingRequiredClaim(claim) => format!("missing {claim} claim"),
            _ => "malformed".into(),
        }
    }
}

/// Whether `token` has the form of an instance token at all (`ds_inst_…`).
pub fn check_instance_token_format(token: Option<&str>) -> Result<(), InstanceAuthError> {
    token.filter(|t| t.starts_with("ds_inst_")).map(|_| ()).ok_or(InstanceAuthError::BadFormat)
}

/// Check an instance token against the instance's stored hash (SB §6.1), in constant time.
pub fn check_instance_token(spec: &InstanceSpec, token: Option<&str>) -> Result<(), InstanceAuthError> {
    check_instance_token_format(token)?;
    let token = token.unwrap_or_default();
    let expected = spec.instance_token_hash.as_deref().ok_or(InstanceAuthError::NotConfigured)?;
    let actual = sha256_hex(token);
    let equal: bool = expected.as_bytes().ct_eq(actual.as_bytes()).into();
    if equal {
        Ok(())
    } else {
        Err(InstanceAuthError::Invalid)
    }
}

#[cfg(test)]
mod tests;
