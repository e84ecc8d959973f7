//! An MCP client over any transport: negotiates the protocol era, then stamps
//! every request the way that era wants.
//!
//! Negotiation follows the 2026-07-28 revision's compatibility rules: probe
//! with `server/discover`; a `DiscoverResult` listing 2026-07-28 means the
//! stateless revision; any other JSON-RPC error, an HTTP 4xx without a modern
//! error body, or a probe timeout means a handshake-era server, which gets
//! `initialize` + `notifications/initialized`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use tracing::{debug, warn};

use super::headers::ParamHeaders;
use super::payload::Payload;
use super::protocol::{self, codes, HANDSHAKE_REQUEST_VERSION, MODERN_VERSION};
use super::transport::{ModernHeaders, Relay, RequestHeaders, Transport, UpstreamError};

/// Which protocol the server speaks, with the version in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    /// Handshake era (2025-03-26 .. 2025-11-25): the version the server answered `initialize` with.
    Handshake { version: String },
    /// The stateless 2026-07-28 revision.
    Stateless { version: String },
}

impl Era {
    pub fn version(&self) -> &str {
        match self {
            Era::Handshake { version } | Era::Stateless { version } => version,
        }
    }
}

/// Knobs of a connection.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub client_name: String,
    pub client_version: String,
    /// Budget for the whole handshake (npx/uvx may download packages first).
    pub handshake_timeout: Duration,
    /// Budget for the `server/discover` probe before assuming a handshake-era server.
    pub probe_timeout: Duration,
    /// Probe the 2026-07-28 revision first (off: go straight to `initialize`).
    pub probe_stateless: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            client_name: "deploystack-satellite".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            handshake_timeout: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(10),
            probe_stateless: true,
        }
    }
}

/// A connected, negotiated MCP client.
#[derive(Debug)]
pub struct McpClient {
    transport: Transport,
    era: Era,
    server_info: Value,
    capabilities: Value,
    instructions: Option<String>,
    client_info: Value,
    /// The `x-mcp-header` annotations of the tools the server listed, by tool name (2026-07-28 over HTTP only: the
    /// only place their headers are sent). Tools without any are not kept.
    param_headers: parking_lot::RwLock<HashMap<String, ParamHeaders>>,
    /// One re-listing after a `HeaderMismatch` at a time: calls refused together wait for each other's, and one
    /// whose tool another's already brought up to date is retried without a listing of its own.
    relisting: tokio::sync::Mutex<()>,
}

/// How many pages of `tools/list` a re-listing after a `HeaderMismatch` reads at most.
const RELIST_PAGES: usize = 100;

impl McpClient {
    /// Negotiate over a fresh transport. On failure the transport is closed.
    pub async fn connect(transport: Transport, options: &ClientOptions) -> Result<Self, UpstreamError> {
        let client_info = json!({"name": options.client_name, "version": options.client_version});
        let negotiated =
            tokio::time::timeout(options.handshake_timeout, negotiate(&transport, options, &client_info)).await;
        let negotiated = match negotiated {
            Ok(Ok(negotiated)) => negotiated,
            Ok(Err(err)) => {
                transport.close().await;
                return Err(err);
            }
            Err(_) => {
                transport.close().await;
                return Err(UpstreamError::Timeout { method: "initialize".into(), after: options.handshake_timeout });
            }
        };
        let Negotiated { era, server_info, capabilities, instructions } = negotiated;
        // What the server says of itself is its to choose, so it is left out here: this line cannot mask it (the
        // instance's secrets are not known at this layer). `instances` logs it masked.
        debug!(protocol = era.version(), "mcp server connected");
        Ok(Self {
            transport,
            era,
            server_info,
            capabilities,
            instructions,
            client_info,
            param_headers: parking_lot::RwLock::default(),
            relisting: tokio::sync::Mutex::new(()),
        })
    }

    pub fn era(&self) -> &Era {
        &self.era
    }

