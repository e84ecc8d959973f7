//! A POST to an MCP endpoint: framing checks, era choice, sessions, and the answer to each message.

use super::*;

pub(super) async fn post(
    deps: &McpDeps,
    endpoint: Endpoint,
    headers: &HeaderMap,
    frame: Frame,
) -> Result<Response, McpError> {
    let (messages, batch) = framed(headers, frame)?;
    if is_stateless(headers, &messages) {
        return stateless_post(deps, &endpoint, headers, messages, batch).await;
    }
    handshake_post(&deps.routing, endpoint, headers, messages, batch).await
}

/// The body's messages, and whether they came as a batch: a JSON body, from a client that takes both answers
/// (JSON and SSE), of at most [`MAX_BATCH_MESSAGES`].
fn framed(headers: &HeaderMap, frame: Frame) -> Result<(Vec<Value>, bool), McpError> {
    let content_type = header(headers, names::CONTENT_TYPE).unwrap_or("");
    let json =
        content_type.trim_start().as_bytes().get(..16).is_some_and(|t| t.eq_ignore_ascii_case(b"application/json"));
    if !json {
        return Err(McpError::UnsupportedMediaType);
    }
    if !accepts_all(headers, ["application/json", "text/event-stream"]) {
        return Err(McpError::NotAcceptable { stream_only: false });
    }
    let (messages, batch) = frame.map_err(|err| match err {
        FrameError::Json(err) => McpError::Parse(err),
        FrameError::EmptyBatch => McpError::EmptyBatch,
    })?;
    if messages.len() > MAX_BATCH_MESSAGES {
        return Err(McpError::BatchTooLarge { messages: messages.len(), max: MAX_BATCH_MESSAGES });
    }
    Ok((messages, batch))
}

/// A 2026-07-28 POST: its version header says so, or a message other than `initialize` carries the envelope.
fn is_stateless(headers: &HeaderMap, messages: &[Value]) -> bool {
    header(headers, names::MCP_PROTOCOL_VERSION) == Some(MODERN_VERSION)
        || messages.iter().any(|m| {
            m.get("method").and_then(Value::as_str) != Some("initialize")
                && protocol::has_stateless_envelope(m.get("params"))
        })
}

/// A handshake-era POST: an `initialize` makes a session, anything else needs one its caller holds.
async fn handshake_post(
    routing: &Routing,
    endpoint: Endpoint,
    headers: &HeaderMap,
    mut messages: Vec<Value>,
    batch: bool,
) -> Result<Response, McpError> {
    let has_init = check_handshake(headers, &messages)?;
    let supplied = header(headers, names::MCP_SESSION_ID);
    // `new_session`: the answer to this request's `initialize`, built with its session.
    let (session_id, new_session) = if has_init {
        match initialize_session(routing, &endpoint, supplied, &messages[0], batch).await? {
            Initialized::Answered(response) => return Ok(response),
            Initialized::Session(id, result) => (id, Some(result)),
        }
    } else {
        (known_session(&endpoint, supplied)?, None)
    };
    if !batch {
        if let Some(message) = messages.pop() {
            let answer = match relayed(routing, &endpoint, &session_id, message).await {
                Err(message) => fixed_listing(routing, &endpoint, &session_id, message),
                relayed => relayed,
            };
            match answer {
                Ok(answer) => return Ok(with_session(answer?, &session_id)),
                Err(message) => messages.push(message),
            }
        }
    }
    let replies = if batch {
        answer_batch(routing, &endpoint, &session_id, messages, new_session).await?
    } else if let Some(message) = messages.pop() {
        let (answer, _) = answer(routing, &endpoint, &session_id, message, new_session).await;
        answer?.into_iter().collect()
    } else {
        Vec::new()
    };
    Ok(with_session(replies_response(replies, batch), &session_id))
}

/// A handshake-era POST's framing: an `initialize` alone, a version header the satellite speaks (but on an
/// `initialize`, which negotiates one), a session id that can be one. Whether the POST initializes.
fn check_handshake(headers: &HeaderMap, messages: &[Value]) -> Result<bool, McpError> {
    let is_initialize = |m: &Value| m.get("method").and_then(Value::as_str) == Some("initialize");
    let has_init = messages.iter().any(is_initialize);
    if has_init && messages.len() > 1 {
        return Err(McpError::InitializeInBatch);
    }
    if let Some(version) = header(headers, names::MCP_PROTOCOL_VERSION).filter(|_| !has_init) {
        if !HANDSHAKE_VERSIONS.contains(&version) {
            return Err(McpError::UnsupportedVersion(version.to_owned()));
        }
    }
    if header(headers, names::MCP_SESSION_ID).is_some_and(|id| !session::well_formed(id)) {
        return Err(McpError::MalformedSession);
    }
    Ok(has_init)
}

