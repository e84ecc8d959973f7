//! Where an authenticated MCP request goes: the hierarchical router for a bearer caller (on `/mcp` or a legacy
//! SSE stream), or one instance for the holder of its instance token (`/i/{path}/mcp`).

use std::sync::Arc;

use serde_json::Value;

use super::Routing;
use crate::auth::Principal;
use crate::instances::Instance;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::RpcError;
use crate::mcp::transport::Relay;
use crate::model::Toolset;
use crate::router::RouteError;

/// The toolset a hierarchical request uses (`None`: every tool), or why the one it selects cannot be used
/// (every request but `ping` then gets that error, `initialize` included).
pub type Selection = Result<Option<Arc<Toolset>>, RpcError>;

/// The router behind an endpoint, with the identity it serves.
#[derive(Clone)]
pub enum Target {
    /// `POST /mcp`: the four meta-tools, as this caller, through a toolset.
    Hierarchical(Principal, Selection),
    /// `POST /i/{path}/mcp`: one instance's own tools.
    Instance(Arc<Instance>),
    /// `POST /message` of a legacy SSE stream: the hierarchical router, as the stream's owner, through the
    /// toolset the stream selected.
    LegacySse(Principal, Selection),
}

impl Target {
    /// Route one request method; `relay` carries what the upstream server says meanwhile back to the client.
    /// `session` is the client's MCP session id, when it has one.
    pub async fn dispatch(
        &self,
        routing: &Routing,
        session: Option<&str>,
        method: &str,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        // Checked here, once for both routers: a token of another type would reach no server as it was sent.
        crate::mcp::progress::check_token(params.as_ref()).map_err(RouteError::Rpc)?;
        match self {
            Target::Hierarchical(caller, selection) | Target::LegacySse(caller, selection) => match selection {
                Ok(toolset) => routing.router.handle(caller, toolset.as_ref(), session, method, params, relay).await,
                Err(_) if method == "ping" => Ok(serde_json::json!({}).into()),
                Err(err) => Err(RouteError::Rpc(err.clone())),
            },
            Target::Instance(instance) => {
                routing.instance_router.handle(instance, session, method, params, relay).await
            }
        }
    }

    /// The cache hints of this endpoint's answer to `method` for a 2026-07-28 client (`router::cache_hints`).
    pub fn cache_hints(&self, method: &str) -> crate::mcp::cache::CacheHints {
        match self {
            Target::Instance(instance) => crate::router::cache_hints::for_instance(instance, method),
            Target::Hierarchical(..) | Target::LegacySse(..) => crate::router::cache_hints::for_hierarchical(method),
        }
    }

    /// `tools/list` as JSON text when this endpoint's answer is the same for every caller (the hierarchical
    /// router's meta-tools); `None` for an instance, whose listing is its catalog's, and for a refused toolset.
    pub fn fixed_listing(&self, routing: &Routing, session: Option<&str>) -> Option<Result<&'static str, RouteError>> {
        match self {
            Target::Hierarchical(caller, Ok(_)) | Target::LegacySse(caller, Ok(_)) => {
                Some(routing.router.list_tools_json(caller, session))
            }
            _ => None,
        }
    }

    /// Why the toolset this request selects cannot be used, if it cannot.
    pub fn refused_selection(&self) -> Option<&RpcError> {
        match self {
            Target::Hierarchical(_, Err(err)) | Target::LegacySse(_, Err(err)) => Some(err),
            _ => None,
        }
    }

    /// The toolset this request uses, if any.
    pub fn toolset(&self) -> Option<&Arc<Toolset>> {
        match self {
            Target::Hierarchical(_, Ok(toolset)) | Target::LegacySse(_, Ok(toolset)) => toolset.as_ref(),
            _ => None,
        }
    }

    /// Who owns sessions made through this target: the caller's (user, team), or the instance.
    pub fn session_owner(&self) -> String {
        match self {
            Target::Hierarchical(caller, _) | Target::LegacySse(caller, _) => {
                super::callers::member_key(caller.user.as_str(), caller.team.as_str())
            }
            Target::Instance(instance) => super::session::instance_owner(&instance.spec().process_id),
        }
    }

    /// The member a request through this target is counted against for `max_concurrent_requests_per_caller`: the
    /// caller on `/mcp` and `/message`, the member an instance belongs to on its endpoint.
    pub fn caller(&self) -> std::sync::Arc<str> {
        match self {
            Target::Hierarchical(caller, _) | Target::LegacySse(caller, _) => {
                super::callers::member_key(caller.user.as_str(), caller.team.as_str()).into()
            }
            Target::Instance(instance) => instance.member_key(),
        }
    }

    /// Whose cap of sessions a session made through this target counts against: the caller's, or the member an
    /// instance belongs to (all of one member's instance endpoints share one cap, apart from their `/mcp` one).
    pub fn session_quota(&self) -> String {
        match self {
            // Apart from the member's `/mcp` sessions: a script opening instance sessions must not end those.
            Target::Instance(instance) => {
                format!("instances\u{0}{}\u{0}{}", instance.spec().user_id, instance.spec().team_id)
            }
            _ => self.session_owner(),
        }
    }
}
