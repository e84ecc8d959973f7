//! A minimal MCP client over Streamable HTTP for the front-door tests: raw
//! requests with full control of headers, plus a handshake-era session.

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use super::TestSatellite;

pub struct Caller {
    pub http: Client,
    pub url: String,
    pub token: Option<String>,
    pub session: Option<String>,
}

impl Caller {
    pub fn new(sat: &TestSatellite, path: &str, token: Option<&str>) -> Self {
        Caller {
            http: Client::new(),
            url: format!("{}{path}", sat.base_url()),
            token: token.map(str::to_owned),
            session: None,
        }
    }

    /// A caller for any satellite URL (e.g. a spawned binary).
    pub fn for_url(url: String, token: Option<&str>) -> Self {
        Caller { http: Client::new(), url, token: token.map(str::to_owned), session: None }
    }

    pub async fn post_raw(
        &self,
        body: String,
        extra: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = self.send(body, extra).await;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let sse = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let reply = if sse { sse_response(&text) } else { serde_json::from_str(&text).unwrap_or(Value::Null) };
        (status, headers, reply)
    }

    /// POST a 2026-07-28 request with the headers a conforming client sends with it ([`modern_headers`]).
    pub async fn post_modern(&self, body: &Value) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let headers = modern_headers(body);
        let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.post_raw(body.to_string(), &extra).await
    }

    /// [`Caller::send`] of a 2026-07-28 request with the headers a conforming client sends with it.
    pub async fn send_modern(&self, body: &Value) -> reqwest::Response {
        let headers = modern_headers(body);
        let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.send(body.to_string(), &extra).await
    }

    /// POST `body` on the caller's session; the status and the answer's text as it came (a JSON body, or an SSE
    /// stream with whatever the server said before its response).
    pub async fn post_text(&self, body: &Value) -> (StatusCode, String) {
        let response = self.send(body.to_string(), &[]).await;
        (response.status(), response.text().await.unwrap_or_default())
    }

    /// POST `body` with the caller's token and session, the default content type and accept unless `extra` sets
    /// them, and `extra`.
    pub async fn send(&self, body: String, extra: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self.http.post(&self.url).body(body);
        for (name, default) in [("content-type", "application/json"), ("accept", "application/json, text/event-stream")]
        {
            if !extra.iter().any(|(k, _)| *k == name) {
                request = request.header(name, default);
            }
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        for (k, v) in extra {
            request = request.header(*k, *v);
        }
        request.send().await.expect("request")
    }

    pub async fn initialize(&mut self) {
        self.initialize_with(json!({})).await;
    }

    /// The handshake, declaring `capabilities`.
    pub async fn initialize_with(&mut self, capabilities: Value) {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":capabilities,"clientInfo":{"name":"t","version":"0"}}});
        let (status, headers, reply) = self.post_raw(body.to_string(), &[]).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(reply["result"]["protocolVersion"], "2025-06-18");
        self.session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert!(self.session.is_some());
    }

    pub async fn call(&self, method: &str, params: Value) -> (StatusCode, Value) {
        let body = json!({"jsonrpc":"2.0","id":7,"method":method,"params":params});
        let (status, _, reply) = self.post_raw(body.to_string(), &[]).await;
        (status, reply)
    }

    pub async fn execute(&self, tool_path: &str, arguments: Value) -> Value {
        self.call(
            "tools/call",
            json!({"name":"execute_mcp_tool","arguments":{"tool_path":tool_path,"arguments":arguments}}),
        )
        .await
        .1
    }

    /// A caller with an initialized handshake-era session.
    pub async fn connect(sat: &TestSatellite, path: &str, token: Option<&str>) -> Self {
        let mut caller = Caller::new(sat, path, token);
        caller.initialize().await;
        caller
    }

    /// A caller with an initialized handshake-era session that declared `capabilities`.
    pub async fn connect_with(sat: &TestSatellite, path: &str, token: Option<&str>, capabilities: Value) -> Self {
        let mut caller = Caller::new(sat, path, token);
        caller.initialize_with(capabilities).await;
        caller
    }

    /// Call one of the endpoint's tools (a meta-tool on `/mcp`).
    pub async fn tool(&self, name: &str, arguments: Value) -> Value {
        self.call("tools/call", json!({"name": name, "arguments": arguments})).await.1
    }
}

/// The JSON-RPC response an SSE answer ends with: a server may speak first (a log message, progress), and the
/// satellite then streams the answer, as the transport allows; what came before the response is skipped.
fn sse_response(body: &str) -> Value {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .rfind(|message| message.get("result").is_some() || message.get("error").is_some())
        .unwrap_or(Value::Null)
}

/// The headers a conforming 2026-07-28 client sends with the request `body` over HTTP: `MCP-Protocol-Version` from
/// its envelope, `Mcp-Method`, and `Mcp-Name` for a method that names a tool, prompt or resource (in the base64
/// sentinel form when it is not plain ASCII).
pub fn modern_headers(body: &Value) -> Vec<(String, String)> {
    use satellite::mcp::headers;
    let method = body["method"].as_str().unwrap_or_default();
    let version = body.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion").and_then(Value::as_str);
    let mut sent = vec![
        ("mcp-protocol-version".to_owned(), version.unwrap_or("2026-07-28").to_owned()),
        (headers::METHOD.to_owned(), method.to_owned()),
    ];
    if let Some(name) = headers::name_key(method).and_then(|key| body["params"][key].as_str()) {
        sent.push((headers::NAME.to_owned(), headers::encode_value(name)));
    }
    sent
}