    pub fn server_info(&self) -> &Value {
        &self.server_info
    }

    pub fn capabilities(&self) -> &Value {
        &self.capabilities
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Send a request in the negotiated era's style.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, UpstreamError> {
        self.request_relayed(method, params, timeout, None).await.and_then(crate::mcp::transport::read_payload)
    }

    /// A request whose notifications and requests to the client go to `relay` while it runs.
    pub async fn request_relayed(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        if self.mirrors_params() {
            match method {
                "tools/list" => return self.list_tools(params, timeout, relay).await,
                "tools/call" => return self.call_mirrored(params, timeout, relay).await,
                _ => {}
            }
        }
        let (params, headers) = self.stamp(method, params);
        self.transport.request_relayed(method, params, &headers, timeout, relay).await
    }

    /// Whether calls carry `Mcp-Param-*` headers: on 2026-07-28 over Streamable HTTP (clients of other transports
    /// may ignore `x-mcp-header`, and the handshake era has no such headers).
    fn mirrors_params(&self) -> bool {
        matches!(self.era, Era::Stateless { .. }) && matches!(self.transport, Transport::StreamableHttp(_))
    }

    /// A page of `tools/list`, its tools' `x-mcp-header` annotations learnt. A tool whose annotations are invalid
    /// is left out of the answer, as a client must, with a warning naming it and why.
    async fn list_tools(
        &self,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        let (params, headers) = self.stamp("tools/list", params);
        let listed = self.transport.request_relayed("tools/list", params, &headers, timeout, relay).await?;
        // An answer that is not a listing (an error result, a value the transport made) is the caller's to read.
        let Ok(mut listing) = listed.to_value() else { return Ok(listed) };
        let Some(tools) = listing.get_mut("tools").and_then(Value::as_array_mut) else { return Ok(listed) };
        let before = tools.len();
        let mut learnt = self.param_headers.write();
        tools.retain(|tool| {
            let Some(name) = tool.get("name").and_then(Value::as_str) else { return true };
            match ParamHeaders::of_tool(tool) {
                Ok(found) if found.is_empty() => {
                    learnt.remove(name);
                    true
                }
                Ok(found) => {
                    learnt.insert(name.to_owned(), found);
                    true
                }
                Err(reason) => {
                    warn!(tool = name, reason = %reason, "tool left out: its x-mcp-header annotations are invalid");
                    learnt.remove(name);
                    false
                }
            }
        });
        let dropped = tools.len() != before;
        drop(learnt);
        // Untouched unless a tool was left out: the server's own text goes on as it was written.
        Ok(if dropped { Payload::Value(listing) } else { listed })
    }

    /// The `Mcp-Param-*` headers a call of the tool `params` names sends.
    fn mirrored(&self, params: Option<&Value>) -> Vec<(String, String)> {
        let Some(name) = params.and_then(|p| p.get("name")).and_then(Value::as_str) else { return Vec::new() };
        let learnt = self.param_headers.read();
        learnt.get(name).map(|found| found.mirror(params.and_then(|p| p.get("arguments")))).unwrap_or_default()
    }

