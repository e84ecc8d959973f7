//! The HTTP surface: MCP endpoints, OAuth metadata, status routes, CORS, and
//! the one place where rejections become responses. The only module of the
//! satellite proper that imports warp.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Instant;

use tokio::net::TcpListener;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::instances::InstanceManager;
use crate::mcp::protocol::{self, codes, RpcError};

pub mod mcp;
pub mod oauth;
pub mod session;
pub mod sse;
pub mod stack;
mod status;

pub use mcp::McpDeps;

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
}

/// Every route of the satellite.
pub fn routes(status: StatusDeps, mcp: McpDeps) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let oauth = oauth::routes(mcp.urls.clone(), mcp.auth.clone());
    let legacy = sse::routes(mcp.clone(), mcp.sse_sessions.clone());
    status::routes(status)
        .or(oauth)
        .unify()
        .or(legacy)
        .unify()
        .or(mcp::routes(mcp))
        .unify()
        .with(cors())
        .map(Reply::into_response)
        .recover(recover)
        .unify()
}

/// OQ-16: permissive CORS with explicit lists; bearer tokens, no cookies.
fn cors() -> warp::cors::Builder {
    warp::cors()
        .allow_any_origin()
        .allow_methods(["GET", "POST", "DELETE", "OPTIONS"])
        .allow_headers([
            "authorization",
            "content-type",
            "accept",
            "mcp-session-id",
            "mcp-protocol-version",
            "last-event-id",
            "x-mcp-client-name",
            "mcp-method",
            "mcp-name",
        ])
        .expose_headers(["mcp-session-id", "www-authenticate", "link"])
}

/// Serve until `shutdown` resolves, then finish in-flight requests.
pub async fn serve(
    listener: TcpListener,
    status: StatusDeps,
    mcp: McpDeps,
    limits: stack::HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    stack::serve(listener, routes(status, mcp), limits, shutdown).await;
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The one place rejections become responses: JSON-RPC error bodies with `id: null`.
async fn recover(rejection: warp::Rejection) -> Result<Response, Infallible> {
    let (status, code, message) = if rejection.is_not_found() {
        (StatusCode::NOT_FOUND, -32000, "Not Found".to_owned())
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            codes::INVALID_REQUEST,
            format!("Request body larger than {} bytes", mcp::MAX_BODY_BYTES),
        )
    } else if rejection.find::<warp::reject::LengthRequired>().is_some() {
        (StatusCode::LENGTH_REQUIRED, codes::INVALID_REQUEST, "Content-Length required".to_owned())
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        (StatusCode::METHOD_NOT_ALLOWED, -32000, "Method Not Allowed".to_owned())
    } else if let Some(err) = rejection.find::<warp::reject::InvalidQuery>() {
        (StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, format!("Invalid query: {err}"))
    } else if rejection.find::<warp::cors::CorsForbidden>().is_some() {
        (StatusCode::FORBIDDEN, -32000, "CORS request forbidden".to_owned())
    } else {
        (StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, format!("Bad Request: {rejection:?}"))
    };
    let body = protocol::error_response(None, RpcError::new(code, message));
    Ok(warp::reply::with_status(warp::reply::json(&body), status).into_response())
}
