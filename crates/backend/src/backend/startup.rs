//! The identity sequence of BP §1, steps 2 and 4-7: registration-token
//! format, persistent directory, backend reachability, stored credentials
//! verified with a heartbeat, registration when they are missing or
//! refused. Every fatal case is one `IdentityError` line (exit 1); the
//! credentials are secrets and never logged.

use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use super::client::{BackendClient, BackendError, Refusal};
use super::credentials::{CredentialStore, Credentials, CredentialsError};
use super::metrics::ProcessMetrics;
use super::wire::{HeartbeatRequest, RegisterRequest, SystemInfo, Transport};
use crate::store::{Replicas, SharedIdentity};

/// How long a replica waits for another one to finish registering (they take turns under a lock).
const IDENTITY_LOCK_WAIT: Duration = Duration::from_secs(60);

const TOKEN_PREFIXES: [&str; 2] = ["deploystack_satellite_global_", "deploystack_satellite_team_"];
const PLACEHOLDER: &str = "your_registration_token_here";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("DEPLOYSTACK_REGISTRATION_TOKEN is malformed: {0}")]
    MalformedToken(&'static str),
    #[error("cannot use the persistent data directory: {0}")]
    PersistentDir(#[from] CredentialsError),
    #[error("the backend is not reachable at startup: {0}")]
    Unreachable(Box<BackendError>),
    #[error("no stored credentials and no DEPLOYSTACK_REGISTRATION_TOKEN to register with; set the token from the DeployStack dashboard")]
    NoToken,
    #[error("registration failed: {0}{1}")]
    Registration(Box<BackendError>, String),
    #[error("the shared database cannot hold the satellite's identity: {0}")]
    Shared(String),
}

/// The advisory-lock key of one purpose (`identity`, `leader`) for the satellite `name`: replicas of one
/// satellite share it, two satellites on one database do not.
pub fn lock_key(purpose: &str, name: &str) -> i64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("satellite {purpose} {name}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// Where the credentials live: `backend.key.json` (BP §2.4), or, for replicas on PostgreSQL, the shared
/// database, so every replica uses the one registration (a registration mints a new key and kills the old).
enum Home<'a> {
    File(CredentialStore),
    Shared { replicas: &'a Replicas, name: &'a str },
}

impl Home<'_> {
    async fn load(&self) -> Result<Option<Credentials>, IdentityError> {
        match self {
            Home::File(file) => Ok(file.load()),
            Home::Shared { replicas, name } => {
                let shared = replicas.shared_identity(name).await.map_err(|e| IdentityError::Shared(e.to_string()))?;
                let parse = |s: &str| chrono::DateTime::parse_from_rfc3339(s).map(|t| t.to_utc()).ok();
                Ok(shared.map(|s| {
                    let registered_at = parse(&s.registered_at).unwrap_or_else(Utc::now);
                    Credentials {
                        api_key: s.api_key,
                        satellite_id: s.satellite_id,
                        satellite_name: (*name).to_owned(),
                        registered_at,
                        last_verified: parse(&s.last_verified).unwrap_or(registered_at),
                    }
                }))
            }
        }
    }

    async fn save(&self, credentials: &Credentials) -> Result<(), String> {
        match self {
            Home::File(file) => file.save(credentials).map_err(|e| e.to_string()),
            Home::Shared { replicas, name } => {
                let identity = SharedIdentity {
                    satellite_id: credentials.satellite_id.clone(),
                    api_key: credentials.api_key.clone(),
                    registered_at: crate::model::iso(credentials.registered_at),
                    last_verified: crate::model::iso(credentials.last_verified),
                };
                replicas.save_shared_identity(name, &identity).await.map_err(|e| e.to_string())
            }
        }
    }
}

/// BP §1 step 2: a present token must look like one (OQ-1: an absent token is fine while stored credentials work).
pub fn check_token(token: Option<&SecretString>) -> Result<(), IdentityError> {
    let Some(token) = token else { return Ok(()) };
    let token = token.expose_secret();
    if token == PLACEHOLDER {
        return Err(IdentityError::MalformedToken("it is still the placeholder from the example file"));
    }
    let rest = TOKEN_PREFIXES.iter().find_map(|prefix| token.strip_prefix(prefix));
    match rest {
        None => Err(IdentityError::MalformedToken(
            "it must start with deploystack_satellite_global_ or deploystack_satellite_team_",
        )),
        Some(rest) if rest.len() < 10 => Err(IdentityError::MalformedToken("it is too short")),
        Some(_) => Ok(()),
    }
}

