//! 2026-07-28 requests: each stands alone, carrying its version in `_meta` and `MCP-Protocol-Version`; no session is created or read.

use super::*;
use crate::mcp::cache::CacheHints;
use crate::mcp::headers as mirrored;

/// 2026-07-28: every request stands alone; no session is created or read.
pub(super) async fn stateless_post(
    deps: &McpDeps,
    endpoint: &Endpoint,
    headers: &HeaderMap,
    mut messages: Vec<Value>,
    batch: bool,
) -> Result<Response, McpError> {
    if messages.len() == 1 && !batch {
        if let Some(single) = messages.pop() {
            match stateless_relayed(deps, endpoint, headers, single).await {
                Ok(response) => return response,
                Err(single) => messages.push(single),
            }
        }
    }
    let identity = Identity::of(&deps.routing.manager, &endpoint.target).await;
    let post = StatelessPost { routing: &deps.routing, endpoint, headers, identity, batch };
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
        match post.outcome(&method, params).await {
            Ok(result) => replies.push(post.result_reply(id, &method, result)),
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

/// A 2026-07-28 POST answered without a relay: what answering each of its requests reads.
struct StatelessPost<'a> {
    routing: &'a Routing,
    endpoint: &'a Endpoint,
    headers: &'a HeaderMap,
    identity: Identity,
    batch: bool,
}

impl StatelessPost<'_> {
    /// The outcome of one request: refused by its envelope, `server/discover` and the removed methods answered
    /// here, anything else by the endpoint's router.
    async fn outcome(&self, method: &str, params: Option<Value>) -> Result<Payload, RouteError> {
        match check_request(self.endpoint, self.headers, method, params.as_ref(), self.batch) {
            Err(err) => Err(RouteError::Rpc(err)),
            Ok(()) if method == "server/discover" => match self.endpoint.target.refused_selection() {
                Some(err) => Err(RouteError::Rpc(err.clone())),
                None => Ok(self.discovered(params.as_ref()).into()),
            },
            Ok(()) if REMOVED_IN_STATELESS.contains(&method) => Err(RouteError::Rpc(RpcError::new(
                codes::METHOD_NOT_FOUND,
                format!("Method not found: {method} is not part of {MODERN_VERSION}"),
            ))),
            Ok(()) => self.endpoint.target.dispatch(self.routing, None, method, params, None).await,
        }
    }

    /// The `server/discover` result: the versions the satellite speaks and the endpoint's identity.
    fn discovered(&self, params: Option<&Value>) -> Value {
        let mut identity = self.identity.clone();
        // A 2026-07-28 client hears of list changes only on `subscriptions/listen`, which `/mcp` does
        // not serve: it promises none (its handshake-era sessions hear them on their GET stream).
        // Before, it promised them and refused the listen.
        let hierarchical = !matches!(self.endpoint.target, Target::Instance(_));
        if hierarchical {
            identity.promise_no_list_changes();
        }
        let mut capabilities = identity.capabilities.clone();
        // Only to a client that declares it: the others never see the experimental methods.
        if hierarchical && crate::router::catalog::declared(params) {
            crate::router::catalog::advertise(&mut capabilities);
        }
        if hierarchical && crate::router::tasks::declared(params) {
            crate::router::tasks::advertise(&mut capabilities);
        }
        let mut discovered = protocol::object([
            ("supportedVersions", json!(SUPPORTED_VERSIONS)),
            ("capabilities", capabilities),
            ("serverInfo", identity.server_info.clone()),
        ]);
        if let Some(instructions) = &identity.instructions {
            discovered["instructions"] = Value::from(instructions.as_str());
        }
        discovered
    }

    /// The response to a request that succeeded, stamped as 2026-07-28 results are.
    fn result_reply(&self, id: protocol::RequestId, method: &str, result: Payload) -> Value {
        match protocol::answer_value(result) {
            Ok(mut result) => {
                let cache = self.endpoint.target.cache_hints(method);
                protocol::stamp_stateless_result(&mut result, method, self.identity.server_info.clone(), cache);
                protocol::response(id, result)
            }
            Err(err) => protocol::error_response(Some(id), err),
        }
    }
}

