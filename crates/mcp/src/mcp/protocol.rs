//! JSON-RPC 2.0 envelopes and the MCP constants the satellite relies on.
//!
//! Data only: nothing here spawns, locks or does IO. Messages are kept as
//! `serde_json::Value` payloads so that fields the satellite does not know
//! (`_meta`, new result fields) pass through untouched.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::mcp::cache::CacheHints;
use crate::mcp::payload::{Payload, ResultType};

/// Handshake-era protocol versions, oldest first.
pub const LEGACY_VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];
/// The stateless revision: no handshake, version and client info in every request's `_meta`.
pub const MODERN_VERSION: &str = "2026-07-28";
/// The version the satellite asks for in `initialize` (OQ-26).
pub const HANDSHAKE_REQUEST_VERSION: &str = "2025-06-18";

/// `_meta` keys of the 2026-07-28 revision.
pub mod meta_keys {
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
    /// On every message of a `subscriptions/listen` stream: the JSON-RPC id of the listen request.
    pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
    /// The level a 2026-07-28 request asks the server's log messages about it at.
    pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
}

/// JSON-RPC and MCP error codes.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// The Streamable HTTP transport's own refusals ("Bad Request: …", "Not Acceptable: …").
    pub const TRANSPORT_ERROR: i64 = -32000;
    /// No credentials, or credentials of the wrong kind (SB §5.3, §6.1); an unknown legacy SSE session.
    pub const UNAUTHORIZED: i64 = -32001;
    /// A bearer token that is not valid (SB §5.3).
    pub const INVALID_TOKEN: i64 = -32002;
    /// A missing scope, or an instance path that does not exist (SB §5.3, §6.1).
    pub const FORBIDDEN: i64 = -32004;
    pub const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: the request needs a client capability its envelope did not declare.
    pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// A JSON-RPC request id: a number or a string, never null for requests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    Number(i64),
    String(String),
    /// An integer above `i64::MAX`. MCP asks for "a string or integer ID" and a Python server echoes `2**64 - 1`
    /// back, so the satellite does too. A fraction (`1.5`, `1e3`) stays refused, as the official SDKs refuse it.
    /// The satellite's own ids are always [`RequestId::Number`].
    Wide(u64),
}

impl From<RequestId> for Value {
    fn from(id: RequestId) -> Value {
        match id {
            RequestId::Number(n) => Value::from(n),
            RequestId::String(s) => Value::String(s),
            RequestId::Wide(n) => Value::from(n),
        }
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s}"),
            RequestId::Wide(n) => write!(f, "{n}"),
        }
    }
}

/// The error object of a JSON-RPC error response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// One incoming JSON-RPC message, classified by shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request { id: RequestId, method: String, params: Option<Value> },
    Notification { method: String, params: Option<Value> },
    Response { id: RequestId, outcome: Result<Value, RpcError> },
}

/// Why a value is not a JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("not a json object")]
    NotAnObject,
    #[error("jsonrpc must be \"2.0\"")]
    BadVersion,
    #[error("invalid id")]
    BadId,
    #[error("method must be a string")]
    BadMethod,
    #[error("response has neither result nor error")]
    EmptyResponse,
    #[error("malformed error object")]
    BadError,
}

/// Why an HTTP body or stdio line is not JSON-RPC at the framing level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("{0}")]
    Json(String),
    #[error("empty batch")]
    EmptyBatch,
}

/// One HTTP body or stdio line, decoded: its messages and whether they came as a batch, or why it cannot be read.
pub type Frame = Result<(Vec<Value>, bool), FrameError>;

/// The messages of one HTTP body or stdio line, and whether they came as a batch: a JSON array is a batch (which
/// must not be empty), any other JSON value is one message (classified later by [`Message::from_value`]).
pub fn decode_frame(bytes: &[u8]) -> Frame {
    match serde_json::from_slice::<Value>(bytes).map_err(|err| FrameError::Json(err.to_string()))? {
        Value::Array(items) if items.is_empty() => Err(FrameError::EmptyBatch),
        Value::Array(items) => Ok((items, true)),
        single => Ok((vec![single], false)),
    }
}