/// The session a request names: one its caller holds.
fn known_session(endpoint: &Endpoint, supplied: Option<&str>) -> Result<String, McpError> {
    let id = supplied.ok_or(McpError::NoSessionId)?;
    if endpoint.sessions.touch(id, &endpoint.owner) == Lookup::Unknown {
        // Expired, terminated, from before a restart, or someone else's: the client initializes again.
        return Err(McpError::SessionNotFound);
    }
    Ok(id.to_owned())
}

/// The messages of a batch are answered side by side (a few at a time), as a server reached directly answers
/// them: one after another, three slow calls overran the request's timeout together and all three answers were
/// lost. A message refused for want of a scope gets its own error and the others are still answered; when all are
/// refused, the POST is, with the challenge that says which scope to ask for. A batch of one may be an
/// `initialize` (answered with the session it made, `new_session`).
async fn answer_batch(
    routing: &Routing,
    endpoint: &Endpoint,
    session_id: &str,
    messages: Vec<Value>,
    mut new_session: Option<Value>,
) -> Result<Vec<Value>, McpError> {
    use futures::StreamExt;
    let answers =
        messages.into_iter().map(|message| answer(routing, endpoint, session_id, message, new_session.take()));
    let answers: Vec<_> = futures::stream::iter(answers).buffered(BATCH_CONCURRENCY).collect().await;
    if answers.iter().all(|(answer, _)| answer.is_err()) {
        if let Some((Err(refused), _)) = answers.into_iter().next() {
            return Err(refused);
        }
        return Err(McpError::Internal);
    }
    let mut replies = Vec::new();
    for (answer, id) in answers {
        match answer {
            Ok(reply) => replies.extend(reply),
            Err(err) => replies.push(protocol::error_response(id, err.rpc())),
        }
    }
    Ok(replies)
}

/// 202 for no reply (notifications and responses only), else the reply, or the batch's replies as one array.
fn replies_response(mut replies: Vec<Value>, batch: bool) -> Response {
    if replies.is_empty() {
        warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response()
    } else if batch {
        json_response(StatusCode::OK, &Value::Array(replies))
    } else {
        json_response(StatusCode::OK, &replies.remove(0))
    }
}

/// Most a batch may carry: each message is answered, and the answers kept until the last is, so a batch of a few
/// thousand cheap requests made one POST cost the satellite hundreds of megabytes.
pub(in crate::http) const MAX_BATCH_MESSAGES: usize = 100;
/// The messages of one batch answered at once, at most: a batch must not take the instance's call slots from its
/// member's other clients, nor multiply the satellite's own request limit a hundredfold.
pub(in crate::http) const BATCH_CONCURRENCY: usize = 8;

/// The answer to one message of a handshake-era POST (none for a notification or a response), and its id, for
/// the error object a batch gives a message whose answer is an HTTP error. `new_session`: the answer to this
/// request's `initialize`, built with its session.
async fn answer(
    routing: &Routing,
    endpoint: &Endpoint,
    session_id: &str,
    message: Value,
    new_session: Option<Value>,
) -> (Result<Option<Value>, McpError>, Option<protocol::RequestId>) {
    let reply = match Message::from_value(message) {
        Err(err) => Some(protocol::error_response(
            None,
            RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {err}")),
        )),
        Ok(Message::Request { id, method, .. }) if method == "initialize" => {
            let result = match new_session {
                Some(result) => result,
                None => initialize_result(None, &Identity::of(&routing.manager, &endpoint.target).await).1,
            };
            Some(protocol::response(id, result))
        }
        Ok(Message::Request { id, method, params }) => {
            let subscription = subscription_of(&method, params.as_ref());
            match endpoint.target.dispatch(routing, Some(session_id), &method, params, None).await {
                Ok(result) => {
                    if let Some(subscription) = subscription {
                        record_subscription(routing, &endpoint.target, &endpoint.sessions, session_id, &subscription);
                    }
                    match protocol::answer_value(protocol::payload_for_handshake(result)) {
                        Ok(result) => Some(protocol::response(id, result)),
                        Err(err) => Some(protocol::error_response(Some(id), err)),
                    }
                }
                Err(RouteError::Rpc(err)) => Some(protocol::error_response(Some(id), err)),
                Err(RouteError::Forbidden(err)) => return (Err(McpError::Auth(err)), Some(id)),
            }
        }
        Ok(Message::Notification { method, params }) => {
            client_notification(&routing.manager, endpoint, session_id, &method, params).await;
            None
        }
        Ok(Message::Response { id, outcome }) => {
            if !endpoint.sessions.exchange.deliver(session_id, &id, outcome) {
                tracing::debug!(%id, "a response nothing waits for (late, or for another session)");
            }
            None
        }
    };
    (Ok(reply), None)
}

