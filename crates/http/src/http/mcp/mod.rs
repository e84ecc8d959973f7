//! The MCP endpoints over Streamable HTTP: `/mcp` (hierarchical router, bearer
//! auth) and `/i/{instance_path}/mcp` (instance router, instance token). One
//! handler serves both protocol eras on the same URL: handshake-era clients
//! get a session at `initialize`; 2026-07-28 requests are stateless and carry
//! their version in `_meta` and `MCP-Protocol-Version`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio_stream::wrappers::BroadcastStream;
use tracing::Instrument as _;
use warp::http::{HeaderMap, HeaderValue, Method, StatusCode};
use warp::reply::Response;
use warp::{Filter, Reply};

use super::audit::finish;
use super::body::Unread;
use super::callers::CallerLimits;
use super::credential::{revoked, Credential};
use super::dispatch::{Selection, Target};
use super::error::{rpc_status, McpError};
use super::exchange::{is_parked_state, response_message, Answer, LongLived, Mode, ProgressTokens};
use super::identity::Identity;
use super::oauth::ResourceUrls;
use super::session::{self, Lookup, SessionTable, StreamError};
use super::stack::PeerAddr;
use super::{json_response, McpDeps, Routing};
use crate::auth;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, Frame, FrameError, Message, RpcError, LEGACY_VERSIONS, MODERN_VERSION};
use crate::router::RouteError;

mod stream;
use stream::{delete, open_stream};

mod stateless;
use stateless::stateless_post;

mod initialize;
use initialize::{initialize_result, initialize_session, Initialized};

mod post;
use post::post;
pub(super) use post::{roots_changed, BATCH_CONCURRENCY, MAX_BATCH_MESSAGES};

/// Comment written on idle server streams.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// Handshake versions accepted at `initialize` (oldest first); the last is answered when the client's is unknown.
const HANDSHAKE_VERSIONS: [&str; 4] = ["2024-11-05", LEGACY_VERSIONS[0], LEGACY_VERSIONS[1], LEGACY_VERSIONS[2]];

/// One authenticated caller on one endpoint: the router it reaches and the session table it uses.
struct Endpoint {
    target: Target,
    sessions: Arc<SessionTable>,
    owner: String,
    /// The instance token a request on an instance's endpoint gave in its query (`?token=`).
    instance_token: Option<String>,
}

impl Endpoint {
    fn new(target: Target, sessions: Arc<SessionTable>) -> Self {
        Self { owner: target.session_owner(), target, sessions, instance_token: None }
    }

    /// What admitted this request, to check again while a stream it opens lasts: the `Authorization` header on
    /// `/mcp`, the instance token (query or header) on an instance's endpoint.
    fn credential(&self, headers: &HeaderMap) -> Credential {
        let authorization = header(headers, names::AUTHORIZATION);
        match &self.target {
            Target::Instance(instance) => {
                let spec = instance.spec();
                Credential::Instance {
                    path: spec.instance_path.clone().unwrap_or_default(),
                    token: self.instance_token.clone().or_else(|| auth::bearer(authorization).map(str::to_owned)),
                    process_id: spec.process_id.clone(),
                }
            }
            Target::Hierarchical(caller, _) | Target::LegacySse(caller, _) => Credential::Bearer {
                authorization: authorization.unwrap_or_default().to_owned(),
                user: caller.user.clone(),
                team: caller.team.clone(),
            },
        }
    }
}

/// Whether a POST body's frame calls `tools/call` (SB §17 counts tool calls); a body that cannot be read calls
/// nothing. The body is decoded once, after the caller is authenticated: counted here and answered by `post`.
fn frame_calls_a_tool(frame: &Frame) -> bool {
    frame.as_ref().is_ok_and(|(messages, _)| crate::activity::calls_a_tool(messages))
}

/// Count one request of a tracked client (SB §17); `tool_call`: the request calls `tools/call`.
fn record_activity(
    activity: &crate::activity::ActivityTracker,
    headers: &HeaderMap,
    tool_call: bool,
    (user_id, team_id): (&str, &str),
    client_id: &str,
    auth_type: &str,
) {
    activity.record(&crate::activity::Seen {
        user_id,
        team_id,
        client_id,
        auth_type,
        client_name_header: header(headers, names::X_MCP_CLIENT_NAME),
        user_agent: header(headers, names::USER_AGENT),
        session_id: header(headers, names::MCP_SESSION_ID),
        forwarded_for: header(headers, names::X_FORWARDED_FOR),
        real_ip: header(headers, names::X_REAL_IP),
        tool_call,
    });
}