/// The commonest line a server writes, read without building a tree: a response carrying a result, to one of
/// the satellite's numeric ids. The result stays the server's text ([`crate::mcp::payload::Payload::Text`]).
/// Anything else, or anything unusual about this (a batch, a repeated member, an id that is not an integer),
/// is `None`, for [`decode_frame`] and [`Message::from_value`], which decide about it as before.
pub fn result_response(text: &str) -> Option<(i64, &RawValue)> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        jsonrpc: Option<&'a RawValue>,
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        method: Option<&'a RawValue>,
        #[serde(borrow)]
        error: Option<&'a RawValue>,
        #[serde(borrow)]
        result: Option<&'a RawValue>,
    }
    let envelope: Envelope = serde_json::from_str(text).ok()?;
    if envelope.jsonrpc?.get() != "\"2.0\"" || envelope.method.is_some() || envelope.error.is_some() {
        return None;
    }
    let id = envelope.id?.get().parse::<i64>().ok()?;
    Some((id, envelope.result?))
}

impl Message {
    /// Classify a parsed JSON value as a request, notification or response.
    pub fn from_value(value: Value) -> Result<Message, MessageError> {
        let Value::Object(mut obj) = value else {
            return Err(MessageError::NotAnObject);
        };
        if !is_version_2(&obj) {
            return Err(MessageError::BadVersion);
        }
        // A present `id` must be a string or an integer: `null` is not one (MCP: "the ID MUST NOT be null"), and a
        // request with it is not a notification. Read as one, a `tools/call` with `"id": null` went to the server as
        // a notification and the client was told 202.
        let id = match obj.remove("id") {
            None => None,
            Some(v) => Some(serde_json::from_value::<RequestId>(v).map_err(|_| MessageError::BadId)?),
        };
        if let Some(method) = obj.remove("method") {
            let Value::String(method) = method else {
                return Err(MessageError::BadMethod);
            };
            let params = obj.remove("params");
            return Ok(match id {
                Some(id) => Message::Request { id, method, params },
                None => Message::Notification { method, params },
            });
        }
        let id = id.ok_or(MessageError::BadId)?;
        if let Some(error) = obj.remove("error") {
            let error: RpcError = serde_json::from_value(error).map_err(|_| MessageError::BadError)?;
            return Ok(Message::Response { id, outcome: Err(error) });
        }
        match obj.remove("result") {
            Some(result) => Ok(Message::Response { id, outcome: Ok(result) }),
            None => Err(MessageError::EmptyResponse),
        }
    }

    pub fn into_value(self) -> Value {
        match self {
            Message::Request { id, method, params } => request(id, &method, params),
            Message::Notification { method, params } => notification(&method, params),
            Message::Response { id, outcome: Ok(result) } => response(id, result),
            Message::Response { id, outcome: Err(error) } => error_response(Some(id), error),
        }
    }
}

/// Whether a message's members say `"jsonrpc": "2.0"`.
pub fn is_version_2(message: &Map<String, Value>) -> bool {
    message.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
}

pub fn request(id: RequestId, method: &str, params: Option<Value>) -> Value {
    let mut obj = Map::new();
    obj.insert("jsonrpc".into(), json!("2.0"));
    obj.insert("id".into(), id.into());
    obj.insert("method".into(), json!(method));
    if let Some(params) = params {
        obj.insert("params".into(), params);
    }
    Value::Object(obj)
}

/// A request as the line a stdio server reads: the same text as `request(..).to_string()`, written straight from
/// its parts. No map is built for the envelope, and the text is written with `serde_json`'s own writer, not through
/// `Display` (which passes every piece through `fmt`): together 6.6k instructions of a proxied call
/// (docs/performance-history.md, 2026-11-28 14:30).
pub fn request_line(id: &RequestId, method: &str, params: Option<&Value>) -> String {
    envelope_line(&Envelope { jsonrpc: "2.0", id: Some(id), method, params })
}