/// A single 2026-07-28 request that reaches an upstream server runs with a relay (which cannot carry server
/// requests: this revision has none), so progress and log messages stream to the client; `None` for the
/// methods the satellite answers itself, whose message is handed back.
pub(super) async fn stateless_relayed(
    deps: &McpDeps,
    endpoint: &Endpoint,
    headers: &HeaderMap,
    message: Value,
) -> Result<Result<Response, McpError>, Value> {
    let Some(method) = message.get("method").and_then(Value::as_str) else { return Err(message) };
    let long_lived = method == "subscriptions/listen" && matches!(endpoint.target, Target::Instance(_));
    let relayable = (long_lived
        || matches!(method, "tools/call" | "resources/read" | "prompts/get" | "completion/complete"))
        && message.get("id").is_some_and(|id| !id.is_null())
        && check_request(endpoint, headers, method, message.get("params"), false).is_ok();
    if !relayable {
        return Err(message);
    }
    let (id, method, params) = match as_request(message) {
        Ok(parts) => parts,
        Err(error) => return Ok(Ok(invalid_request(error))),
    };
    // A listen holds one of its caller's stream places for as long as it is open, as every long-lived stream does.
    let long_lived = match long_lived {
        true => match hold_listen(deps, endpoint, headers) {
            Ok(listen) => Some(listen),
            Err(refused) => return Ok(Err(refused)),
        },
        false => None,
    };
    let mode = stateless_mode(endpoint, &method, params.as_ref(), long_lived);
    let server_info = Identity::of(&deps.routing.manager, &endpoint.target).await.server_info;
    let cache = endpoint.target.cache_hints(&method);
    let finish = stamped(id.clone(), method.clone(), server_info.clone(), cache);
    let scope = format!("stateless:{}", uuid::Uuid::new_v4());
    let exchange = &endpoint.sessions.exchange;
    let state = params.as_ref().and_then(|p| p.get("requestState"));
    let answered_method = method.clone();
    let answer = if is_parked_state(state) {
        // The retry of a call the satellite parked when its server asked the client something.
        let state = state.and_then(Value::as_str).unwrap_or_default().to_owned();
        let responses = params.as_ref().and_then(|p| p.get("inputResponses"));
        exchange.resume(scope, id.clone(), mode, &state, responses, finish).await
    } else {
        let (target, routing) = (endpoint.target.clone(), deps.routing.clone());
        let run = move |relay| async move { target.dispatch(&routing, None, &method, params, Some(&relay)).await };
        exchange.respond(scope, id.clone(), mode, run, finish).await
    };
    Ok(stateless_response(id, &answered_method, server_info, cache, answer))
}

/// A `subscriptions/listen` lasts: it holds one of its caller's stream places, and ends once the credential that
/// opened it no longer admits the caller.
fn hold_listen(deps: &McpDeps, endpoint: &Endpoint, headers: &HeaderMap) -> Result<LongLived, McpError> {
    let streams = &deps.places.streams;
    let place = streams.take(endpoint.target.caller()).ok_or(McpError::CallerStreams { limit: streams.max() })?;
    let long_lived = LongLived::new();
    let (auth, manager) = (deps.gate.auth.clone(), deps.routing.manager.clone());
    let watch = revoked(auth, manager, endpoint.credential(headers), "subscriptions/listen");
    // Ends with the request, however it ends (`LongLived` cancels `ends` when its last copy goes); the place
    // goes with it.
    let ends = long_lived.ends();
    // On the satellite's tracker, which shutdown waits for; the drain ends a listen first.
    deps.background.tasks.spawn(async move {
        let _place = place;
        tokio::select! {
            _ = watch => ends.cancel(),
            _ = ends.cancelled() => {}
        }
    });
    Ok(long_lived)
}

/// How the exchange treats a relayed 2026-07-28 request: what its envelope declares, and who may resume it.
fn stateless_mode(endpoint: &Endpoint, method: &str, params: Option<&Value>, long_lived: Option<LongLived>) -> Mode {
    let meta = params.and_then(|p| p.get("_meta"));
    // Only these may end in `input_required` (MRTR): a server's request during any other is answered as a client
    // without the capability would answer it, whatever the client declared. (A completion parked so made the SDK
    // fail to read it as a `CompleteResult`, and left the call waiting upstream.)
    let may_ask = matches!(method, "tools/call" | "prompts/get" | "resources/read");
    let capabilities = meta
        .and_then(|m| m.get(protocol::meta_keys::CLIENT_CAPABILITIES))
        .filter(|_| may_ask)
        .cloned()
        .unwrap_or_else(|| json!({}));
    let log_level = meta.and_then(|m| m.get(protocol::meta_keys::LOG_LEVEL)).and_then(Value::as_str).map(str::to_owned);
    let progress = ProgressTokens::of(params);
    Mode::Stateless { capabilities, owner: endpoint.owner.clone(), long_lived, log_level, progress }
}

/// The last message of a relayed 2026-07-28 request's stream: its outcome, stamped as 2026-07-28 results are.
fn stamped(
    reply_id: protocol::RequestId,
    method: String,
    server_info: Value,
    cache: CacheHints,
) -> impl FnOnce(Result<Payload, RouteError>) -> Value + Send + Sync + 'static {
    move |outcome: Result<Payload, RouteError>| {
        let result = outcome.and_then(|result| {
            let mut result = protocol::answer_value(result).map_err(RouteError::Rpc)?;
            protocol::stamp_stateless_result(&mut result, &method, server_info, cache);
            protocol::retag_subscription(&mut result, &reply_id);
            Ok(Payload::Value(result))
        });
        response_message(reply_id, result)
    }
}

