//! The identity sequence of BP §1, steps 2 and 4-7: registration-token
//! format, persistent directory, backend reachability, stored credentials
//! verified with a heartbeat, registration when they are missing or
//! refused. Every fatal case is one `IdentityError` line (exit 1); the
//! credentials are secrets and never logged.

use std::path::Path;

use chrono::Utc;
use secrecy::{ExposeSecret, SecretString};
use tracing::{info, warn};

use super::client::{BackendClient, BackendError};
use super::credentials::{CredentialStore, Credentials, CredentialsError};
use super::metrics::ProcessMetrics;
use super::wire::{HeartbeatRequest, RegisterRequest, SystemInfo, Transport};

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

/// Steps 4-7: the credentials this satellite runs with, set on `client`.
pub async fn identify(
    client: &BackendClient,
    name: &str,
    token: Option<&SecretString>,
    persistent_dir: &Path,
    metrics: &mut ProcessMetrics,
) -> Result<Credentials, IdentityError> {
    check_token(token)?;
    let store = CredentialStore::open(persistent_dir)?;
    client.health().await.map_err(|e| IdentityError::Unreachable(Box::new(e)))?;

    if let Some(mut stored) = store.load() {
        client.set_credentials(&stored);
        let sample = metrics.sample();
        let beat =
            HeartbeatRequest::verification(env!("CARGO_PKG_VERSION"), sample.memory_usage_mb, sample.uptime_seconds);
        match client.heartbeat(&beat).await {
            Ok(_) => {
                stored.last_verified = Utc::now();
                if let Err(err) = store.save(&stored) {
                    warn!(error = %err, "could not record the verification time of the stored credentials");
                }
                info!(satellite_id = %stored.satellite_id, "stored backend credentials verified");
                return Ok(stored);
            }
            Err(err) => {
                warn!(error = %err, "stored backend credentials were refused; registering again");
                if let Err(err) = store.clear() {
                    warn!(error = %err, "could not clear the stored credentials");
                }
            }
        }
    }

    let token = token.ok_or(IdentityError::NoToken)?;
    let request = RegisterRequest {
        name: name.to_owned(),
        capabilities: Some(vec![Transport::Stdio, Transport::Http, Transport::Sse]),
        system_info: Some(SystemInfo {
            os: Some(format!("{} {}", std::env::consts::OS, std::env::consts::OS)),
            arch: Some(std::env::consts::ARCH.to_owned()),
            node_version: Some(concat!("rust-satellite/", env!("CARGO_PKG_VERSION")).to_owned()),
            memory_mb: total_memory_mb(),
        }),
    };
    let registered = client.register(token, &request).await.map_err(|err| {
        let hint = match &err {
            BackendError::Status { body: Some(body), .. } => {
                body.instructions.as_ref().map(|i| format!(" ({i})")).unwrap_or_default()
            }
            _ => String::new(),
        };
        IdentityError::Registration(Box::new(err), hint)
    })?;
    let now = Utc::now();
    let credentials = Credentials {
        api_key: SecretString::from(registered.satellite.api_key.expose().to_owned()),
        satellite_id: registered.satellite.id.clone(),
        satellite_name: registered.satellite.name.clone().unwrap_or_else(|| name.to_owned()),
        registered_at: now,
        last_verified: now,
    };
    client.set_credentials(&credentials);
    if let Err(err) = store.save(&credentials) {
        warn!(error = %err, "registered, but the credentials could not be stored; the next start registers again");
    }
    info!(satellite_id = %credentials.satellite_id, status = registered.satellite.status.as_deref().unwrap_or("unknown"), "registered with the backend");
    Ok(credentials)
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