/// Steps 4-7: the credentials this satellite runs with, set on `client`. With `shared` (replicas on one
/// PostgreSQL database) the credentials live in the database and the replicas take turns under an advisory
/// lock: the first registers, the others find its credentials and verify them.
pub async fn identify(
    client: &BackendClient,
    name: &str,
    token: Option<&SecretString>,
    persistent_dir: &Path,
    shared: Option<&Replicas>,
    metrics: &mut ProcessMetrics,
) -> Result<Credentials, IdentityError> {
    check_token(token)?;
    let file = CredentialStore::open(persistent_dir)?;
    client.health().await.map_err(|e| IdentityError::Unreachable(Box::new(e)))?;
    let Some(replicas) = shared else { return identify_in(client, name, token, &Home::File(file), metrics).await };
    let lock = tokio::time::timeout(IDENTITY_LOCK_WAIT, replicas.advisory_lock(lock_key("identity", name), true))
        .await
        .map_err(|_| {
            IdentityError::Shared(format!("another replica held the identity lock for {IDENTITY_LOCK_WAIT:?}"))
        })?
        .map_err(|e| IdentityError::Shared(e.to_string()))?;
    let identified = identify_in(client, name, token, &Home::Shared { replicas, name }, metrics).await;
    if let Some(lock) = lock {
        lock.release().await;
    }
    identified
}

/// Steps 5-7 with the credentials in `home`: the stored ones when the backend accepts them, else a registration.
async fn identify_in(
    client: &BackendClient,
    name: &str,
    token: Option<&SecretString>,
    home: &Home<'_>,
    metrics: &mut ProcessMetrics,
) -> Result<Credentials, IdentityError> {
    if let Some(stored) = home.load().await? {
        if let Some(verified) = verify(client, token, home, stored, metrics).await? {
            return Ok(verified);
        }
    }
    register(client, name, token, home).await
}

/// Step 5: the stored credentials, verified with a heartbeat. `Some` when the backend accepts them; `None` when the
/// satellite is to register again; an error when this start fails and leaves them in place.
async fn verify(
    client: &BackendClient,
    token: Option<&SecretString>,
    home: &Home<'_>,
    mut stored: Credentials,
    metrics: &mut ProcessMetrics,
) -> Result<Option<Credentials>, IdentityError> {
    client.set_credentials(&stored);
    let sample = metrics.sample();
    let beat = HeartbeatRequest::verification(env!("CARGO_PKG_VERSION"), sample.memory_usage_mb, sample.uptime_seconds);
    match client.heartbeat(&beat).await {
        Ok(_) => {
            stored.last_verified = Utc::now();
            if let Err(err) = home.save(&stored).await {
                warn!(error = %err, "could not record the verification time of the stored credentials");
            }
            info!(satellite_id = %stored.satellite_id, "stored backend credentials verified");
            Ok(Some(stored))
        }
        // Replicas share these credentials: only a refusal of them justifies a registration, which would
        // revoke the key every running replica uses. Anything else (a timeout, a 5xx) fails this start and
        // leaves them in place; the orchestrator starts the replica again.
        Err(err) if matches!(home, Home::Shared { .. }) && !refused(&err) => {
            Err(IdentityError::Unreachable(Box::new(err)))
        }
        // A passing failure (a timeout, a 5xx, a 429) says nothing of the key. Cleared, it was gone for good:
        // the registration token is single-use, so this start and every later one failed until an operator
        // made a new one. The file is kept; a registration with a token still valid replaces it, and with no
        // token this start fails on the backend's error and the next one verifies the key again.
        Err(err) if !refused(&err) => {
            if token.is_none() {
                return Err(IdentityError::Unreachable(Box::new(err)));
            }
            warn!(error = %err, "the stored backend credentials could not be verified; registering again, keeping them unless that succeeds");
            Ok(None)
        }
        Err(err) => {
            warn!(error = %err, "stored backend credentials were refused; registering again");
            // Shared: the row is replaced when the registration succeeds, and kept if it fails; only the file is
            // cleared here. (A `Home::clear` matched after the call deleted the shared row too.)
            if let Home::File(file) = home {
                if let Err(err) = file.clear() {
                    warn!(error = %err, "could not clear the stored credentials");
                }
            }
            Ok(None)
        }
    }
}

