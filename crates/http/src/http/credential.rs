//! A long-lived client stream (a session's GET stream, a legacy SSE stream, a 2026-07-28 `subscriptions/listen`)
//! ends when the credential that opened it no longer admits its caller: a token revoked or expired, a user removed
//! from the team, an instance token changed or its instance gone. Each request authenticates anew; a stream is
//! one request that lasts, so its credential is checked again each time a configuration is applied and every
//! [`RECHECK`] (JWTs expire, the control plane revokes OAuth tokens).

use std::time::Duration;

use tracing::info;

use crate::auth::{self, Authenticator, Recheck};
use crate::instances::InstanceManager;
use crate::model::{ProcessId, TeamId, UserId};

/// How often a stream's credential is checked again without a configuration change.
pub const RECHECK: Duration = Duration::from_secs(30);

/// What opened a stream, kept to check it again. Holds the caller's token: never logged (no `Debug`).
pub enum Credential {
    /// An `Authorization` header (`/mcp`, `/sse`): admits while it authenticates the same user of the same team.
    Bearer { authorization: String, user: UserId, team: TeamId },
    /// An instance token (`/i/{path}/mcp`): admits while the path names the same instance and it takes the token.
    Instance { path: String, token: Option<String>, process_id: ProcessId },
}

impl Credential {
    /// Whether the credential still admits the caller. A token the control plane cannot be asked about now is
    /// taken as still valid: a backend that blinks does not end every stream.
    pub async fn admits(&self, auth: &Authenticator, manager: &InstanceManager) -> bool {
        match self {
            Credential::Bearer { authorization, user, team } => match auth.recheck(authorization).await {
                Recheck::Admitted(principal) => principal.user == *user && principal.team == *team,
                Recheck::Refused => false,
                Recheck::Unknown => true,
            },
            Credential::Instance { path, token, process_id } => {
                manager.by_instance_path(path).is_some_and(|instance| {
                    instance.spec().process_id == *process_id
                        && auth::check_instance_token(instance.spec(), token.as_deref()).is_ok()
                })
            }
        }
    }

    /// Who the stream is for, for the log line that says it ended.
    fn whose(&self) -> String {
        match self {
            Credential::Bearer { user, team, .. } => format!("{user} of {team}"),
            Credential::Instance { process_id, .. } => format!("instance {process_id}"),
        }
    }
}

/// Resolves once `credential` no longer admits its caller: checked each time a configuration is applied and
/// every [`RECHECK`]. Never resolves otherwise; the stream it guards ends it by dropping it.
pub async fn revoked(auth: Authenticator, manager: InstanceManager, credential: Credential, stream: &'static str) {
    let mut applied = manager.applied();
    applied.mark_unchanged();
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + RECHECK, RECHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            changed = applied.changed() => {
                if changed.is_err() {
                    // The manager is gone: the satellite is stopping, which ends the stream anyway.
                    std::future::pending::<()>().await;
                }
            }
        }
        if !credential.admits(&auth, &manager).await {
            info!(caller = %credential.whose(), stream, "stream closed: its credential no longer admits the caller");
            return;
        }
    }
}
