//! The 2026-07-28 headers that mirror a request's body over HTTP (`Mcp-Method`, `Mcp-Name`, and the
//! `Mcp-Param-{Name}` a tool asks for with `x-mcp-header`), at both ends of the satellite: sent to a server whose
//! tools ask for them, and checked on what a client sends. The server is the official Python SDK's, which refuses a
//! call whose headers are missing or disagree with its body, as the revision requires.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Client, StatusCode};
use satellite::config::sha256_hex;
use satellite::discovery;
use satellite::mcp::client::{ClientOptions, Era, McpClient};
use satellite::mcp::transport::{StreamableHttpTransport, Transport};
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::{json, Value};

use crate::common::*;

const CALL: Duration = Duration::from_secs(10);
const ALICE: &str = "alice-token-0123456789";
const INSTANCE_TOKEN: &str = "ds_inst_alice-regional-0123456789";

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// `tests/fixtures/header_server.py`: `where(region, query)` mirrors `region` as `Mcp-Param-Region`; `rezone`
/// changes that to `Mcp-Param-Zone` without announcing it; `broken` carries an invalid annotation.
async fn header_server() -> HttpServer {
    HttpServer::python("header_server.py").await
}

fn where_call(region: &str) -> Option<Value> {
    Some(json!({"name": "where", "arguments": {"region": region, "query": "q"}}))
}

/// The satellite sends the headers the server's tool asks for, in the sentinel form where a value is not plain
/// ASCII, has spaces at an end, or looks like the sentinel itself; leaves out of the listing the tool whose
/// annotation is invalid; and when the server changes the header a tool asks for without saying so, lists the tools
/// again on the server's refusal and retries the call once. Before, every call of such a tool was refused
/// (-32020): the satellite sent no `Mcp-Param-*` header at all.
#[tokio::test]
async fn a_2026_server_gets_the_parameter_headers_its_tools_ask_for() {
    let server = header_server().await;
    let transport =
        StreamableHttpTransport::new("test".into(), Client::new(), server.url("/mcp"), &BTreeMap::new()).unwrap();
    let client = McpClient::connect(Transport::StreamableHttp(transport), &ClientOptions::default()).await.unwrap();
    assert!(matches!(client.era(), Era::Stateless { .. }), "{:?}", client.era());
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    let names: Vec<&str> = catalog.tools.iter().map(|t| t.name()).collect();
    assert!(names.contains(&"where") && names.contains(&"rezone"), "{names:?}");
    assert!(!names.contains(&"broken"), "a tool whose x-mcp-header is invalid is left out: {names:?}");

    for region in ["eu-west1", "日本", " padded ", "=?base64?literal?=", "tab\there"] {
        let answer = client.request("tools/call", where_call(region), CALL).await.expect(region);
        assert_eq!(text(&answer), format!("{region}: q"), "{answer}");
    }
    // An argument left out sends no header, and the server says what it thinks of the call itself.
    let missing = client.request("tools/call", Some(json!({"name": "where", "arguments": {"query": "q"}})), CALL).await;
    assert!(missing.as_ref().is_ok_and(|r| r["isError"] == true), "{missing:?}");

    let rezoned = client.request("tools/call", Some(json!({"name": "rezone", "arguments": {}})), CALL).await.unwrap();
    assert_eq!(text(&rezoned), "rezoned");
    let answer = client.request("tools/call", where_call("eu"), CALL).await.expect("retried with Mcp-Param-Zone");
    assert_eq!(text(&answer), "eu: q", "{answer}");
    client.close().await;
}