/// A notification as a stdio line; see [`request_line`].
pub fn notification_line(method: &str, params: Option<&Value>) -> String {
    envelope_line(&Envelope { jsonrpc: "2.0", id: None, method, params })
}

/// A request or notification going out, in the order `request` and `notification` write their members.
#[derive(Serialize)]
struct Envelope<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RequestId>,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a Value>,
}

fn envelope_line(envelope: &Envelope<'_>) -> String {
    // Writing strings, integers and `Value`s into memory cannot fail (a `Value`'s keys are strings); should it
    // ever, the envelope goes the slower way, through the same `Value` `request` builds.
    serde_json::to_string(envelope).unwrap_or_else(|_| {
        let params = envelope.params.cloned();
        match envelope.id {
            Some(id) => request(id.clone(), envelope.method, params).to_string(),
            None => notification(envelope.method, params).to_string(),
        }
    })
}

pub fn notification(method: &str, params: Option<Value>) -> Value {
    let mut obj = Map::new();
    obj.insert("jsonrpc".into(), json!("2.0"));
    obj.insert("method".into(), json!(method));
    if let Some(params) = params {
        obj.insert("params".into(), params);
    }
    Value::Object(obj)
}

pub fn response(id: RequestId, result: Value) -> Value {
    object([("jsonrpc", Value::from("2.0")), ("id", id.into()), ("result", result)])
}

/// A response as JSON text, around a result already written as JSON text (one JSON value).
pub fn response_text(id: &RequestId, result_json: &str) -> String {
    let id = match id {
        RequestId::Number(n) => n.to_string(),
        RequestId::String(s) => Value::from(s.as_str()).to_string(),
        RequestId::Wide(n) => n.to_string(),
    };
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result_json}}}"#)
}

/// A response around a result that may still be the server's own text, written as [`response`] writes one.
#[derive(Serialize)]
pub struct ResultResponse<'a> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    result: &'a Payload,
}

impl<'a> ResultResponse<'a> {
    pub fn new(id: &'a RequestId, result: &'a Payload) -> Self {
        ResultResponse { jsonrpc: "2.0", id, result }
    }
}

/// An error response; `id` is `None` (serialised as null) when the request id is unknown.
pub fn error_response(id: Option<RequestId>, error: RpcError) -> Value {
    let error = serde_json::to_value(error)
        .unwrap_or_else(|err| json!({"code": codes::INTERNAL_ERROR, "message": err.to_string()}));
    object([("jsonrpc", Value::from("2.0")), ("id", id.map_or(Value::Null, Value::from)), ("error", error)])
}

/// A JSON object of `entries`, the values moved in. `json!` would serialise each interpolated `Value` into a
/// copy of itself (`to_value`), which on a response carrying a tool's result or a tool list is most of the
/// cost of answering.
pub fn object<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let mut map = Map::with_capacity(N);
    for (key, value) in entries {
        map.insert(key.to_owned(), value);
    }
    Value::Object(map)
}

/// The `_meta` object the 2026-07-28 revision requires on every request.
pub fn modern_request_meta(version: &str, client_info: &Value) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(meta_keys::PROTOCOL_VERSION.into(), json!(version));
    meta.insert(meta_keys::CLIENT_INFO.into(), client_info.clone());
    meta.insert(meta_keys::CLIENT_CAPABILITIES.into(), json!({}));
    meta
}