/// Count one request on `/mcp` of a caller who came through an OAuth client (SB §17).
fn record_oauth_activity(
    activity: &crate::activity::ActivityTracker,
    headers: &HeaderMap,
    endpoint: &Endpoint,
    tool_call: bool,
) {
    if let Target::Hierarchical(principal, _) = &endpoint.target {
        if let Some(client) = &principal.client_id {
            let user_team = (principal.user.0.as_str(), principal.team.0.as_str());
            record_activity(activity, headers, tool_call, user_team, client, "oauth");
        }
    }
}

/// Count one request on an instance's endpoint of the client its member tracks (SB §17).
fn record_instance_activity(
    activity: &crate::activity::ActivityTracker,
    headers: &HeaderMap,
    endpoint: &Endpoint,
    tool_call: bool,
) {
    if let Target::Instance(instance) = &endpoint.target {
        let spec = instance.spec();
        let user_team = (spec.user_id.0.as_str(), spec.team_id.0.as_str());
        record_activity(activity, headers, tool_call, user_team, instance.client_id(), "instance_token");
    }
}

pub fn routes(deps: McpDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer per request, not a copy of every dependency: warp runs this for each route it tries.
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    // Read once the caller is known (`body`): a stranger's answer does not wait for its body.
    let body = super::body::unread();
    let peer = warp::ext::optional::<PeerAddr>();
    let headers = warp::header::headers_cloned();

    // `?toolset=NAME` selects a toolset (docs/toolsets.md); any other query parameter is ignored.
    let hier = warp::path("mcp")
        .and(warp::path::end())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify().map(|raw: String| toolset_param(&raw)));
    let hier_post =
        hier.and(super::allow::cors_post()).and(headers).and(body).and(peer).and(with.clone()).then(hierarchical_post);
    // GET opens the session's stream, DELETE ends the session: one route, two methods.
    let hier_other = hier.and(stream_or_end()).and(headers).and(peer).and(with.clone()).then(hierarchical_other);

    let inst = warp::path!("i" / String / "mcp").and(warp::query::<HashMap<String, String>>());
    let inst_post =
        inst.and(super::allow::cors_post()).and(headers).and(body).and(peer).and(with.clone()).then(instance_post);
    let inst_other = inst.and(stream_or_end()).and(headers).and(peer).and(with).then(instance_other);
    // The POSTs first, the calls among them: warp tries each route in turn, and each try costs a filter future.
    hier_post.or(inst_post).unify().or(hier_other).unify().or(inst_other).unify()
}

/// `POST /mcp`: a bearer caller's messages, through the toolset it selects.
async fn hierarchical_post(
    toolset: Option<String>,
    headers: HeaderMap,
    body: Unread,
    peer: Option<PeerAddr>,
    deps: Arc<McpDeps>,
) -> Response {
    let answer = async {
        let endpoint = hierarchical_endpoint(&deps, &headers, toolset.as_deref()).await?;
        let (_place, frame) = admitted_frame(&deps.places.requests, &endpoint, &headers, body).await?;
        record_oauth_activity(&deps.background.activity, &headers, &endpoint, frame_calls_a_tool(&frame));
        Box::pin(post(&deps, endpoint, &headers, frame)).await
    }
    .await;
    with_link(finish(&deps.gate, "mcp", peer, &headers, None, answer).await, &deps.gate.urls)
}

/// `GET` or `DELETE /mcp`: a bearer caller's session stream, or the session's end.
async fn hierarchical_other(
    toolset: Option<String>,
    method: Method,
    headers: HeaderMap,
    peer: Option<PeerAddr>,
    deps: Arc<McpDeps>,
) -> Response {
    let answer = hierarchical_endpoint(&deps, &headers, toolset.as_deref()).await.and_then(|e| {
        record_oauth_activity(&deps.background.activity, &headers, &e, false);
        stream_or_delete(&deps, method, e, &headers)
    });
    with_link(finish(&deps.gate, "mcp", peer, &headers, None, answer).await, &deps.gate.urls)
}

