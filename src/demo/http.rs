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

impl Shared {
    /// Whether this `initialize` is refused, as the test hook asks of the next ones (counting it).
    fn refuses_initialize(&self) -> bool {
        let ordering = std::sync::atomic::Ordering::SeqCst;
        self.refuse_initialize.fetch_update(ordering, ordering, |n| n.checked_sub(1)).is_ok()
    }
}

fn routes(shared: Arc<Shared>) -> impl Filter<Extract = (Response,), Error = std::convert::Infallible> + Clone {
    let demo_path = warp::path("mcp").and(warp::path::end()).map(String::new);
    let corpus_path = warp::path!("servers" / String / "mcp");
    let endpoint = demo_path.or(corpus_path).unify();

    let post = endpoint
        .and(warp::post())
        .and(warp::header::optional::<String>("mcp-session-id"))
        .and(warp::body::content_length_limit(MAX_BODY))
        .and(warp::body::bytes())
        .and(with_shared(&shared))
        .then(handle_post);
    let delete = endpoint
        .and(warp::delete())
        .and(warp::header::optional::<String>("mcp-session-id"))
        .and(with_shared(&shared))
        .map(delete_session);
    let get = endpoint.and(warp::get()).map(|_slug: String| {
        warp::reply::with_status("server stream not offered", StatusCode::METHOD_NOT_ALLOWED).into_response()
    });
    post.or(delete)
        .unify()
        .or(get)
        .unify()
        .or(forget_sessions(&shared))
        .unify()
        .or(refuse_initialize(&shared))
        .unify()
        .recover(|rejection: warp::Rejection| async move {
            let status = if rejection.is_not_found() { StatusCode::NOT_FOUND } else { StatusCode::BAD_REQUEST };
            Ok::<_, std::convert::Infallible>(
                warp::reply::with_status(format!("{rejection:?}"), status).into_response(),
            )
        })
        .unify()
}

fn with_shared(
    shared: &Arc<Shared>,
) -> impl Filter<Extract = (Arc<Shared>,), Error = std::convert::Infallible> + Clone {
    let shared = shared.clone();
    warp::any().map(move || shared.clone())
}

/// Test hook: forget every session, as a restarted server would.
fn forget_sessions(shared: &Arc<Shared>) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::path!("admin" / "forget-sessions").and(warp::post()).and(with_shared(shared)).map(|shared: Arc<Shared>| {
        let n = shared.sessions.lock().drain().count();
        warp::reply::json(&serde_json::json!({"forgotten": n})).into_response()
    })
}

/// Test hook: refuse the next `n` initialize requests with 503.
fn refuse_initialize(shared: &Arc<Shared>) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    warp::path!("admin" / "refuse-initialize" / usize).and(warp::post()).and(with_shared(shared)).map(
        |n: usize, shared: Arc<Shared>| {
            shared.refuse_initialize.store(n, std::sync::atomic::Ordering::SeqCst);
            warp::reply::json(&serde_json::json!({"refusing": n})).into_response()
        },
    )
}

/// `DELETE`: end the handshake-era session named, 404 when there is none.
fn delete_session(_slug: String, session: Option<String>, shared: Arc<Shared>) -> Response {
    let removed = session.is_some_and(|id| shared.sessions.lock().remove(&id).is_some());
    let status = if removed { StatusCode::OK } else { StatusCode::NOT_FOUND };
    warp::reply::with_status(warp::reply(), status).into_response()
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
    if method == "initialize" && shared.refuses_initialize() {
        return warp::reply::with_status("restarting", StatusCode::SERVICE_UNAVAILABLE).into_response();
    }
    let session = match session_for(&shared, stateless, &method, session_id.as_deref()) {
        Ok(session) => session,
        Err((status, error)) => return json_error(status, id, error),
    };
    match server.handle(value, &session).await {
        Reply::Nothing => warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response(),
        Reply::Initialized { response, version } => open_session(&shared, &response, version),
        Reply::Response(response) => {
            let status = response_status(&response, stateless, &method);
            warp::reply::with_status(warp::reply::json(&response), status).into_response()
        }
    }
}

/// The session a request runs in: the handshake era needs a live session for everything after initialize.
fn session_for(
    shared: &Shared,
    stateless: bool,
    method: &str,
    session_id: Option<&str>,
) -> Result<Session, (StatusCode, RpcError)> {
    if stateless || method == "initialize" || method == "server/discover" {
        return Ok(Session::default());
    }
    let Some(sid) = session_id else {
        return Err((
            StatusCode::BAD_REQUEST,
            RpcError::new(codes::INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required"),
        ));
    };
    let session = shared.sessions.lock().get(sid).cloned();
    session.ok_or_else(|| (StatusCode::NOT_FOUND, RpcError::new(-32001, "Session not found")))
}

/// A successful `initialize`'s answer, with the new session it opens named in `Mcp-Session-Id`.
fn open_session(shared: &Shared, response: &Value, version: String) -> Response {
    let sid = uuid::Uuid::new_v4().to_string();
    shared.sessions.lock().insert(sid.clone(), Session { initialized: true, version: Some(version) });
    let mut reply = warp::reply::json(response).into_response();
    if let Ok(value) = HeaderValue::from_str(&sid) {
        reply.headers_mut().insert("mcp-session-id", value);
    }
    reply
}

/// 2026-07-28 maps protocol errors to HTTP statuses.
fn response_status(response: &Value, stateless: bool, method: &str) -> StatusCode {
    match response.pointer("/error/code").and_then(Value::as_i64) {
        Some(codes::METHOD_NOT_FOUND) if stateless || method == "server/discover" => StatusCode::NOT_FOUND,
        Some(codes::INVALID_PARAMS | codes::UNSUPPORTED_PROTOCOL_VERSION | codes::HEADER_MISMATCH) if stateless => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::OK,
    }
}

fn json_error(status: StatusCode, id: Option<protocol::RequestId>, error: RpcError) -> Response {
    warp::reply::with_status(warp::reply::json(&protocol::error_response(id, error)), status).into_response()
}

/// Slugs of the corpus servers, for logs.
pub fn slugs(servers: &HashMap<String, DemoServer>) -> HashSet<&str> {
    servers.keys().map(String::as_str).collect()
}
