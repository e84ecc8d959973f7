//! The demo server over Streamable HTTP (warp). Handshake-era clients get a
//! session (`Mcp-Session-Id`) at initialize; 2026-07-28 requests are
//! stateless. With a corpus, each server slug has its own endpoint.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use warp::http::{HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply as _};

use super::{is_stateless, DemoServer, Reply, Session};
use crate::mcp::protocol::{self, codes, RpcError};

/// Largest request body accepted.
const MAX_BODY: u64 = 4 * 1024 * 1024;

struct Shared {
    /// The demo server at `/mcp`, or one per corpus slug at `/servers/{slug}/mcp`.
    servers: HashMap<String, DemoServer>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Test hook: how many `initialize` requests to come are refused with 503, as a server restarting would.
    refuse_initialize: std::sync::atomic::AtomicUsize,
}

/// Serve `servers` (key "" is `/mcp`) on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    servers: HashMap<String, DemoServer>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let shared =
        Arc::new(Shared { servers, sessions: Mutex::new(HashMap::new()), refuse_initialize: Default::default() });
    warp::serve(routes(shared)).incoming(listener).graceful(shutdown).run().await;
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

fn routes(shared: Arc<Shared>) -> impl Filter<Extract = (Response,), Error = std::convert::Infallible> + Clone {
    let with_shared = {
        let shared = shared.clone();
        warp::any().map(move || shared.clone())
    };
    let demo_path = warp::path("mcp").and(warp::path::end()).map(String::new);
    let corpus_path = warp::path!("servers" / String / "mcp");
    let endpoint = demo_path.or(corpus_path).unify();

    let post = endpoint
        .and(warp::post())
        .and(warp::header::optional::<String>("mcp-session-id"))
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .and(with_shared.clone())
        .then(handle_post);
    let delete = endpoint
        .and(warp::delete())
        .and(warp::header::optional::<String>("mcp-session-id"))
        .and(with_shared.clone())
        .map(|_slug: String, session: Option<String>, shared: Arc<Shared>| {
            let removed = session.is_some_and(|id| shared.sessions.lock().remove(&id).is_some());
            let status = if removed { StatusCode::OK } else { StatusCode::NOT_FOUND };
            warp::reply::with_status(warp::reply(), status).into_response()
        });
    let get = endpoint.and(warp::get()).map(|_slug: String| {
        warp::reply::with_status("server stream not offered", StatusCode::METHOD_NOT_ALLOWED).into_response()
    });
    // Test hook: forget every session, as a restarted server would.
    let forget = warp::path!("admin" / "forget-sessions").and(warp::post()).and(with_shared.clone()).map(
        |shared: Arc<Shared>| {
            let n = shared.sessions.lock().drain().count();
            warp::reply::json(&serde_json::json!({"forgotten": n})).into_response()
        },
    );
    // Test hook: refuse the next `n` initialize requests with 503.
    let refuse = warp::path!("admin" / "refuse-initialize" / usize).and(warp::post()).and(with_shared).map(
        |n: usize, shared: Arc<Shared>| {
            shared.refuse_initialize.store(n, std::sync::atomic::Ordering::SeqCst);
            warp::reply::json(&serde_json::json!({"refusing": n})).into_response()
        },
    );
    post.or(delete)
        .unify()
        .or(get)
        .unify()
        .or(forget)
        .unify()
        .or(refuse)
        .unify()
        .recover(|rejection: warp::Rejection| async move {
            let status = if rejection.is_not_found() { StatusCode::NOT_FOUND } else { StatusCode::BAD_REQUEST };
            Ok::<_, std::convert::Infallible>(
                warp::reply::with_status(format!("{rejection:?}"), status).into_response(),
            )
        })
        .unify()
}

async fn handle_post(slug: String, session_id: Option<String>, body: bytes::Bytes, shared: Arc<Shared>) -> Response {
    let Some(server) = shared.servers.get(&slug).cloned() else {
        return json_error(
            StatusCode::NOT_FOUND,
            None,
            RpcError::new(codes::METHOD_NOT_FOUND, format!("no server {slug:?}")),
        );
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(err) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                None,
                RpcError::new(codes::PARSE_ERROR, format!("Parse error: {err}")),
            )
        }
    };
    let method = value.get("method").and_then(Value::as_str).unwrap_or("").to_owned();
    let id = value.get("id").cloned().and_then(|id| serde_json::from_value(id).ok());
    let stateless = is_stateless(&method, value.get("params"));

    if method == "initialize" {
        let refused = shared.refuse_initialize.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| n.checked_sub(1),
        );
        if refused.is_ok() {
            return warp::reply::with_status("restarting", StatusCode::SERVICE_UNAVAILABLE).into_response();
        }
    }
    // The handshake era needs a live session for everything after initialize.
    let session = if stateless || method == "initialize" || method == "server/discover" {
        Session::default()
    } else {
        match session_id.as_ref() {
            None => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    id,
                    RpcError::new(codes::INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required"),
                )
            }
            Some(sid) => match shared.sessions.lock().get(sid).cloned() {
                Some(session) => session,
                None => return json_error(StatusCode::NOT_FOUND, id, RpcError::new(-32001, "Session not found")),
            },
        }
    };
    match server.handle(value, &session).await {
        Reply::Nothing => warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response(),
        Reply::Initialized { response, version } => {
            let sid = uuid::Uuid::new_v4().to_string();
            shared.sessions.lock().insert(sid.clone(), Session { initialized: true, version: Some(version) });
            let mut reply = warp::reply::json(&response).into_response();
            if let Ok(value) = HeaderValue::from_str(&sid) {
                reply.headers_mut().insert("mcp-session-id", value);
            }
            reply
        }
        Reply::Response(response) => {
            // 2026-07-28 maps protocol errors to HTTP statuses.
            let status = match response.pointer("/error/code").and_then(Value::as_i64) {
                Some(codes::METHOD_NOT_FOUND) if stateless || method == "server/discover" => StatusCode::NOT_FOUND,
                Some(codes::INVALID_PARAMS | codes::UNSUPPORTED_PROTOCOL_VERSION | codes::HEADER_MISMATCH)
                    if stateless =>
                {
                    StatusCode::BAD_REQUEST
                }
                _ => StatusCode::OK,
            };
            warp::reply::with_status(warp::reply::json(&response), status).into_response()
        }
    }
}

fn json_error(status: StatusCode, id: Option<protocol::RequestId>, error: RpcError) -> Response {
    warp::reply::with_status(warp::reply::json(&protocol::error_response(id, error)), status).into_response()
}

/// Slugs of the corpus servers, for logs.
pub fn slugs(servers: &HashMap<String, DemoServer>) -> HashSet<&str> {
    servers.keys().map(String::as_str).collect()
}