/// Merge `extra` into `params._meta`, creating both when absent. Existing keys
/// set by the caller win, so a caller's own `_meta` is never overwritten.
pub fn stamp_meta(params: Option<Value>, extra: Map<String, Value>) -> Value {
    let mut params = match params {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Value::Object(meta) = meta {
        for (k, v) in extra {
            meta.entry(k).or_insert(v);
        }
    }
    Value::Object(params)
}

/// Results of the stateless revision carry `resultType`, cache hints on listings and reads (`cache`: what the
/// satellite can vouch for), and the server's info.
pub fn stamp_stateless_result(result: &mut Value, method: &str, server_info: Value, cache: CacheHints) {
    let Value::Object(obj) = result else { return };
    // What the upstream said stays (an `input_required` result above all); only what it left out is added.
    obj.entry("resultType").or_insert_with(|| json!("complete"));
    if crate::mcp::cache::cacheable(method) && obj.get("resultType").and_then(Value::as_str) == Some("complete") {
        cache.stamp(obj);
    }
    let meta = obj.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert(meta_keys::SERVER_INFO.into(), server_info);
    }
}

/// Shape a result for a handshake-era client: what only 2026-07-28 has (a `complete` result type, cache hints, the
/// server info stamped into `_meta`) goes, so each client sees the shapes of the revision it negotiated.
/// An `input_required` result is left whole: there is nothing to turn it into without losing it.
/// A server's text is read only when there is something to take out.
/// A result as a value for an answer the satellite builds as one (a stream's message, a 2026-07-28 answer), read
/// leniently ([`Payload::into_lenient_value`]); one that still cannot be read is an error the client is told
/// (-32603), never a `null` result.
pub fn answer_value(result: Payload) -> Result<Value, RpcError> {
    result.into_lenient_value().map_err(|err| {
        tracing::warn!(error = %err, "a result could not be read as JSON");
        RpcError::new(codes::INTERNAL_ERROR, format!("MCP server error: its result could not be read: {err}"))
    })
}

pub fn payload_for_handshake(result: Payload) -> Payload {
    if result.shape().result_type != Some(ResultType::Complete) {
        return result;
    }
    match result.to_value() {
        Ok(mut value) => {
            shape_for_handshake(&mut value);
            Payload::Value(value)
        }
        // Too deeply nested to read: passed on as it came.
        Err(_) => result,
    }
}

/// [`payload_for_handshake`] of a value.
pub fn shape_for_handshake(result: &mut Value) {
    let Value::Object(obj) = result else { return };
    if obj.get("resultType").and_then(Value::as_str) != Some("complete") {
        return;
    }
    obj.remove("resultType");
    obj.remove("ttlMs");
    obj.remove("cacheScope");
    if let Some(Value::Object(meta)) = obj.get_mut("_meta") {
        meta.remove(meta_keys::SERVER_INFO);
        if meta.is_empty() {
            obj.remove("_meta");
        }
    }
}

