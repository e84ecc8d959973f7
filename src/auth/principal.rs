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
}
