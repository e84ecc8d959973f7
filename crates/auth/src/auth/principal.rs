//! Who a caller is once authenticated, and why authentication failed: the vocabulary every authenticator
//! (the directory, JWTs, introspection) produces.

use crate::model::{TeamId, UserId};

pub const SCOPE_READ: &str = "mcp:read";
pub const SCOPE_EXECUTE: &str = "mcp:tools:execute";

/// An authenticated caller of the hierarchical router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user: UserId,
    pub team: TeamId,
    pub scopes: Vec<String>,
    /// The OAuth client the token was issued to (introspection); drives activity tracking (SB §17).
    pub client_id: Option<String>,
    /// What the caller may administer besides using tools.
    pub role: Role,
}

/// A caller's role in their team.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    #[default]
    Member,
    /// Reads the team's analytics (a standalone user with `role = "admin"`, the backend's `team_admin`).
    TeamAdmin,
}

impl Role {
    /// The role an introspection answer's `team_role` (or a JWT's `team_role` claim) names; anything but
    /// `team_admin` is a member.
    pub fn from_team_role(team_role: Option<&str>) -> Role {
        match team_role {
            Some("team_admin") => Role::TeamAdmin,
            _ => Role::Member,
        }
    }
}

impl Principal {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope)
    }

    pub fn require(&self, scope: &str) -> Result<(), AuthError> {
        if self.has_scope(scope) {
            Ok(())
        } else {
            Err(AuthError::InsufficientScope(scope.to_owned()))
        }
    }
}

/// Why authentication failed (SB §5.3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("Bearer token required")]
    Missing,
    #[error("{0}")]
    Invalid(String),
    #[error("Token missing required scope: {0}")]
    InsufficientScope(String),
    #[error("Admin role required: this token belongs to a team member, not a team admin")]
    NotAdmin,
    /// The control plane could not be asked about a token it has not vouched for recently (503, `Retry-After`).
    #[error("The token cannot be checked now: the control plane is unreachable ({0})")]
    Unavailable(String),
    /// A verified token names a known user and a team that user is not a member of.
    #[error("Token names a team its user is not a member of")]
    NotMember,
}
