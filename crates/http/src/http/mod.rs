//! The HTTP surface: MCP endpoints, OAuth metadata, status routes, CORS, and
//! the one place where rejections become responses. The only module of the
//! satellite proper that imports warp.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::auth::Authenticator;
use crate::instances::InstanceManager;
use crate::router::{HierarchicalRouter, InstanceRouter};

mod activity;
mod admin_page;
pub mod allow;
pub mod analytics;
mod audit;
mod body;
mod body_deadline;
pub mod callers;
mod credential;
mod dispatch;
pub mod error;
pub mod exchange;
pub mod guard;
pub mod identity;
pub mod mcp;
pub mod oauth;
mod scrape;
pub mod session;
pub mod sse;
pub mod stack;
mod status;
mod toolsets;
mod wakes;

pub use audit::AuthAudit;
pub use error::McpError;

/// Largest accepted request body (SB §3.2).
pub const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;

/// Everything the MCP endpoints (`/mcp`, `/i/{path}/mcp`, `/sse`, `/message`) need, in the parts each step takes.
#[derive(Clone)]
pub struct McpDeps {
    pub routing: Routing,
    pub gate: Gate,
    pub sessions: Sessions,
    pub places: callers::Places,
    pub background: Background,
}

/// Where an MCP request goes: the two routers, the toolsets a bearer caller selects from, and the instances behind
/// them (woken, notified, followed by a session's stream).
#[derive(Clone)]
pub struct Routing {
    pub router: HierarchicalRouter,
    pub instance_router: InstanceRouter,
    /// Which toolset a request selects (`?toolset=`) or defaults to.
    pub toolsets: crate::toolsets::Toolsets,
    pub manager: InstanceManager,
}

/// Who is let in, and what a refusal says: the authenticator, the audit of refused credentials and the URLs a
/// bearer challenge names.
#[derive(Clone)]
pub struct Gate {
    pub auth: Authenticator,
    /// `security.auth.failed` for refused credentials, rate-limited per source.
    pub audit: Arc<audit::AuthAudit>,
    pub urls: oauth::ResourceUrls,
}

/// The session tables: of `/mcp`, of the instance endpoints, of the legacy SSE transport.
#[derive(Clone)]
pub struct Sessions {
    pub mcp: Arc<session::SessionTable>,
    pub instances: Arc<session::SessionTable>,
    pub legacy: Arc<sse::SseSessions>,
}

/// What a request hands on that outlives it: the activity it counts, the events it reports, the work it starts.
#[derive(Clone)]
pub struct Background {
    /// Client activity (SB §17), reported by the `client-activity` job.
    pub activity: Arc<crate::activity::ActivityTracker>,
    /// Where connection events of the legacy SSE transport go.
    pub events: crate::events::Emitter,
    /// Background work a request starts (waking a dormant instance); awaited at shutdown.
    pub tasks: tokio_util::task::TaskTracker,
}

/// What the status routes read.
#[derive(Clone)]
pub struct StatusDeps {
    pub manager: InstanceManager,
    pub jobs: crate::jobs::Jobs,
    pub started: Instant,
    pub debug_route: bool,
    pub show_version: bool,
    pub show_uptime: bool,
    pub mode: &'static str,
    /// Managed mode: what the backend loops last did (`GET /api/status/backend`).
    pub backend: Option<Arc<crate::backend::monitor::BackendMonitor>>,
    /// `/api/analytics` and `/admin`.
    pub analytics: analytics::AnalyticsDeps,
    /// `/metrics` needs this bearer token when set (`SATELLITE_METRICS_TOKEN`).
    pub metrics_token: Option<Arc<secrecy::SecretString>>,
}

/// Every route of the satellite, behind the Host/Origin check.
pub fn routes(
    status: StatusDeps,
    mcp: McpDeps,
    guard: guard::HostGuard,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let metrics = scrape::routes(scrape::ScrapeDeps {
        status: status.clone(),
        sessions: mcp.sessions.mcp.clone(),
        instance_sessions: mcp.sessions.instances.clone(),
        sse_sessions: mcp.sessions.legacy.clone(),
        token: status.metrics_token.clone(),
    })
    .boxed();
    let oauth = oauth::routes(mcp.gate.urls.clone(), mcp.gate.auth.clone());
    let legacy = sse::routes(mcp.clone());
    let toolsets = toolsets::routes(toolsets::ToolsetDeps {
        auth: mcp.gate.auth.clone(),
        toolsets: mcp.routing.toolsets.clone(),
        manager: mcp.routing.manager.clone(),
    });
    // Boxed: the full type of every route combined is too deep for the compiler. CORS opens the MCP and OAuth
    // routes to browser clients; the status routes (the debug route above all) are never readable by a page of
    // another origin.
    // The MCP routes come first (then the rest in order of traffic): warp tries each route in turn, and every
    // try costs a filter future and clones of what the route captures.
    let served = mcp::routes(mcp)
        .boxed()
        .or(oauth.boxed())
        .unify()
        .or(legacy.boxed())
        .unify()
        .with(cors())
        .map(Reply::into_response)
        .boxed();
    // Tried only once warp's CORS refused a preflight: no cost for any request it lets through.
    let served = served.or(param_preflight()).unify().boxed();
    // The admin API is not opened to other origins either: its page is served from here.
    let admin = analytics::routes(status.analytics.clone()).or(toolsets).unify().boxed();
    // Probes and the scrape are asked by infrastructure naming the pod's address: outside the Host guard.
    let open = status::probes(status.clone()).boxed().or(metrics).unify().boxed();
    let all = served.or(status::routes(status).boxed()).unify().or(admin).unify().boxed();
    open.or(guard.filter().and(all)).unify().recover(recover).unify()
}