/// A lone `tools/list` request whose answer is fixed (the meta-tools) is answered with the JSON text written
/// once. Anything else is handed back, for the plain path.
fn fixed_listing(
    routing: &Routing,
    endpoint: &Endpoint,
    session_id: &str,
    message: Value,
) -> Result<Result<Response, McpError>, Value> {
    let listing = message.get("method").and_then(Value::as_str) == Some("tools/list")
        && message.as_object().is_some_and(protocol::is_version_2);
    let id = match message.get("id") {
        Some(Value::Number(n)) if listing => {
            n.as_i64().map(protocol::RequestId::Number).or_else(|| n.as_u64().map(protocol::RequestId::Wide))
        }
        Some(Value::String(s)) if listing => Some(protocol::RequestId::String(s.clone())),
        _ => None,
    };
    let Some(id) = id else { return Err(message) };
    Ok(match endpoint.target.fixed_listing(routing, Some(session_id)) {
        None => return Err(message),
        Some(Ok(text)) => Ok(raw_json_response(protocol::response_text(&id, text).into_bytes())),
        Some(Err(RouteError::Rpc(err))) => Ok(json_response(StatusCode::OK, &protocol::error_response(Some(id), err))),
        Some(Err(RouteError::Forbidden(err))) => Err(McpError::Auth(err)),
    })
}

