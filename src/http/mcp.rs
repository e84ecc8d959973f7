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
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_stream::wrappers::BroadcastStream;
use warp::http::{HeaderMap, HeaderValue, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use super::audit::finish;
use super::dispatch::{Selection, Target};
use super::error::{rpc_status, McpError};
use super::exchange::{is_parked_state, response_message, Answer, Mode};
use super::identity::Identity;
use super::oauth::ResourceUrls;
use super::session::{self, Lookup, SessionTable, StreamError};
use super::stack::PeerAddr;
use super::{json_response, McpDeps, MAX_BODY_BYTES};
use crate::auth;
use crate::mcp::protocol::{self, codes, FrameError, Message, RpcError, LEGACY_VERSIONS, MODERN_VERSION};
use crate::router::RouteError;

/// Comment written on idle server streams.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// Handshake versions accepted at `initialize` (oldest first); the last is answered when the client's is unknown.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", LEGACY_VERSIONS[0], LEGACY_VERSIONS[1], LEGACY_VERSIONS[2]];

/// One authenticated caller on one endpoint: the router it reaches and the session table it uses.
struct Endpoint {
    target: Target,
    sessions: Arc<SessionTable>,
    owner: String,
}

impl Endpoint {
    fn new(target: Target, sessions: Arc<SessionTable>) -> Self {
        Self { owner: target.session_owner(), target, sessions }
    }
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
    let peer = warp::ext::optional::<PeerAddr>();

    // `?toolset=NAME` selects a toolset (docs/toolsets.md); any other query parameter is ignored.
    let hier = warp::path("mcp")
        .and(warp::path::end())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify().map(|raw: String| toolset_param(&raw)));
    let hier_post =
        hier.and(warp::post()).and(warp::header::headers_cloned()).and(body).and(peer).and(with.clone()).then(
            |toolset: Option<String>, headers: HeaderMap, body: Bytes, peer: Option<PeerAddr>, deps: McpDeps| async move {
                let answer = match hierarchical_endpoint(&deps, &headers, Some(&body), toolset.as_deref()).await {
                    Ok(endpoint) => post(&deps, endpoint, &headers, &body).await,
                    Err(err) => Err(err),
                };
                with_link(finish(&deps, "mcp", peer, &headers, None, answer).await, &deps.urls)
            },
        );
    let hier_get = hier.and(warp::get()).and(warp::header::headers_cloned()).and(peer).and(with.clone()).then(
        |toolset: Option<String>, headers: HeaderMap, peer: Option<PeerAddr>, deps: McpDeps| async move {
            let answer = hierarchical_endpoint(&deps, &headers, None, toolset.as_deref())
                .await
                .and_then(|e| open_stream(&deps, e, &headers));
            with_link(finish(&deps, "mcp", peer, &headers, None, answer).await, &deps.urls)
        },
    );
    let hier_delete = hier.and(warp::delete()).and(warp::header::headers_cloned()).and(peer).and(with.clone()).then(
        |toolset: Option<String>, headers: HeaderMap, peer: Option<PeerAddr>, deps: McpDeps| async move {
            let answer = hierarchical_endpoint(&deps, &headers, None, toolset.as_deref())
                .await
                .and_then(|e| delete(e, &headers));
            with_link(finish(&deps, "mcp", peer, &headers, None, answer).await, &deps.urls)
        },
    );

    let inst = warp::path!("i" / String / "mcp").and(warp::query::<HashMap<String, String>>());
    let inst_post =
        inst.and(warp::post()).and(warp::header::headers_cloned()).and(body).and(peer).and(with.clone()).then(
            |path: String,
             query: HashMap<String, String>,
             headers: HeaderMap,
             body: Bytes,
             peer: Option<PeerAddr>,
             deps: McpDeps| async move {
                let answer = match instance_endpoint(&deps, &path, &query, &headers) {
                    Ok(endpoint) => {
                        if let Target::Instance(instance) = &endpoint.target {
                            let spec = instance.spec();
                            let user_team = (spec.user_id.0.clone(), spec.team_id.0.clone());
                            let client_id = format!("instance:{path}");
                            record_activity(&deps, &headers, Some(&body), &user_team, &client_id, "instance_token");
                        }
                        post(&deps, endpoint, &headers, &body).await
                    }
                    Err(err) => Err(err),
                };
                finish(&deps, "instance", peer, &headers, query.get("token").map(String::as_str), answer).await
            },
        );
    let inst_get =
        inst.and(warp::get()).and(warp::header::headers_cloned()).and(peer).and(with.clone()).then(
            |path: String,
             query: HashMap<String, String>,
             headers: HeaderMap,
             peer: Option<PeerAddr>,
             deps: McpDeps| async move {
                let answer =
                    instance_endpoint(&deps, &path, &query, &headers).and_then(|e| open_stream(&deps, e, &headers));
                finish(&deps, "instance", peer, &headers, query.get("token").map(String::as_str), answer).await
            },
        );
    let inst_delete =
        inst.and(warp::delete()).and(warp::header::headers_cloned()).and(peer).and(with).then(
            |path: String,
             query: HashMap<String, String>,
             headers: HeaderMap,
             peer: Option<PeerAddr>,
             deps: McpDeps| async move {
                let answer = instance_endpoint(&deps, &path, &query, &headers).and_then(|e| delete(e, &headers));
                finish(&deps, "instance", peer, &headers, query.get("token").map(String::as_str), answer).await
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
    toolset: Option<&str>,
) -> Result<Endpoint, McpError> {
    let principal = deps.auth.authenticate_request(header(headers, "authorization")).await.map_err(McpError::Auth)?;
    if let Some(client) = &principal.client_id {
        let user_team = (principal.user.0.clone(), principal.team.0.clone());
        record_activity(deps, headers, body, &user_team, client, "oauth");
    }
    let selection = select_toolset(deps, &principal, toolset);
    Ok(Endpoint::new(Target::Hierarchical(principal, selection), deps.sessions.clone()))
}

/// The `toolset` parameter of a query string, decoded.
pub(super) fn toolset_param(raw: &str) -> Option<String> {
    url::form_urlencoded::parse(raw.as_bytes()).find(|(key, _)| key == "toolset").map(|(_, value)| value.into_owned())
}

/// The toolset a request of `caller` uses, or the JSON-RPC error that says why the one it selects cannot be.
pub(super) fn select_toolset(deps: &McpDeps, caller: &crate::auth::Principal, requested: Option<&str>) -> Selection {
    deps.toolsets.resolve(caller, requested).map_err(|err| {
        let name = match &err {
            crate::toolsets::ToolsetError::Unknown { name, .. }
            | crate::toolsets::ToolsetError::DanglingDefault { name } => Some(name.clone()),
            _ => None,
        };
        RpcError::new(codes::INVALID_PARAMS, err.to_string()).with_data(json!({"toolset": name}))
    })
}

fn instance_endpoint(
    deps: &McpDeps,
    path: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Endpoint, McpError> {
    let token = query.get("token").map(String::as_str).or_else(|| auth::bearer(header(headers, "authorization")));
    // An unknown path, an instance without a token configured and a wrong token answer alike (401 "Invalid
    // token"), so the answers reveal nothing about which instance paths exist.
    let instance = deps.manager.by_instance_path(path);
    let checked = match &instance {
        Some(instance) => auth::check_instance_token(instance.spec(), token),
        None => auth::check_instance_token_format(token).and(Err(auth::InstanceAuthError::Invalid)),
    };
    let instance = match checked {
        Ok(()) => instance.ok_or(McpError::InstanceAuth(auth::InstanceAuthError::Invalid))?,
        Err(auth::InstanceAuthError::NotConfigured | auth::InstanceAuthError::NotFound) => {
            return Err(McpError::InstanceAuth(auth::InstanceAuthError::Invalid))
        }
        Err(err) => return Err(McpError::InstanceAuth(err)),
    };
    if instance.is_dormant() {
        // Any instance-router request (initialize first) wakes a dormant process ahead of the calls (SB §9.8).
        let (manager, dormant) = (deps.manager.clone(), instance.clone());
        deps.tasks.spawn(async move {
            if let Err(err) = manager.wake(&dormant).await {
                tracing::warn!(process_id = %dormant.spec().process_id, error = %err, "waking a dormant instance failed");
            }
        });
    }
    Ok(Endpoint::new(Target::Instance(instance), deps.instance_sessions.clone()))
}

fn accepts(headers: &HeaderMap, mime: &str) -> bool {
    header(headers, "accept").is_some_and(|a| {
        a.split(',').any(|part| {
            let part = part.split(';').next().unwrap_or("").trim();
            part.eq_ignore_ascii_case(mime) || part == "*/*"
        })
    })
}

fn initialize_result(requested: Option<&str>, identity: &Identity) -> (String, Value) {
    let version = requested.filter(|v| HANDSHAKE_VERSIONS.contains(v)).unwrap_or(LEGACY_VERSIONS[2]).to_owned();
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": identity.capabilities,
        "serverInfo": identity.server_info,
    });
    if let Some(instructions) = &identity.instructions {
        result["instructions"] = json!(instructions);
    }
    (version, result)
}

async fn post(deps: &McpDeps, endpoint: Endpoint, headers: &HeaderMap, body: &Bytes) -> Result<Response, McpError> {
    let content_type = header(headers, "content-type").unwrap_or("");
    if !content_type.trim().to_ascii_lowercase().starts_with("application/json") {
        return Err(McpError::UnsupportedMediaType);
    }
    if !(accepts(headers, "application/json") && accepts(headers, "text/event-stream")) {
        return Err(McpError::NotAcceptable { stream_only: false });
    }
    let (messages, batch) = protocol::decode_frame(body).map_err(|err| match err {
        FrameError::Json(err) => McpError::Parse(err),
        FrameError::EmptyBatch => McpError::EmptyBatch,
    })?;
    let header_version = header(headers, "mcp-protocol-version").map(str::to_owned);
    let stateless = header_version.as_deref() == Some(MODERN_VERSION)
        || messages.iter().any(|m| {
            m.get("method").and_then(Value::as_str) != Some("initialize")
                && protocol::has_stateless_envelope(m.get("params"))
        });
    if stateless {
        return stateless_post(deps, &endpoint, header_version.as_deref(), messages, batch).await;
    }

    let is_initialize = |m: &Value| m.get("method").and_then(Value::as_str) == Some("initialize");
    let has_init = messages.iter().any(is_initialize);
    if has_init && messages.len() > 1 {
        return Err(McpError::InitializeInBatch);
    }
    if let Some(version) = header_version.as_deref().filter(|_| !has_init) {
        if !HANDSHAKE_VERSIONS.contains(&version) {
            return Err(McpError::UnsupportedVersion(version.to_owned()));
        }
    }
    let supplied = header(headers, "mcp-session-id").map(str::to_owned);
    if supplied.as_deref().is_some_and(|id| !session::well_formed(id)) {
        return Err(McpError::MalformedSession);
    }
    let mut new_session: Option<(String, Value)> = None;
    let session_id = if has_init {
        if let Some(id) = &supplied {
            if endpoint.sessions.touch(id, &endpoint.owner) == Lookup::Known {
                return Err(McpError::AlreadyInitialized);
            }
        }
        if let Some(err) = endpoint.target.refused_selection() {
            // No session for a connection whose toolset cannot be used: the client shows why it failed.
            let id = messages[0].get("id").cloned().and_then(|id| serde_json::from_value(id).ok());
            return Ok(json_response(StatusCode::OK, &protocol::error_response(id, err.clone())));
        }
        let requested = messages[0].pointer("/params/protocolVersion").and_then(Value::as_str);
        let (version, result) = initialize_result(requested, &Identity::of(deps, &endpoint.target).await);
        let capabilities = messages[0].pointer("/params/capabilities").cloned().unwrap_or_default();
        let id = endpoint.sessions.create_with(&endpoint.owner, &version, capabilities);
        new_session = Some((id.clone(), result));
        id
    } else {
        let id = supplied.ok_or(McpError::NoSessionId)?;
        if endpoint.sessions.touch(&id, &endpoint.owner) == Lookup::Unknown {
            // Expired, terminated, from before a restart, or someone else's: the client initializes again.
            return Err(McpError::SessionNotFound);
        }
        id
    };

    if !batch {
        if let Some(answer) = relayed(deps, &endpoint, &session_id, &messages[0]).await {
            let mut response = answer?;
            if let Ok(value) = HeaderValue::from_str(&session_id) {
                response.headers_mut().insert("mcp-session-id", value);
            }
            return Ok(response);
        }
    }
    let mut replies = Vec::new();
    for message in messages {
        let reply = match Message::from_value(message) {
            Err(err) => Some(protocol::error_response(
                None,
                RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {err}")),
            )),
            Ok(Message::Request { id, method, .. }) if method == "initialize" => {
                let result = match &new_session {
                    Some((_, result)) => result.clone(),
                    None => initialize_result(None, &Identity::of(deps, &endpoint.target).await).1,
                };
                Some(protocol::response(id, result))
            }
            Ok(Message::Request { id, method, params }) => {
                match endpoint.target.dispatch(deps, Some(&session_id), &method, params, None).await {
                    Ok(mut result) => {
                        protocol::shape_for_handshake(&mut result);
                        Some(protocol::response(id, result))
                    }
                    Err(RouteError::Rpc(err)) => Some(protocol::error_response(Some(id), err)),
                    Err(RouteError::Forbidden(err)) => return Err(McpError::Auth(err)),
                }
            }
            Ok(Message::Notification { method, params }) => {
                client_notification(deps, &endpoint, &session_id, &method, params).await;
                None
            }
            Ok(Message::Response { id, outcome }) => {
                if !endpoint.sessions.exchange.deliver(&session_id, &id, outcome) {
                    tracing::debug!(%id, "a response nothing waits for (late, or for another session)");
                }
                None
            }
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
    Ok(response)
}

/// A single handshake-era request runs with a relay, so what the server says meanwhile reaches the client on
/// an SSE response; `None` for anything that is not such a request (initialize, notifications, responses).
async fn relayed(
    deps: &McpDeps,
    endpoint: &Endpoint,
    session_id: &str,
    message: &Value,
) -> Option<Result<Response, McpError>> {
    let method = message.get("method").and_then(Value::as_str)?;
    if method == "initialize" {
        return None;
    }
    let Ok(Message::Request { id, method, params }) = Message::from_value(message.clone()) else { return None };
    // A subscription the server accepts is this session's: its stream then carries that resource's updates.
    let subscription = match method.as_str() {
        "resources/subscribe" | "resources/unsubscribe" => {
            params.as_ref().and_then(|p| p.get("uri")).and_then(Value::as_str).map(|uri| {
                (uri.to_owned(), method == "resources/subscribe", endpoint.sessions.clone(), session_id.to_owned())
            })
        }
        _ => None,
    };
    let (target, deps_owned, reply_id) = (endpoint.target.clone(), deps.clone(), id.clone());
    let session = session_id.to_owned();
    let answer = endpoint
        .sessions
        .exchange
        .respond(
            session_id.to_owned(),
            id.clone(),
            Mode::Handshake { capabilities: endpoint.sessions.capabilities(session_id) },
            move |relay| async move {
                let outcome = target.dispatch(&deps_owned, Some(&session), &method, params, Some(&relay)).await;
                if let (Ok(_), Some((uri, subscribed, sessions, session))) = (&outcome, subscription) {
                    sessions.set_subscription(&session, &uri, subscribed);
                }
                outcome
            },
            move |outcome| response_message(reply_id, outcome.map(handshake_shaped)),
        )
        .await;
    Some(match answer {
        Answer::Streamed(response) => Ok(response),
        Answer::Done(Ok(result)) => {
            Ok(json_response(StatusCode::OK, &protocol::response(id, handshake_shaped(result))))
        }
        Answer::Done(Err(RouteError::Rpc(err))) => {
            Ok(json_response(StatusCode::OK, &protocol::error_response(Some(id), err)))
        }
        Answer::Done(Err(RouteError::Forbidden(err))) => Err(McpError::Auth(err)),
    })
}

fn handshake_shaped(mut result: Value) -> Value {
    protocol::shape_for_handshake(&mut result);
    result
}

/// A notification from the client: cancellation stops the named call; on an instance endpoint the rest (roots
/// changes and the like) go to the server, which is the one they concern.
async fn client_notification(deps: &McpDeps, endpoint: &Endpoint, scope: &str, method: &str, params: Option<Value>) {
    match (method, &endpoint.target) {
        ("notifications/cancelled", _) => endpoint.sessions.exchange.cancel(scope, params.as_ref()),
        ("notifications/initialized", _) => {}
        (_, Target::Instance(instance)) => deps.manager.notify(instance, method, params).await,
        _ => {}
    }
}

/// 2026-07-28: every request stands alone; no session is created or read.
async fn stateless_post(
    deps: &McpDeps,
    endpoint: &Endpoint,
    header_version: Option<&str>,
    messages: Vec<Value>,
    batch: bool,
) -> Result<Response, McpError> {
    if let [single] = messages.as_slice() {
        if let Some(response) = stateless_relayed(deps, endpoint, header_version, single).await {
            return response;
        }
    }
    let identity = Identity::of(deps, &endpoint.target).await;
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
            Ok(()) if method == "server/discover" => match endpoint.target.refused_selection() {
                Some(err) => Err(RouteError::Rpc(err.clone())),
                None => {
                    let mut discovered = json!({
                        "supportedVersions": SUPPORTED_VERSIONS,
                        "capabilities": identity.capabilities,
                        "serverInfo": identity.server_info,
                    });
                    if let Some(instructions) = &identity.instructions {
                        discovered["instructions"] = json!(instructions);
                    }
                    Ok(discovered)
                }
            },
            Ok(()) if REMOVED_IN_STATELESS.contains(&method.as_str()) => Err(RouteError::Rpc(RpcError::new(
                codes::METHOD_NOT_FOUND,
                format!("Method not found: {method} is not part of {MODERN_VERSION}"),
            ))),
            Ok(()) => endpoint.target.dispatch(deps, None, &method, params, None).await,
        };
        match outcome {
            Ok(mut result) => {
                protocol::stamp_stateless_result(&mut result, &method, identity.server_info.clone());
                replies.push(protocol::response(id, result));
            }
            Err(RouteError::Forbidden(err)) => return Err(McpError::Auth(err)),
            Err(RouteError::Rpc(err)) => {
                if !batch {
                    status = rpc_status(err.code);
                }
                replies.push(protocol::error_response(Some(id), err));
            }
        }
    }
    Ok(match (replies.len(), batch) {
        (0, _) => warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response(),
        (_, true) => json_response(StatusCode::OK, &Value::Array(replies)),
        (_, false) => json_response(status, &replies.remove(0)),
    })
}

/// A single 2026-07-28 request that reaches an upstream server runs with a relay (which cannot carry server
/// requests: this revision has none), so progress and log messages stream to the client; `None` for the
/// methods the satellite answers itself.
async fn stateless_relayed(
    deps: &McpDeps,
    endpoint: &Endpoint,
    header_version: Option<&str>,
    message: &Value,
) -> Option<Result<Response, McpError>> {
    let method = message.get("method").and_then(Value::as_str)?;
    let long_lived = method == "subscriptions/listen" && matches!(endpoint.target, Target::Instance(_));
    if !(long_lived || matches!(method, "tools/call" | "resources/read" | "prompts/get" | "completion/complete"))
        || check_envelope(header_version, message.get("params")).is_err()
    {
        return None;
    }
    let Ok(Message::Request { id, method, params }) = Message::from_value(message.clone()) else { return None };
    let capabilities = params
        .as_ref()
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(protocol::meta_keys::CLIENT_CAPABILITIES))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mode = Mode::Stateless { capabilities, owner: endpoint.owner.clone(), long_lived };
    let (target, deps_owned, reply_id, stamp_method) =
        (endpoint.target.clone(), deps.clone(), id.clone(), method.clone());
    let server_info = Identity::of(deps, &endpoint.target).await.server_info;
    let stamp_info = server_info.clone();
    let scope = format!("stateless:{}", uuid::Uuid::new_v4());
    let finish = move |outcome: Result<Value, RouteError>| {
        let result = outcome.map(|mut result| {
            protocol::stamp_stateless_result(&mut result, &stamp_method, stamp_info);
            protocol::retag_subscription(&mut result, &reply_id);
            result
        });
        response_message(reply_id, result)
    };
    let exchange = &endpoint.sessions.exchange;
    let state = params.as_ref().and_then(|p| p.get("requestState"));
    let answer = if is_parked_state(state) {
        // The retry of a call the satellite parked when its server asked the client something.
        let state = state.and_then(Value::as_str).unwrap_or_default().to_owned();
        let responses = params.as_ref().and_then(|p| p.get("inputResponses"));
        exchange.resume(scope, id.clone(), mode, &state, responses, finish).await
    } else {
        exchange
            .respond(
                scope,
                id.clone(),
                mode,
                move |relay| async move { target.dispatch(&deps_owned, None, &method, params, Some(&relay)).await },
                finish,
            )
            .await
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or_default();
    Some(match answer {
        Answer::Streamed(response) => Ok(response),
        Answer::Done(Ok(mut result)) => {
            protocol::stamp_stateless_result(&mut result, method, server_info);
            Ok(json_response(StatusCode::OK, &protocol::response(id, result)))
        }
        Answer::Done(Err(RouteError::Rpc(err))) => {
            Ok(json_response(rpc_status(err.code), &protocol::error_response(Some(id), err)))
        }
        Answer::Done(Err(RouteError::Forbidden(err))) => Err(McpError::Auth(err)),
    })
}

/// Methods of the handshake era that 2026-07-28 removed: a stateless request for one is answered 404/-32601
/// whatever the upstream speaks, so the client sees one revision, not a mix.
const REMOVED_IN_STATELESS: [&str; 5] =
    ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];

