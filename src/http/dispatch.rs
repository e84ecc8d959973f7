//! Where an authenticated MCP request goes: the hierarchical router for a bearer caller (on `/mcp` or a legacy
//! SSE stream), or one instance for the holder of its instance token (`/i/{path}/mcp`).

use std::sync::Arc;

use serde_json::Value;

use super::McpDeps;
use crate::auth::Principal;
use crate::instances::Instance;
use crate::mcp::transport::Relay;
use crate::router::RouteError;

/// The router behind an endpoint, with the identity it serves.
#[derive(Clone)]
pub enum Target {
    /// `POST /mcp`: the four meta-tools, as this caller.
    Hierarchical(Principal),
    /// `POST /i/{path}/mcp`: one instance's own tools.
    Instance(Arc<Instance>),
    /// `POST /message` of a legacy SSE stream: the hierarchical router, as the stream's owner.
    LegacySse(Principal),
}

impl Target {
    /// Route one request method.
    /// Route one request method; `relay` carries what the upstream server says meanwhile back to the client.
    /// `session` is the client's MCP session id, when it has one.
    pub async fn dispatch(
        &self,
        deps: &McpDeps,
        session: Option<&str>,
        method: &str,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Value, RouteError> {
        match self {
            Target::Hierarchical(caller) | Target::LegacySse(caller) => {
                deps.router.handle(caller, session, method, params, relay).await
            }
            Target::Instance(instance) => deps.instance_router.handle(instance, session, method, params, relay).await,
        }
    }

    /// Who owns sessions made through this target: the caller's (user, team), or the instance.
    pub fn session_owner(&self) -> String {
        match self {
            Target::Hierarchical(caller) | Target::LegacySse(caller) => format!("{}\u{0}{}", caller.user, caller.team),
            Target::Instance(instance) => format!("instance:{}", instance.spec().process_id),
        }
    }
}
