//! The tower stack around the warp routes, and the accept loop that serves it.
//!
//! Each request gets an `x-request-id` (kept when the client sent one) and a
//! tracing span carrying it; a deadline; and a place under a global
//! concurrency limit, refused at once with 503 when the satellite is full
//! (load shedding) rather than queued without bound. Shutdown stops accepting,
//! then lets open connections finish their in-flight requests.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::{debug, info_span};
use warp::http::Request;
use warp::reply::Response;
use warp::Filter;

use super::McpError;

/// The TCP peer of the connection a request came on (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// Limits of the HTTP stack.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Requests handled at once; more are refused with 503.
    pub max_concurrent_requests: usize,
    /// Until the response starts (an SSE stream, once started, is not cut).
    pub request_timeout: Duration,
}

fn overload_response(err: &BoxError) -> Response {
    let refusal = if err.is::<tower::load_shed::error::Overloaded>() {
        McpError::Overloaded
    } else if err.is::<tower::timeout::error::Elapsed>() {
        McpError::GatewayTimeout
    } else {
        McpError::Internal
    };
    // Not a bearer failure, so the resource URLs are never read.
    refusal.into_response(&super::oauth::ResourceUrls { public_url: String::new() })
}

/// Serve `routes` behind the tower stack until `shutdown` resolves, then drain open connections.
pub async fn serve<F>(
    listener: TcpListener,
    routes: F,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) where
    F: Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static,
{
    // Shared by every connection: one limit for the whole satellite.
    let limited = ServiceBuilder::new()
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(limits.max_concurrent_requests))
        .timeout(limits.request_timeout)
        .service(warp::service(routes));
    let rescued = tower::service_fn(move |request: Request<hyper::body::Incoming>| {
        let inner = limited.clone();
        async move {
            let outcome = match ServiceExt::<Request<hyper::body::Incoming>>::ready_oneshot(inner).await {
                Ok(ready) => ready.oneshot(request).await,
                Err(err) => Err(err),
            };
            Ok::<Response, Infallible>(outcome.unwrap_or_else(|err| overload_response(&err)))
        }
    });
    let service = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request<hyper::body::Incoming>| {
            let request_id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
            info_span!("http", method = %request.method(), path = %request.uri().path(), request_id = %request_id)
        }))
        .layer(PropagateRequestIdLayer::x_request_id())
        .service(rescued);

    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    debug!(error = %err, "accept failed");
                    // Out of descriptors and similar: give the system a moment instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Every request of the connection carries the peer's address, for client tracking and audit events.
        let with_peer = service.clone().map_request(move |mut request: Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(PeerAddr(peer));
            request
        });
        let connection_service = TowerToHyperService::new(with_peer);
        let builder = auto::Builder::new(TokioExecutor::new());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), connection_service).into_owned();
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = watched.await {
                debug!(error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
