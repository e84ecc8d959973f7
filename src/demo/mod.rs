//! The bundled demo MCP server (`satellite demo-server`): a small, real MCP
//! server the satellite ships with, used by the embedded default, the tests and
//! the benchmarks. It speaks the handshake era and the stateless 2026-07-28
//! revision (restrictable with `--protocol`), over stdio or Streamable HTTP,
//! and can serve the tool-search corpus, one endpoint per server.

use std::sync::Arc;

use parking_lot::Mutex;

use serde_json::{json, Value};

use crate::mcp::cache::CacheHints;
use crate::mcp::protocol::{self, codes, meta_keys, Message, RpcError, LEGACY_VERSIONS, MODERN_VERSION};

pub mod corpus;
pub mod http;
pub mod stdio;
mod tools;

use tools::{demo_offer, too_deep_tool};

/// Which protocol eras the server accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtocolSupport {
    /// Only the initialize handshake (2025-03-26 .. 2025-11-25).
    Legacy,
    /// Only the stateless 2026-07-28 revision.
    Modern,
    Both,
}

impl ProtocolSupport {
    fn legacy(self) -> bool {
        matches!(self, ProtocolSupport::Legacy | ProtocolSupport::Both)
    }

    fn modern(self) -> bool {
        matches!(self, ProtocolSupport::Modern | ProtocolSupport::Both)
    }
}

/// What a server offers: the demo tools, or one corpus server's tools.
#[derive(Debug, Clone)]
pub struct Offer {
    pub name: String,
    pub tools: Vec<Value>,
    pub with_resources: bool,
    /// `Some(slug)` for corpus servers: calls answer with a short text.
    pub corpus_slug: Option<String>,
    /// Echoed by `with_meta` as `_meta["demo/instance"]`, so tests can tell which instance answered.
    pub label: Option<String>,
}

/// How the demo server misbehaves when listing its tools, to test a gateway's tolerance (`--tools-shape`,
/// `--stall-after-page`, `--fail-tools-list`, `--deep-tool`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quirks {
    /// `tools/list` answers the tools as a bare array (`array`), under `functions`, or under another key.
    pub shape: Option<String>,
    /// Pages after this many are never answered (needs a page size).
    pub stall_after_page: Option<usize>,
    /// `tools/list` answers a JSON-RPC error.
    pub fail_listing: bool,
    /// `tools/list` also lists `too_deep`, whose input schema nests deeper than a JSON parser follows by default.
    pub deep_tool: bool,
    /// Offer `toggle_tool`, which hides or shows a tool at run time and announces the change (stdio).
    pub mutable: bool,
}

/// What changes while the server runs (`toggle_tool`): hidden tools, and where notifications go.
#[derive(Debug, Default)]
pub struct Live {
    pub hidden: Mutex<std::collections::BTreeSet<String>>,
    /// New descriptions of tools, by name (a tool that changes what it says it does).
    pub descriptions: Mutex<std::collections::BTreeMap<String, String>>,
    /// The stdio writer, for notifications sent outside any request.
    pub notify: Mutex<Option<tokio::sync::mpsc::Sender<String>>>,
}

/// One connection's handshake state (stdio: the process; HTTP: the session).
#[derive(Debug, Default, Clone)]
pub struct Session {
    pub initialized: bool,
    pub version: Option<String>,
}

/// The protocol logic, independent of transport.
#[derive(Debug, Clone)]
pub struct DemoServer {
    pub support: ProtocolSupport,
    pub page_size: Option<usize>,
    pub offer: Arc<Offer>,
    pub quirks: Arc<Quirks>,
    pub live: Arc<Live>,
}

/// The outcome of handling one message.
#[derive(Debug)]
pub enum Reply {
    /// A response to send back.
    Response(Value),
    /// A notification or a stray response: nothing to send.
    Nothing,
    /// `initialize` succeeded: the caller opens a session, then sends the response.
    Initialized { response: Value, version: String },
}

/// Whether a request carries the 2026-07-28 envelope.
pub fn is_stateless(method: &str, params: Option<&Value>) -> bool {
    method != "initialize" && protocol::has_stateless_envelope(params)
}

impl DemoServer {
    pub fn demo(support: ProtocolSupport, page_size: Option<usize>) -> Self {
        Self { support, page_size, offer: Arc::new(demo_offer()), quirks: Arc::default(), live: Arc::default() }
    }

    /// Misbehave as `quirks` say when listing tools.
    pub fn with_quirks(mut self, quirks: Quirks) -> Self {
        if quirks.mutable {
            let mut offer = (*self.offer).clone();
            offer.tools.push(json!({
                "name": "toggle_tool",
                "description": "Hide a tool of this server (or show it again), or give it a new `description`, and announce the change `announce` times.",
                "inputSchema": {"type": "object", "properties": {
                    "name": {"type": "string"}, "description": {"type": "string"},
                    "announce": {"type": "integer", "minimum": 0}}, "required": ["name"]},
            }));
            self.offer = Arc::new(offer);
        }
        self.quirks = Arc::new(quirks);
        self
    }

