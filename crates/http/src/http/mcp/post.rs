//! A POST to an MCP endpoint: framing checks, era choice, sessions, and the answer to each message.

use super::*;

pub(super) async fn post(
    deps: &McpDeps,
    endpoint: Endpoint,
    headers: &HeaderMap,
    frame: Frame,
) -> Result<Response, McpError> {
    let content_type = header(headers, names::CONTENT_TYPE).unwrap_or("");
    let json =
        content_type.trim_start().as_bytes().get(..16).is_some_and(|t| t.eq_ignore_ascii_case(b"application/json"));
    if !json {
        return Err(McpError::UnsupportedMediaType);
    }
    if !accepts_all(headers, ["application/json", "text/event-stream"]) {
        return Err(McpError::NotAcceptable { stream_only: false });
    }
    let (mut messages, batch) = frame.map_err(|err| match err {
        FrameError::Json(err) => McpError::Parse(err),
        FrameError::EmptyBatch => McpError::EmptyBatch,
    })?;
    if messages.len() > MAX_BATCH_MESSAGES {
        return Err(McpError::BatchTooLarge { messages: messages.len(), max: MAX_BATCH_MESSAGES });
    }
    let header_version = header(headers, names::MCP_PROTOCOL_VERSION).map(str::to_owned);
    let stateless = header_version.as_deref() == Some(MODERN_VERSION)
        || messages.iter().any(|m| {
            m.get("method").and_then(Value::as_str) != Some("initialize")
                && protocol::has_stateless_envelope(m.get("params"))
        });
    if stateless {
        return stateless_post(deps, &endpoint, headers, messages, batch).await;
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
    let supplied = header(headers, names::MCP_SESSION_ID).map(str::to_owned);
    if supplied.as_deref().is_some_and(|id| !session::well_formed(id)) {
        return Err(McpError::MalformedSession);
    }
    // The answer to this request's `initialize`, built with its session.
    let mut new_session: Option<Value> = None;
    let session_id = if has_init {
        if let Some(id) = &supplied {
            if endpoint.sessions.touch(id, &endpoint.owner) == Lookup::Known {
                return Err(McpError::AlreadyInitialized);
            }
        }
        let capabilities = messages[0].pointer("/params/capabilities").cloned().unwrap_or_default();
        // The declared capabilities are kept for the session's life: bounded like everything a client can make
        // the satellite keep.
        let oversized = (crate::mcp::payload::json_len(&capabilities) > session::MAX_CAPABILITIES_BYTES).then(|| {
            RpcError::new(
                codes::INVALID_PARAMS,
                format!("capabilities larger than {} KiB", session::MAX_CAPABILITIES_BYTES / 1024),
            )
        });
        // No session for a connection whose toolset cannot be used: the client shows why it failed.
        if let Some(err) = oversized.as_ref().or(endpoint.target.refused_selection()) {
            let id = messages[0].get("id").cloned().and_then(|id| serde_json::from_value(id).ok());
            return Ok(json_response(StatusCode::OK, &protocol::error_response(id, err.clone())));
        }
        // An `initialize` that is no valid request (no id, or a null or fractional one) makes no session: a session
        // id belongs only on the answer that carries an `InitializeResult`. Before, a session was made first and
        // worked, though the client was told 202 or an error.
        match Message::from_value(messages[0].clone()) {
            Ok(Message::Request { .. }) => {}
            invalid => {
                let why = match invalid {
                    Err(err) => err.to_string(),
                    Ok(_) => "initialize is a request: it needs an id".to_owned(),
                };
                let err = RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {why}"));
                return Ok(json_response(StatusCode::BAD_REQUEST, &protocol::error_response(None, err)));
            }
        }
        let requested = messages[0].pointer("/params/protocolVersion").and_then(Value::as_str);
        // The commonest: a lone `initialize` on `/mcp` with no toolset, answered with the text made once per version.
        if !batch && matches!(endpoint.target, Target::Hierarchical(..)) && endpoint.target.toolset().is_none() {
            let id = messages[0].get("id").filter(|id| !id.is_null()).cloned();
            let id = id.and_then(|id| serde_json::from_value::<protocol::RequestId>(id).ok());
            if let (Some(id), Some((version, result))) = (id, hierarchical_initialize_result(requested)) {
                let quota = endpoint.target.session_quota();
                let session = endpoint.sessions.create_in(&endpoint.owner, &quota, version, capabilities);
                let response = json_response(StatusCode::OK, &protocol::ResultResponse::new(&id, result));
                return Ok(with_session(response, &session));
            }
        }
        let (version, result) =
            initialize_result(requested, &Identity::of(&deps.routing.manager, &endpoint.target).await);
        let id = endpoint.sessions.create_in(&endpoint.owner, &endpoint.target.session_quota(), &version, capabilities);
        new_session = Some(result);
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
        if let Some(message) = messages.pop() {
            let answer = match relayed(&deps.routing, &endpoint, &session_id, message).await {
                Err(message) => fixed_listing(&deps.routing, &endpoint, &session_id, message),
                relayed => relayed,
            };
            match answer {
                Ok(answer) => return Ok(with_session(answer?, &session_id)),
                Err(message) => messages.push(message),
            }
        }
    }
    let mut replies = Vec::new();
    if batch {
        // The messages of a batch are answered side by side (a few at a time), as a server reached directly answers
        // them: one after another, three slow calls overran the request's timeout together and all three answers
        // were lost. A
        // message refused for want of a scope gets its own error and the others are still answered; when all are
        // refused, the POST is, with the challenge that says which scope to ask for.
        use futures::StreamExt;
        // A batch of one may be an `initialize` (answered with the session it made).
        let mut new_session = new_session.take();
        let answers = messages
            .into_iter()
            .map(|message| answer(&deps.routing, &endpoint, &session_id, message, new_session.take()));
        let answers: Vec<_> = futures::stream::iter(answers).buffered(BATCH_CONCURRENCY).collect().await;
        if answers.iter().all(|(answer, _)| answer.is_err()) {
            if let Some((Err(refused), _)) = answers.into_iter().next() {
                return Err(refused);
            }
            return Err(McpError::Internal);
        }
        for (answer, id) in answers {
            match answer {
                Ok(reply) => replies.extend(reply),
                Err(err) => replies.push(protocol::error_response(id, err.rpc())),
            }
        }
    } else if let Some(message) = messages.pop() {
        let (answer, _) = answer(&deps.routing, &endpoint, &session_id, message, new_session.take()).await;
        replies.extend(answer?);
    }
    let response = if replies.is_empty() {
        warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response()
    } else if batch {
        json_response(StatusCode::OK, &Value::Array(replies))
    } else {
        json_response(StatusCode::OK, &replies.remove(0))
    };
    Ok(with_session(response, &session_id))
}

/// Most a batch may carry: each message is answered, and the answers kept until the last is, so a batch of a few
/// thousand cheap requests made one POST cost the satellite hundreds of megabytes.
const MAX_BATCH_MESSAGES: usize = 100;
/// The messages of one batch answered at once, at most: a batch must not take the instance's call slots from its
/// member's other clients, nor multiply the satellite's own request limit a hundredfold.
const BATCH_CONCURRENCY: usize = 8;

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
                    if let Some((uri, subscribed)) = subscription {
                        record_subscription(
                            routing,
                            &endpoint.target,
                            &endpoint.sessions,
                            session_id,
                            &uri,
                            subscribed,
                        );
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

/// The answer, carrying the session it belongs to.
fn with_session(mut response: Response, session_id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(session_id) {
        response.headers_mut().insert("mcp-session-id", value);
    }
    response
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
    let relayable =
        message.get("method").and_then(Value::as_str).is_some_and(|m| m != "initialize" && !answered_locally(m))
            && message.get("id").is_some_and(|id| !id.is_null());
    if !relayable {
        return Err(message);
    }
    let (id, method, params) = match as_request(message) {
        Ok(parts) => parts,
        Err(error) => return Ok(Ok(invalid_request(error))),
    };
    // A subscription the server accepts is this session's: its stream then carries that resource's updates.
    let subscription = subscription_of(&method, params.as_ref())
        .map(|(uri, subscribed)| (uri, subscribed, endpoint.sessions.clone(), session_id.to_owned()));
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
                if let (Ok(_), Some((uri, subscribed, sessions, session))) = (&outcome, subscription) {
                    record_subscription(&routing, &target, &sessions, &session, &uri, subscribed);
                }
                outcome
            },
            move |outcome| response_message(reply_id, outcome.map(protocol::payload_for_handshake)),
        )
        .await;
    Ok(match answer {
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
    })
}

/// The resource a `resources/subscribe` (true) or `resources/unsubscribe` (false) names.
fn subscription_of(method: &str, params: Option<&Value>) -> Option<(String, bool)> {
    let subscribed = match method {
        "resources/subscribe" => true,
        "resources/unsubscribe" => false,
        _ => return None,
    };
    params.and_then(|p| p.get("uri")).and_then(Value::as_str).map(|uri| (uri.to_owned(), subscribed))
}

/// Record on the session a subscription change the server accepted, on every path a request takes (alone or in a
/// batch). A session that ended while its subscribe ran lets go of it at once: its end could not.
fn record_subscription(
    routing: &Routing,
    target: &Target,
    sessions: &SessionTable,
    session: &str,
    uri: &str,
    subscribed: bool,
) {
    if sessions.set_subscription(session, uri, subscribed) || !subscribed {
        return;
    }
    if let Target::Instance(instance) = target {
        let timeout = routing.instance_router.call_timeout;
        routing.manager.release_subscriptions(&instance.spec().process_id, session, vec![uri.to_owned()], timeout);
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
