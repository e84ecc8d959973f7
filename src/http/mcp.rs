//! The MCP endpoints over Streamable HTTP: `/mcp` (hierarchical router, bearer
//! auth) and `/i/{instance_path}/mcp` (instance router, instance token). One
//! handler serves both protocol eras on the same URL: handshake-era clients
//! get a session at `initialize`; 2026-07-28 requests are stateless and carry
//! their version in `_meta` and `MCP-Protocol-Version`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::StreamExt;
use serde_json::{json, Value};
use warp::http::{HeaderMap, HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use super::oauth::{auth_error_response, instance_auth_error_response, json_response, ResourceUrls};
use super::session::{Lookup, SessionTable, StreamError};
use crate::auth::{self, Authenticator, InstanceAuthError};
use crate::instances::InstanceManager;
use crate::mcp::protocol::{self, codes, Message, RpcError, LEGACY_VERSIONS, MODERN_VERSION};
use crate::router::{HierarchicalRouter, InstanceRouter, RouteError};

/// Largest accepted request body (SB §3.2).
pub const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// Comment written on idle server streams.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// Handshake versions accepted at `initialize` (oldest first); the last is answered when the client's is unknown.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", LEGACY_VERSIONS[0], LEGACY_VERSIONS[1], LEGACY_VERSIONS[2]];

type DispatchFn = Arc<dyn Fn(String, Option<Value>) -> BoxFuture<'static, Result<Value, RouteError>> + Send + Sync>;

/// Everything the MCP routes need.
#[derive(Clone)]
pub struct McpDeps {
    pub router: HierarchicalRouter,
    pub instance_router: InstanceRouter,
    pub manager: InstanceManager,
    pub auth: Authenticator,
    pub urls: ResourceUrls,
    pub sessions: Arc<SessionTable>,
    pub instance_sessions: Arc<SessionTable>,
    pub sse_sessions: Arc<super::sse::SseSessions>,
    /// Client activity (SB §17), reported by the `client-activity` job.
    pub activity: Arc<crate::activity::ActivityTracker>,
    /// Where connection events of the legacy SSE transport go.
    pub events: crate::events::Emitter,
}

/// One authenticated caller on one endpoint.
struct Endpoint {
    sessions: Arc<SessionTable>,
    owner: String,
    dispatch: DispatchFn,
    urls: ResourceUrls,
    /// (user, team) of an instance-router caller, for activity tracking.
    user_team: (String, String),
}

/// Count one request of a tracked client (SB §17); `tools/call` anywhere in the body counts as a tool call.
fn record_activity(
    deps: &McpDeps,
    headers: &HeaderMap,
    body: Option<&[u8]>,
    user_team: &(String, String),
    client_id: &str,
    auth_type: &str,
) {
    let tool_call = body.is_some_and(crate::activity::is_tool_call);
    deps.activity.record(&crate::activity::Seen {
        user_id: &user_team.0,
        team_id: &user_team.1,
        client_id,
        auth_type,
        client_name_header: header(headers, "x-mcp-client-name"),
        user_agent: header(headers, "user-agent"),
        session_id: header(headers, "mcp-session-id"),
        forwarded_for: header(headers, "x-forwarded-for"),
        real_ip: header(headers, "x-real-ip"),
        tool_call,
    });
}

pub fn routes(deps: McpDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let with = warp::any().map(move || deps.clone());
    let body = warp::body::content_length_limit(MAX_BODY_BYTES).and(warp::body::bytes());

    let hier = warp::path("mcp").and(warp::path::end());
    let hier_post = hier.and(warp::post()).and(warp::header::headers_cloned()).and(body).and(with.clone()).then(
        |headers: HeaderMap, body: Bytes, deps: McpDeps| async move {
            match hierarchical_endpoint(&deps, &headers, Some(&body)).await {
                Ok(endpoint) => with_link(post(endpoint, &headers, &body).await, &deps.urls),
                Err(response) => *response,
            }
        },
    );
    let hier_get = hier.and(warp::get()).and(warp::header::headers_cloned()).and(with.clone()).then(
        |headers: HeaderMap, deps: McpDeps| async move {
            match hierarchical_endpoint(&deps, &headers, None).await {
                Ok(endpoint) => with_link(open_stream(endpoint, &headers), &deps.urls),
                Err(response) => *response,
            }
        },
    );
    let hier_delete = hier.and(warp::delete()).and(warp::header::headers_cloned()).and(with.clone()).then(
        |headers: HeaderMap, deps: McpDeps| async move {
            match hierarchical_endpoint(&deps, &headers, None).await {
                Ok(endpoint) => with_link(delete(endpoint, &headers), &deps.urls),
                Err(response) => *response,
            }
        },
    );

    let inst = warp::path!("i" / String / "mcp").and(warp::query::<HashMap<String, String>>());
    let inst_post = inst.and(warp::post()).and(warp::header::headers_cloned()).and(body).and(with.clone()).then(
        |path: String, query: HashMap<String, String>, headers: HeaderMap, body: Bytes, deps: McpDeps| async move {
            match instance_endpoint(&deps, &path, &query, &headers) {
                Ok(endpoint) => {
                    record_activity(
                        &deps,
                        &headers,
                        Some(&body),
                        &endpoint.user_team,
                        &format!("instance:{path}"),
                        "instance_token",
                    );
                    post(endpoint, &headers, &body).await
                }
                Err(response) => *response,
            }
        },
    );
    let inst_get = inst.and(warp::get()).and(warp::header::headers_cloned()).and(with.clone()).map(
        |path: String, query: HashMap<String, String>, headers: HeaderMap, deps: McpDeps| match instance_endpoint(
            &deps, &path, &query, &headers,
        ) {
            Ok(endpoint) => open_stream(endpoint, &headers),
            Err(response) => *response,
        },
    );
    let inst_delete = inst.and(warp::delete()).and(warp::header::headers_cloned()).and(with).map(
        |path: String, query: HashMap<String, String>, headers: HeaderMap, deps: McpDeps| match instance_endpoint(
            &deps, &path, &query, &headers,
        ) {
            Ok(endpoint) => delete(endpoint, &headers),
            Err(response) => *response,
        },
    );
    hier_post
        .or(hier_get)
        .unify()
        .or(hier_delete)
        .unify()
        .or(inst_post)
        .unify()
        .or(inst_get)
        .unify()
        .or(inst_delete)
        .unify()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn with_link(mut response: Response, urls: &ResourceUrls) -> Response {
    response.headers_mut().insert("link", HeaderValue::from_static(urls.link_header()));
    response
}

async fn hierarchical_endpoint(
    deps: &McpDeps,
    headers: &HeaderMap,
    body: Option<&[u8]>,
) -> Result<Endpoint, Box<Response>> {
    let principal = deps
        .auth
        .authenticate_request(header(headers, "authorization"))
        .await
        .map_err(|err| Box::new(auth_error_response(&err, &deps.urls)))?;
    if let Some(client) = &principal.client_id {
        let user_team = (principal.user.0.clone(), principal.team.0.clone());
        record_activity(deps, headers, body, &user_team, client, "oauth");
    }
    let owner = format!("{}\u{0}{}", principal.user, principal.team);
    let router = deps.router.clone();
    let dispatch: DispatchFn = Arc::new(move |method, params| {
        let router = router.clone();
        let principal = principal.clone();
        Box::pin(async move { router.handle(&principal, &method, params).await })
    });
    Ok(Endpoint {
        sessions: deps.sessions.clone(),
        owner,
        dispatch,
        urls: deps.urls.clone(),
        user_team: (String::new(), String::new()),
    })
}

fn instance_endpoint(
    deps: &McpDeps,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Endpoint, Box<Response>> {
    let instance = deps
        .manager
        .by_instance_path(path)
        .ok_or_else(|| Box::new(instance_auth_error_response(&InstanceAuthError::NotFound)))?;
    let token = query.get("token").map(String::as_str).or_else(|| auth::bearer(header(headers, "authorization")));
    auth::check_instance_token(instance.spec(), token).map_err(|err| Box::new(instance_auth_error_response(&err)))?;
    if instance.is_dormant() {
        // Any instance-router request (initialize first) wakes a dormant process ahead of the calls (SB §9.8).
        let (manager, dormant) = (deps.manager.clone(), instance.clone());
        tokio::spawn(async move {
            if let Err(err) = manager.wake(&dormant).await {
                tracing::warn!(process_id = %dormant.spec().process_id, error = %err, "waking a dormant instance failed");
            }
        });
    }
    let owner = format!("instance:{}", instance.spec().process_id);
    let user_team = (instance.spec().user_id.0.clone(), instance.spec().team_id.0.clone());
    let router = deps.instance_router.clone();
    let dispatch: DispatchFn = Arc::new(move |method, params| {
        let router = router.clone();
        let instance = instance.clone();
        Box::pin(async move { router.handle(&instance, &method, params).await })
    });
    Ok(Endpoint { sessions: deps.instance_sessions.clone(), owner, dispatch, urls: deps.urls.clone(), user_team })
}

fn rpc_error(status: StatusCode, code: i64, message: &str) -> Response {
    json_response(status, &protocol::error_response(None, RpcError::new(code, message)))
}

fn accepts(headers: &HeaderMap, mime: &str) -> bool {
    header(headers, "accept").is_some_and(|a| {
        a.split(',').any(|part| {
            let part = part.split(';').next().unwrap_or("").trim();
            part.eq_ignore_ascii_case(mime) || part == "*/*"
        })
    })
}

fn initialize_result(requested: Option<&str>) -> (String, Value) {
    let version = requested.filter(|v| HANDSHAKE_VERSIONS.contains(v)).unwrap_or(LEGACY_VERSIONS[2]).to_owned();
    let result = json!({
        "protocolVersion": version,
        "capabilities": {"tools": {}, "resources": {}},
        "serverInfo": server_info(),
        "instructions": "Find tools with discover_mcp_tools (1-3 keywords), then run them with execute_mcp_tool.",
    });
    (version, result)
}

fn server_info() -> Value {
    json!({"name": "deploystack-satellite", "version": env!("CARGO_PKG_VERSION")})
}

async fn post(endpoint: Endpoint, headers: &HeaderMap, body: &Bytes) -> Response {
    let content_type = header(headers, "content-type").unwrap_or("");
    if !content_type.trim().to_ascii_lowercase().starts_with("application/json") {
        return rpc_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            -32000,
            "Unsupported Media Type: Content-Type must be application/json",
        );
    }
    if !(accepts(headers, "application/json") && accepts(headers, "text/event-stream")) {
        return rpc_error(
            StatusCode::NOT_ACCEPTABLE,
            -32000,
            "Not Acceptable: Client must accept both application/json and text/event-stream",
        );
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(err) => return rpc_error(StatusCode::BAD_REQUEST, codes::PARSE_ERROR, &format!("Parse error: {err}")),
    };
    let (messages, batch) = match value {
        Value::Array(items) if items.is_empty() => {
            return rpc_error(StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, "Invalid Request: empty batch")
        }
        Value::Array(items) => (items, true),
        single => (vec![single], false),
    };
    let header_version = header(headers, "mcp-protocol-version").map(str::to_owned);
    let stateless = header_version.as_deref() == Some(MODERN_VERSION)
        || messages.iter().any(|m| {
            m.get("method").and_then(Value::as_str) != Some("initialize")
                && protocol::has_stateless_envelope(m.get("params"))
        });
    if stateless {
        return stateless_post(&endpoint, header_version.as_deref(), messages, batch).await;
    }

    let is_initialize = |m: &Value| m.get("method").and_then(Value::as_str) == Some("initialize");
    let has_init = messages.iter().any(is_initialize);
    if has_init && messages.len() > 1 {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            codes::INVALID_REQUEST,
            "Invalid Request: initialize must not be batched with other messages",
        );
    }
    if let Some(version) = header_version.as_deref().filter(|_| !has_init) {
        if !HANDSHAKE_VERSIONS.contains(&version) {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                -32000,
                &format!("Bad Request: Unsupported protocol version: {version}"),
            );
        }
    }
    let supplied = header(headers, "mcp-session-id").map(str::to_owned);
    let mut new_session: Option<(String, Value)> = None;
    let session_id = if has_init {
        if let Some(id) = &supplied {
            if endpoint.sessions.touch(id, &endpoint.owner) == Lookup::Known {
                return rpc_error(
                    StatusCode::BAD_REQUEST,
                    codes::INVALID_REQUEST,
                    "Invalid Request: Server already initialized",
                );
            }
        }
        let requested = messages[0].pointer("/params/protocolVersion").and_then(Value::as_str);
        let (version, result) = initialize_result(requested);
        let id = endpoint.sessions.create(&endpoint.owner, &version);
        new_session = Some((id.clone(), result));
        id
    } else {
        match supplied {
            Some(id) => {
                if endpoint.sessions.touch(&id, &endpoint.owner) == Lookup::Unknown {
                    // A client surviving a satellite restart, an expiry, or presenting someone else's id.
                    let version = header_version.clone().unwrap_or_else(|| LEGACY_VERSIONS[0].to_owned());
                    endpoint.sessions.resurrect(&id, &endpoint.owner, &version);
                }
                id
            }
            None => return rpc_error(StatusCode::BAD_REQUEST, -32000, "Bad Request: No session ID provided"),
        }
    };

    let mut replies = Vec::new();
    for message in messages {
        let reply = match Message::from_value(message) {
            Err(err) => Some(protocol::error_response(
                None,
                RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {err}")),
            )),
            Ok(Message::Request { id, method, .. }) if method == "initialize" => {
                let result = new_session.as_ref().map(|(_, r)| r.clone()).unwrap_or_else(|| initialize_result(None).1);
                Some(protocol::response(id, result))
            }
            Ok(Message::Request { id, method, params }) => match (endpoint.dispatch)(method, params).await {
                Ok(result) => Some(protocol::response(id, result)),
                Err(RouteError::Rpc(err)) => Some(protocol::error_response(Some(id), err)),
                Err(RouteError::Forbidden(err)) => return auth_error_response(&err, &endpoint.urls),
            },
            Ok(Message::Notification { .. } | Message::Response { .. }) => None,
        };
        replies.extend(reply);
    }
    let mut response = if replies.is_empty() {
        warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response()
    } else if batch {
        json_response(StatusCode::OK, &Value::Array(replies))
    } else {
        json_response(StatusCode::OK, &replies.remove(0))
    };
    if let Ok(value) = HeaderValue::from_str(&session_id) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    response
}