    /// Label this server's answers (see `Offer::label`).
    pub fn with_label(mut self, label: Option<String>) -> Self {
        let mut offer = (*self.offer).clone();
        offer.label = label;
        self.offer = Arc::new(offer);
        self
    }

    /// Leave these tools out (to show a server whose tool set changed between discoveries).
    pub fn without_tools(mut self, names: &[String]) -> Self {
        let mut offer = (*self.offer).clone();
        offer.tools.retain(|t| !names.iter().any(|n| t["name"] == n.as_str()));
        self.offer = Arc::new(offer);
        self
    }

    fn capabilities(&self) -> Value {
        if self.offer.with_resources {
            json!({"tools": {"listChanged": self.quirks.mutable}, "resources": {}, "prompts": {}})
        } else {
            json!({"tools": {"listChanged": self.quirks.mutable}})
        }
    }

    fn server_info(&self) -> Value {
        json!({"name": self.offer.name, "version": env!("CARGO_PKG_VERSION")})
    }

    /// Handle one message. `session` is the connection's handshake state.
    pub async fn handle(&self, value: Value, session: &Session) -> Reply {
        let message = match Message::from_value(value) {
            Ok(message) => message,
            Err(err) => {
                return Reply::Response(protocol::error_response(
                    None,
                    RpcError::new(codes::INVALID_REQUEST, err.to_string()),
                ))
            }
        };
        let (id, method, params) = match message {
            Message::Request { id, method, params } => (id, method, params),
            Message::Notification { .. } | Message::Response { .. } => return Reply::Nothing,
        };
        match self.route(&method, params, session).await {
            Ok(Reply::Response(result)) => Reply::Response(protocol::response(id, result)),
            Ok(Reply::Initialized { response, version }) => {
                Reply::Initialized { response: protocol::response(id, response), version }
            }
            Ok(Reply::Nothing) => Reply::Nothing,
            Err(err) => Reply::Response(protocol::error_response(Some(id), err)),
        }
    }

    async fn route(&self, method: &str, params: Option<Value>, session: &Session) -> Result<Reply, RpcError> {
        if method == "initialize" {
            return self.initialize(params.as_ref());
        }
        let stateless = self.check_era(method, params.as_ref(), session)?;
        let mut result = match method {
            "server/discover" => json!({
                "supportedVersions": [MODERN_VERSION],
                "capabilities": self.capabilities(),
                "instructions": "Demo server bundled with the satellite.",
            }),
            "ping" => json!({}),
            "tools/list" => self.quirky_list_tools(params.as_ref()).await?,
            "tools/call" => self.call_tool(params.as_ref().unwrap_or(&Value::Null)).await?,
            "resources/list" if self.offer.with_resources => json!({"resources": demo_resources()}),
            "resources/templates/list" if self.offer.with_resources => json!({"resourceTemplates": demo_templates()}),
            "resources/read" if self.offer.with_resources => read_resource(params.as_ref(), stateless)?,
            "prompts/list" if self.offer.with_resources => json!({"prompts": []}),
            _ => return Err(method_not_found(method)),
        };
        if stateless {
            // Its lists change only when it says so (`--mutable-tools` announces them), its resources never: an hour.
            let cache = CacheHints::private_for(60 * 60 * 1000);
            protocol::stamp_stateless_result(&mut result, method, self.server_info(), cache);
        }
        Ok(Reply::Response(result))
    }