    /// A `tools/call` with its arguments mirrored into headers. A server refusing them (`HeaderMismatch`: the
    /// tool's schema changed since it was listed) has its tools listed again, and the call is retried once if the
    /// headers it would now send differ.
    async fn call_mirrored(
        &self,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, UpstreamError> {
        let sent = self.mirrored(params.as_ref());
        let (stamped, mut headers) = self.stamp("tools/call", params.clone());
        if let Some(modern) = headers.modern.as_mut() {
            modern.params = sent.clone();
        }
        let err = match self.transport.request_relayed("tools/call", stamped, &headers, timeout, relay).await {
            Err(UpstreamError::Rpc(err)) if err.code == codes::HEADER_MISMATCH => err,
            other => return other,
        };
        // One budget for the wait and the re-listing, the call's own.
        let tool = params.as_ref().and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
        let relisted = tokio::time::timeout(timeout, async {
            let _one = self.relisting.lock().await;
            // Another call's re-listing brought this tool up to date meanwhile: nothing to list.
            if self.mirrored(params.as_ref()) == sent {
                self.relist(tool, timeout).await;
            }
        })
        .await;
        if relisted.is_err() {
            debug!(tool, "tools/list again after a HeaderMismatch took longer than the call may");
        }
        let now = self.mirrored(params.as_ref());
        if now == sent {
            return Err(UpstreamError::Rpc(err));
        }
        debug!(tool = ?params.as_ref().and_then(|p| p.get("name")), "tool's x-mcp-header changed, call retried");
        let (stamped, mut headers) = self.stamp("tools/call", params);
        if let Some(modern) = headers.modern.as_mut() {
            modern.params = now;
        }
        self.transport.request_relayed("tools/call", stamped, &headers, timeout, relay).await
    }

    /// The pages of `tools/list` again, up to the one that lists `tool` (at most [`RELIST_PAGES`]), for what they
    /// say of `x-mcp-header`. A failure ends it: the retry that follows sends what is known.
    async fn relist(&self, tool: &str, timeout: Duration) {
        let mut cursor: Option<Value> = None;
        for _ in 0..RELIST_PAGES {
            let params = cursor.take().map(|cursor| json!({ "cursor": cursor }));
            let page = match self.list_tools(params, timeout, None).await.and_then(crate::mcp::transport::read_payload)
            {
                Ok(page) => page,
                Err(err) => {
                    debug!(error = %err, "tools/list again after a HeaderMismatch failed");
                    return;
                }
            };
            let listed = page
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|tools| tools.iter().any(|t| t.get("name").and_then(Value::as_str) == Some(tool)));
            match page.get("nextCursor") {
                Some(next) if !next.is_null() && !listed => cursor = Some(next.clone()),
                _ => return,
            }
        }
    }

    /// Send a notification in the negotiated era's style (a client's `notifications/cancelled`, say).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), UpstreamError> {
        let (params, headers) = self.stamp(method, params);
        self.transport.notify(method, params, &headers).await
    }

    /// The server's instructions, when it gave any.
    pub fn instructions(&self) -> Option<&str> {
        self.instructions.as_deref()
    }

    pub async fn close(&self) {
        self.transport.close().await;
    }

    fn stamp(&self, method: &str, params: Option<Value>) -> (Option<Value>, RequestHeaders) {
        match &self.era {
            Era::Handshake { version } => {
                (params, RequestHeaders { protocol_version: Some(version.clone()), modern: None })
            }
            Era::Stateless { version } => {
                // `Mcp-Name` mirrors what the method names (a tool, prompt, resource or task), nothing else.
                let key = crate::mcp::headers::name_key(method);
                let name = key.and_then(|key| params.as_ref()?.get(key)?.as_str()).map(str::to_owned);
                let params = protocol::stamp_meta(params, protocol::modern_request_meta(version, &self.client_info));
                let headers = RequestHeaders {
                    protocol_version: Some(version.clone()),
                    modern: Some(ModernHeaders { method: method.to_owned(), name, params: Vec::new() }),
                };
                (Some(params), headers)
            }
        }
    }
}

/// What negotiation learned about the server.
struct Negotiated {
    era: Era,
    server_info: Value,
    capabilities: Value,
    instructions: Option<String>,
}

async fn negotiate(
    transport: &Transport,
    options: &ClientOptions,
    client_info: &Value,
) -> Result<Negotiated, UpstreamError> {
    if options.probe_stateless && transport.may_speak_modern() {
        if let Some(found) = probe_stateless(transport, options, client_info).await? {
            return Ok(found);
        }
    }
    initialize(transport, client_info, options.handshake_timeout).await
}