/// 2026-07-28: every request stands alone; no session is created or read.
async fn stateless_post(
    endpoint: &Endpoint,
    header_version: Option<&str>,
    messages: Vec<Value>,
    batch: bool,
) -> Response {
    let mut replies = Vec::new();
    let mut status = StatusCode::OK;
    for message in messages {
        let (id, method, params) = match Message::from_value(message) {
            Err(err) => {
                replies.push(protocol::error_response(
                    None,
                    RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {err}")),
                ));
                continue;
            }
            Ok(Message::Request { id, method, params }) => (id, method, params),
            Ok(_) => continue,
        };
        let outcome = match check_envelope(header_version, params.as_ref()) {
            Err(err) => Err(RouteError::Rpc(err)),
            Ok(()) if method == "server/discover" => Ok(json!({
                "supportedVersions": SUPPORTED_VERSIONS,
                "capabilities": {"tools": {}, "resources": {}},
                "instructions": "Find tools with discover_mcp_tools (1-3 keywords), then run them with execute_mcp_tool.",
            })),
            Ok(()) if method == "initialize" => Err(RouteError::Rpc(RpcError::new(
                codes::INVALID_REQUEST,
                "initialize is not part of 2026-07-28; send requests with _meta instead",
            ))),
            Ok(()) => (endpoint.dispatch)(method.clone(), params).await,
        };
        match outcome {
            Ok(mut result) => {
                protocol::stamp_stateless_result(&mut result, &method, server_info());
                replies.push(protocol::response(id, result));
            }
            Err(RouteError::Forbidden(err)) => return auth_error_response(&err, &endpoint.urls),
            Err(RouteError::Rpc(err)) => {
                if !batch {
                    status = match err.code {
                        codes::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
                        codes::INVALID_PARAMS
                        | codes::HEADER_MISMATCH
                        | codes::UNSUPPORTED_PROTOCOL_VERSION
                        | codes::INVALID_REQUEST => StatusCode::BAD_REQUEST,
                        _ => StatusCode::OK,
                    };
                }
                replies.push(protocol::error_response(Some(id), err));
            }
        }
    }
    match (replies.len(), batch) {
        (0, _) => warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response(),
        (_, true) => json_response(StatusCode::OK, &Value::Array(replies)),
        (_, false) => json_response(status, &replies.remove(0)),
    }
}

