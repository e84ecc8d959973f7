//! `POST /message`: one message of a legacy stream's client, authenticated as the stream's owner and answered on
//! the stream.

use std::collections::HashMap;

use serde_json::{json, Value};
use warp::http::{HeaderMap, StatusCode};
use warp::reply::Response;

use super::super::body::Unread;
use super::super::callers::{member_key, Admitted, CallerLimits};
use super::super::error::McpError;
use super::super::identity::Identity;
use super::super::mcp::select_toolset;
use super::super::{json_response, McpDeps};
use super::seat::take_seat;
use super::sessions::Touched;
use super::{accepted, invalid, new_message_id, notified, relayed_call, SseSessions};
use crate::auth::{Principal, SCOPE_READ};
use crate::mcp::protocol::{self, Message, RequestId, LEGACY_VERSIONS};

pub(super) async fn message(
    deps: &McpDeps,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Unread,
) -> Result<Response, McpError> {
    let id = session_id(query)?;
    // Every message authenticates, as every `/mcp` request does: the session id alone is not a credential, and a
    // token revoked since the stream opened stops working at once. It must be the identity that opened the stream.
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
    let caller = deps.gate.auth.authenticate_request(authorization).await.map_err(McpError::Auth)?;
    let (_place, parsed) = read_admitted(&deps.places.requests, &caller, headers, body).await?;
    let tool_call = match &parsed {
        Ok(Value::Array(messages)) => crate::activity::calls_a_tool(messages),
        Ok(message) => crate::activity::calls_a_tool(std::slice::from_ref(message)),
        Err(_) => false,
    };
    let stream = deps.sessions.legacy.touch(id, &caller, tool_call)?;
    caller.require(SCOPE_READ).map_err(McpError::Auth)?;
    record_activity(deps, &caller, headers, id, tool_call);
    let value = parsed.map_err(|err| McpError::Parse(err.to_string()))?;
    answer(deps, id, caller, stream, value).await
}

/// One message of the stream's client (or a batch of them, `batch`): a notification or a response is taken; a
/// request is answered on the stream, `initialize` at once and any other by its router, with a relay.
async fn answer(
    deps: &McpDeps,
    id: &str,
    caller: Principal,
    stream: Touched,
    value: Value,
) -> Result<Response, McpError> {
    let sessions = &deps.sessions.legacy;
    let value = match value {
        Value::Array(messages) => return super::batch::answer_batch(deps, id, caller, stream, messages).await,
        value => value,
    };
    let reply = match Message::from_value(value) {
        Err(err) => invalid(&err),
        Ok(Message::Notification { method, params }) => {
            notified(deps, id, &caller, &method, params).await;
            return Ok(accepted());
        }
        Ok(Message::Response { id: answered, outcome }) => {
            sessions.exchange.deliver(id, &answered, outcome);
            return Ok(accepted());
        }
        Ok(Message::Request { id: request_id, method, params }) if method == "initialize" => {
            let capabilities = params.as_ref().and_then(|p| p.get("capabilities")).cloned().unwrap_or_default();
            take_seat(deps, id, &caller, capabilities);
            initialized(&deps.routing.toolsets, &caller, stream.toolset.as_deref(), request_id, params.as_ref())
        }
        Ok(Message::Request { id: request_id, method, params }) => {
            let selection = select_toolset(&deps.routing.toolsets, &caller, stream.toolset.as_deref());
            return relayed_call(deps, id, stream).run(caller, selection, request_id, method, params).await;
        }
    };
    send_reply(sessions, id, &stream, &reply)
}

/// The session a message names (`?session=`, or `?sessionId=` as some clients send it), if it can be one.
fn session_id(query: &HashMap<String, String>) -> Result<&str, McpError> {
    let id = query.get("session").or_else(|| query.get("sessionId")).map(String::as_str).unwrap_or("");
    let well_formed = id.len() >= 32 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    well_formed.then_some(id).ok_or(McpError::MissingSseSession)
}

/// One of the caller's places (`http::callers`), shared with its `/mcp` requests, and the body, read once and
/// parsed (or left unreadable, refused below); at its limit, a spare place for a small body that holds no request,
/// so that a caller at its limit can still cancel or answer.
async fn read_admitted(
    requests: &CallerLimits,
    caller: &Principal,
    headers: &HeaderMap,
    body: Unread,
) -> Result<(Admitted, Result<Value, serde_json::Error>), McpError> {
    let busy = || McpError::CallerBusy { limit: requests.max() };
    let length = headers.get(warp::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    let place =
        requests.admit(member_key(caller.user.as_str(), caller.team.as_str()).into(), length).ok_or_else(busy)?;
    // Read once, after authentication: counted for activity, then answered (or refused as unreadable).
    let body = body.read().await?;
    let parsed = serde_json::from_slice::<Value>(&body);
    let admitted = match &parsed {
        Ok(Value::Array(messages)) => place.admits(messages),
        Ok(message) => place.admits(std::slice::from_ref(message)),
        Err(_) => true,
    };
    if !admitted {
        return Err(busy());
    }
    Ok((place, parsed))
}

/// Legacy SSE callers count as client activity too (SB §17): by OAuth client when the stream's token had one.
fn record_activity(deps: &McpDeps, caller: &Principal, headers: &HeaderMap, id: &str, tool_call: bool) {
    let client_id = caller.client_id.clone().unwrap_or_else(|| "legacy-sse".to_owned());
    let auth_type = if caller.client_id.is_some() { "oauth" } else { "sse" };
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    deps.background.activity.record(&crate::activity::Seen {
        user_id: &caller.user.0,
        team_id: &caller.team.0,
        client_id: &client_id,
        auth_type,
        client_name_header: header_text("x-mcp-client-name"),
        user_agent: header_text("user-agent"),
        session_id: Some(id),
        forwarded_for: header_text("x-forwarded-for"),
        real_ip: header_text("x-real-ip"),
        tool_call,
    });
}

/// The answer to `initialize` on a legacy stream: the version asked when it is one of the handshake's, else the
/// oldest; the satellite's identity through the stream's toolset.
fn initialized(
    toolsets: &crate::toolsets::Toolsets,
    caller: &Principal,
    toolset: Option<&str>,
    id: RequestId,
    params: Option<&Value>,
) -> Value {
    let requested = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str);
    let version = requested.filter(|v| *v == "2024-11-05" || LEGACY_VERSIONS.contains(v)).unwrap_or("2024-11-05");
    match select_toolset(toolsets, caller, toolset) {
        // The toolset the stream was opened with is gone since: say so, as `/mcp` does.
        Err(err) => protocol::error_response(Some(id), err),
        Ok(selected) => {
            let mut identity = Identity::hierarchical_with(selected.as_deref());
            // The legacy stream does not carry list changes: promise none.
            identity.promise_no_list_changes();
            protocol::response(
                id,
                json!({"protocolVersion": version, "capabilities": identity.capabilities,
                       "serverInfo": identity.server_info, "instructions": identity.instructions}),
            )
        }
    }
}

/// Put the reply on the stream, and say so.
fn send_reply(sessions: &SseSessions, id: &str, stream: &Touched, reply: &Value) -> Result<Response, McpError> {
    let message_id = new_message_id();
    let event = warp::sse::Event::default().id(message_id.clone()).event("message").data(reply.to_string());
    if stream.events.try_send(event).is_err() {
        // The stream is gone or not keeping up: end the session rather than buffer without bound.
        sessions.end(id);
        return Err(McpError::SseStreamClosed);
    }
    Ok(json_response(StatusCode::OK, &json!({"status": "sent", "messageId": message_id})))
}