/// `Ok(None)` means "not a stateless server, fall back to initialize".
async fn probe_stateless(
    transport: &Transport,
    options: &ClientOptions,
    client_info: &Value,
) -> Result<Option<Negotiated>, UpstreamError> {
    let params = protocol::stamp_meta(None, protocol::modern_request_meta(MODERN_VERSION, client_info));
    let headers = RequestHeaders {
        protocol_version: Some(MODERN_VERSION.into()),
        modern: Some(ModernHeaders { method: "server/discover".into(), name: None, params: Vec::new() }),
    };
    match transport.request("server/discover", Some(params), &headers, options.probe_timeout).await {
        Ok(result) => {
            let supported = result.get("supportedVersions").and_then(Value::as_array);
            let speaks_modern = supported.is_some_and(|v| v.iter().any(|v| v.as_str() == Some(MODERN_VERSION)));
            if !speaks_modern {
                debug!(result = %result, "server/discover without a supported stateless version, falling back");
                return Ok(None);
            }
            let server_info = result
                .get("_meta")
                .and_then(|m| m.get(protocol::meta_keys::SERVER_INFO))
                .cloned()
                .unwrap_or_else(|| json!({}));
            let capabilities = result.get("capabilities").cloned().unwrap_or_else(|| json!({}));
            let instructions = result.get("instructions").and_then(Value::as_str).map(str::to_owned);
            let era = Era::Stateless { version: MODERN_VERSION.into() };
            Ok(Some(Negotiated { era, server_info, capabilities, instructions }))
        }
        Err(UpstreamError::Rpc(err)) if err.code == codes::UNSUPPORTED_PROTOCOL_VERSION => {
            // A stateless server that does not speak our revision: the handshake is the only common ground left.
            debug!(error = %err.message, "server rejected 2026-07-28, falling back to initialize");
            Ok(None)
        }
        Err(UpstreamError::Rpc(err)) => {
            debug!(code = err.code, "server/discover refused, handshake-era server");
            Ok(None)
        }
        Err(UpstreamError::HttpStatus { status, .. }) if (400..500).contains(&status) => Ok(None),
        Err(UpstreamError::Timeout { .. }) if matches!(transport, Transport::Stdio(_)) => {
            debug!("server/discover unanswered, handshake-era server");
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

async fn initialize(
    transport: &Transport,
    client_info: &Value,
    timeout: Duration,
) -> Result<Negotiated, UpstreamError> {
    // The satellite relays sampling, elicitation and roots to the client whose call asked; a client that cannot
    // take them gets its error passed back as the answer. Its clients' `notifications/roots/list_changed` reach the
    // server (on an instance endpoint, and from `/mcp` and `/sse` to all the caller's servers): `listChanged`.
    let params = json!({
        "protocolVersion": HANDSHAKE_REQUEST_VERSION,
        "capabilities": {"roots": {"listChanged": true}, "sampling": {}, "elicitation": {}},
        "clientInfo": client_info,
    });
    let headers = RequestHeaders::default();
    let result = transport.request("initialize", Some(params), &headers, timeout).await.map_err(|err| match err {
        UpstreamError::Rpc(rpc) => UpstreamError::Protocol(format!("mcp handshake failed: {}", rpc.message)),
        other => other,
    })?;
    let Some(server_info) = result.get("serverInfo").cloned() else {
        return Err(UpstreamError::Protocol(format!(
            "invalid initialization response: {}",
            super::transport::preview_value(&result)
        )));
    };
    // Accept whatever version the server answers with (OQ-26); log it.
    let version = result.get("protocolVersion").and_then(Value::as_str).unwrap_or(HANDSHAKE_REQUEST_VERSION).to_owned();
    let capabilities = result.get("capabilities").cloned().unwrap_or_else(|| json!({}));
    let instructions = result.get("instructions").and_then(Value::as_str).map(str::to_owned);
    let headers = RequestHeaders { protocol_version: Some(version.clone()), modern: None };
    transport.notify("notifications/initialized", None, &headers).await?;
    Ok(Negotiated { era: Era::Handshake { version }, server_info, capabilities, instructions })
}