/// Versions a 2026-07-28 client is told the satellite speaks.
const SUPPORTED_VERSIONS: [&str; 4] = [MODERN_VERSION, LEGACY_VERSIONS[2], LEGACY_VERSIONS[1], LEGACY_VERSIONS[0]];

fn check_envelope(header_version: Option<&str>, params: Option<&Value>) -> Result<(), RpcError> {
    protocol::check_stateless_envelope(header_version, params, &SUPPORTED_VERSIONS)
}

fn open_stream(endpoint: Endpoint, headers: &HeaderMap) -> Response {
    if header(headers, "mcp-protocol-version") == Some(MODERN_VERSION) {
        return warp::reply::with_status("2026-07-28 has no server stream", StatusCode::METHOD_NOT_ALLOWED)
            .into_response();
    }
    let Some(id) = header(headers, "mcp-session-id") else {
        return warp::reply::with_status("Invalid or missing session ID", StatusCode::BAD_REQUEST).into_response();
    };
    if !accepts(headers, "text/event-stream") {
        return rpc_error(StatusCode::NOT_ACCEPTABLE, -32000, "Not Acceptable: Client must accept text/event-stream");
    }
    let token = match endpoint.sessions.open_stream(id, &endpoint.owner) {
        Ok(token) => token,
        Err(StreamError::NoSession) => {
            return warp::reply::with_status("Invalid or missing session ID", StatusCode::BAD_REQUEST).into_response()
        }
        Err(StreamError::AlreadyOpen) => {
            return rpc_error(StatusCode::CONFLICT, -32000, "Conflict: Only one SSE stream is allowed per session")
        }
    };
    // The satellite sends no server-initiated messages; the stream carries pings until the session ends.
    let events = futures::stream::once(async move { token.cancelled().await })
        .filter_map(|_| async { None::<Result<warp::sse::Event, Infallible>> });
    let stream = warp::sse::keep_alive().interval(PING_INTERVAL).text("ping").stream(events);
    let mut response = warp::sse::reply(stream).into_response();
    if let Ok(value) = HeaderValue::from_str(id) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    response
}