/// Validate the 2026-07-28 request envelope: the required `_meta` keys (-32602), a `MCP-Protocol-Version`
/// header that agrees when there is one (-32020), and the stateless version (-32022, listing `supported`).
pub fn check_stateless_envelope(
    header_version: Option<&str>,
    params: Option<&Value>,
    supported: &[&str],
) -> Result<(), RpcError> {
    let meta = params.and_then(|p| p.get("_meta")).and_then(Value::as_object);
    let missing: Vec<&str> = [meta_keys::PROTOCOL_VERSION, meta_keys::CLIENT_CAPABILITIES]
        .into_iter()
        .filter(|k| meta.is_none_or(|m| !m.contains_key(*k)))
        .collect();
    if !missing.is_empty() {
        return Err(RpcError::new(
            codes::INVALID_PARAMS,
            format!("params._meta is missing the required envelope key(s): {}", missing.join(", ")),
        ));
    }
    let version = meta.and_then(|m| m.get(meta_keys::PROTOCOL_VERSION)).and_then(Value::as_str).unwrap_or("");
    if header_version.is_some_and(|header| header != version) {
        return Err(RpcError::new(codes::HEADER_MISMATCH, "MCP-Protocol-Version header does not match params._meta"));
    }
    if version != MODERN_VERSION {
        return Err(RpcError::new(codes::UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version")
            .with_data(json!({"supported": supported, "requested": version})));
    }
    // 2026-07-28 logging: a level that is not one of the eight SHOULD be refused with -32602. Passed on, it reached
    // a server that refused it, or, on a handshake-era server, was taken for no level at all.
    if let Some(level) = meta.and_then(|m| m.get(meta_keys::LOG_LEVEL)) {
        check_log_level(Some(level))?;
    }
    Ok(())
}

/// The log levels of RFC 5424 that MCP names, least severe first.
pub const LOG_LEVELS: [&str; 8] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// A `logging/setLevel` `level`, or a 2026-07-28 request's `_meta` log level: one of [`LOG_LEVELS`], or -32602
/// (2025-11-25 and 2026-07-28 logging: "Invalid log level").
pub fn check_log_level(level: Option<&Value>) -> Result<&'static str, RpcError> {
    let named = level.and_then(Value::as_str);
    LOG_LEVELS.into_iter().find(|known| Some(*known) == named).ok_or_else(|| {
        let shown = level.map_or_else(|| "none".to_owned(), Value::to_string);
        RpcError::new(
            codes::INVALID_PARAMS,
            format!("Invalid params: invalid log level {shown}; one of {}", LOG_LEVELS.join(", ")),
        )
    })
}

/// Whether a request carries the 2026-07-28 envelope (`_meta` protocol version).
/// A message relayed for request `id` names that request as its subscription: the upstream tagged it with the
/// id the satellite used upstream, the client knows its own.
pub fn retag_subscription(params: &mut Value, id: &RequestId) {
    if let Some(tag) = params.get_mut("_meta").and_then(|m| m.get_mut(meta_keys::SUBSCRIPTION_ID)) {
        *tag = serde_json::to_value(id).unwrap_or(Value::Null);
    }
}