/// A satellite serving alice the header server as `regional`, at `/i/alice-regional/mcp`, once it is online.
async fn satellite_with(server: &HttpServer) -> TestSatellite {
    let config = format!(
        r#"
[[teams]]
id = "acme"
[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{alice}"]
[[servers]]
slug = "regional"
transport = "http"
url = "{url}"
[[installations]]
id = "i-regional"
team = "acme"
server = "regional"
[installations.users.alice]
instance_path = "alice-regional"
instance_token_sha256 = "{instance}"
"#,
        alice = sha256_hex(ALICE),
        url = server.url("/mcp"),
        instance = sha256_hex(INSTANCE_TOKEN),
    );
    let sat = TestSatellite::start(&config).await;
    let id = ProcessId::from("regional-acme-alice-i-regional");
    wait_until(Duration::from_secs(60), "regional online", || {
        let online = sat.satellite.manager().get(&id).is_some_and(|i| i.status().status == InstanceStatus::Online);
        async move { online.then_some(()) }
    })
    .await;
    sat
}

fn envelope() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

/// As a server, the satellite holds a 2026-07-28 client to what the revision asks of it, as the server behind it
/// would: `Mcp-Method` and `Mcp-Name` present and naming what the body names (decoded from the sentinel form),
/// `MCP-Protocol-Version` present, and on an instance's endpoint the `Mcp-Param-*` headers of the tool called
/// agreeing with its arguments. Each refusal is 400 with -32020 and says what disagrees. Before, every header but
/// the version was ignored, and a missing version header was taken as agreeing: a proxy in front routing on the
/// headers could be told one tool while the satellite called another.
#[tokio::test]
async fn a_2026_clients_headers_must_agree_with_its_body() {
    let server = header_server().await;
    let sat = satellite_with(&server).await;
    let instance = Caller::new(&sat, &format!("/i/alice-regional/mcp?token={INSTANCE_TOKEN}"), None);
    let call = |region: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "where", "arguments": {"region": region, "query": "q"}, "_meta": envelope()}})
    };
    let standard = |body: &Value| modern_headers(body);
    let post = |body: Value, extra: Vec<(String, String)>| {
        let instance = &instance;
        async move {
            let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let (status, _, reply) = instance.post_raw(body.to_string(), &extra).await;
            (status, reply)
        }
    };
    let with = |body: &Value, more: &[(&str, &str)]| {
        let mut sent = standard(body);
        sent.extend(more.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        sent
    };

    // Agreeing: the region header as sent, or in the sentinel form, or an integer written as the body's.
    let (status, reply) = post(call("eu"), with(&call("eu"), &[("mcp-param-region", "eu")])).await;
    assert_eq!((status, text(&reply["result"])), (StatusCode::OK, "eu: q"), "{reply}");
    let (status, reply) = post(call("日本"), with(&call("日本"), &[("Mcp-Param-Region", "=?base64?5pel5pys?=")])).await;
    assert_eq!((status, text(&reply["result"])), (StatusCode::OK, "日本: q"), "{reply}");

    let refusals: Vec<(&str, Vec<(String, String)>)> = vec![
        ("Mcp-Param-Region header is missing", standard(&call("eu"))),
        ("does not match", with(&call("eu"), &[("mcp-param-region", "us")])),
        ("more than once", with(&call("eu"), &[("mcp-param-region", "eu"), ("mcp-param-region", "eu")])),
        ("base64", with(&call("eu"), &[("mcp-param-region", "=?base64?ZX=?=")])),
        (
            "Mcp-Method header is missing",
            vec![("mcp-protocol-version".into(), "2026-07-28".into()), ("mcp-param-region".into(), "eu".into())],
        ),
        (
            "MCP-Protocol-Version header is missing",
            with(&call("eu"), &[("mcp-param-region", "eu")])
                .into_iter()
                .filter(|(k, _)| k != "mcp-protocol-version")
                .collect(),
        ),
        (
            "Mcp-Name header \"rezone\" does not match",
            with(&call("eu"), &[("mcp-param-region", "eu")])
                .into_iter()
                .map(|(k, v)| if k == "mcp-name" { (k, "rezone".to_owned()) } else { (k, v) })
                .collect(),
        ),
        (
            "Mcp-Method header \"tools/list\" does not match",
            with(&call("eu"), &[("mcp-param-region", "eu")])
                .into_iter()
                .map(|(k, v)| if k == "mcp-method" { (k, "tools/list".to_owned()) } else { (k, v) })
                .collect(),
        ),
    ];
    for (why, headers) in refusals {
        let (status, reply) = post(call("eu"), headers.clone()).await;
        assert_eq!(
            (status, reply["error"]["code"].as_i64()),
            (StatusCode::BAD_REQUEST, Some(-32020)),
            "{why}: {reply}"
        );
        let message = reply["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{why}: {message}");
    }

    // `/mcp`'s meta-tools name no header: a client sends the standard ones, and a header no tool names is ignored.
    let hierarchical = Caller::new(&sat, "/mcp", Some(ALICE));
    let execute = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "execute_mcp_tool",
        "arguments": {"tool_path": "regional:where", "arguments": {"region": "eu", "query": "q"}}, "_meta": envelope()}});
    let sent = with(&execute, &[("mcp-param-other", "x")]);
    let sent: Vec<(&str, &str)> = sent.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (status, _, reply) = hierarchical.post_raw(execute.to_string(), &sent).await;
    assert_eq!((status, text(&reply["result"])), (StatusCode::OK, "eu: q"), "{reply}");
    let (status, _, reply) = hierarchical.post_modern(&execute).await;
    assert_eq!((status, text(&reply["result"])), (StatusCode::OK, "eu: q"), "{reply}");
    let (status, _, reply) = hierarchical
        .post_raw(execute.to_string(), &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call")])
        .await;
    assert_eq!((status, reply["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32020)), "{reply}");
    assert!(sat.satellite.shutdown().await);
}

/// A browser page calling an instance's tool over 2026-07-28 sends the tool's own `Mcp-Param-*` headers, which its
/// preflight names: allowed, like the standard headers. Before, warp's fixed list refused the preflight (403), and
/// no browser client could call such a tool. A header outside the list is still refused, and the status routes
/// still answer no preflight.
#[tokio::test]
async fn a_browsers_preflight_may_name_parameter_headers() {
    let server = header_server().await;
    let sat = satellite_with(&server).await;
    let http = Client::new();
    let preflight = |path: &str, headers: &str| {
        http.request(reqwest::Method::OPTIONS, format!("{}{path}", sat.base_url()))
            .header("origin", "http://localhost:5173")
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", headers)
            .send()
    };
    let named = "content-type, mcp-protocol-version, mcp-method, mcp-name, mcp-param-region, authorization";
    for path in ["/mcp", "/i/alice-regional/mcp"] {
        let answer = preflight(path, named).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
        let allowed = answer.headers()["access-control-allow-headers"].to_str().unwrap().to_owned();
        assert!(allowed.contains("mcp-param-region"), "{path}: {allowed}");
        assert_eq!(answer.headers()["access-control-allow-origin"], "http://localhost:5173");
    }
    let plain = preflight("/mcp", "content-type, mcp-method").await.unwrap();
    assert_eq!(plain.status(), StatusCode::OK, "warp's CORS answers the rest as before");
    for (path, headers) in [("/mcp", "mcp-param-region, x-secret"), ("/api/status/debug", "mcp-param-region")] {
        let refused = preflight(path, headers).await.unwrap();
        assert!(!refused.headers().contains_key("access-control-allow-origin"), "{path} {headers}");
    }
    assert!(sat.satellite.shutdown().await);
}