/// Versions a 2026-07-28 client is told the satellite speaks.
const SUPPORTED_VERSIONS: [&str; 4] = [MODERN_VERSION, LEGACY_VERSIONS[2], LEGACY_VERSIONS[1], LEGACY_VERSIONS[0]];

fn check_envelope(header_version: Option<&str>, params: Option<&Value>) -> Result<(), RpcError> {
    protocol::check_stateless_envelope(header_version, params, &SUPPORTED_VERSIONS)
}

fn open_stream(deps: &McpDeps, endpoint: Endpoint, headers: &HeaderMap) -> Result<Response, McpError> {
    if header(headers, "mcp-protocol-version") == Some(MODERN_VERSION) {
        return Err(McpError::NoServerStream);
    }
    let id = header(headers, "mcp-session-id").ok_or(McpError::InvalidSession)?;
    if !session::well_formed(id) {
        return Err(McpError::MalformedSession);
    }
    if !accepts(headers, "text/event-stream") {
        return Err(McpError::NotAcceptable { stream_only: true });
    }
    let token = endpoint.sessions.open_stream(id, &endpoint.owner).map_err(|err| match err {
        StreamError::NoSession => McpError::SessionNotFound,
        StreamError::AlreadyOpen => McpError::StreamConflict,
    })?;
    // On an instance endpoint the stream carries what the server announces outside any request: list changes,
    // and updates of the resources this session subscribed to. On `/mcp` it carries the caller's own list
    // changes (an instance of theirs came or went, its resources or prompts changed); the four meta-tools never
    // change, and discover always searches the current catalogs.
    let notes: std::pin::Pin<Box<dyn futures::Stream<Item = Value> + Send + Sync>> = match &endpoint.target {
        Target::Instance(instance) => {
            let (sessions, session_id) = (endpoint.sessions.clone(), id.to_owned());
            let notes = BroadcastStream::new(instance.announcements()).filter_map(move |note| {
                let keep = note.ok().filter(|note| for_session(note, &sessions, &session_id));
                async move { keep }
            });
            Box::pin(notes)
        }
        Target::Hierarchical(caller, _) | Target::LegacySse(caller, _) => {
            let (team, user) = (caller.team.clone(), caller.user.clone());
            let notes = BroadcastStream::new(deps.manager.view_changes())
                .filter_map(move |change| {
                    let notes = match change {
                        Ok(change) if change.team == team && change.user == user => change.notifications(),
                        Ok(_) => Vec::new(),
                        // Fell behind: some of the missed changes may have been this caller's.
                        Err(_) => crate::instances::ViewChange {
                            team: team.clone(),
                            user: user.clone(),
                            resources: true,
                            prompts: true,
                        }
                        .notifications(),
                    };
                    async move { (!notes.is_empty()).then(|| futures::stream::iter(notes)) }
                })
                .flatten();
            Box::pin(notes)
        }
    };
    // The stream ends with the session (or the satellite); until then pings keep it open.
    let events = notes
        .map(|note| Ok::<_, Infallible>(warp::sse::Event::default().event("message").data(note.to_string())))
        .chain(futures::stream::pending())
        .take_until(async move { token.cancelled().await });
    let stream = warp::sse::keep_alive().interval(PING_INTERVAL).text("ping").stream(events);
    let mut response = warp::sse::reply(stream).into_response();
    if let Ok(value) = HeaderValue::from_str(id) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    Ok(response)
}