/// `POST /i/{path}/mcp`: the messages of an instance token's holder, to that instance.
async fn instance_post(
    path: String,
    query: HashMap<String, String>,
    headers: HeaderMap,
    body: Unread,
    peer: Option<PeerAddr>,
    deps: Arc<McpDeps>,
) -> Response {
    let answer = async {
        let endpoint = instance_endpoint(&deps, &path, &query, &headers)?;
        let (_place, frame) = admitted_frame(&deps.places.requests, &endpoint, &headers, body).await?;
        record_instance_activity(&deps.background.activity, &headers, &endpoint, frame_calls_a_tool(&frame));
        Box::pin(post(&deps, endpoint, &headers, frame)).await
    }
    .await;
    finish(&deps.gate, "instance", peer, &headers, query.get("token").map(String::as_str), answer).await
}

/// `GET` or `DELETE /i/{path}/mcp`: an instance session's stream, or the session's end.
async fn instance_other(
    path: String,
    query: HashMap<String, String>,
    method: Method,
    headers: HeaderMap,
    peer: Option<PeerAddr>,
    deps: Arc<McpDeps>,
) -> Response {
    let answer =
        instance_endpoint(&deps, &path, &query, &headers).and_then(|e| stream_or_delete(&deps, method, e, &headers));
    finish(&deps.gate, "instance", peer, &headers, query.get("token").map(String::as_str), answer).await
}

/// GET or DELETE, as the method it is; any other method is left to the other routes (and, failing them, 405).
fn stream_or_end() -> impl Filter<Extract = (Method,), Error = warp::Rejection> + Clone {
    super::allow::cors_get().map(|| Method::GET).or(super::allow::cors_delete().map(|| Method::DELETE)).unify()
}

/// A GET opens the endpoint's stream; a DELETE ends its session.
fn stream_or_delete(
    deps: &McpDeps,
    method: Method,
    endpoint: Endpoint,
    headers: &HeaderMap,
) -> Result<Response, McpError> {
    match method {
        Method::DELETE => delete(endpoint, headers),
        _ => open_stream(deps, endpoint, headers),
    }
}

/// The MCP headers, as names made once: a name given as text is parsed and lowercased on every lookup.
pub(super) mod names {
    use warp::http::HeaderName;
    pub const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
    pub const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
    pub const X_MCP_CLIENT_NAME: HeaderName = HeaderName::from_static("x-mcp-client-name");
    pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
    pub use warp::http::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, USER_AGENT};
}

fn header<K: warp::http::header::AsHeaderName>(headers: &HeaderMap, name: K) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The answer, carrying the session it belongs to.
fn with_session(mut response: Response, session_id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(session_id) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    response
}

fn with_link(mut response: Response, urls: &ResourceUrls) -> Response {
    response.headers_mut().insert("link", HeaderValue::from_static(urls.link_header()));
    response
}

async fn hierarchical_endpoint(
    deps: &McpDeps,
    headers: &HeaderMap,
    toolset: Option<&str>,
) -> Result<Endpoint, McpError> {
    let principal =
        deps.gate.auth.authenticate_request(header(headers, names::AUTHORIZATION)).await.map_err(McpError::Auth)?;
    let selection = select_toolset(&deps.routing.toolsets, &principal, toolset);
    Ok(Endpoint::new(Target::Hierarchical(principal, selection), deps.sessions.mcp.clone()))
}

/// One of the caller's places, held until the answer starts (`http::callers`); 429 when it holds all of them. At
/// its limit, a small body still gets a spare place: what it holds must then be no request (a cancellation of one
/// of its calls, an answer to a server's question), checked by [`refuse_spare_request`].
fn take_place(
    requests: &CallerLimits,
    endpoint: &Endpoint,
    headers: &HeaderMap,
) -> Result<super::callers::Admitted, McpError> {
    let length = header(headers, names::CONTENT_LENGTH);
    requests.admit(endpoint.target.caller(), length).ok_or(McpError::CallerBusy { limit: requests.max() })
}

