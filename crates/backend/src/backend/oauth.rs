//! OAuth tokens of remote MCP servers (BP §11): asked for per user
//! instance (status first, then the token), cached 5 minutes under
//! `installation:user:team` (or until the token expires), dropped on a 401
//! from the server and on `invalidate_user_token_cache`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tracing::{info, warn};

use super::client::{BackendClient, BackendError};
use super::wire::OAuthTokenRequest;
use crate::instances::deploy::NoGithubToken;
use crate::instances::{NoToken, OAuthTokens};
use crate::model::{InstanceSpec, UserId};

pub const CACHE_TTL: Duration = Duration::from_secs(5 * 60);

struct Cached {
    access_token: String,
    until: Instant,
}

/// The backend as the source of users' OAuth tokens.
pub struct BackendOAuth {
    client: Arc<BackendClient>,
    cache: Mutex<HashMap<OAuthTokenRequest, Cached>>,
}

impl BackendOAuth {
    pub fn new(client: Arc<BackendClient>) -> Self {
        Self { client, cache: Mutex::new(HashMap::new()) }
    }

    fn key(spec: &InstanceSpec) -> OAuthTokenRequest {
        OAuthTokenRequest {
            installation_id: spec.installation_id.0.clone(),
            user_id: spec.user_id.0.clone(),
            team_id: spec.team_id.0.clone(),
        }
    }

    async fn fetch(&self, spec: &InstanceSpec) -> Result<String, NoToken> {
        let key = Self::key(spec);
        if key.installation_id.is_empty() || key.user_id.is_empty() || key.team_id.is_empty() {
            return Err(NoToken::Required(format!("OAuth required but missing context for {}", spec.process_id)));
        }
        if let Some(hit) = self.cache.lock().get(&key).filter(|c| c.until > Instant::now()) {
            return Ok(hit.access_token.clone());
        }
        let required = || {
            NoToken::Required(format!(
                "OAuth authorization required for {}. Please visit the dashboard to authorize this MCP server.",
                spec.server_name
            ))
        };
        match self.client.token_status(&key).await {
            Ok(status) if !status.exists => return Err(required()),
            Ok(status) if status.expired == Some(true) => {
                info!(process_id = %spec.process_id, "OAuth token marked expired; the backend refreshes it, using it meanwhile");
            }
            Ok(_) => {}
            Err(BackendError::Status { status: 404, .. }) => return Err(required()),
            // Only "no token" (above) asks the user to act; the backend failing now is retried.
            Err(err) => return Err(NoToken::Unavailable(format!("OAuth token status unavailable: {err}"))),
        }
        let token = match self.client.token_retrieve(&key).await {
            Ok(token) => token,
            Err(BackendError::Status { status: 404, .. }) => return Err(required()),
            Err(err) => return Err(NoToken::Unavailable(format!("OAuth token unavailable: {err}"))),
        };
        let mut until = Instant::now() + CACHE_TTL;
        if let Some(expires) = token.expires_at.as_deref().and_then(|t| DateTime::parse_from_rfc3339(t).ok()) {
            let left = (expires.with_timezone(&Utc) - Utc::now()).to_std().unwrap_or_default();
            until = until.min(Instant::now() + left);
        }
        let access = token.access_token.expose().to_owned();
        self.cache.lock().insert(key, Cached { access_token: access.clone(), until });
        Ok(access)
    }

    /// Drop every cached token of `user`; returns how many.
    pub fn invalidate_user(&self, user: &UserId) -> usize {
        let mut cache = self.cache.lock();
        let before = cache.len();
        cache.retain(|key, _| key.user_id != user.0);
        before - cache.len()
    }
}

impl OAuthTokens for BackendOAuth {
    fn bearer<'a>(&'a self, spec: &'a InstanceSpec) -> BoxFuture<'a, Result<String, NoToken>> {
        Box::pin(self.fetch(spec))
    }

    fn invalidate(&self, spec: &InstanceSpec) {
        if self.cache.lock().remove(&Self::key(spec)).is_some() {
            warn!(process_id = %spec.process_id, "OAuth token refused by the MCP server; dropped from the cache");
        }
    }
}

/// GitHub installation tokens for deployments (BP §12), straight from the backend (it caches them itself).
pub struct BackendGithub(pub Arc<BackendClient>);

impl crate::instances::deploy::GithubTokens for BackendGithub {
    fn token<'a>(
        &'a self,
        installation: &'a crate::model::InstallationId,
    ) -> BoxFuture<'a, Result<String, NoGithubToken>> {
        Box::pin(async move {
            match self.0.github_token(&installation.0).await {
                Ok(answer) => Ok(answer.token.expose().to_owned()),
                Err(err) => Err(NoGithubToken {
                    reason: format!("installation token unavailable: {err}"),
                    transient: err.transient(),
                }),
            }
        })
    }
}