/// Whether a server announcement is for this session: a resource update only if it subscribed to that resource.
fn for_session(note: &Value, sessions: &SessionTable, session_id: &str) -> bool {
    match note.get("method").and_then(Value::as_str) {
        Some("notifications/resources/updated") => {
            let uri = note.pointer("/params/uri").and_then(Value::as_str).unwrap_or_default();
            sessions.subscribed(session_id, uri)
        }
        _ => true,
    }
}

fn delete(endpoint: Endpoint, headers: &HeaderMap) -> Result<Response, McpError> {
    match header(headers, "mcp-session-id") {
        None => Err(McpError::InvalidSession),
        Some(id) if !session::well_formed(id) => Err(McpError::MalformedSession),
        Some(id) if endpoint.sessions.remove(id, &endpoint.owner) => {
            Ok(warp::reply::with_status(warp::reply(), StatusCode::OK).into_response())
        }
        Some(_) => Err(McpError::SessionNotFound),
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
        let own = Identity::hierarchical();
        assert_eq!(initialize_result(Some("2025-03-26"), &own).0, "2025-03-26");
        assert_eq!(initialize_result(Some("2024-11-05"), &own).0, "2024-11-05");
        assert_eq!(initialize_result(Some("1999-01-01"), &own).0, "2025-11-25");
        assert_eq!(initialize_result(None, &own).0, "2025-11-25");
    }
}
