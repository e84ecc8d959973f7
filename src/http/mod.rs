//! The HTTP surface: status routes today; the MCP endpoints plug in here.
//! The only module of the satellite proper that imports warp.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Instant;

use tokio::net::TcpListener;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use crate::instances::InstanceManager;

mod status;

/// What the status routes read.
#[derive(Clone)]
pub struct StatusDeps {
    pub manager: InstanceManager,
    pub started: Instant,
    pub debug_route: bool,
    pub show_version: bool,
    pub show_uptime: bool,
    pub mode: &'static str,
}

/// Every route of the satellite.
pub fn routes(deps: StatusDeps) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    status::routes(deps).recover(recover).unify()
}

/// Serve until `shutdown` resolves, then finish in-flight requests.
pub async fn serve(
    listener: TcpListener,
    deps: StatusDeps,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    warp::serve(routes(deps)).incoming(listener).graceful(shutdown).run().await;
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The one place rejections become responses.
async fn recover(rejection: warp::Rejection) -> Result<Response, Infallible> {
    let (status, error) = if rejection.is_not_found() {
        (StatusCode::NOT_FOUND, "not found")
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        (StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    } else {
        (StatusCode::BAD_REQUEST, "bad request")
    };
    let body = serde_json::json!({"error": error});
    Ok(warp::reply::with_status(warp::reply::json(&body), status).into_response())
}
