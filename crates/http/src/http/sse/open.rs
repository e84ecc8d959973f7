//! `GET /sse`: the caller authenticated, its stream opened with a first event naming where to POST, and the
//! connection reported.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::StreamExt;
use rand::RngCore;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use warp::http::HeaderMap;
use warp::reply::Response;
use warp::Reply;

use super::super::callers::{member_key, Place};
use super::super::credential::{revoked, Credential};
use super::super::error::McpError;
use super::super::McpDeps;
use super::sessions::{SseSession, Unregister};
use super::STREAM_BUFFER;
use crate::auth::{Principal, SCOPE_READ};
use crate::events::ClientConnected;

pub(super) async fn open(deps: &McpDeps, headers: &HeaderMap, toolset: Option<String>) -> Result<Response, McpError> {
    let sessions = &deps.sessions.legacy;
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
    let principal = deps
        .gate
        .auth
        .authenticate_request(authorization)
        .await
        .and_then(|p| p.require(SCOPE_READ).map(|_| p))
        .map_err(McpError::Auth)?;
    // A toolset that cannot be used refuses the stream, with the reason, rather than opening an empty one.
    super::super::mcp::select_toolset(&deps.routing.toolsets, &principal, toolset.as_deref()).map_err(McpError::Rpc)?;
    // Held for as long as the stream is open: each holds a connection, and one caller's must not take them all.
    let caller = member_key(principal.user.as_str(), principal.team.as_str());
    let streams = &deps.places.streams;
    let place = streams.take(caller.into()).ok_or(McpError::CallerStreams { limit: streams.max() })?;
    let id = new_session_id();
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let (team_id, connected_user) = (principal.team.0.clone(), principal.user.clone());
    // The stream ends once its token no longer admits its caller (revoked, expired, the user gone).
    let revoked = revoked_bearer(deps, authorization, &principal);
    sessions.sessions.lock().insert(id.clone(), SseSession::new(principal, toolset, tx));
    let connected = connection(headers, &id, &team_id);
    let reported = sessions.report_connected(&deps.background.events, connected, &connected_user).await;
    let guard = Unregister {
        id: id.clone(),
        sessions: sessions.clone(),
        emitter: deps.background.events.clone(),
        tasks: deps.background.tasks.clone(),
        team_id,
        opened: Instant::now(),
        reported,
    };
    Ok(stream_response(&id, rx, (guard, place), revoked))
}

/// A fresh session id: 32 random bytes, URL-safe.
fn new_session_id() -> String {
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// Resolves once the bearer that opened the stream no longer admits its caller.
fn revoked_bearer(
    deps: &McpDeps,
    authorization: Option<&str>,
    principal: &Principal,
) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
    let credential = Credential::Bearer {
        authorization: authorization.unwrap_or_default().to_owned(),
        user: principal.user.clone(),
        team: principal.team.clone(),
    };
    let (auth, manager) = (deps.gate.auth.clone(), deps.routing.manager.clone());
    revoked(auth, manager, credential, "legacy sse")
}

/// The `mcp.client.connected` report of a stream (BP §8.5-15).
fn connection(headers: &HeaderMap, id: &str, team_id: &str) -> ClientConnected {
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let user_agent = header_text("user-agent").unwrap_or_else(|| "unknown".into());
    let ip =
        crate::activity::ip_address(header_text("x-forwarded-for").as_deref(), header_text("x-real-ip").as_deref());
    ClientConnected {
        session_id: crate::secrets::session_reference(id),
        client_type: client_type(&user_agent),
        user_agent,
        team_id: team_id.to_owned(),
        transport: "sse",
        ip_address: ip,
    }
}

/// BP §8.5-15 `client_type` from the user agent.
fn client_type(user_agent: &str) -> &'static str {
    let ua = user_agent.to_ascii_lowercase();
    if ua.contains("vscode") || ua == "undici" {
        "vscode"
    } else if ua.contains("cursor") {
        "cursor"
    } else if ua.contains("claude") {
        "claude"
    } else {
        "unknown"
    }
}

/// The stream: the event naming where to POST, then what the session's messages put on it, with a heartbeat. It
/// holds the session's registration and the caller's place while it lasts, and ends once `revoked` resolves.
fn stream_response(
    id: &str,
    rx: mpsc::Receiver<warp::sse::Event>,
    keep: (Unregister, Place),
    revoked: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Response {
    let endpoint = warp::sse::Event::default().event("endpoint").data(format!("/message?session={id}"));
    let events = futures::stream::once(async move { endpoint })
        .chain(ReceiverStream::new(rx))
        .map(move |event| {
            let _keep = &keep;
            Ok::<_, Infallible>(event)
        })
        .take_until(revoked);
    let stream = warp::sse::keep_alive().interval(Duration::from_secs(30)).text("heartbeat").stream(events);
    let mut response = warp::sse::reply(stream).into_response();
    response.headers_mut().insert("access-control-allow-origin", warp::http::HeaderValue::from_static("*"));
    response
}