/// Steps 6-7: register with `token`, set the new credentials on `client` and keep them in `home`.
async fn register(
    client: &BackendClient,
    name: &str,
    token: Option<&SecretString>,
    home: &Home<'_>,
) -> Result<Credentials, IdentityError> {
    let token = token.ok_or(IdentityError::NoToken)?;
    let registered = client.register(token, &register_request(name)).await.map_err(registration_failed)?;
    let now = Utc::now();
    let credentials = Credentials {
        api_key: SecretString::from(registered.satellite.api_key.expose().to_owned()),
        satellite_id: registered.satellite.id.clone(),
        satellite_name: registered.satellite.name.clone().unwrap_or_else(|| name.to_owned()),
        registered_at: now,
        last_verified: now,
    };
    client.set_credentials(&credentials);
    if let Err(err) = home.save(&credentials).await {
        warn!(error = %err, "registered, but the credentials could not be stored; the next start registers again");
    }
    info!(satellite_id = %credentials.satellite_id, status = registered.satellite.status.as_deref().unwrap_or("unknown"), "registered with the backend");
    Ok(credentials)
}

fn register_request(name: &str) -> RegisterRequest {
    RegisterRequest {
        name: name.to_owned(),
        capabilities: Some(vec![Transport::Stdio, Transport::Http, Transport::Sse]),
        system_info: Some(SystemInfo {
            os: Some(format!("{} {}", std::env::consts::OS, std::env::consts::OS)),
            arch: Some(std::env::consts::ARCH.to_owned()),
            node_version: Some(concat!("rust-satellite/", env!("CARGO_PKG_VERSION")).to_owned()),
            memory_mb: total_memory_mb(),
        }),
    }
}

/// A registration the backend refused, with its instructions when it gave some.
fn registration_failed(err: BackendError) -> IdentityError {
    let hint = match &err {
        BackendError::Status { body: Some(body), .. } => {
            body.instructions.as_ref().map(|i| format!(" ({i})")).unwrap_or_default()
        }
        _ => String::new(),
    };
    IdentityError::Registration(Box::new(err), hint)
}

/// The backend refused the credentials themselves (not a network failure or a server error).
fn refused(err: &BackendError) -> bool {
    matches!(err, BackendError::Status { refusal: Refusal::Unauthorized | Refusal::Forbidden, .. })
}

/// Replicas: adopt the shared credentials when another replica registered again (its registration revoked the
/// key this replica holds). Called periodically; a no-op while they are the same.
pub async fn adopt_shared(client: &BackendClient, replicas: &Replicas, name: &str) -> Result<(), IdentityError> {
    let home = Home::Shared { replicas, name };
    if let Some(shared) = home.load().await? {
        if client.satellite_id().as_deref() != Some(shared.satellite_id.as_str()) || !client.uses_key(&shared.api_key) {
            client.set_credentials(&shared);
            info!(satellite_id = %shared.satellite_id, "adopted the credentials another replica registered");
        }
    }
    Ok(())
}

fn total_memory_mb() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    #[test]
    fn registration_tokens_are_checked_before_anything_else() {
        assert!(check_token(None).is_ok());
        assert!(check_token(Some(&token("deploystack_satellite_global_eyJhbGciOiJIUzI1NiJ9"))).is_ok());
        assert!(check_token(Some(&token("deploystack_satellite_team_0123456789"))).is_ok());
        for bad in ["your_registration_token_here", "deploystack_satellite_global_short", "abc", ""] {
            let err = check_token(Some(&token(bad))).unwrap_err().to_string();
            assert!(err.starts_with("DEPLOYSTACK_REGISTRATION_TOKEN is malformed"), "{bad}: {err}");
            assert!(bad.len() < 10 || !err.contains(bad), "the token itself is never echoed");
        }
    }
}