/// A body read on a spare place that holds a request after all: 429, as at the limit.
fn refuse_spare_request(
    requests: &CallerLimits,
    place: &super::callers::Admitted,
    frame: &Frame,
) -> Result<(), McpError> {
    match frame {
        Ok((messages, _)) if !place.admits(messages) => Err(McpError::CallerBusy { limit: requests.max() }),
        _ => Ok(()),
    }
}

/// One of the caller's places ([`take_place`]), and the body read on it, decoded (once, after the caller is
/// authenticated: counted, then answered by `post`).
async fn admitted_frame(
    requests: &CallerLimits,
    endpoint: &Endpoint,
    headers: &HeaderMap,
    body: Unread,
) -> Result<(super::callers::Admitted, Frame), McpError> {
    let place = take_place(requests, endpoint, headers)?;
    let frame = protocol::decode_frame(&body.read().await?);
    refuse_spare_request(requests, &place, &frame)?;
    Ok((place, frame))
}

/// The `toolset` parameter of a query string, decoded.
pub(super) fn toolset_param(raw: &str) -> Option<String> {
    url::form_urlencoded::parse(raw.as_bytes()).find(|(key, _)| key == "toolset").map(|(_, value)| value.into_owned())
}

/// The toolset a request of `caller` uses, or the JSON-RPC error that says why the one it selects cannot be.
pub(super) fn select_toolset(
    toolsets: &crate::toolsets::Toolsets,
    caller: &crate::auth::Principal,
    requested: Option<&str>,
) -> Selection {
    toolsets.resolve(caller, requested).map_err(|err| {
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
    let token = query.get("token").map(String::as_str).or_else(|| auth::bearer(header(headers, names::AUTHORIZATION)));
    // An unknown path, an instance without a token configured and a wrong token answer alike (401 "Invalid
    // token"), so the answers reveal nothing about which instance paths exist.
    let instance = deps.routing.manager.by_instance_path(path);
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
        let (manager, dormant) = (deps.routing.manager.clone(), instance.clone());
        deps.background.tasks.spawn(
            async move {
                if let Err(err) = manager.wake(&dormant).await {
                    tracing::warn!(process_id = %dormant.spec().process_id, error = %err, "waking a dormant instance failed");
                }
            }
            .in_current_span(),
        );
    }
    let mut endpoint = Endpoint::new(Target::Instance(instance), deps.sessions.instances.clone());
    endpoint.instance_token = query.get("token").cloned();
    Ok(endpoint)
}

/// A message with a method and an id, taken apart as a request; anything else it turns out to be is the error
/// the plain path would answer it with (`Invalid Request`, sent with id null: `invalid_request`).
fn as_request(message: Value) -> Result<(protocol::RequestId, String, Option<Value>), RpcError> {
    match Message::from_value(message) {
        Ok(Message::Request { id, method, params }) => Ok((id, method, params)),
        other => {
            let reason = other.err().map_or_else(|| "not a request".to_owned(), |err| err.to_string());
            Err(RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {reason}")))
        }
    }
}

fn invalid_request(error: RpcError) -> Response {
    json_response(StatusCode::OK, &protocol::error_response(None, error))
}

/// Whether the `Accept` header takes each of `mimes` (by name, case aside, or as `*/*`), read in one pass.
fn accepts_all<const N: usize>(headers: &HeaderMap, mimes: [&str; N]) -> bool {
    let mut taken = [false; N];
    // Several `Accept` lines are one list (RFC 9110 §5.3), as a client or a proxy may send them.
    let parts = headers.get_all(names::ACCEPT).into_iter().flat_map(|accept| accept.as_bytes().split(|&b| b == b','));
    for part in parts {
        let media = part.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
        if media == b"*/*" {
            return true;
        }
        for (mime, taken) in mimes.iter().zip(taken.iter_mut()) {
            *taken |= media.eq_ignore_ascii_case(mime.as_bytes());
        }
    }
    taken.iter().all(|&t| t)
}

#[cfg(test)]
mod tests {
    use super::stateless::check_envelope;
    use super::*;

    /// What `Accept` takes: each type named (case aside, parameters and spaces ignored), or `*/*`; a header missing
    /// or empty takes nothing, and one type named does not stand for another.
    #[test]
    fn accept_takes_the_named_types_or_everything() {
        let both = ["application/json", "text/event-stream"];
        let takes = |accept: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(accept) = accept {
                headers.insert("accept", HeaderValue::from_str(accept).unwrap());
            }
            accepts_all(&headers, both)
        };
        for taken in [
            "application/json, text/event-stream",
            "text/event-stream,application/json",
            " Application/JSON ;q=0.9 ,\ttext/event-stream; charset=utf-8",
            "*/*",
            "text/html, */*;q=0.1",
        ] {
            assert!(takes(Some(taken)), "{taken:?}");
        }
        for refused in
            [None, Some(""), Some("application/json"), Some("text/event-stream"), Some("application/*, text/*")]
        {
            assert!(!takes(refused), "{refused:?}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("accept", HeaderValue::from_static("text/event-stream"));
        assert!(accepts_all(&headers, ["text/event-stream"]));
        // Two lines are one list: before, only the first was read, and such a client got 406.
        headers.append("accept", HeaderValue::from_static("application/json"));
        assert!(accepts_all(&headers, both));
    }

    /// Every POST's future is boxed (the route's closure), so copied whole into the heap once per request. Waking a
    /// dormant instance for an `initialize` (~6 KB) held inline made it 8.7 KB in a release build, for a branch a
    /// tool call never takes; boxed there, it is 4.1 KB (the bound leaves room for growth, not for another large branch).
    #[test]
    fn a_posts_future_stays_small() {
        let size = future_size!(post::post, <'a> (&'a McpDeps, Endpoint, &'a HeaderMap, Frame));
        assert!(size <= 5 * 1024, "post's future is {size} bytes: box the large branch");
    }

    #[test]
    fn envelope_errors_follow_2026_07_28() {
        let meta = |v: &str| json!({"_meta": {"io.modelcontextprotocol/protocolVersion": v, "io.modelcontextprotocol/clientCapabilities": {}}});
        let sent = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.append(*name, HeaderValue::from_static(value));
            }
            headers
        };
        let good = sent(&[("mcp-protocol-version", MODERN_VERSION), ("mcp-method", "tools/list")]);
        assert_eq!(check_envelope(&good, "tools/list", Some(&meta(MODERN_VERSION)), false), Ok(()));
        assert_eq!(
            check_envelope(&good, "tools/list", Some(&json!({})), false).unwrap_err().code,
            codes::INVALID_PARAMS
        );
        for (headers, why) in [
            (sent(&[("mcp-protocol-version", "2025-06-18"), ("mcp-method", "tools/list")]), "does not match"),
            (sent(&[("mcp-method", "tools/list")]), "MCP-Protocol-Version header is missing"),
            (sent(&[("mcp-protocol-version", MODERN_VERSION)]), "Mcp-Method header is missing"),
            (sent(&[("mcp-protocol-version", MODERN_VERSION), ("mcp-method", "tools/call")]), "does not match"),
        ] {
            let err = check_envelope(&headers, "tools/list", Some(&meta(MODERN_VERSION)), false).unwrap_err();
            assert_eq!(err.code, codes::HEADER_MISMATCH, "{headers:?}");
            assert!(err.message.contains(why), "{headers:?}: {}", err.message);
        }
        // A batch needs no header, but one sent must agree.
        assert_eq!(check_envelope(&sent(&[]), "tools/list", Some(&meta(MODERN_VERSION)), true), Ok(()));
        let other = sent(&[("mcp-method", "tools/call")]);
        assert_eq!(
            check_envelope(&other, "tools/list", Some(&meta(MODERN_VERSION)), true).unwrap_err().code,
            codes::HEADER_MISMATCH
        );
        // The client that disagrees with itself is told so before it is told its version is not served.
        let old = sent(&[("mcp-protocol-version", "1900-01-01"), ("mcp-method", "tools/list")]);
        let unsupported = check_envelope(&old, "tools/list", Some(&meta("1900-01-01")), false).unwrap_err();
        assert_eq!(unsupported.code, codes::UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(unsupported.data.unwrap()["requested"], "1900-01-01");
    }
}