fn delete(endpoint: Endpoint, headers: &HeaderMap) -> Response {
    match header(headers, "mcp-session-id") {
        Some(id) if endpoint.sessions.remove(id, &endpoint.owner) => {
            warp::reply::with_status(warp::reply(), StatusCode::OK).into_response()
        }
        _ => warp::reply::with_status("Invalid or missing session ID", StatusCode::BAD_REQUEST).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_errors_follow_2026_07_28() {
        let meta = |v: &str| json!({"_meta": {"io.modelcontextprotocol/protocolVersion": v, "io.modelcontextprotocol/clientCapabilities": {}}});
        assert_eq!(check_envelope(Some(MODERN_VERSION), Some(&meta(MODERN_VERSION))), Ok(()));
        assert_eq!(check_envelope(None, Some(&json!({}))).unwrap_err().code, codes::INVALID_PARAMS);
        assert_eq!(
            check_envelope(Some("2025-06-18"), Some(&meta(MODERN_VERSION))).unwrap_err().code,
            codes::HEADER_MISMATCH
        );
        let unsupported = check_envelope(None, Some(&meta("1900-01-01"))).unwrap_err();
        assert_eq!(unsupported.code, codes::UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(unsupported.data.unwrap()["requested"], "1900-01-01");
    }

    #[test]
    fn initialize_echoes_supported_versions_only() {
        assert_eq!(initialize_result(Some("2025-03-26")).0, "2025-03-26");
        assert_eq!(initialize_result(Some("2024-11-05")).0, "2024-11-05");
        assert_eq!(initialize_result(Some("1999-01-01")).0, "2025-11-25");
        assert_eq!(initialize_result(None).0, "2025-11-25");
    }
}