/// Request headers a browser client of the MCP and OAuth routes may send (CORS).
const CORS_HEADERS: [&str; 9] = [
    "authorization",
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "x-mcp-client-name",
    "mcp-method",
    "mcp-name",
];
const CORS_METHODS: [&str; 4] = ["GET", "POST", "DELETE", "OPTIONS"];

/// OQ-16: permissive CORS with explicit lists; bearer tokens, no cookies.
fn cors() -> warp::cors::Builder {
    warp::cors().allow_any_origin().allow_methods(CORS_METHODS).allow_headers(CORS_HEADERS).expose_headers([
        "mcp-session-id",
        "www-authenticate",
        "link",
    ])
}

/// The preflight of a browser's POST to an MCP endpoint that carries `Mcp-Param-{Name}` headers (2026-07-28: a
/// tool's own header names, known only once it is listed). warp's CORS allows a fixed list of header names, so it
/// would refuse them: answered here with the same policy, the named headers allowed when each is one of the list
/// or a `Mcp-Param-` name. Any other preflight goes on to warp's.
fn param_preflight() -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone {
    // Everything is read inside, and anything else is refused as not found: a rejection of its own (a missing
    // header, another method) would outrank the one the request's real route gives.
    // The method and path first: the headers are copied only for a preflight to an MCP endpoint.
    let mcp_options = warp::method().and(warp::path::full()).and_then(
        |method: warp::http::Method, path: warp::path::FullPath| async move {
            let path = path.as_str();
            let mcp = path == "/mcp" || (path.starts_with("/i/") && path.ends_with("/mcp"));
            if method == warp::http::Method::OPTIONS && mcp {
                Ok(())
            } else {
                Err(warp::reject::not_found())
            }
        },
    );
    mcp_options.untuple_one().and(warp::header::headers_cloned()).and_then(
        |headers: warp::http::HeaderMap| async move { preflight_answer(&headers).ok_or_else(warp::reject::not_found) },
    )
}

fn preflight_answer(headers: &warp::http::HeaderMap) -> Option<warp::reply::Response> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (origin, asked, requested) =
        (headers.get("origin")?, text("access-control-request-method")?, text("access-control-request-headers")?);
    let names: Vec<String> =
        requested.split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect();
    let param = |h: &str| {
        h.strip_prefix(crate::mcp::headers::PARAM_PREFIX)
            .is_some_and(|rest| !rest.is_empty() && warp::http::HeaderName::from_bytes(h.as_bytes()).is_ok())
    };
    let allowed = CORS_METHODS.contains(&asked)
        && names.iter().any(|h| param(h))
        && names.iter().all(|h| CORS_HEADERS.contains(&h.as_str()) || param(h));
    if !allowed {
        return None;
    }
    let mut answer = warp::reply().into_response();
    let out = answer.headers_mut();
    out.insert("access-control-allow-origin", origin.clone());
    out.insert("access-control-allow-methods", warp::http::HeaderValue::from_str(&CORS_METHODS.join(", ")).ok()?);
    out.insert("access-control-allow-headers", warp::http::HeaderValue::from_str(&names.join(", ")).ok()?);
    Some(answer)
}

/// Serve until `shutdown` resolves, then finish in-flight requests.
pub async fn serve(
    listener: TcpListener,
    status: StatusDeps,
    mcp: McpDeps,
    limits: stack::HttpLimits,
    guard: guard::HostGuard,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let metrics = status.manager.metrics().clone();
    stack::serve(listener, routes(status, mcp, guard), limits, metrics, shutdown).await;
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The one place rejections become responses: JSON-RPC error bodies with `id: null`.
async fn recover(rejection: warp::Rejection) -> Result<Response, Infallible> {
    let err = if let Some(guard::Refused(reason)) = rejection.find::<guard::Refused>() {
        McpError::Forbidden(reason.clone())
    } else if rejection.is_not_found() {
        McpError::NotFound
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        McpError::PayloadTooLarge { limit: MAX_BODY_BYTES }
    } else if rejection.find::<warp::reject::LengthRequired>().is_some() {
        McpError::LengthRequired
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        let allow = allow::noted();
        // OPTIONS, where the routes name it among what they take, is answered with what they take.
        if allow::asks_options() && allow.contains(allow::Methods::OPTIONS) {
            let mut answer = warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT).into_response();
            answer.headers_mut().insert(warp::http::header::ALLOW, allow.header());
            return Ok(answer);
        }
        McpError::MethodNotAllowed { allow }
    } else if let Some(err) = rejection.find::<warp::reject::InvalidQuery>() {
        McpError::InvalidQuery(err.to_string())
    } else if rejection.find::<warp::cors::CorsForbidden>().is_some() {
        McpError::CorsForbidden
    } else {
        McpError::BadRequest(format!("{rejection:?}"))
    };
    // No rejection is a bearer failure, so the resource URLs are never read.
    Ok(err.into_response(&oauth::ResourceUrls { public_url: String::new() }))
}

/// A JSON body with a status.
pub fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    warp::reply::with_status(warp::reply::json(body), status).into_response()
}