pub fn has_stateless_envelope(params: Option<&Value>) -> bool {
    params.and_then(|p| p.get("_meta")).and_then(|m| m.get(meta_keys::PROTOCOL_VERSION)).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stdio line is written from its parts, and is the same text the `Value` envelope gives: member order,
    /// escapes, a `null` params kept, no params left out, string and numeric ids.
    #[test]
    fn lines_are_written_as_the_value_envelope_would_be() {
        let params = [
            None,
            Some(Value::Null),
            Some(json!({"name": "echo", "arguments": {"z": 1, "a": "q\"uote\\ \n é 😀 \u{7}", "m": [1.5, -0, true]}})),
            Some(json!([1, {"b": null}])),
        ];
        for params in params {
            for id in [RequestId::Number(-42), RequestId::Number(i64::MAX), RequestId::String("a\"b".into())] {
                let line = request_line(&id, "tools/call", params.as_ref());
                assert_eq!(line, request(id.clone(), "tools/call", params.clone()).to_string());
                assert!(!line.contains('\n'), "one line: {line}");
            }
            let line = notification_line("notifications/ta\"sk", params.as_ref());
            assert_eq!(line, notification("notifications/ta\"sk", params.clone()).to_string());
        }
    }

    #[test]
    fn classifies_each_message_kind() {
        let req = Message::from_value(json!({"jsonrpc":"2.0","id":7,"method":"tools/list"})).unwrap();
        assert_eq!(req, Message::Request { id: RequestId::Number(7), method: "tools/list".into(), params: None });
        let note = Message::from_value(json!({"jsonrpc":"2.0","method":"notifications/initialized"})).unwrap();
        assert!(matches!(note, Message::Notification { .. }));
        let ok = Message::from_value(json!({"jsonrpc":"2.0","id":"a","result":{}})).unwrap();
        assert_eq!(ok, Message::Response { id: RequestId::String("a".into()), outcome: Ok(json!({})) });
        let err =
            Message::from_value(json!({"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"nope"}})).unwrap();
        assert!(matches!(err, Message::Response { outcome: Err(RpcError { code: -32601, .. }), .. }));
    }

    /// An integer id beyond `i64` is taken and written back as the peer wrote it (a Python server echoes
    /// `2**64 - 1` unchanged); fractions, `null`, objects, arrays and booleans are not ids.
    #[test]
    fn any_integer_is_an_id_and_is_written_back_as_it_came() {
        for text in ["18446744073709551615", "9223372036854775808", "-9223372036854775808", "0"] {
            let request: Value =
                serde_json::from_str(&format!(r#"{{"jsonrpc":"2.0","id":{text},"method":"ping"}}"#)).expect("json");
            let Ok(Message::Request { id, .. }) = Message::from_value(request.clone()) else {
                panic!("id {text} refused");
            };
            assert_eq!(Value::from(id.clone()), request["id"], "id {text}");
            assert_eq!(response(id.clone(), json!({}))["id"], request["id"]);
            let written: Value = serde_json::from_str(&response_text(&id, "{}")).expect("json");
            assert_eq!(written["id"], request["id"]);
        }
        for bad in [json!(true), json!([1]), json!({"n": 1}), json!(1.5), json!(1e3), Value::Null] {
            let request = json!({"jsonrpc":"2.0","id": bad,"method":"ping"});
            assert_eq!(Message::from_value(request), Err(MessageError::BadId));
        }
    }

    /// The fast path takes only what the general path would read as a result to a numeric id, and the same
    /// result; everything else is left to the general path.
    #[test]
    fn a_result_line_is_read_without_a_tree_and_anything_else_is_left_alone() {
        let (id, result) = result_response(r#"{"result": {"a" : 1.10}, "jsonrpc":"2.0", "id": 12}"#).expect("a result");
        assert_eq!((id, result.get()), (12, r#"{"a" : 1.10}"#));
        // Members it does not know (a peer's extensions) do not keep it off the fast path.
        let (_, result) = result_response(r#"{"jsonrpc":"2.0","id":3,"result":[],"_meta":{"x":1},"trace":"t"}"#)
            .expect("a result with unknown members");
        assert_eq!(result.get(), "[]");
        assert!(result_response(r#"{"jsonrpc":"2.0","id":-3,"result":null}"#).is_none(), "a null result");
        for other in [
            r#"{"jsonrpc":"2.0","id":"a","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1e2,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
            r#"{"jsonrpc":"2.0","result":{}}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
            r#"{"id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"result":{"b":2}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}"#,
            "not json",
        ] {
            assert!(result_response(other).is_none(), "{other}");
        }
    }

    #[test]
    fn rejects_malformed_messages() {
        assert_eq!(Message::from_value(json!([1])), Err(MessageError::NotAnObject));
        assert_eq!(Message::from_value(json!({"id":1,"method":"x"})), Err(MessageError::BadVersion));
        assert_eq!(Message::from_value(json!({"jsonrpc":"2.0","id":1.5,"method":"x"})), Err(MessageError::BadId));
        assert_eq!(Message::from_value(json!({"jsonrpc":"2.0","id":1})), Err(MessageError::EmptyResponse));
        assert_eq!(Message::from_value(json!({"jsonrpc":"2.0","method":3})), Err(MessageError::BadMethod));
    }

    #[test]
    fn stamp_meta_keeps_caller_keys() {
        let params = json!({"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"mine","k":1}});
        let stamped = stamp_meta(Some(params), modern_request_meta(MODERN_VERSION, &json!({"name":"c"})));
        assert_eq!(stamped["_meta"]["io.modelcontextprotocol/protocolVersion"], "mine");
        assert_eq!(stamped["_meta"]["k"], 1);
        assert_eq!(stamped["_meta"]["io.modelcontextprotocol/clientCapabilities"], json!({}));
        assert_eq!(stamped["name"], "x");
    }
}