    /// The handshake, when the server speaks the handshake era: the version asked for if it knows it, else its own.
    fn initialize(&self, params: Option<&Value>) -> Result<Reply, RpcError> {
        if !self.support.legacy() {
            return Err(method_not_found("initialize"));
        }
        let requested = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str).unwrap_or("");
        let version = if LEGACY_VERSIONS.contains(&requested) { requested } else { LEGACY_VERSIONS[2] };
        let response = json!({
            "protocolVersion": version,
            "capabilities": self.capabilities(),
            "serverInfo": self.server_info(),
            "instructions": "Demo server bundled with the satellite.",
        });
        Ok(Reply::Initialized { response, version: version.to_owned() })
    }

    /// Whether a request (other than `initialize`) is stateless, when the server takes it in its era: a valid
    /// 2026-07-28 envelope, or a handshake-era request on an initialized session.
    fn check_era(&self, method: &str, params: Option<&Value>, session: &Session) -> Result<bool, RpcError> {
        let stateless = self.support.modern() && is_stateless(method, params);
        if stateless {
            protocol::check_stateless_envelope(None, params, &[MODERN_VERSION])?;
        } else if method == "server/discover" || !self.support.legacy() {
            // A handshake-era server does not know server/discover; a modern-only one needs the envelope.
            if !self.support.modern() {
                return Err(method_not_found(method));
            }
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                format!("params._meta is missing the required envelope key(s): {}", meta_keys::PROTOCOL_VERSION),
            ));
        } else if !session.initialized && method != "ping" {
            return Err(RpcError::new(codes::INVALID_REQUEST, "server not initialized"));
        }
        Ok(stateless)
    }

    async fn quirky_list_tools(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let quirks = &self.quirks;
        if quirks.fail_listing {
            return Err(RpcError::new(codes::INTERNAL_ERROR, "this server cannot list its tools"));
        }
        let page = match (params.and_then(|p| p.get("cursor")).and_then(Value::as_str), self.page_size) {
            (Some(cursor), Some(size)) if size > 0 => cursor.parse::<usize>().unwrap_or(0) / size,
            _ => 0,
        };
        if quirks.stall_after_page.is_some_and(|pages| page >= pages) {
            std::future::pending::<()>().await;
        }
        let mut result = self.list_tools(params)?;
        if let (true, Some(tools)) = (quirks.deep_tool, result.get_mut("tools").and_then(Value::as_array_mut)) {
            tools.push(too_deep_tool());
        }
        match quirks.shape.as_deref() {
            None | Some("standard") => {}
            Some("array") => result = result["tools"].take(),
            Some(key) => {
                let tools = result["tools"].take();
                if let Some(object) = result.as_object_mut() {
                    object.remove("tools");
                    object.insert(key.to_owned(), tools);
                }
            }
        }
        Ok(result)
    }

    fn list_tools(&self, params: Option<&Value>) -> Result<Value, RpcError> {
        let hidden = self.live.hidden.lock().clone();
        let described = self.live.descriptions.lock().clone();
        let visible: Vec<Value>;
        let tools = if hidden.is_empty() && described.is_empty() {
            &self.offer.tools
        } else {
            visible = self
                .offer
                .tools
                .iter()
                .filter(|t| !hidden.iter().any(|h| t["name"] == h.as_str()))
                .map(|t| {
                    let mut tool = t.clone();
                    if let Some(description) = t["name"].as_str().and_then(|n| described.get(n)) {
                        tool["description"] = json!(description);
                    }
                    tool
                })
                .collect();
            &visible
        };
        let Some(size) = self.page_size else {
            return Ok(json!({"tools": tools}));
        };
        let start = match params.and_then(|p| p.get("cursor")) {
            None | Some(Value::Null) => 0,
            Some(Value::String(c)) => c
                .parse::<usize>()
                .ok()
                .filter(|s| *s <= tools.len())
                .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "invalid cursor"))?,
            Some(_) => return Err(RpcError::new(codes::INVALID_PARAMS, "invalid cursor")),
        };
        let end = (start + size).min(tools.len());
        let mut result = json!({"tools": &tools[start..end]});
        if end < tools.len() {
            result["nextCursor"] = json!(end.to_string());
        }
        Ok(result)
    }
}

pub const UI_RESOURCE_URI: &str = "ui://demo/app.html";

fn method_not_found(method: &str) -> RpcError {
    RpcError::new(codes::METHOD_NOT_FOUND, format!("Method not found: {method}"))
}

fn demo_resources() -> Value {
    json!([
        {"uri": "demo://readme", "name": "readme", "description": "About the demo server", "mimeType": "text/markdown"},
        {"uri": UI_RESOURCE_URI, "name": "demo-app", "description": "The demo MCP App", "mimeType": "text/html;profile=mcp-app",
         "_meta": {"ui": {"resourceUri": UI_RESOURCE_URI}}},
    ])
}

fn demo_templates() -> Value {
    json!([{"uriTemplate": "demo://items/{id}", "name": "item", "description": "One demo item by id", "mimeType": "text/plain"}])
}

fn read_resource(params: Option<&Value>, stateless: bool) -> Result<Value, RpcError> {
    let uri = params
        .and_then(|p| p.get("uri"))
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "missing uri"))?;
    let (mime, text) = match uri {
        "demo://readme" => ("text/markdown", "# Demo\n\nThe satellite's bundled demo MCP server.".to_owned()),
        UI_RESOURCE_URI => {
            ("text/html;profile=mcp-app", "<!doctype html><title>Demo app</title><h1>Demo app</h1>".to_owned())
        }
        other => match other.strip_prefix("demo://items/") {
            Some(id) if !id.is_empty() => ("text/plain", format!("item {id}")),
            _ => {
                // Resource not found: -32002 in the handshake era, -32602 in 2026-07-28.
                let code = if stateless { codes::INVALID_PARAMS } else { -32002 };
                return Err(
                    RpcError::new(code, format!("Resource not found: {other}")).with_data(json!({"uri": other}))
                );
            }
        },
    };
    Ok(json!({"contents": [{"uri": uri, "mimeType": mime, "text": text}]}))
}

#[cfg(test)]
mod tests;