/// The response to a relayed 2026-07-28 request: the stream it started, or its outcome as plain JSON.
fn stateless_response(
    id: protocol::RequestId,
    method: &str,
    server_info: Value,
    cache: CacheHints,
    answer: Answer,
) -> Result<Response, McpError> {
    match answer {
        Answer::Streamed(response) => Ok(response),
        Answer::Done(Ok(result)) => match protocol::answer_value(result) {
            Ok(mut result) => {
                protocol::stamp_stateless_result(&mut result, method, server_info, cache);
                Ok(json_response(StatusCode::OK, &protocol::response(id, result)))
            }
            Err(err) => Ok(json_response(rpc_status(err.code), &protocol::error_response(Some(id), err))),
        },
        Answer::Done(Err(RouteError::Rpc(err))) => {
            Ok(json_response(rpc_status(err.code), &protocol::error_response(Some(id), err)))
        }
        Answer::Done(Err(RouteError::Forbidden(err))) => Err(McpError::Auth(err)),
    }
}

/// Methods of the handshake era that 2026-07-28 removed: a stateless request for one is answered 404/-32601
/// whatever the upstream speaks, so the client sees one revision, not a mix.
pub(super) const REMOVED_IN_STATELESS: [&str; 5] =
    ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];

/// Versions a 2026-07-28 client is told the satellite speaks.
pub(super) const SUPPORTED_VERSIONS: [&str; 4] =
    [MODERN_VERSION, LEGACY_VERSIONS[2], LEGACY_VERSIONS[1], LEGACY_VERSIONS[0]];

/// A 2026-07-28 request's envelope and the headers that mirror it: the envelope's keys (-32602), then
/// `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` present and agreeing with the body (-32020, "Server
/// Validation"), then the version served (-32022). In a batch, which one set of headers cannot describe, the
/// headers sent must agree with every request and none is required.
pub(super) fn check_envelope(
    headers: &HeaderMap,
    method: &str,
    params: Option<&Value>,
    batch: bool,
) -> Result<(), RpcError> {
    let mismatch = |reason: String| RpcError::new(codes::HEADER_MISMATCH, format!("Header mismatch: {reason}"));
    let mut versions = headers.get_all(names::MCP_PROTOCOL_VERSION).iter();
    let (version, again) = (versions.next(), versions.next());
    if again.is_some() {
        return Err(mismatch("MCP-Protocol-Version header appears more than once".into()));
    }
    let version = version.map(|v| v.to_str().map_err(|_| mismatch("MCP-Protocol-Version header is not text".into())));
    let version = version.transpose()?;
    match protocol::check_stateless_envelope(version, params, &SUPPORTED_VERSIONS) {
        Err(err) if err.code != codes::UNSUPPORTED_PROTOCOL_VERSION => Err(err),
        checked => {
            if version.is_none() && !batch {
                return Err(mismatch("MCP-Protocol-Version header is missing".into()));
            }
            mirrored::check_request(headers, method, params, !batch).map_err(mismatch)?;
            checked
        }
    }
}

/// [`check_envelope`], a progress token of a type the specification allows, and on an instance's endpoint the
/// `Mcp-Param-*` headers of a `tools/call` against its arguments, by the `x-mcp-header` annotations of the tool
/// the catalog lists (a tool it does not list has none the satellite knows of). The meta-tools of `/mcp` have none.
fn check_request(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    method: &str,
    params: Option<&Value>,
    batch: bool,
) -> Result<(), RpcError> {
    check_envelope(headers, method, params, batch)?;
    // Before a relay is made: the retry of a parked call, which no router sees, carries a token of its own.
    crate::mcp::progress::check_token(params)?;
    let Target::Instance(instance) = &endpoint.target else { return Ok(()) };
    if method != "tools/call" {
        return Ok(());
    }
    let Some(name) = params.and_then(|p| p.get("name")).and_then(Value::as_str) else { return Ok(()) };
    let Some(catalog) = instance.catalog() else { return Ok(()) };
    // Most tools name no header: they are not in the catalog's index of those that do, and nothing is read.
    let Some(schema) = catalog.header_schema(name) else { return Ok(()) };
    let Ok(schema) = serde_json::from_str::<Value>(schema.get()) else { return Ok(()) };
    // Invalid annotations: a conforming client dropped the tool and sends no headers for it.
    let Ok(annotated) = mirrored::ParamHeaders::of(&schema) else { return Ok(()) };
    annotated
        .check(params.and_then(|p| p.get("arguments")), headers)
        .map_err(|reason| RpcError::new(codes::HEADER_MISMATCH, format!("Header mismatch: {reason}")))
}
