//! What a request asks the server to remember for its connection (a subscription, a log level), which a server
//! started anew must be asked again; and a 2026-07-28 server, which has no session to remember them in, for which
//! the satellite keeps them and answers itself.

use serde_json::Value;

use crate::instances::instance::{Instance, InstanceError};
use crate::mcp::client::{Era, McpClient};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{codes, RpcError};
use crate::mcp::transport::UpstreamError;

/// What a request asks the server to remember for the connection, which a server started anew must be asked again.
pub(super) enum Remembered {
    /// The resource a `resources/subscribe` (true) or `resources/unsubscribe` (false) names.
    Subscription(String, bool),
    /// The level of a `logging/setLevel`.
    LogLevel(String),
}

pub(super) fn remembered(method: &str, params: Option<&Value>) -> Option<Remembered> {
    let text = |key: &str| params?.get(key)?.as_str().map(str::to_owned);
    match method {
        "resources/subscribe" => Some(Remembered::Subscription(text("uri")?, true)),
        "resources/unsubscribe" => Some(Remembered::Subscription(text("uri")?, false)),
        "logging/setLevel" => Some(Remembered::LogLevel(text("level")?)),
        _ => None,
    }
}

/// What a request the server answered asked it to remember, noted for a server started anew to be asked again.
pub(super) fn note_remembered(instance: &Instance, remember: Remembered) {
    match remember {
        Remembered::Subscription(uri, subscribed) => instance.note_subscription(&uri, subscribed),
        Remembered::LogLevel(level) => instance.note_log_level(level),
    }
}

/// Put the log level a client set (`logging/setLevel`) in a 2026-07-28 request's `_meta`, unless it names one.
fn ask_log_level(params: &mut Option<Value>, level: String) {
    let params = params.get_or_insert_with(|| Value::Object(serde_json::Map::new()));
    let Some(params) = params.as_object_mut() else { return };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(meta) = meta.as_object_mut() {
        meta.entry(crate::mcp::protocol::meta_keys::LOG_LEVEL).or_insert(Value::String(level));
    }
}

/// A 2026-07-28 server has no session to keep a log level or subscriptions in (the revision removed both methods):
/// the satellite keeps them, answers here, asks for the level on each request's `_meta`, and watches the subscribed
/// resources on its own listen (`listen::listen_upstream`). `Some` is the answer given here, a refusal too (what
/// `remember` held is then taken); `None`, the request goes to the server.
pub(super) fn answer_stateless(
    instance: &Instance,
    method: &str,
    client: &McpClient,
    remember: &mut Option<Remembered>,
    params: &mut Option<Value>,
) -> Option<Result<Payload, InstanceError>> {
    if !matches!(client.era(), Era::Stateless { .. }) {
        return None;
    }
    if let Some(answer) = answer_here(instance, method, client.capabilities(), remember.take(), params.as_ref()) {
        return Some(answer);
    }
    if let Some(level) = instance.log_level() {
        ask_log_level(params, level);
    }
    None
}

/// The answer the satellite gives itself to a request that changes what it keeps for a 2026-07-28 server
/// (`declared` its capabilities), or to a `logging/setLevel` it refuses; `None` when the request goes on.
fn answer_here(
    instance: &Instance,
    method: &str,
    declared: &Value,
    remember: Option<Remembered>,
    params: Option<&Value>,
) -> Option<Result<Payload, InstanceError>> {
    // Subscriptions only where the server declares them (else the client gets -32601, as from the server).
    // A log level is kept whatever the server declares: the official Python SDK's servers log on request
    // without declaring `logging`.
    match remember {
        Some(Remembered::Subscription(..))
            if declared.pointer("/resources/subscribe").and_then(Value::as_bool) != Some(true) =>
        {
            Some(Err(not_declared("resources.subscribe")))
        }
        Some(Remembered::Subscription(uri, subscribed)) => {
            instance.note_subscription(&uri, subscribed);
            Some(Ok(Payload::from(serde_json::json!({}))))
        }
        // Answered here, so checked here: a level no server knows, kept, went into the `_meta` of every
        // later request to this server, which refused them all.
        Some(Remembered::LogLevel(level)) => {
            let level = match crate::mcp::protocol::check_log_level(Some(&Value::String(level))) {
                Ok(level) => level,
                Err(err) => return Some(Err(InstanceError::Upstream(UpstreamError::Rpc(err)))),
            };
            instance.note_log_level(level.to_owned());
            Some(Ok(Payload::from(serde_json::json!({}))))
        }
        // No level, or not a string: refused alike (the same check cannot pass without a string).
        None if method == "logging/setLevel" => {
            let level = params.and_then(|p| p.get("level"));
            match crate::mcp::protocol::check_log_level(level) {
                Ok(_) => None,
                Err(err) => Some(Err(InstanceError::Upstream(UpstreamError::Rpc(err)))),
            }
        }
        None => None,
    }
}

/// The refusal of a method the server does not declare `what` for, as the server itself would refuse it.
fn not_declared(what: &str) -> InstanceError {
    let message = format!("Method not found: the server does not declare {what}");
    InstanceError::Upstream(UpstreamError::Rpc(RpcError::new(codes::METHOD_NOT_FOUND, message)))
}