/// A 200 with a JSON body already written.
fn raw_json_response(body: Vec<u8>) -> Response {
    let mut response = Response::new(body.into());
    response.headers_mut().insert(warp::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A 200 carrying the JSON-RPC response around `result`, written once into a body of its final size. Grown from
/// empty (`warp::reply::json`), the body of a result of megabytes was copied at each doubling and ended up to twice
/// the result's size, all while the result itself was still held.
fn result_response(id: &protocol::RequestId, result: &Payload) -> Response {
    let envelope = protocol::ResultResponse::new(id, result);
    let id_room = match id {
        protocol::RequestId::String(id) => id.len() + 8,
        protocol::RequestId::Number(_) | protocol::RequestId::Wide(_) => 24,
    };
    let room = match result {
        Payload::Text { text, .. } => text.get().len() + id_room + 40,
        Payload::Value(_) => 128,
    };
    let mut body = Vec::with_capacity(room);
    match serde_json::to_writer(&mut body, &envelope) {
        Ok(()) => raw_json_response(body),
        // Writing a result cannot fail (its keys are strings, its numbers finite); warp's answer should it ever.
        Err(_) => json_response(StatusCode::OK, &envelope),
    }
}

/// Methods both routers answer at once from what the satellite keeps (its meta-tools, the catalogs): no server
/// can speak during them, so they need no relay and no task of their own.
fn answered_locally(method: &str) -> bool {
    matches!(method, "ping" | "tools/list" | "resources/list" | "resources/templates/list")
}

/// A single handshake-era request runs with a relay, so what the server says meanwhile reaches the client on
/// an SSE response. Anything that is not such a request (initialize, notifications, responses, what the
/// satellite answers itself) is handed back, for the plain path.
pub(super) async fn relayed(
    routing: &Routing,
    endpoint: &Endpoint,
    session_id: &str,
    message: Value,
) -> Result<Result<Response, McpError>, Value> {
    if !relayable(&message) {
        return Err(message);
    }
    let (id, method, params) = match as_request(message) {
        Ok(parts) => parts,
        Err(error) => return Ok(Ok(invalid_request(error))),
    };
    // A subscription the server accepts is this session's: its stream then carries that resource's updates.
    let subscription = subscription_of(&method, params.as_ref())
        .map(|subscription| (subscription, endpoint.sessions.clone(), session_id.to_owned()));
    let (target, routing, reply_id) = (endpoint.target.clone(), routing.clone(), id.clone());
    let session = session_id.to_owned();
    let answer = endpoint
        .sessions
        .exchange
        .respond(
            session_id.to_owned(),
            id.clone(),
            Mode::Handshake { capabilities: endpoint.sessions.capabilities(session_id) },
            move |relay| async move {
                let outcome = target.dispatch(&routing, Some(&session), &method, params, Some(&relay)).await;
                if let (Ok(_), Some((subscription, sessions, session))) = (&outcome, subscription) {
                    record_subscription(&routing, &target, &sessions, &session, &subscription);
                }
                outcome
            },
            move |outcome| response_message(reply_id, outcome.map(protocol::payload_for_handshake)),
        )
        .await;
    Ok(relayed_response(id, answer))
}

/// A request that reaches an upstream server: one with an id, of a method the satellite does not answer itself.
fn relayable(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str).is_some_and(|m| m != "initialize" && !answered_locally(m))
        && message.get("id").is_some_and(|id| !id.is_null())
}

/// The response to a relayed request: the stream it started, or its outcome as plain JSON.
fn relayed_response(id: protocol::RequestId, answer: Answer) -> Result<Response, McpError> {
    match answer {
        Answer::Streamed(response) => Ok(response),
        Answer::Done(Ok(result)) => {
            // The server's text goes out as it came, inside the client's own envelope.
            let result = protocol::payload_for_handshake(result);
            Ok(result_response(&id, &result))
        }
        Answer::Done(Err(RouteError::Rpc(err))) => {
            Ok(json_response(StatusCode::OK, &protocol::error_response(Some(id), err)))
        }
        Answer::Done(Err(RouteError::Forbidden(err))) => Err(McpError::Auth(err)),
    }
}

/// A change of the resources a session subscribes to.
struct Subscription {
    uri: String,
    /// `resources/subscribe` (true) or `resources/unsubscribe` (false).
    subscribed: bool,
}

/// The resource a `resources/subscribe` or `resources/unsubscribe` names.
fn subscription_of(method: &str, params: Option<&Value>) -> Option<Subscription> {
    let subscribed = match method {
        "resources/subscribe" => true,
        "resources/unsubscribe" => false,
        _ => return None,
    };
    let uri = params.and_then(|p| p.get("uri")).and_then(Value::as_str)?;
    Some(Subscription { uri: uri.to_owned(), subscribed })
}

/// Record on the session a subscription change the server accepted, on every path a request takes (alone or in a
/// batch). A session that ended while its subscribe ran lets go of it at once: its end could not.
fn record_subscription(
    routing: &Routing,
    target: &Target,
    sessions: &SessionTable,
    session: &str,
    change: &Subscription,
) {
    let Subscription { uri, subscribed } = change;
    if sessions.set_subscription(session, uri, *subscribed) || !subscribed {
        return;
    }
    if let Target::Instance(instance) = target {
        let timeout = routing.instance_router.call_timeout;
        routing.manager.release_subscriptions(&instance.spec().process_id, session, vec![uri.clone()], timeout);
    }
}

/// A notification from the client: cancellation stops the named call; on an instance endpoint the rest (roots
/// changes and the like) go to the server, which is the one they concern; on `/mcp` a roots change goes to every
/// server of the caller's.
pub(super) async fn client_notification(
    manager: &crate::instances::InstanceManager,
    endpoint: &Endpoint,
    scope: &str,
    method: &str,
    params: Option<Value>,
) {
    match (method, &endpoint.target) {
        ("notifications/cancelled", _) => endpoint.sessions.exchange.cancel(scope, params.as_ref()),
        ("notifications/initialized", _) => {}
        (_, Target::Instance(instance)) => manager.notify(instance, method, params).await,
        ("notifications/roots/list_changed", Target::Hierarchical(caller, _)) => {
            roots_changed(manager, caller, params).await
        }
        _ => {}
    }
}

/// On `/mcp` and legacy `/sse` the caller's roots are those of every server of theirs: each running one hears of
/// the change (and asks for the new roots on a stream of this caller's, `Seats`). A 2026-07-28 server has no such
/// notification: it reads the roots of each request.
pub(crate) async fn roots_changed(
    manager: &crate::instances::InstanceManager,
    caller: &auth::Principal,
    params: Option<Value>,
) {
    let handshake = |instance: &&Arc<crate::instances::Instance>| {
        instance.client().is_some_and(|c| matches!(c.era(), crate::mcp::client::Era::Handshake { .. }))
    };
    let instances = manager.instances_for(&caller.user, &caller.team);
    let told = instances
        .iter()
        .filter(handshake)
        .map(|instance| manager.notify(instance, "notifications/roots/list_changed", params.clone()));
    futures::future::join_all(told).await;
}
