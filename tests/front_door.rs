//! The client-facing endpoints at the HTTP level: authentication answers,
//! framing checks, sessions, both protocol eras, isolation between users, and
//! a storm of malformed requests that must each get a clear error.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use satellite::config::sha256_hex;
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::{json, Value};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const READER: &str = "reader-token-0123456789";
const CAROL: &str = "carol-token-0123456789";
const RUNNER: &str = "runner-token-0123456789";

/// Alice's instance token (`instance_token("alice")`).
static ALICE_INSTANCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| instance_token("alice"));

fn instance_token(user: &str) -> String {
    format!("ds_inst_{}", sha256_hex(user))
}

fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    format!(
        r#"
[sandbox]
allowed_commands = [{exe}]

[[teams]]
id = "acme"
[[teams]]
id = "globex"
[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{alice}"]
[[users]]
id = "bob"
teams = ["acme"]
[[users.tokens]]
sha256 = "{bob}"
[[users.tokens]]
sha256 = "{reader}"
scopes = ["mcp:read"]
[[users.tokens]]
sha256 = "{runner}"
scopes = ["mcp:execute"]
[[users]]
id = "carol"
teams = ["globex"]
token_sha256 = ["{carol}"]
[[servers]]
slug = "demo"
transport = "stdio"
command = {exe}
args = ["demo-server"]
[[installations]]
id = "d-acme"
team = "acme"
server = "demo"
[installations.users.alice]
instance_path = "alice-demo"
instance_token_sha256 = "{alice_inst}"
[installations.users.bob]
instance_path = "bob-demo"
instance_token_sha256 = "{bob_inst}"
[[installations]]
id = "d-globex"
team = "globex"
server = "demo"
[installations.users.carol]
instance_path = "carol-demo"
"#,
        alice = sha256_hex(ALICE),
        bob = sha256_hex(BOB),
        reader = sha256_hex(READER),
        runner = sha256_hex(RUNNER),
        carol = sha256_hex(CAROL),
        alice_inst = sha256_hex(&instance_token("alice")),
        bob_inst = sha256_hex(&instance_token("bob")),
    )
}

async fn started() -> TestSatellite {
    started_with(&config()).await
}

async fn started_with(config: &str) -> TestSatellite {
    let sat = TestSatellite::start(config).await;
    for id in ["demo-acme-alice-d-acme", "demo-acme-bob-d-acme", "demo-globex-carol-d-globex"] {
        wait_online(&sat, id).await;
    }
    sat
}

/// Waits (with the deadline) until the instance `id` is online.
async fn wait_online(sat: &TestSatellite, id: &str) {
    let pid = ProcessId::from(id);
    wait_until(DEADLINE, id, || {
        let online = sat.satellite.manager().get(&pid).is_some_and(|i| i.status().status == InstanceStatus::Online);
        async move { online.then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn authentication_failures_follow_the_resource_server_contract() {
    let sat = started().await;
    let nobody = Caller::new(&sat, "/mcp", None);
    let (status, headers, body) =
        nobody.post_raw(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}).to_string(), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let www = headers["www-authenticate"].to_str().unwrap();
    assert!(
        www.starts_with("Bearer realm=\"DeployStack MCP Satellite\"")
            && www.contains("resource_metadata=")
            && www.contains("Bearer token required"),
        "{www}"
    );
    assert_eq!(body["error"]["code"], -32001);
    assert_eq!(body["id"], Value::Null);
    let wrong = Caller::new(&sat, "/mcp", Some("not-a-token"));
    let (status, headers, body) =
        wrong.post_raw(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}).to_string(), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers["www-authenticate"].to_str().unwrap().contains("error=\"invalid_token\""));
    assert_eq!(body["error"]["code"], -32002);

    // A read-only token may discover but not execute.
    let mut reader = Caller::new(&sat, "/mcp", Some(READER));
    reader.initialize().await;
    let (status, found) =
        reader.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":"echo"}})).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let (status, denied) = reader
        .call(
            "tools/call",
            json!({"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":{"text":"x"}}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(denied["error"]["code"], -32004);

    let metadata: Value = reqwest::get(format!("{}/.well-known/oauth-protected-resource", sat.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(metadata["resource"].as_str().unwrap().ends_with("/mcp"));
    assert_eq!(metadata["scopes_supported"], json!(["mcp:read", "mcp:tools:execute"]));

    // Authenticated answers carry the Link header.
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    let (_, headers, _) = alice.post_raw(json!({"jsonrpc":"2.0","id":2,"method":"ping"}).to_string(), &[]).await;
    assert!(headers["link"].to_str().unwrap().contains("oauth-protected-resource"));
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn framing_sessions_and_both_eras() {
    let sat = started().await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}).to_string();
    let (status, _, body) = alice.post_raw(list.clone(), &[]).await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("Bad Request: No session ID provided"))
    );
    let (status, _, _) = alice.post_raw(list.clone(), &[("accept", "application/json")]).await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "only json accepted");
    // What a client declares is kept for the session's life, so it is bounded: a clear error, no session.
    let boasting = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",
        "clientInfo":{"name":"boaster","version":"1"},"capabilities":{"experimental":{"x":"y".repeat(20_000)}}}});
    let (status, headers, body) = alice.post_raw(boasting.to_string(), &[]).await;
    assert_eq!((status, body["error"]["code"].as_i64()), (StatusCode::OK, Some(-32602)), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("capabilities larger than 16 KiB"), "{body}");
    assert!(headers.get("mcp-session-id").is_none());
    alice.initialize().await;
    let (status, _, body) = alice.post_raw(list.clone(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> =
        body["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["discover_mcp_tools", "execute_mcp_tool", "list_mcp_resources", "read_mcp_resource"]);
    // Batches answer in an array; notifications alone get 202.
    let batch = json!([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"prompts/list"}]);
    let (status, _, body) = alice.post_raw(batch.to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_array().unwrap().len(), 2);
    assert_eq!(body[1]["result"], json!({"prompts": []}));
    let (status, _, _) =
        alice.post_raw(json!({"jsonrpc":"2.0","method":"notifications/initialized"}).to_string(), &[]).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _, body) = alice.post_raw(list.clone(), &[("mcp-protocol-version", "1999-01-01")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // An unknown session id is 404 so the client initializes again; a malformed one is 400 and never stored; a
    // session is its creator's only.
    let mut bob = Caller::new(&sat, "/mcp", Some(BOB));
    bob.session = Some("00000000-0000-4000-8000-000000000000".into());
    let (status, reply) = bob.call("ping", json!({})).await;
    assert_eq!((status, reply["error"]["message"].as_str()), (StatusCode::NOT_FOUND, Some("Session not found")));
    for malformed in ["x".repeat(129), "has space".to_owned(), "x".repeat(20_000)] {
        bob.session = Some(malformed.clone());
        let (status, _, _) = bob.post_raw(json!({"jsonrpc":"2.0","id":1,"method":"ping"}).to_string(), &[]).await;
        assert!(status == StatusCode::BAD_REQUEST || status.as_u16() == 431, "{} bytes: {status}", malformed.len());
    }
    bob.session = alice.session.clone();
    let (status, _) = bob.call("ping", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "alice's session is not bob's");
    let mut thief = Caller::new(&sat, "/mcp", Some(BOB));
    thief.session = alice.session.clone();
    let stolen = thief
        .http
        .delete(&thief.url)
        .bearer_auth(BOB)
        .header("mcp-session-id", alice.session.clone().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(stolen.status(), StatusCode::NOT_FOUND, "bob cannot end alice's session");
    let own = alice
        .http
        .delete(&alice.url)
        .bearer_auth(ALICE)
        .header("mcp-session-id", alice.session.clone().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::OK);

    // 2026-07-28 on the same URL: no session, envelope checked.
    let stateless = Caller::new(&sat, "/mcp", Some(ALICE));
    let meta = |v: &str| json!({"io.modelcontextprotocol/protocolVersion": v, "io.modelcontextprotocol/clientCapabilities": {}});
    let discover = json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta": meta("2026-07-28")}});
    let (status, headers, body) = stateless.post_modern(&discover).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.get("mcp-session-id").is_none());
    assert!(body["result"]["supportedVersions"].as_array().unwrap().contains(&json!("2026-07-28")));
    let old = json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta": meta("1900-01-01")}});
    let (status, _, body) = stateless.post_modern(&old).await;
    assert_eq!((status, body["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32022)));
    assert!(body["error"]["data"]["supported"].as_array().unwrap().contains(&json!("2026-07-28")));
    let mismatch = json!({"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta": meta("2026-07-28")}});
    let (status, _, body) = stateless
        .post_raw(mismatch.to_string(), &[("mcp-protocol-version", "2025-06-18"), ("mcp-method", "tools/list")])
        .await;
    assert_eq!((status, body["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32020)));
    let call = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":{"text":"stateless"}},"_meta": meta("2026-07-28")}});
    let (status, _, body) = stateless.post_modern(&call).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["result"]["content"][0]["text"], "stateless");
    assert_eq!(body["result"]["resultType"], "complete");
    assert!(sat.satellite.shutdown().await);
}

/// A lone `tools/list` on `/mcp` is answered from JSON text written once; whatever its id, the answer must be the
/// one the general path gives the same request inside a batch.
#[tokio::test]
async fn a_lone_tools_list_answers_what_the_general_path_answers() {
    let sat = started().await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    let ids = [
        json!(0),
        json!(-7),
        json!(i64::MAX),
        json!(u64::MAX),
        json!(1.5),
        json!(""),
        json!("a\"b\\c\u{2028}\u{0}ü</script>"),
        json!(true),
        json!({"nested": 1}),
    ];
    for id in ids {
        for request in [
            json!({"jsonrpc":"2.0","id":id,"method":"tools/list"}),
            json!({"jsonrpc":"2.0","id":id,"method":"tools/list","params":{"cursor":"x"}}),
            json!({"id":id,"method":"tools/list"}),
            json!({"jsonrpc":"1.0","id":id,"method":"tools/list"}),
        ] {
            let (status, headers, lone) = alice.post_raw(request.to_string(), &[]).await;
            let (batch_status, _, batch) = alice.post_raw(json!([request]).to_string(), &[]).await;
            assert_eq!((status, batch_status), (StatusCode::OK, StatusCode::OK), "{request}");
            assert_eq!(lone, batch[0], "{request}");
            assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"));
            assert_eq!(headers.get("mcp-session-id").and_then(|v| v.to_str().ok()), alice.session.as_deref());
        }
    }
    // The fixed answer is the four meta-tools, for a read-only token too.
    let mut reader = Caller::new(&sat, "/mcp", Some(READER));
    reader.initialize().await;
    let (status, reply) = reader.call("tools/list", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply["id"], 7);
    assert_eq!(reply["result"]["tools"].as_array().map(Vec::len), Some(4), "{reply}");
    // A token without mcp:read is refused the listing alike on both paths.
    let mut runner = Caller::new(&sat, "/mcp", Some(RUNNER));
    runner.initialize().await;
    let request = json!({"jsonrpc":"2.0","id":3,"method":"tools/list"});
    let (status, headers, lone) = runner.post_raw(request.to_string(), &[]).await;
    let (batch_status, batch_headers, batch) = runner.post_raw(json!([request]).to_string(), &[]).await;
    assert_eq!((status, batch_status), (StatusCode::FORBIDDEN, StatusCode::FORBIDDEN), "{lone}");
    assert_eq!(lone, batch);
    assert_eq!(headers.get("www-authenticate"), batch_headers.get("www-authenticate"));
}

/// A batch carries at most 100 messages: more are refused at once (400, -32600), not answered into a body of
/// hundreds of megabytes. Its messages are answered side by side, as a server reached directly answers them: three
/// 2-second calls fit a 5-second request timeout together (before, one after another, they overran it and all three
/// answers were lost). A message the token's scopes refuse gets its own error; the others are still answered.
#[tokio::test]
async fn a_batch_is_bounded_and_its_messages_are_answered_side_by_side() {
    let config = config().replacen("[[teams]]", "[satellite]\nhttp_timeout_seconds = 5\n\n[[teams]]", 1);
    let sat = started_with(&config).await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    let listing = |n: usize| json!({"jsonrpc":"2.0","id":n,"method":"tools/list"});
    let (status, _, refused) = alice.post_raw(json!((0..101).map(listing).collect::<Vec<_>>()).to_string(), &[]).await;
    let said: String = refused.to_string().chars().take(300).collect();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{said}");
    assert_eq!(refused["error"]["code"], -32600, "{said}");
    let (status, _, answered) = alice.post_raw(json!((0..100).map(listing).collect::<Vec<_>>()).to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answered.as_array().map(Vec::len), Some(100));

    let slow = |n: u64| {
        json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{"name":"execute_mcp_tool",
            "arguments":{"tool_path":"demo:slow","arguments":{"ms":2000}}}})
    };
    let (status, _, calls) = alice.post_raw(json!([slow(1), slow(2), slow(3)]).to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{calls}");
    let ids: Vec<&Value> = calls.as_array().expect("an array").iter().map(|c| &c["id"]).collect();
    assert_eq!(ids, [&json!(1), &json!(2), &json!(3)], "{calls}");
    assert!(calls.as_array().unwrap().iter().all(|c| c.get("result").is_some()), "{calls}");

    // An `initialize` alone in a batch (2025-03-26 allows it) is answered with the version the session was made
    // with, as alone.
    let fresh = Caller::new(&sat, "/mcp", Some(ALICE));
    let init = json!([{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26",
        "capabilities":{},"clientInfo":{"name":"batcher","version":"1"}}}]);
    let (status, _, initialized) = fresh.post_raw(init.to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{initialized}");
    assert_eq!(initialized[0]["result"]["protocolVersion"], "2025-03-26", "{initialized}");

    // A token with mcp:read only: the call is refused in the batch, the listing still answered.
    let mut reader = Caller::new(&sat, "/mcp", Some(READER));
    reader.initialize().await;
    let echo = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_mcp_tool",
        "arguments":{"tool_path":"demo:echo","arguments":{"text":"through"}}}});
    let (status, _, mixed) = reader.post_raw(json!([listing(1), echo]).to_string(), &[]).await;
    assert_eq!(status, StatusCode::OK, "{mixed}");
    assert_eq!(mixed[0]["id"], 1, "{mixed}");
    assert_eq!(mixed[0]["result"]["tools"].as_array().map(Vec::len), Some(4), "the listing is answered: {mixed}");
    assert_eq!(mixed[1]["id"], 2, "{mixed}");
    assert_eq!(mixed[1]["error"]["code"], -32004, "the call is refused: {mixed}");
    assert!(sat.satellite.shutdown().await);
}

/// The MCP routes are tried before the others: a request no route serves still gets the status that says why.
#[tokio::test]
async fn requests_no_route_serves_get_the_status_that_says_why() {
    let sat = started().await;
    let http = Client::new();
    for (method, path, expected) in [
        ("PUT", "/mcp", StatusCode::METHOD_NOT_ALLOWED),
        ("PUT", "/i/alice-demo/mcp", StatusCode::METHOD_NOT_ALLOWED),
        ("PATCH", "/api/status/debug", StatusCode::METHOD_NOT_ALLOWED),
        ("DELETE", "/healthz", StatusCode::METHOD_NOT_ALLOWED),
        ("GET", "/nope", StatusCode::NOT_FOUND),
        ("GET", "/mcp/extra", StatusCode::NOT_FOUND),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let answer = http
            .request(method.clone(), format!("{}{path}", sat.base_url()))
            .bearer_auth(ALICE)
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), expected, "{method} {path}");
        let body: Value = answer.json().await.expect("a JSON error body");
        assert!(body["error"]["message"].is_string(), "{method} {path}: {body}");
    }
    let metadata =
        http.get(format!("{}/.well-known/oauth-protected-resource", sat.base_url())).send().await.expect("answer");
    assert_eq!(metadata.status(), StatusCode::OK);
}

#[tokio::test]
async fn users_reach_only_their_own_instances() {
    let sat = started().await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    let mut bob = Caller::new(&sat, "/mcp", Some(BOB));
    let mut carol = Caller::new(&sat, "/mcp", Some(CAROL));
    for caller in [&mut alice, &mut bob, &mut carol] {
        caller.initialize().await;
    }
    // Alice crashes her own demo instance; bob's and carol's keep working.
    let bob_pid = sat.satellite.manager().get(&ProcessId::from("demo-acme-bob-d-acme")).unwrap().pid();
    let crashed = alice.execute("demo:exit_process", json!({"code": 9})).await;
    assert!(crashed["error"]["message"].as_str().unwrap_or_default().contains("exit code 9"), "{crashed}");
    let alice_instance = sat.satellite.manager().get(&ProcessId::from("demo-acme-alice-d-acme")).unwrap();
    wait_until(DEADLINE, "alice's instance offline", || {
        let offline = alice_instance.status().status == InstanceStatus::Offline;
        async move { offline.then_some(()) }
    })
    .await;
    assert_eq!(bob.execute("demo:echo", json!({"text": "bob"})).await["result"]["content"][0]["text"], "bob");
    assert_eq!(carol.execute("demo:echo", json!({"text": "carol"})).await["result"]["content"][0]["text"], "carol");
    assert_eq!(sat.satellite.manager().get(&ProcessId::from("demo-acme-bob-d-acme")).unwrap().pid(), bob_pid);

    // Alice now sees no demo tools and gets the blocked-execution result naming her status.
    let (_, found) = alice.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":"echo"}})).await;
    let document: Value = serde_json::from_str(found["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(document["total_found"], 0, "{document}");
    assert!(document["hint"].is_string());
    // Offline lets a call through as a recovery probe (SB §10.1); the dead process gives a clear error.
    let probe = alice.execute("demo:echo", json!({"text": "x"})).await;
    assert!(probe["error"]["message"].as_str().unwrap_or_default().contains("not running"), "{probe}");
    let (_, bob_found) =
        bob.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":"echo"}})).await;
    assert!(bob_found["result"]["content"][0]["text"].as_str().unwrap().contains("demo:echo"));

    // Instance router: each token opens only its own path.
    let base = sat.base_url();
    let http = Client::new();
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}});
    let post = |url: String| {
        http.post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init.to_string())
            .send()
    };
    let own = post(format!("{base}/i/bob-demo/mcp?token={}", instance_token("bob"))).await.unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    let cases = [
        (format!("{base}/i/bob-demo/mcp?token={}", instance_token("alice")), StatusCode::UNAUTHORIZED, -32001),
        (format!("{base}/i/bob-demo/mcp"), StatusCode::UNAUTHORIZED, -32001),
        (format!("{base}/i/bob-demo/mcp?token=plain"), StatusCode::UNAUTHORIZED, -32001),
        // An unknown path and a member without an instance token answer like a wrong token: no oracle for
        // which instance paths exist (before: 404 for unknown paths, 401 for real ones, 500 without a token).
        (format!("{base}/i/nobody/mcp?token={}", instance_token("bob")), StatusCode::UNAUTHORIZED, -32001),
        (format!("{base}/i/nobody/mcp"), StatusCode::UNAUTHORIZED, -32001),
        (format!("{base}/i/carol-demo/mcp?token={}", instance_token("carol")), StatusCode::UNAUTHORIZED, -32001),
    ];
    for (url, status, code) in cases {
        let response = post(url.clone()).await.unwrap();
        assert_eq!(response.status(), status, "{url}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{url}");
    }
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn a_thousand_malformed_requests_each_get_a_clear_error() {
    let sat = started().await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"x\":\"{}\"}}}}",
        "a".repeat(5 * 1024 * 1024)
    );
    let cases: Vec<(String, Option<&str>, StatusCode, Option<i64>)> = vec![
        ("{not json".into(), Some(ALICE), StatusCode::BAD_REQUEST, Some(-32700)),
        ("[]".into(), Some(ALICE), StatusCode::BAD_REQUEST, Some(-32600)),
        (r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#.into(), Some(ALICE), StatusCode::OK, Some(-32600)),
        (r#"{"jsonrpc":"2.0","id":3,"method":"no/such"}"#.into(), Some(ALICE), StatusCode::OK, Some(-32601)),
        (r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":5}}}"#.into(), Some(ALICE), StatusCode::OK, Some(-32602)),
        (r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"discover_mcp_tools","arguments":{"query":""}}}"#.into(), Some(ALICE), StatusCode::OK, Some(-32602)),
        (r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"read_mcp_resource","arguments":{"uri":"|x"}}}"#.into(), Some(ALICE), StatusCode::OK, Some(-32602)),
        (r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":[1]}}}"#.into(), Some(ALICE), StatusCode::OK, Some(-32602)),
        // A tool /mcp does not have, and one no server of the caller's has: invalid params, as a server answers.
        (r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}"#.into(), Some(ALICE), StatusCode::OK, Some(-32602)),
        (r#"{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":"nowhere:echo","arguments":{}}}}"#.into(), Some(ALICE), StatusCode::OK, Some(-32602)),
        (r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#.into(), Some("expired-or-wrong"), StatusCode::UNAUTHORIZED, Some(-32002)),
        (r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#.into(), None, StatusCode::UNAUTHORIZED, Some(-32001)),
        (r#"{"jsonrpc":"2.0","id":10,"method":"initialize","params":{}}"#.into(), Some(ALICE), StatusCode::BAD_REQUEST, Some(-32600)),
        (huge, Some(ALICE), StatusCode::PAYLOAD_TOO_LARGE, Some(-32600)),
    ];
    for round in 0..84 {
        for (body, token, status, code) in &cases {
            if round > 0 && body.len() > 1_000_000 {
                continue;
            }
            let caller = Caller {
                http: alice.http.clone(),
                url: alice.url.clone(),
                token: token.map(str::to_owned),
                session: alice.session.clone(),
            };
            let (got, _, reply) = caller.post_raw(body.clone(), &[]).await;
            assert_eq!(got, *status, "{}: {reply}", &body[..body.len().min(120)]);
            assert_eq!(reply["error"]["code"].as_i64(), *code, "{}: {reply}", &body[..body.len().min(120)]);
            if let Some(id) = serde_json::from_str::<Value>(body).ok().and_then(|v| v.get("id").cloned()) {
                if got == StatusCode::OK && reply.get("id").is_some_and(|i| !i.is_null()) {
                    assert_eq!(reply["id"], id, "the error echoes the request id");
                }
            }
        }
    }
    let wrong_type = alice.post_raw("{}".into(), &[("content-type", "text/plain")]).await;
    assert_eq!(wrong_type.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Still serving.
    let echoed = alice.execute("demo:echo", json!({"text": "still here"})).await;
    assert_eq!(echoed["result"]["content"][0]["text"], "still here");
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn requests_carry_an_id_and_overload_is_shed() {
    let config = config().replacen("[[teams]]", "[satellite]\nmax_concurrent_requests = 1\n\n[[teams]]", 1);
    let sat = TestSatellite::start(&config).await;
    wait_online(&sat, "demo-acme-alice-d-acme").await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    let (_, headers, _) = alice
        .post_raw(json!({"jsonrpc":"2.0","id":1,"method":"ping"}).to_string(), &[("x-request-id", "trace-me-42")])
        .await;
    assert_eq!(headers["x-request-id"], "trace-me-42", "a client's request id is kept");
    let (_, headers, _) = alice.post_raw(json!({"jsonrpc":"2.0","id":1,"method":"ping"}).to_string(), &[]).await;
    assert!(!headers["x-request-id"].is_empty(), "one is made when absent");

    // With room for one request, a second one while a slow call runs is refused at once.
    let slow = alice.execute("demo:slow", json!({"ms": 3000}));
    let probe = async {
        let (status, _, body) = wait_until(DEADLINE, "a request to be shed", || async {
            let (status, headers, body) =
                alice.post_raw(json!({"jsonrpc":"2.0","id":2,"method":"ping"}).to_string(), &[]).await;
            (status == StatusCode::SERVICE_UNAVAILABLE).then_some((status, headers, body))
        })
        .await;
        (status, body)
    };
    let (slow_result, (status, body)) = tokio::join!(slow, probe);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], -32000);
    assert_eq!(slow_result["result"]["content"][0]["text"], "slept 3000 ms");
    assert_eq!(alice.call("ping", json!({})).await.0, StatusCode::OK, "served again once there is room");
    assert!(sat.satellite.shutdown().await);
}

/// `SATELLITE_HTTP_TIMEOUT_SECONDS` (docs/operations.md): a request whose answer has not started by then gets 504
/// with a JSON-RPC error and its request id, and frees its place; the next request is served.
#[tokio::test]
async fn a_request_past_its_deadline_gets_504_and_frees_its_place() {
    let config = config().replacen(
        "[[teams]]",
        "[satellite]\nhttp_timeout_seconds = 1\nmax_concurrent_requests = 1\n\n[[teams]]",
        1,
    );
    let sat = TestSatellite::start(&config).await;
    wait_online(&sat, "demo-acme-alice-d-acme").await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    // Answered as JSON once the result is in (not an SSE stream started early): its head waits for the result.
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "execute_mcp_tool",
        "arguments": {"tool_path": "demo:slow", "arguments": {"ms": 3000}}}});
    let (status, headers, body) = alice.post_raw(call.to_string(), &[("x-request-id", "late-1")]).await;
    // Answered at the deadline, not after the call: a call let run to its end would have answered 200 with its result.
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert!(body.get("result").is_none(), "{body}");
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("Gateway Timeout"), "{body}");
    assert_eq!(headers["x-request-id"], "late-1", "a refused answer carries the request id too");
    // Its place under the limit of one was given back.
    assert_eq!(alice.call("ping", json!({})).await.0, StatusCode::OK);
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn disabled_tools_are_never_listed_searched_or_run() {
    let config = config().replacen(
        "id = \"d-acme\"\nteam = \"acme\"\nserver = \"demo\"\n",
        "id = \"d-acme\"\nteam = \"acme\"\nserver = \"demo\"\ndisabled_tools = [\"fail\"]\n",
        1,
    );
    assert!(config.contains("disabled_tools"));
    let sat = started_with(&config).await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    for query in ["*", "fail", "always fails tool error"] {
        let (_, reply) =
            alice.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":query}})).await;
        let text = reply["result"]["content"][0]["text"].as_str().unwrap();
        assert!(!text.contains("demo:fail"), "{query}: {text}");
    }
    let refused = alice.execute("demo:fail", json!({})).await;
    assert_eq!(refused["result"]["isError"], true);
    assert!(
        refused["result"]["content"][0]["text"].as_str().unwrap().contains("disabled by the team administrator"),
        "{refused}"
    );
    // The other team's installation of the same server is not affected.
    let mut carol = Caller::new(&sat, "/mcp", Some(CAROL));
    carol.initialize().await;
    let (_, found) = carol.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":"fail"}})).await;
    assert!(found["result"]["content"][0]["text"].as_str().unwrap().contains("demo:fail"));
    // Instance router: not listed, not run.
    let mut direct = Caller::new(&sat, &format!("/i/alice-demo/mcp?token={}", instance_token("alice")), None);
    direct.initialize().await;
    let (_, tools) = direct.call("tools/list", json!({})).await;
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(!names.contains(&"fail") && names.contains(&"echo"), "{names:?}");
    let (_, refused) = direct.call("tools/call", json!({"name": "fail", "arguments": {}})).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(sat.satellite.shutdown().await);
}

/// A client's `notifications/cancelled` ends its call at once (and cancels it upstream): the waiting POST gets
/// its answer long before the server would have finished, and the instance takes the next call.
#[tokio::test]
async fn a_cancelled_call_ends_at_once() {
    let sat = started().await;
    let mut direct = Caller::new(&sat, &format!("/i/alice-demo/mcp?token={}", instance_token("alice")), None);
    direct.initialize().await;
    let slow =
        json!({"jsonrpc":"2.0","id":"slow-1","method":"tools/call","params":{"name":"slow","arguments":{"ms":60000}}});
    let cancel =
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow-1","reason":"user"}});
    let call = direct.post_raw(slow.to_string(), &[]);
    tokio::pin!(call);
    // The cancellation may overtake the call it names; it is repeated until the call ends.
    let (_, _, reply) = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            tokio::select! {
                reply = &mut call => break reply,
                (status, _, _) = direct.post_raw(cancel.to_string(), &[]) => {
                    assert_eq!(status, StatusCode::ACCEPTED);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
    .await
    .expect("the cancelled call is answered");
    assert_eq!(reply["id"], "slow-1", "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap_or_default().contains("cancelled"), "{reply}");
    let (_, echoed) = direct.call("tools/call", json!({"name": "echo", "arguments": {"text": "next"}})).await;
    assert_eq!(echoed["result"]["content"][0]["text"], "next", "{echoed}");
    assert!(sat.satellite.shutdown().await);
}

/// The same through the hierarchical router: cancelling an `execute_mcp_tool` call ends it at once, and the
/// caller's next call goes through.
#[tokio::test]
async fn a_cancelled_execute_mcp_tool_call_ends_at_once() {
    let sat = started().await;
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    let slow = json!({"jsonrpc":"2.0","id":"slow-2","method":"tools/call","params":{"name":"execute_mcp_tool",
        "arguments":{"tool_path":"demo:slow","arguments":{"ms":60000}}}});
    let cancel =
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow-2","reason":"user"}});
    let call = alice.post_raw(slow.to_string(), &[]);
    tokio::pin!(call);
    let (_, _, reply) = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            tokio::select! {
                reply = &mut call => break reply,
                (status, _, _) = alice.post_raw(cancel.to_string(), &[]) => {
                    assert_eq!(status, StatusCode::ACCEPTED);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
    .await
    .expect("the cancelled call is answered");
    assert_eq!(reply["id"], "slow-2", "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap_or_default().contains("cancelled"), "{reply}");
    let echoed = alice.execute("demo:echo", json!({"text": "next"})).await;
    assert_eq!(echoed["result"]["content"][0]["text"], "next", "{echoed}");
    assert!(sat.satellite.shutdown().await);
}

/// Resources on `/mcp` carry valid URIs: the original where it is the caller's only one, a `satellite://` URI
/// naming the server where two servers share it; each form reads from the right server, a bare shared URI is
/// refused as ambiguous, and an unknown one is -32602.
#[tokio::test]
async fn resource_uris_on_mcp_are_valid_and_unambiguous() {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let twin = format!(
        "{}\n[[servers]]\nslug = \"twin\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n[[installations]]\nid = \"t-acme\"\nteam = \"acme\"\nserver = \"twin\"\n",
        config()
    );
    let sat = started_with(&twin).await;
    wait_online(&sat, "twin-acme-alice-t-acme").await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let (_, listing) = alice.call("resources/list", json!({})).await;
    let uris: Vec<&str> =
        listing["result"]["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap()).collect();
    assert!(uris.contains(&"satellite://demo/demo%3A%2F%2Freadme"), "{uris:?}");
    assert!(uris.contains(&"satellite://twin/demo%3A%2F%2Freadme"), "{uris:?}");
    for uri in &uris {
        assert!(url::Url::parse(uri).is_ok(), "{uri} is a valid URI");
    }
    let (_, read) = alice.call("resources/read", json!({"uri": "satellite://twin/demo%3A%2F%2Freadme"})).await;
    assert_eq!(read["result"]["contents"][0]["uri"], "demo://readme", "{read}");
    let (status, ambiguous) = alice.call("resources/read", json!({"uri": "demo://readme"})).await;
    assert_eq!((status, ambiguous["error"]["code"].as_i64()), (StatusCode::OK, Some(-32602)), "{ambiguous}");
    assert!(ambiguous["error"]["message"].as_str().unwrap().contains("satellite://demo/"), "{ambiguous}");
    let (_, unknown) = alice.call("resources/read", json!({"uri": "demo://nothing-here"})).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    // Carol (another team) has one demo server: her readme keeps its original URI.
    let carol = Caller::connect(&sat, "/mcp", Some(CAROL)).await;
    let (_, own) = carol.call("resources/read", json!({"uri": "demo://readme"})).await;
    assert!(own["result"]["contents"][0]["text"].is_string(), "{own}");
    let (_, foreign) = carol.call("resources/read", json!({"uri": "satellite://twin/demo%3A%2F%2Freadme"})).await;
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    assert!(sat.satellite.shutdown().await);
}

/// Each client gets the shapes of the revision it negotiated, whatever revision the server speaks: no 2026-07-28
/// result fields for a handshake-era session, and `resultType` with its server info for a 2026-07-28 request.
#[tokio::test]
async fn results_have_the_shape_of_the_clients_revision() {
    let sat = started().await;
    let url = format!("/i/alice-demo/mcp?token={}", instance_token("alice"));
    let old = Caller::connect(&sat, &url, None).await;
    for (method, params) in [
        ("tools/call", json!({"name": "echo", "arguments": {"text": "x"}})),
        ("tools/list", json!({})),
        ("resources/read", json!({"uri": "demo://readme"})),
    ] {
        let (_, reply) = old.call(method, params).await;
        let result = &reply["result"];
        assert!(result.is_object(), "{method}: {reply}");
        for key in ["resultType", "ttlMs", "cacheScope"] {
            assert!(result.get(key).is_none(), "{method}: {key} in {reply}");
        }
        assert!(result.pointer("/_meta/io.modelcontextprotocol~1serverInfo").is_none(), "{method}: {reply}");
    }
    let new = Caller::new(&sat, &url, None);
    let envelope = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"y"},"_meta":envelope}});
    let (_, _, reply) = new.post_modern(&body).await;
    assert_eq!(reply["result"]["resultType"], "complete", "{reply}");
    assert_eq!(reply["result"]["content"][0]["text"], "y", "{reply}");
    assert!(sat.satellite.shutdown().await);
}

/// On legacy SSE the session id is not a credential: every `/message` authenticates, as the stream's owner. Before,
/// a POST with the session id and no Authorization header ran tools as the stream's owner.
#[tokio::test]
async fn legacy_messages_authenticate_as_the_streams_owner() {
    use futures::StreamExt;
    let sat = started().await;
    let http = reqwest::Client::new();
    let stream = http.get(format!("{}/sse", sat.base_url())).bearer_auth(ALICE).send().await.unwrap();
    assert!(stream.status().is_success());
    let mut body = stream.bytes_stream();
    let mut text = String::new();
    let endpoint = tokio::time::timeout(DEADLINE, async {
        loop {
            text.push_str(&String::from_utf8_lossy(&body.next().await.expect("stream open").unwrap()));
            if let Some(line) = text.lines().find(|l| l.starts_with("data:") && l.contains("/message?session=")) {
                return line.trim_start_matches("data:").trim().to_owned();
            }
        }
    })
    .await
    .expect("the endpoint event");
    let url = format!("{}{endpoint}", sat.base_url());
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let post = |token: Option<&str>| {
        let request = http.post(&url).json(&ping);
        match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
        .send()
    };
    let anonymous = post(None).await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "the session id alone is refused");
    assert!(anonymous.headers().contains_key("www-authenticate"));
    assert_eq!(post(Some(BOB)).await.unwrap().status(), StatusCode::FORBIDDEN, "another user's token is refused");
    assert_eq!(post(Some("not-a-token-0123456789")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(post(Some(ALICE)).await.unwrap().status(), StatusCode::OK, "the owner's own token works");
    drop(body);
    assert!(sat.satellite.shutdown().await);
}

/// A client opening and closing legacy SSE streams in a loop gets every stream, but its connections are reported
/// (`mcp.client.connected`, then `disconnected`) only up to a budget per minute: before, each one wrote two events
/// to the outbox, without bound, pushing out the events that matter.
#[tokio::test]
async fn legacy_streams_opened_in_a_loop_do_not_flood_the_outbox() {
    use futures::StreamExt;
    const STREAMS: usize = 80;
    let sat = started().await;
    let http = reqwest::Client::new();
    for n in 0..STREAMS {
        let stream = http.get(format!("{}/sse", sat.base_url())).bearer_auth(ALICE).send().await.unwrap();
        assert!(stream.status().is_success(), "stream {n}");
        let mut body = stream.bytes_stream();
        let first = tokio::time::timeout(DEADLINE, body.next()).await.expect("the endpoint event").expect("open");
        assert!(String::from_utf8_lossy(&first.unwrap()).contains("/message?session="), "stream {n}");
    }
    let store = sat.satellite.store();
    let count = |kind: &'static str| async move {
        store.outbox().events(Some(kind), 0, 1_000).await.map(|events| events.len()).unwrap_or_default()
    };
    let (connected, disconnected) = wait_until(DEADLINE, "every reported connection's end", || async {
        let (connected, disconnected) = (count("mcp.client.connected").await, count("mcp.client.disconnected").await);
        (connected > 0 && connected == disconnected).then_some((connected, disconnected))
    })
    .await;
    // One budget of 30 a minute, two if the loop straddled a minute.
    assert!(connected <= 60, "{connected} connections of {STREAMS} reported, {disconnected} ends");
    assert!(sat.satellite.shutdown().await);
}

/// A session id is not a credential on Streamable HTTP either: another user presenting alice's session id can
/// neither take over her GET stream, end her session nor cancel on it, and her stream stays open and hers.
#[tokio::test]
async fn another_users_session_id_can_neither_take_end_nor_cancel_a_stream() {
    use futures::StreamExt;
    let sat = started().await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let session = alice.session.clone().expect("a session");
    let http = reqwest::Client::new();
    let url = format!("{}/mcp", sat.base_url());
    let get = |token: &'static str| {
        http.get(&url)
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &session)
            .send()
    };
    let stream = get(ALICE).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let mut body = stream.bytes_stream();

    assert_eq!(get(BOB).await.unwrap().status(), StatusCode::NOT_FOUND, "bob cannot open alice's stream");
    let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}});
    let post = |body: Value| {
        http.post(&url)
            .bearer_auth(BOB)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &session)
            .json(&body)
            .send()
    };
    assert_eq!(post(cancel).await.unwrap().status(), StatusCode::NOT_FOUND, "bob cannot cancel on it");
    let delete = http.delete(&url).bearer_auth(BOB).header("mcp-session-id", &session).send().await.unwrap();
    assert_eq!(delete.status(), StatusCode::NOT_FOUND, "bob cannot end it");

    // Alice's stream is still the session's one open stream, and it has not ended.
    assert_eq!(get(ALICE).await.unwrap().status(), StatusCode::CONFLICT, "her stream is still registered");
    let next = tokio::time::timeout(Duration::from_millis(500), body.next()).await;
    assert!(!matches!(next, Ok(None)), "alice's stream ended");
    let (status, reply) = alice.call("ping", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(sat.satellite.shutdown().await);
}

/// Strangers holding connections cannot take the satellite: half-sent requests, silent connections and idle
/// keep-alive ones are closed after the header timeout, connections past `max_connections` wait in the backlog
/// (no descriptor spent), and a good request is served once room frees up. Before, 200 half-sent requests were
/// held open forever, and later (found by `benches/storm.rs`) silent connections still were.
#[tokio::test]
async fn half_sent_requests_are_closed_and_connections_are_capped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = config().replacen("[[teams]]", "[satellite]\nmax_connections = 16\n\n[[teams]]", 1);
    let sat = started_with(&config).await;
    let addr = sat.satellite.local_addr();
    let mut held = Vec::new();
    for n in 0..30 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        match n % 5 {
            // Half a request head.
            0 => stream.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty").await.expect("half a head"),
            // Nothing at all (before, these were held for ever, and a cap full of them starved everyone).
            1 => {}
            // One whole request on a keep-alive connection, then silence.
            2 => stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.expect("a request"),
            // The first byte of the HTTP/2 preface (before, held for ever: no timer runs until the protocol is
            // known).
            3 => stream.write_all(b"P").await.expect("one byte"),
            // The whole HTTP/2 preface, then silence (the HTTP/2 side has no header timer).
            _ => stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.expect("the preface"),
        }
        held.push(stream);
    }
    // The satellite ends every half-sent, silent or idle connection (those it accepted at once, then those that
    // waited in the backlog).
    for (n, stream) in held.iter_mut().enumerate() {
        let mut buf = [0u8; 512];
        let closed = tokio::time::timeout(DEADLINE, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "connection {n} (kind {}) was never closed", n % 5);
    }
    let (status, body) = Caller::connect(&sat, "/mcp", Some(ALICE)).await.call("tools/list", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(sat.satellite.shutdown().await);
}

/// An HTTP/2 connection with nothing in flight for the header timeout is closed, as an idle HTTP/1 keep-alive
/// connection is, though its peer answers every ping; one carrying a stream (a legacy SSE stream) is not, however
/// long the stream lasts. Before, any HTTP/2 peer that had sent one request and answered pings held its connection,
/// and its place under `max_connections`, for ever. And an HTTP/2 request is served: its host is its
/// `:authority` (before, having no `Host` header, every one but the probes was refused 403 "Invalid Host").
#[tokio::test]
async fn an_idle_http2_connection_is_closed_and_a_streaming_one_is_not() {
    let sat = started().await;
    let addr = sat.satellite.local_addr();
    let connect = || async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (client, connection) = h2::client::handshake(tcp).await.expect("an HTTP/2 handshake");
        // Runs the connection (answering the satellite's pings) until the satellite closes it.
        (client, tokio::spawn(connection))
    };
    let get = |path: &str, token: Option<&str>| {
        let mut request = warp::http::Request::get(format!("http://127.0.0.1{path}"));
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.header("accept", "text/event-stream").body(()).expect("a request")
    };
    // A stream first: its connection has a request in flight the whole time.
    let (mut streaming, streaming_connection) = connect().await;
    let (answer, _) = streaming.send_request(get("/sse", Some(ALICE)), true).expect("a stream");
    let sse = answer.await.expect("the stream's head");
    assert_eq!(sse.status(), StatusCode::OK);
    let mut events = sse.into_body();
    let endpoint = events.data().await.expect("the endpoint event").expect("data");
    assert!(String::from_utf8_lossy(&endpoint).contains("endpoint"));
    // Then, on another connection, a request naming a host the satellite does not serve (HTTP/2 names it in
    // `:authority`, not `Host`: refused as a `Host` would be), and one answered whole; the connection is idle after.
    let (mut idle, idle_connection) = connect().await;
    let rebound = warp::http::Request::get("http://evil.example/mcp").body(()).expect("a request");
    let (answer, _) = idle.send_request(rebound, true).expect("a request");
    assert_eq!(answer.await.expect("an answer").status(), StatusCode::FORBIDDEN);
    let (answer, _) = idle.send_request(get("/healthz", None), true).expect("a request");
    let answer = answer.await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::OK);
    let mut body = answer.into_body();
    while let Some(chunk) = body.data().await {
        chunk.expect("the body");
    }
    let closed = tokio::time::timeout(DEADLINE, idle_connection).await;
    assert!(closed.is_ok(), "the idle HTTP/2 connection was never closed");
    assert!(!streaming_connection.is_finished(), "the connection carrying a stream stays open");
    drop((streaming, events));
    assert!(sat.satellite.shutdown().await);
}

/// A stranger's request is answered (401) on its head: its body is not waited for. Before, the body was read
/// first and held one of the `max_concurrent_requests` places until the request timeout, so a few sockets
/// trickling bodies with no token at all shut every user out (503).
#[tokio::test]
async fn a_stranger_trickling_a_body_holds_no_place() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = config().replacen("[[teams]]", "[satellite]\nmax_concurrent_requests = 3\n\n[[teams]]", 1);
    let sat = started_with(&config).await;
    let addr = sat.satellite.local_addr();
    let session = "s".repeat(43);
    let mut strangers = Vec::new();
    for path in ["/mcp".to_owned(), "/i/alice-demo/mcp".to_owned(), format!("/message?sessionId={session}")] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{{\"jsonrpc\""
        );
        stream.write_all(head.as_bytes()).await.expect("a head and the start of a body");
        // Answered while the body is still to come.
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        let head_read = tokio::time::timeout(DEADLINE, async {
            while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(head_read.is_ok() && answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
        strangers.push(stream);
    }
    // With the strangers' sockets still open, every place is free for Alice.
    let mut alice = Caller::new(&sat, "/mcp", Some(ALICE));
    alice.initialize().await;
    for _ in 0..3 {
        let (status, body) = alice.call("tools/list", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    drop(strangers);
    assert!(sat.satellite.shutdown().await);
}

/// One member cannot take the places everyone shares: alice's requests hold at most
/// `max_concurrent_requests_per_caller` of them, counted across `/mcp` and her instance endpoints. Past that hers are
/// refused at once (429, with `Retry-After`), while bob is served, and a cancellation of hers still gets through,
/// on `/mcp` and on legacy `/message` (where, before, it got 429 too); a place she gives back is hers again. Before,
/// two bodies trickled in with her token held two of the three places for the request timeout, and a third user
/// got 503.
#[tokio::test]
async fn a_caller_holds_at_most_its_own_share_of_the_places() {
    use tokio::io::AsyncWriteExt;
    let config = config().replacen(
        "[[teams]]",
        // Her trickled bodies hold their places past the body-read timeout's default (408 after 30 s) however slow
        // the machine running this test.
        "[satellite]\nmax_concurrent_requests = 3\nmax_concurrent_requests_per_caller = 2\nbody_read_timeout_seconds = 600\n\n[[teams]]",
        1,
    );
    let sat = started_with(&config).await;
    let addr = sat.satellite.local_addr();
    // Alice's legacy SSE stream (which holds no place), for her `/message` posts below.
    let http = reqwest::Client::new();
    let legacy = http.get(format!("{}/sse", sat.base_url())).bearer_auth(ALICE).send().await.expect("a stream");
    let mut legacy = Box::pin(legacy.bytes_stream());
    let mut heard = String::new();
    let has_endpoint = |heard: &str| heard.lines().any(|l| l.starts_with("data:") && l.contains("/message?session="));
    hear(&mut legacy, &mut heard, has_endpoint).await;
    let endpoint = heard
        .lines()
        .find(|l| l.starts_with("data:") && l.contains("/message?session="))
        .map(|l| l.trim_start_matches("data:").trim().to_owned())
        .expect("the endpoint event");
    let message = format!("{}{endpoint}", sat.base_url());
    let mut trickling = Vec::new();
    for (path, token) in
        [("/mcp".to_owned(), ALICE.to_owned()), ("/i/alice-demo/mcp".to_owned(), ALICE_INSTANCE.clone())]
    {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: 100000\r\n\r\n{{\"jsonrpc\""
        );
        stream.write_all(head.as_bytes()).await.expect("a head and the start of a body");
        trickling.push(stream);
    }
    let alice = Caller::new(&sat, "/mcp", Some(ALICE));
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let refused = wait_until(DEADLINE, "alice's third request refused", || {
        let (alice, list) = (&alice, &list);
        async move {
            let response = alice.send_modern(list).await;
            (response.status() == StatusCode::TOO_MANY_REQUESTS).then_some(response)
        }
    })
    .await;
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("2 requests of this caller"), "{body}");
    let (status, _, reply) = Caller::new(&sat, "/mcp", Some(BOB)).post_modern(&list).await;
    assert_eq!(status, StatusCode::OK, "bob is served: {reply}");
    // At her limit, she may still cancel a call: a small body holding no request takes a spare place.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    assert_eq!(alice.send_modern(&cancel).await.status(), StatusCode::ACCEPTED, "a cancellation gets through");
    assert_eq!(alice.send_modern(&list).await.status(), StatusCode::TOO_MANY_REQUESTS, "a request still does not");
    // The same on legacy `/message`, which counts against the same places.
    let legacy_cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}});
    let posted = http.post(&message).bearer_auth(ALICE).json(&legacy_cancel).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::ACCEPTED, "a cancellation on /message gets through");
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"});
    let posted = http.post(&message).bearer_auth(ALICE).json(&ping).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::TOO_MANY_REQUESTS, "a request on /message still does not");
    drop(trickling.pop());
    wait_until(DEADLINE, "alice served once a place is hers again", || {
        let (alice, list) = (&alice, &list);
        async move { (alice.send_modern(list).await.status() == StatusCode::OK).then_some(()) }
    })
    .await;
    drop(trickling);
    assert!(sat.satellite.shutdown().await);
}

/// The satellite of `config()` plus the fixture's `paged` server for alice (instance path `alice-paged`, token
/// `instance_token("alice-paged")`) and bob, both online.
async fn with_paged() -> TestSatellite {
    with_paged_and(|_| {}).await
}

/// `with_paged`, its configuration changed by `adjust` first.
async fn with_paged_and(adjust: impl FnOnce(&mut satellite::config::Config)) -> TestSatellite {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "\n[[servers]]\nslug = \"paged\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"paged\"]\n\
         [[installations]]\nid = \"i-paged\"\nteam = \"acme\"\nserver = \"paged\"\n\
         [installations.users.alice]\ninstance_path = \"alice-paged\"\ninstance_token_sha256 = \"{}\"\n\
         [installations.users.bob]\ninstance_path = \"bob-paged\"\n",
        sha256_hex(&instance_token("alice-paged"))
    );
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &(config() + &extra), adjust).await;
    sat.wait_ready().await;
    wait_online(&sat, "paged-acme-alice-i-paged").await;
    wait_online(&sat, "paged-acme-bob-i-paged").await;
    sat
}

/// A stdio server's log messages reach an instance's client as they would directly, each once: one sent during a
/// call on that call's answer only, one sent outside any call on the session's GET stream. Before, the second was
/// dropped, and the first would have gone on both streams had the GET stream carried log messages at all.
#[tokio::test]
async fn log_messages_reach_the_client_once_on_the_stream_they_belong_to() {
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let session = direct.session.clone().expect("a session");
    let mut stream = get_stream(&sat, &path, &session).await;
    let call = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"log","arguments":{}}});
    let (_, answer) = direct.post_text(&call).await;
    assert!(answer.contains("during the call") && answer.contains("logged"), "on the call's answer: {answer}");
    // The server logs once more, with no call running, when the client says its roots changed.
    let (told, _) = direct.post_text(&json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"})).await;
    assert_eq!(told, StatusCode::ACCEPTED);
    let mut heard = String::new();
    let logged = hear(&mut stream, &mut heard, |heard| heard.contains("outside any call")).await;
    assert!(logged, "a log message outside any call reaches the GET stream: {heard}");
    assert!(!heard.contains("during the call"), "the call's log message came twice: {heard}");
    assert!(sat.satellite.shutdown().await);
}

/// `Some(())` when instance `id` is dormant, for `wait_until`.
fn asleep(sat: &TestSatellite, id: &str) -> std::future::Ready<Option<()>> {
    let dormant = sat.satellite.manager().get(&ProcessId::from(id)).is_some_and(|i| i.is_dormant());
    std::future::ready(dormant.then_some(()))
}

/// Proof that the idle job ran since now (with `fast_idle`): Bob's instance of the paged server is woken by a call
/// and falls asleep again.
async fn idle_job_ran(sat: &TestSatellite) {
    let bob = Caller::connect(sat, "/mcp", Some(BOB)).await;
    let ran = bob.execute("paged:ok", json!({})).await;
    assert_eq!(ran["result"]["content"][0]["text"], "ok", "{ran}");
    wait_until(DEADLINE, "bob's idle instance asleep", || asleep(sat, "paged-acme-bob-i-paged")).await;
}

/// An instance whose client subscribed to one of its resources stays up while idle: put to sleep, its server
/// would forget the subscription and the client would never hear of an update. Bob's instance of the same server,
/// with no subscription, sleeps meanwhile (the idle job ran); once Alice unsubscribes hers sleeps too.
#[tokio::test]
async fn a_subscribed_instance_is_not_put_to_sleep() {
    let sat = with_paged_and(crate::common::lifecycle::fast_idle).await;
    let dormant = |id: &'static str| asleep(&sat, id);
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let subscribe = |method: &str| json!({"jsonrpc":"2.0","id":9,"method":method,"params":{"uri":"paged://report"}});
    let (status, answer) = direct.post_text(&subscribe("resources/subscribe")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.contains("\"result\""), "{answer}");
    assert!(dormant("paged-acme-alice-i-paged").await.is_none(), "awake after the subscription's call");

    // The idle job has run since Alice subscribed.
    idle_job_ran(&sat).await;
    assert!(dormant("paged-acme-alice-i-paged").await.is_none(), "the subscribed instance stays up");

    let (status, _) = direct.post_text(&subscribe("resources/unsubscribe")).await;
    assert_eq!(status, StatusCode::OK);
    wait_until(DEADLINE, "alice's instance asleep once unsubscribed", || dormant("paged-acme-alice-i-paged")).await;
    assert!(sat.satellite.shutdown().await);
}

/// An open `subscriptions/listen` keeps its instance awake, as docs/decisions.md promises: asleep, the server
/// would announce nothing on it. Before, the listen took no call slot and the idle sweep stopped the process
/// under it; the stream stayed open and went silent. Once the client closes the stream the instance sleeps.
#[tokio::test]
async fn an_open_listen_keeps_its_instance_awake() {
    let sat = with_paged_and(crate::common::lifecycle::fast_idle).await;
    let dormant = |id: &'static str| asleep(&sat, id);
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let mut stream = listen_stream(&sat, &path, json!({"toolsListChanged": true})).await;
    next_message(&mut stream, "an acknowledgement", |m| m["method"] == "notifications/subscriptions/acknowledged")
        .await;
    assert!(dormant("paged-acme-alice-i-paged").await.is_none(), "awake once the listen is acknowledged");

    // The idle job has run since Alice's listen opened.
    idle_job_ran(&sat).await;
    assert!(dormant("paged-acme-alice-i-paged").await.is_none(), "the listened-to instance stays up");

    drop(stream);
    wait_until(DEADLINE, "alice's instance asleep once the listen closed", || dormant("paged-acme-alice-i-paged"))
        .await;
    assert!(sat.satellite.shutdown().await);
}

/// A task-augmented call's answer (2025-11-25: a `CreateTaskResult`, a task and no content) reaches the client as
/// the server wrote it, and the task's status notifications reach the session's GET stream. Before, any result
/// without `content` was wrapped as text, so the client never saw its task, and the status was dropped.
#[tokio::test]
async fn a_task_created_by_a_call_reaches_the_client_as_a_task() {
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let session = direct.session.clone().expect("a session");
    let mut stream = get_stream(&sat, &path, &session).await;
    let (status, answer) =
        direct.call("tools/call", json!({"name": "task", "arguments": {}, "task": {"ttl": 60000}})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // The server's own id, sealed to alice's instance (docs/decisions.md, "Tasks pass through").
    let id = answer["result"]["task"]["taskId"].as_str().unwrap_or_default().to_owned();
    assert_eq!(satellite::mcp::task_ids::open(&id), Some(("paged-acme-alice-i-paged".into(), "task-1".into())));
    assert!(answer["result"].get("content").is_none(), "not wrapped: {answer}");
    // The server then says the task is done, outside any call: on the GET stream, as a direct client hears it,
    // under the id the client was given.
    let mut heard = String::new();
    let told = hear(&mut stream, &mut heard, |heard| heard.contains("notifications/tasks/status")).await;
    assert!(told, "the task's status reaches the GET stream: {heard}");
    assert!(heard.contains("\"completed\"") && heard.contains(&id), "{heard}");
    assert!(sat.satellite.shutdown().await);
}

/// A server that crashes and is restarted has forgotten what its client subscribed to, while the client's session
/// outlives it: the satellite asks the new process to watch the same resources again (and to log at the level the
/// client set) and tells the client each resource may have changed meanwhile. Before, the restarted server held no subscription and the client heard of no update
/// again.
#[tokio::test]
async fn a_restarted_server_watches_what_its_client_subscribed_to_again() {
    let sat = with_paged_and(|config| {
        config.upstream.lifecycle.restart_backoff = vec![Duration::from_millis(10); 3];
    })
    .await;
    let id = ProcessId::from("paged-acme-alice-i-paged");
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let session = direct.session.clone().expect("a session");
    let mut stream = get_stream(&sat, &path, &session).await;
    let mut heard = String::new();
    let call = |name: &str| json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":name,"arguments":{}}});

    let subscribe = json!({"jsonrpc":"2.0","id":6,"method":"resources/subscribe","params":{"uri":"paged://report"}});
    let (status, answer) = direct.post_text(&subscribe).await;
    assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
    let level = json!({"jsonrpc":"2.0","id":8,"method":"logging/setLevel","params":{"level":"warning"}});
    let (status, answer) = direct.post_text(&level).await;
    assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
    let (_, touched) = direct.post_text(&call("touch")).await;
    assert!(touched.contains("subscribed: paged://report; log level: warning"), "{touched}");
    hear_updates(&mut stream, &mut heard, 1).await;

    let before = sat.satellite.manager().get(&id).and_then(|i| i.pid()).expect("a running server");
    let (_, died) = direct.post_text(&call("exit")).await;
    assert!(died.contains("error"), "the server died during the call: {died}");
    wait_until(DEADLINE, "the server restarted", || {
        let instance = sat.satellite.manager().get(&id);
        async move {
            let instance = instance?;
            (instance.state() == InstanceStatus::Online && instance.pid().is_some_and(|pid| pid != before))
                .then_some(())
        }
    })
    .await;
    // The restart itself is announced: what changed while the server was down was never sent.
    hear_updates(&mut stream, &mut heard, 2).await;
    // And its lists, unchanged: while it restarted its endpoint listed none, and a client that listed then would keep
    // an empty list.
    assert!(heard.contains("notifications/tools/list_changed"), "{heard}");
    let (_, touched) = direct.post_text(&call("touch")).await;
    assert!(touched.contains("subscribed: paged://report"), "the new process watches the resource: {touched}");
    assert!(touched.contains("log level: warning"), "the new process logs at the level the client set: {touched}");
    hear_updates(&mut stream, &mut heard, 3).await;
    assert!(sat.satellite.shutdown().await);
}

/// Two clients of one member subscribe to the same resource of a server, which holds one session (the
/// satellite's) for both: one unsubscribing must not end the other's updates. Before, the first client's
/// `resources/unsubscribe` went to the server, which stopped watching the resource for both. The last holder's
/// unsubscribe still reaches it.
#[tokio::test]
async fn one_clients_unsubscribe_leaves_another_clients_subscription() {
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let first = Caller::connect(&sat, &path, None).await;
    let second = Caller::connect(&sat, &path, None).await;
    let mut stream = get_stream(&sat, &path, second.session.as_deref().expect("a session")).await;
    let request =
        |id: u64, method: &str| json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"uri":"paged://report"}});
    let touch = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"touch","arguments":{}}});
    for (caller, id) in [(&first, 1), (&second, 2)] {
        let (status, answer) = caller.post_text(&request(id, "resources/subscribe")).await;
        assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
    }
    let (status, answer) = first.post_text(&request(3, "resources/unsubscribe")).await;
    assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
    let (_, touched) = first.post_text(&touch).await;
    assert!(touched.contains("subscribed: paged://report"), "the server still watches it for the second: {touched}");
    let mut heard = String::new();
    hear_updates(&mut stream, &mut heard, 1).await;

    let (status, answer) = second.post_text(&request(4, "resources/unsubscribe")).await;
    assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
    let (_, touched) = second.post_text(&touch).await;
    assert!(touched.contains("subscribed: none"), "the last holder's unsubscribe reached the server: {touched}");

    // A client that goes without unsubscribing (its session deleted, or expired) lets go of its subscription with
    // it: the server stops watching a resource no client holds any more. Before, its hold outlived it, and every
    // later client's unsubscribe of that resource was answered by the satellite and never reached the server.
    // Then the same for a subscribe sent in a batch, which takes another path through the satellite.
    let third = Caller::connect(&sat, &path, None).await;
    for (caller, subscribe) in
        [(&first, request(5, "resources/subscribe")), (&third, json!([request(6, "resources/subscribe")]))]
    {
        let (status, answer) = caller.post_text(&subscribe).await;
        assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
        let (_, touched) = second.post_text(&touch).await;
        assert!(touched.contains("subscribed: paged://report"), "{touched}");
        let ended = caller
            .http
            .delete(&caller.url)
            .header("mcp-session-id", caller.session.clone().expect("a session"))
            .send()
            .await
            .expect("a delete");
        assert_eq!(ended.status(), StatusCode::OK);
        wait_until(DEADLINE, "the server no longer watches what the ended session held", || async {
            let (_, touched) = second.post_text(&touch).await;
            touched.contains("subscribed: none").then_some(())
        })
        .await;
    }
    assert!(sat.satellite.shutdown().await);
}

/// Past the bound of resources an instance's subscriptions are held for (1,000), a subscribe is refused with a
/// reason, not sent upstream with no hold to record it: before, another client's unsubscribe of that resource, or
/// a listen's end, was sent on to the server and ended the updates of the client whose hold did not fit. A
/// resource held already is still taken.
#[tokio::test]
async fn a_subscribe_past_the_bound_is_refused_not_sent_unheld() {
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let subscribe =
        |id: usize, uri: &str| json!({"jsonrpc":"2.0","id":id,"method":"resources/subscribe","params":{"uri":uri}});
    let first = Caller::connect(&sat, &path, None).await;
    // In batches of 100, the most one may carry.
    for start in (0..1_000).step_by(100) {
        let batch: Vec<Value> = (start..start + 100).map(|n| subscribe(n, &format!("paged://r{n}"))).collect();
        let (status, answer) = first.post_text(&Value::Array(batch)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let answers: Vec<Value> = serde_json::from_str(&answer).expect("a batch answer");
        let taken = answers.iter().filter(|a| a.get("result").is_some()).count();
        assert_eq!(taken, 100, "every one taken: {answer:.300}");
    }

    let second = Caller::connect(&sat, &path, None).await;
    let (status, refused) = second.post_text(&subscribe(2_000, "paged://extra")).await;
    assert_eq!(status, StatusCode::OK);
    let refused: Value = serde_json::from_str(&refused).expect("a JSON-RPC answer");
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(
        refused["error"]["message"].as_str().unwrap_or("").contains("too many resource subscriptions"),
        "{refused}"
    );
    let (_, taken) = second.post_text(&subscribe(2_001, "paged://r7")).await;
    assert!(taken.contains("\"result\""), "a resource held already: {taken}");
    let touch = json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"touch","arguments":{}}});
    let (_, touched) = second.post_text(&touch).await;
    assert!(touched.contains("paged://r999") && !touched.contains("paged://extra"), "{touched:.200}");

    // A 2026-07-28 client's listen is acknowledged without the resource past the bound, as one the server refused.
    let mut stream = listen_stream(&sat, &path, json!({"resourceSubscriptions":["paged://extra", "paged://r7"]})).await;
    let ack =
        next_message(&mut stream, "an acknowledgement", |m| m["method"] == "notifications/subscriptions/acknowledged")
            .await;
    assert_eq!(ack["params"]["notifications"]["resourceSubscriptions"], json!(["paged://r7"]), "{ack}");
    drop(stream);
    assert!(sat.satellite.shutdown().await);
}

/// The same across a Streamable HTTP server that restarts: the satellite's next request finds its session
/// forgotten and negotiates a new one, and the subscriptions are asked again on it. server-everything (a real
/// server from npm) sends updates only for the subscriptions of the session asking, and answers a forgotten session
/// with 400 "No valid session ID provided", as the SDK's example servers do, where the spec says 404: before, every
/// call failed after such a restart, and the client never heard of an update again.
#[tokio::test]
async fn a_remote_server_that_forgot_the_session_watches_what_its_client_subscribed_to_again() {
    let port = free_port();
    let server = HttpServer::everything_on(port, "streamableHttp").await;
    let extra = format!(
        "\n[[servers]]\nslug = \"every\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
         [[installations]]\nid = \"i-every\"\nteam = \"acme\"\nserver = \"every\"\n\
         [installations.users.alice]\ninstance_path = \"alice-every\"\ninstance_token_sha256 = \"{}\"\n",
        sha256_hex(&instance_token("alice-every"))
    );
    let sat = TestSatellite::start_in(tempfile::tempdir().unwrap(), &(config() + &extra)).await;
    sat.wait_ready().await;
    wait_online(&sat, "every-acme-alice-i-every").await;
    let path = format!("/i/alice-every/mcp?token={}", instance_token("alice-every"));
    let direct = Caller::connect(&sat, &path, None).await;
    let session = direct.session.clone().expect("a session");
    let mut stream = get_stream(&sat, &path, &session).await;
    let mut heard = String::new();
    let uri = "demo://resource/static/document/architecture.md";
    let subscribe = json!({"jsonrpc":"2.0","id":6,"method":"resources/subscribe","params":{"uri":uri}});
    let (status, answer) = direct.post_text(&subscribe).await;
    assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");

    let mut server = server;
    server.child.kill().await.expect("the first server stops");
    let _server = HttpServer::everything_on(port, "streamableHttp").await;
    // Updates every 5 s for this session's subscriptions, starting now.
    let toggle = json!({"jsonrpc":"2.0","id":7,"method":"tools/call",
        "params":{"name":"toggle-subscriber-updates","arguments":{}}});
    let (status, toggled) = direct.post_text(&toggle).await;
    assert!(status == StatusCode::OK && toggled.contains("Started simulated"), "{status}: {toggled}");
    // One announced by the satellite when the subscription was taken again, and then the server's own.
    hear_updates(&mut stream, &mut heard, 2).await;
    assert!(heard.contains(uri), "{heard}");
    assert!(sat.satellite.shutdown().await);
}

/// A 2026-07-28 `subscriptions/listen` (id "sub-1") for `notifications` on the endpoint at `path`, opened (200), as
/// its body's chunks.
async fn listen_stream(
    sat: &TestSatellite,
    path: &str,
    notifications: Value,
) -> impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin {
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}});
    let listen = json!({"jsonrpc":"2.0","id":"sub-1","method":"subscriptions/listen",
        "params":{"_meta": meta, "notifications": notifications}});
    let response = Client::new()
        .post(format!("{}{path}", sat.base_url()))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(listen.to_string())
        .send()
        .await
        .expect("a listen");
    assert_eq!(response.status(), StatusCode::OK);
    Box::pin(response.bytes_stream())
}

/// The GET stream of `session` on the endpoint at `path`, opened (200), as its body's chunks.
async fn get_stream(
    sat: &TestSatellite,
    path: &str,
    session: &str,
) -> impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin {
    get_stream_as(sat, path, session, None).await
}

/// `get_stream` with the caller's bearer token, when the endpoint needs one.
async fn get_stream_as(
    sat: &TestSatellite,
    path: &str,
    session: &str,
    token: Option<&str>,
) -> impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin {
    let mut request = reqwest::Client::new()
        .get(format!("{}{path}", sat.base_url()))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let stream = request.send().await.expect("a GET stream");
    assert_eq!(stream.status(), StatusCode::OK);
    Box::pin(stream.bytes_stream())
}

/// Read a GET stream until `wanted` resource updates in all have come on it.
async fn hear_updates(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    heard: &mut String,
    wanted: usize,
) {
    let updates = |heard: &str| heard.matches("notifications/resources/updated").count();
    hear(stream, heard, |heard| updates(heard) >= wanted).await;
    assert!(updates(heard) >= wanted, "{wanted} updates on the GET stream: {heard}");
}

/// Read an SSE stream into `heard` until `done` says so; false when the stream ended or `DEADLINE` passed first.
async fn hear(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    heard: &mut String,
    done: impl Fn(&str) -> bool,
) -> bool {
    use futures::StreamExt;
    let read = tokio::time::timeout(DEADLINE, async {
        while !done(heard) {
            match stream.next().await {
                Some(Ok(chunk)) => heard.push_str(&String::from_utf8_lossy(&chunk)),
                _ => return false,
            }
        }
        true
    });
    read.await.unwrap_or(false)
}

/// `/mcp` passes prompts, reads and completions on whole, as a client would get them from the server directly:
/// every page of a server's prompts (before, only the first), the read's `_meta` with its progress token, so the
/// server's progress reaches the client (before, dropped), and completions only for a token that may execute, as
/// `prompts/get` (before, any read-only token).
#[tokio::test]
async fn prompts_reads_and_completions_on_mcp_reach_the_server_whole() {
    let sat = with_paged().await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;

    let (status, listed) = alice.call("prompts/list", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let names: Vec<&str> = listed["result"]["prompts"]
        .as_array()
        .map(|prompts| prompts.iter().filter_map(|p| p["name"].as_str()).filter(|n| n.starts_with("paged:")).collect())
        .unwrap_or_default();
    assert_eq!(names, ["paged:p1", "paged:p2", "paged:p3", "paged:p4", "paged:p5"], "{listed}");
    assert!(listed["result"].get("nextCursor").is_none(), "the listing is whole: {listed}");

    let read = json!({"jsonrpc":"2.0","id":3,"method":"resources/read",
        "params":{"uri":"paged://report","_meta":{"progressToken":"tok-1"}}});
    let (status, answer) = alice.post_text(&read).await;
    assert_eq!(status, StatusCode::OK);
    assert!(answer.contains("progress token: yes"), "the server got the progress token: {answer}");
    let progress = answer
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message["method"] == "notifications/progress");
    assert_eq!(progress.map(|p| p["params"]["progressToken"].clone()), Some(json!("tok-1")), "{answer}");

    let complete = json!({"ref":{"type":"ref/prompt","name":"paged:p1"},"argument":{"name":"city","value":"pa"}});
    let (status, completed) = alice.call("completion/complete", complete.clone()).await;
    assert_eq!((status, completed["result"]["completion"]["values"].clone()), (StatusCode::OK, json!(["paris"])));
    let reader = Caller::connect(&sat, "/mcp", Some(READER)).await;
    let (status, refused) = reader.call("completion/complete", complete).await;
    assert_eq!((status, refused["error"]["code"].as_i64()), (StatusCode::FORBIDDEN, Some(-32004)), "{refused}");
    assert!(sat.satellite.shutdown().await);
}

/// A GET stream on `/mcp` stays open for the session (it carries pings, and nothing else there), and ends when
/// the session does.
#[tokio::test]
async fn the_get_stream_stays_open_until_the_session_ends() {
    use futures::StreamExt;
    let sat = started().await;
    let caller = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let session = caller.session.clone().expect("session");
    let http = reqwest::Client::new();
    let stream = http
        .get(format!("{}/mcp", sat.base_url()))
        .bearer_auth(ALICE)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let mut body = stream.bytes_stream();
    // An instance's first announcement of its lists follows its `online` (7cff410): a stream opened just then may
    // hear it. A message is no end; what must not come is the stream's end.
    let early = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match body.next().await {
                Some(Ok(chunk)) if String::from_utf8_lossy(&chunk).contains("/list_changed") => continue,
                other => return other,
            }
        }
    })
    .await;
    assert!(early.is_err(), "the stream is still open, nothing sent but list changes: {early:?}");
    let deleted = http
        .delete(format!("{}/mcp", sat.base_url()))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::OK);
    let ended = tokio::time::timeout(DEADLINE, async { while let Some(Ok(_)) = body.next().await {} }).await;
    assert!(ended.is_ok(), "the stream ends with its session");
    assert!(sat.satellite.shutdown().await);
}

/// A client that drops its GET stream may open it again (before: 409, the session still counted as streaming,
/// which also kept it from ever expiring).
#[tokio::test]
async fn a_dropped_get_stream_can_be_opened_again() {
    let sat = started().await;
    let caller = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let session = caller.session.clone().expect("session");
    let http = reqwest::Client::new();
    let open = || {
        http.get(format!("{}/mcp", sat.base_url()))
            .bearer_auth(ALICE)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &session)
            .send()
    };
    let first = open().await.expect("a stream");
    assert_eq!(first.status(), StatusCode::OK);
    drop(first);
    let again = wait_until(DEADLINE, "the stream opened again", || async {
        let response = open().await.ok()?;
        (response.status() == StatusCode::OK).then_some(response)
    })
    .await;
    drop(again);
    assert!(sat.satellite.shutdown().await);
}

/// Browser pages may use the MCP routes (CORS), but the status routes, the debug route above all, are never
/// readable by a page of another origin: they carry no `Access-Control-Allow-Origin`.
#[tokio::test]
async fn status_routes_are_not_readable_cross_origin() {
    let config = config().replacen("[[teams]]", "[satellite]\ndebug_route = true\n\n[[teams]]", 1);
    let sat = started_with(&config).await;
    let http = Client::new();
    let page = "http://localhost:5173";
    for path in ["/api/status/debug", "/healthz"] {
        let answer = http.get(format!("{}{path}", sat.base_url())).header("origin", page).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
        assert!(!answer.headers().contains_key("access-control-allow-origin"), "{path} is not for other origins");
    }
    let mcp = http
        .post(format!("{}/mcp", sat.base_url()))
        .header("origin", page)
        .bearer_auth(ALICE)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status(), StatusCode::OK);
    assert!(mcp.headers().contains_key("access-control-allow-origin"), "MCP routes stay open to browser clients");
    assert!(sat.satellite.shutdown().await);
}

/// Discover answers cost the agent few tokens: compact JSON, schemas without titles or defaults their
/// description states; `full_schemas` gives the server's schema as published, `explain` says why each result
/// matched, and `pretty_results` brings back the reference's indented form.
#[tokio::test]
async fn discover_answers_are_compact_trimmed_and_explained_on_request() -> Result<(), Box<dyn std::error::Error>> {
    let sat = started().await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let discover = |arguments: Value| {
        let alice = &alice;
        async move {
            let (_, reply) = alice.call("tools/call", json!({"name":"discover_mcp_tools","arguments":arguments})).await;
            let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
            let document: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let slow = document["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["tool_path"] == "demo:slow")
                .cloned()
                .unwrap_or(Value::Null);
            (text, slow)
        }
    };
    let (text, slow) = discover(json!({"query": "sleep milliseconds"})).await;
    assert!(!text.contains('\n'), "compact by default: {text}");
    let schema = &slow["input_schema"];
    assert_eq!(
        *schema,
        json!({"type": "object", "properties": {"ms": {"type": "integer", "description": "Milliseconds to sleep (default 100)", "minimum": 0, "maximum": 60000}}}),
        "{slow}"
    );
    assert!(slow.get("matched").is_none(), "no explanation unless asked: {slow}");

    let (_, full) = discover(json!({"query": "sleep milliseconds", "full_schemas": true})).await;
    assert_eq!(full["input_schema"]["title"], "slowArguments", "{full}");
    assert_eq!(full["input_schema"]["properties"]["ms"]["default"], 100, "{full}");

    let (_, explained) = discover(json!({"query": "sleep for some milliseconds", "explain": true})).await;
    assert_eq!(explained["matched"]["description"], json!(["sleep", "millisecond"]), "{explained}");
    assert_eq!(explained["matched"]["exact_name"], false, "{explained}");
    let (_, exact) = discover(json!({"query": "demo slow", "explain": true})).await;
    assert_eq!(exact["matched"]["exact_name"], true, "{exact}");
    assert_eq!(exact["matched"]["server"], json!(["demo"]), "{exact}");
    assert!(sat.satellite.shutdown().await);

    let sat = started_with(&format!("[satellite]\npretty_results = true\n{}", config())).await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let (_, reply) =
        alice.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":"sleep milliseconds"}})).await;
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("\n  \"tools\": ["), "the reference's 2-space form: {text}");
    assert!(text.contains("\"input_schema\": {\n"), "schemas are indented like the rest: {text}");
    assert!(sat.satellite.shutdown().await);
    Ok(())
}

/// Two installations of one server give a member two instances under one slug: discover still shows each tool
/// path once, in a search and in the wildcard listing.
#[tokio::test]
async fn discover_shows_a_tool_path_once_when_two_instances_share_a_slug() -> Result<(), Box<dyn std::error::Error>> {
    let second = "\n[[installations]]\nid = \"d-acme-2\"\nteam = \"acme\"\nserver = \"demo\"\n";
    let sat = started_with(&format!("{}{second}", config())).await;
    wait_online(&sat, "demo-acme-alice-d-acme-2").await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    for query in ["sleep milliseconds", "*"] {
        let (_, reply) = alice
            .call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query": query, "limit": 50}}))
            .await;
        let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_default();
        let document: Value = serde_json::from_str(text)?;
        let paths: Vec<&str> =
            document["tools"].as_array().into_iter().flatten().filter_map(|t| t["tool_path"].as_str()).collect();
        assert!(paths.contains(&"demo:slow"), "{query}: {text}");
        let mut unique = paths.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), paths.len(), "{query}: each path once: {paths:?}");
        assert_eq!(document["total_found"], paths.len(), "{query}");
    }
    assert!(sat.satellite.shutdown().await);
    Ok(())
}

/// Discover follows a remote server that vanishes and comes back with different tools: each caller's cached
/// view of what they can see moves with every status and catalog change, never serving a stale world.
#[tokio::test]
async fn discover_follows_a_remote_server_that_vanishes_and_comes_back() -> Result<(), Box<dyn std::error::Error>> {
    let (mut server, addr, extra) = HttpServer::remote_for_acme().await;
    let sat = started_with(&format!("{}{extra}", config())).await;
    let id = ProcessId::from("remote-acme-alice-i-remote");
    let status_is = |status: InstanceStatus| {
        let instance = sat.satellite.manager().get(&id);
        move || {
            let reached = instance.as_ref().is_some_and(|i| i.status().status == status);
            async move { reached.then_some(()) }
        }
    };
    wait_until(DEADLINE, "remote online", status_is(InstanceStatus::Online)).await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let found = |query: &'static str| {
        let alice = &alice;
        async move {
            let (_, reply) =
                alice.call("tools/call", json!({"name":"discover_mcp_tools","arguments":{"query":query}})).await;
            reply["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
        }
    };
    assert!(found("sleep milliseconds").await.contains("remote:slow"), "seen, and the caller's view is cached");

    server.child.kill().await?;
    let gone = alice.execute("remote:echo", json!({"text": "x"})).await;
    assert!(gone.get("error").is_some() || gone["result"]["isError"] == true, "{gone}");
    wait_until(DEADLINE, "remote offline", status_is(InstanceStatus::Offline)).await;
    let text = found("sleep milliseconds").await;
    assert!(!text.contains("remote:"), "an offline server's tools are not offered: {text}");
    assert!(text.contains("demo:slow"), "{text}");

    // Back on the same port without its slow tool: the probe reconnects and rediscovers by itself.
    let _server = HttpServer::demo_on(&addr, &["--without-tool", "slow"]).await;
    wait_until(DEADLINE, "remote online again", status_is(InstanceStatus::Online)).await;
    let text = found("echo text").await;
    assert!(text.contains("remote:echo"), "back: {text}");
    assert!(!found("sleep milliseconds").await.contains("remote:slow"), "the removed tool is not offered");
    assert!(sat.satellite.shutdown().await);
    Ok(())
}

/// A client's spare connection that has sent nothing (HTTP clients open them ahead of need) does not hold the
/// drain on SIGTERM: it used to keep the stop waiting for the whole header timeout (10 s), past a short drain.
#[tokio::test]
async fn a_silent_connection_does_not_hold_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let sat = TestSatellite::start_with(dir, &config(), |config| config.drain = Duration::from_secs(2)).await;
    sat.wait_ready().await;
    let silent = tokio::net::TcpStream::connect(sat.satellite.local_addr()).await.unwrap();
    // One request on another connection, so the listener has surely accepted the silent one by now.
    let answered = reqwest::get(format!("{}/healthz", sat.base_url())).await.unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    assert!(sat.satellite.shutdown().await, "the drain finished within its 2 s deadline");
    drop(silent);
}

/// Requests made one at a time do not wake the runtime's other worker. hyper hands a request's body to the
/// service through a channel, inside the poll of the connection's own task, and that wake made tokio treat the
/// task as yielding: it woke a parked worker to share its queue, which found nothing and parked again, a futex
/// wake and a context switch or two per request (docs/performance-history.md, 2026-11-28 17:10). The client is a plain
/// blocking socket on a thread of its own, so every park counted is the satellite's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_made_one_at_a_time_do_not_wake_the_other_worker() {
    const CALLS: u64 = 200;
    let sat = started().await;
    let parked = as_alice_on_a_thread(&sat, move |conn, session, parks| {
        let call = |i: u64| {
            json!({"jsonrpc":"2.0","id":i + 2,"method":"tools/call",
                "params":{"name":"echo","arguments":{"text":format!("call-{i}")}}})
            .to_string()
        };
        let (_, warm) = conn.post("/i/alice-demo/mcp", &ALICE_INSTANCE, session, &call(CALLS));
        assert!(warm.contains(&format!("call-{CALLS}")), "{warm}");
        let before = parks();
        for i in 0..CALLS {
            let (head, body) = conn.post("/i/alice-demo/mcp", &ALICE_INSTANCE, session, &call(i));
            assert!(head.starts_with("HTTP/1.1 200") && body.contains(&format!("\"call-{i}\"")), "{head}{body}");
        }
        parks() - before
    })
    .await;
    // Per request a worker parks twice: waiting for the server's answer, then for the next request. The other
    // worker woken and parked again on every request made it three.
    assert!(parked < CALLS * 5 / 2, "{parked} parks for {CALLS} requests made one at a time");
    assert!(sat.satellite.shutdown().await);
}

/// A body that comes after its head, once the satellite has read the head and gone idle (a slow client, a body
/// cut across packets), is still read and answered: the wake it brings comes between the connection's polls and
/// must reach its task, not be folded away like the wakes during a poll (`http::wakes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_comes_after_its_head_is_still_answered() {
    let sat = started().await;
    let (head, body) = as_alice_on_a_thread(&sat, |conn, session, parks| {
        let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
            "params":{"name":"echo","arguments":{"text":"late body"}}});
        let request = conn.request("/i/alice-demo/mcp", &ALICE_INSTANCE, session, &call.to_string());
        let cut = request.find("\r\n\r\n").expect("a head") + 4 + 10;
        let before = parks();
        conn.send(&request.as_bytes()[..cut]);
        // The satellite has read the head and a piece of the body, and gone idle waiting for the rest.
        let deadline = std::time::Instant::now() + DEADLINE;
        while parks() == before {
            assert!(std::time::Instant::now() < deadline, "the satellite never read the head");
            std::thread::yield_now();
        }
        conn.send(&request.as_bytes()[cut..]);
        conn.answer()
    })
    .await;
    assert!(head.starts_with("HTTP/1.1 200") && body.contains("late body"), "{head}{body}");
    assert!(sat.satellite.shutdown().await);
}

/// Runs `client` on a thread of its own with a raw connection to Alice's demo instance, initialized (its session,
/// if any), and a counter of the satellite runtime's parks; what `client` returns.
async fn as_alice_on_a_thread<T: Send + 'static>(
    sat: &TestSatellite,
    client: impl FnOnce(&mut RawHttp, Option<&str>, &dyn Fn() -> u64) -> T + Send + 'static,
) -> T {
    let addr = sat.base_url().trim_start_matches("http://").to_owned();
    let parks = parks_counter();
    let thread = std::thread::spawn(move || {
        let mut conn = RawHttp::connect(&addr);
        let session = conn.initialize("/i/alice-demo/mcp", &ALICE_INSTANCE);
        client(&mut conn, session.as_deref(), &parks)
    });
    tokio::task::spawn_blocking(move || thread.join().expect("the client thread")).await.expect("joined")
}

/// HTTP/1.1 over a blocking socket, one request at a time: only what the tests above need, so that no async client
/// shares the satellite's runtime.
struct RawHttp {
    stream: std::io::BufReader<std::net::TcpStream>,
    host: String,
}

impl RawHttp {
    fn connect(addr: &str) -> RawHttp {
        let stream = std::net::TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        RawHttp { stream: std::io::BufReader::new(stream), host: addr.to_owned() }
    }

    /// A handshake-era `initialize` on `path`; the session, when the route keeps one.
    fn initialize(&mut self, path: &str, token: &str) -> Option<String> {
        let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",
            "capabilities":{},"clientInfo":{"name":"raw","version":"1"}}});
        let (head, _) = self.post(path, token, None, &init.to_string());
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        header(&head, "mcp-session-id")
    }

    /// POSTs `body` and returns the answer's head and body.
    fn post(&mut self, path: &str, token: &str, session: Option<&str>, body: &str) -> (String, String) {
        let request = self.request(path, token, session, body);
        self.send(request.as_bytes());
        self.answer()
    }

    /// The bytes of a POST of `body`.
    fn request(&self, path: &str, token: &str, session: Option<&str>, body: &str) -> String {
        let session = session.map(|s| format!("mcp-session-id: {s}\r\n")).unwrap_or_default();
        format!(
            "POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {token}\r\n\
             content-type: application/json\r\naccept: application/json, text/event-stream\r\n{session}\
             content-length: {}\r\n\r\n{body}",
            body.len(),
            host = self.host
        )
    }

    fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stream.get_mut().write_all(bytes).expect("write");
    }

    /// The next answer's head and body (with a `content-length`, or chunked).
    fn answer(&mut self) -> (String, String) {
        use std::io::{BufRead, Read};
        let mut head = String::new();
        loop {
            let mut line = String::new();
            assert!(self.stream.read_line(&mut line).expect("read") > 0, "closed after {head}");
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let mut answer = Vec::new();
        if let Some(length) = header(&head, "content-length") {
            answer.resize(length.parse::<usize>().expect("a length"), 0);
            self.stream.read_exact(&mut answer).expect("body");
        } else {
            // A slow answer comes as an event stream, chunked.
            let chunked = header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
            assert!(chunked, "neither a length nor chunks: {head}");
            loop {
                let mut size = String::new();
                self.stream.read_line(&mut size).expect("chunk size");
                let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
                let mut chunk = vec![0; size + 2];
                self.stream.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..size]);
            }
        }
        (head, String::from_utf8(answer).expect("utf-8"))
    }
}

/// How many times this runtime's workers have parked so far (each park follows a wake-up).
fn parks_counter() -> impl Fn() -> u64 + Send + 'static {
    let metrics = tokio::runtime::Handle::current().metrics();
    move || (0..metrics.num_workers()).map(|worker| metrics.worker_park_count(worker)).sum::<u64>()
}

/// The value of header `name` in an answer's head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
    })
}

/// A satellite with the `asks-client` fixture installed for alice, on her instance endpoint `alice-asks`.
async fn with_asks() -> TestSatellite {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "\n[[servers]]\nslug = \"asks\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"asks-client\"]\n\
         [[installations]]\nid = \"i-asks\"\nteam = \"acme\"\nserver = \"asks\"\n\
         [installations.users.alice]\ninstance_path = \"alice-asks\"\ninstance_token_sha256 = \"{}\"\n",
        sha256_hex(&instance_token("alice-asks"))
    );
    let sat = TestSatellite::start(&(config() + &extra)).await;
    sat.wait_ready().await;
    wait_online(&sat, "asks-acme-alice-i-asks").await;
    sat
}

/// Read a GET stream until the server's request `method` comes on it; the request.
async fn next_request(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    method: &str,
) -> Value {
    next_message(stream, &format!("a {method} request"), |message| {
        message["method"] == method && message.get("id").is_some()
    })
    .await
}

/// Read an SSE stream until a message `wanted` comes on it; that message.
async fn next_message(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    what: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let find = |heard: &str| {
        heard
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| wanted(message))
    };
    let mut heard = String::new();
    hear(stream, &mut heard, |heard| find(heard).is_some()).await;
    find(&heard).unwrap_or_else(|| panic!("no {what} on the stream: {heard}"))
}

/// A server's request made outside any call (here `roots/list`, asked after the client said its roots changed)
/// reaches the member's own client on a GET stream, and the client's answer goes back to the server: on `/mcp`,
/// where a roots change now reaches every server of the caller's, and on the instance's endpoint, whose client is
/// asked first. Before, the satellite answered a stdio server itself, with no roots.
#[tokio::test]
async fn a_servers_request_outside_any_call_is_answered_by_its_members_client() {
    let sat = with_asks().await;
    let roots = json!({"roots": {"listChanged": true}});
    let changed = json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"});
    let path = format!("/i/alice-asks/mcp?token={}", instance_token("alice-asks"));
    let direct = Caller::connect_with(&sat, &path, None, roots.clone()).await;

    // On /mcp: the roots change reaches alice's server, which asks her client on her stream.
    let alice = Caller::connect_with(&sat, "/mcp", Some(ALICE), roots.clone()).await;
    let mut on_mcp = get_stream_as(&sat, "/mcp", alice.session.as_deref().expect("a session"), Some(ALICE)).await;
    let (status, text) = alice.post_text(&changed).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let request = next_request(&mut on_mcp, "roots/list").await;
    answer_roots(&alice, &request, "file:///alice/mcp").await;
    server_heard(&direct, "file:///alice/mcp").await;

    // On the instance's endpoint, whose own client is asked before one on /mcp.
    let mut on_instance = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let (status, text) = direct.post_text(&changed).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let request = next_request(&mut on_instance, "roots/list").await;
    answer_roots(&direct, &request, "file:///alice/direct").await;
    server_heard(&direct, "file:///alice/direct").await;
    assert!(sat.satellite.shutdown().await);
}

/// The JSON-RPC messages of an SSE text heard so far.
fn heard_messages(heard: &str) -> Vec<Value> {
    heard
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .collect()
}

/// Read `stream` into `heard` until a message `wanted` is among its messages; that message.
async fn hear_message(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    heard: &mut String,
    what: &str,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    let find = |heard: &str| heard_messages(heard).into_iter().find(|message| wanted(message));
    hear(stream, heard, |heard| find(heard).is_some()).await;
    find(heard).unwrap_or_else(|| panic!("no {what} on the stream: {heard}"))
}

/// A 2026-07-28 server (`asks-2026`, stdio) asks a handshake-era client to open a URL (an elicitation in URL mode,
/// through `input_required`): the satellite asks the client on the call's stream, with the URL and elicitation id
/// as the server wrote them, and retries with the answer. The server asks only because the satellite declared the client's own capabilities: a client offering form mode
/// alone is not asked at all.
#[tokio::test]
async fn a_2026_servers_url_elicitation_reaches_a_handshake_era_client() {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "\n[[servers]]\nslug = \"asks26\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"asks-2026\"]\n\
         [[installations]]\nid = \"i-asks26\"\nteam = \"acme\"\nserver = \"asks26\"\n\
         [installations.users.alice]\ninstance_path = \"alice-asks26\"\ninstance_token_sha256 = \"{}\"\n",
        sha256_hex(&instance_token("alice-asks26"))
    );
    let sat = TestSatellite::start(&(config() + &extra)).await;
    sat.wait_ready().await;
    wait_online(&sat, "asks26-acme-alice-i-asks26").await;
    let path = format!("/i/alice-asks26/mcp?token={}", instance_token("alice-asks26"));
    let direct = Caller::connect_with(&sat, &path, None, json!({"elicitation": {"form": {}, "url": {}}})).await;
    let visit = json!({"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"visit","arguments":{}}});
    let is_request = |m: &Value| m["method"] == "elicitation/create" && m.get("id").is_some();

    // On the call's own stream.
    let response = direct.send(visit.to_string(), &[]).await;
    let mut stream = Box::pin(response.bytes_stream());
    let mut heard = String::new();
    let request = hear_message(&mut stream, &mut heard, "the URL elicitation", is_request).await;
    assert_eq!(request["params"]["mode"], "url", "{request}");
    assert_eq!(request["params"]["url"], "https://auth.example.com/sign-in", "{request}");
    assert_eq!(request["params"]["elicitationId"], "sign-in-1", "{request}");
    let answer = json!({"jsonrpc":"2.0","id":request["id"],"result":{"action":"accept"}});
    assert_eq!(direct.post_text(&answer).await.0, StatusCode::ACCEPTED);
    let last = hear_message(&mut stream, &mut heard, "the call's answer", |m| m["id"] == 11).await;
    assert!(last["result"]["content"][0]["text"].as_str().is_some_and(|t| t.contains("accept")), "{last}");
    assert!(last["result"].get("resultType").is_none(), "a handshake-era result: {last}");

    // A client offering form mode only: the server sees that, and asks nothing.
    let form_only = Caller::connect_with(&sat, &path, None, json!({"elicitation": {"form": {}}})).await;
    let said = form_only.tool("visit", json!({})).await;
    assert!(said.to_string().contains("no URL mode"), "{said}");
    assert!(sat.satellite.shutdown().await);
}

/// A server that withdraws its request to the client (`notifications/cancelled`) while its call runs: the
/// client hears on the call's stream, under the id it knows and while the call is still held, that it
/// need not answer; an answer it sends anyway does not reach the server. The same for a request made outside any
/// call, on the session's GET stream. Before, the client was never told: its user was still asked (until the
/// satellite's own 300 s wait ran out) and the late answer went to the server.
#[tokio::test]
async fn a_request_the_server_withdraws_is_withdrawn_from_the_client() {
    let sat = with_asks().await;
    let path = format!("/i/alice-asks/mcp?token={}", instance_token("alice-asks"));
    let direct =
        Caller::connect_with(&sat, &path, None, json!({"elicitation": {}, "roots": {"listChanged": true}})).await;
    let call = json!({"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"withdraw","arguments":{}}});
    let response = direct.send(call.to_string(), &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = Box::pin(response.bytes_stream());
    let mut heard = String::new();
    let is_request = |m: &Value| m["method"] == "elicitation/create" && m.get("id").is_some();
    let request = hear_message(&mut stream, &mut heard, "the elicitation", is_request).await;
    let retracted = direct.tool("retract", json!({})).await;
    assert!(retracted.to_string().contains("retracted 1"), "{retracted}");
    let withdrawal = |m: &Value| m["method"] == "notifications/cancelled";
    let note = hear_message(&mut stream, &mut heard, "the withdrawal", withdrawal).await;
    assert_eq!(note["params"]["requestId"], request["id"], "{note}");
    assert!(!heard_messages(&heard).iter().any(|m| m["id"] == 11), "the call is still held: {heard}");

    // The client answers anyway: nothing waits for it, and the server hears nothing.
    let answer = json!({"jsonrpc":"2.0","id":request["id"],"result":{"action":"decline"}});
    let (status, text) = direct.post_text(&answer).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let released = direct.tool("release", json!({})).await;
    assert!(released.to_string().contains(r#"{\"late answers\": []}"#), "{released}");
    let last = hear_message(&mut stream, &mut heard, "the call's answer", |m| m["id"] == 11).await;
    assert!(last.to_string().contains("released"), "{last}");

    // Outside any call: the server asks for the roots when told they changed, then withdraws that.
    let mut on_get = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let changed = json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"});
    let (status, text) = direct.post_text(&changed).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let mut heard = String::new();
    let is_request = |m: &Value| m["method"] == "roots/list" && m.get("id").is_some();
    let request = hear_message(&mut on_get, &mut heard, "the roots request", is_request).await;
    let retracted = direct.tool("retract", json!({})).await;
    assert!(retracted.to_string().contains("retracted 1"), "{retracted}");
    let note = hear_message(&mut on_get, &mut heard, "the withdrawal", withdrawal).await;
    assert_eq!(note["params"]["requestId"], request["id"], "{note}");
    assert!(sat.satellite.shutdown().await);
}

/// What a session asked of its instance's server (a resource to watch, a log level) is asked again of the new server
/// when the instance is edited in place, as of a restarted one: the session outlives the edit, and goes on hearing
/// the resource's updates. Before, the new server knew of neither, and the session waited for updates in vain.
#[tokio::test]
async fn an_instance_edited_in_place_keeps_what_its_sessions_asked_of_the_server() {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let paged = |alice_args: &str| {
        format!(
            "\n[[servers]]\nslug = \"paged\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"paged\"]\n\
             [[installations]]\nid = \"i-paged\"\nteam = \"acme\"\nserver = \"paged\"\n\
             [installations.users.alice]\ninstance_path = \"alice-paged\"\ninstance_token_sha256 = \"{}\"\n{alice_args}",
            sha256_hex(&instance_token("alice-paged"))
        )
    };
    let sat = TestSatellite::start(&(config() + &paged(""))).await;
    sat.wait_ready().await;
    let id = ProcessId::from("paged-acme-alice-i-paged");
    wait_online(&sat, id.as_str()).await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let asked = [
        json!({"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"paged://report"}}),
        json!({"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"warning"}}),
    ];
    for request in &asked {
        let (status, answer) = direct.post_text(request).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let mut stream = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let before = sat.satellite.manager().get(&id).expect("alice's instance");
    sat.rewrite_config(&(config() + &paged("args = [\"--edited\"]\n")));
    wait_until(DEADLINE, "the edited instance online", || {
        let edited = sat.satellite.manager().get(&id).filter(|now| !std::sync::Arc::ptr_eq(now, &before));
        let online = edited.is_some_and(|now| now.state() == InstanceStatus::Online);
        async move { online.then_some(()) }
    })
    .await;
    let touch = json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"touch","arguments":{}}});
    let touched = wait_until(DEADLINE, "the new server asked again", || async {
        let (_, touched) = direct.post_text(&touch).await;
        touched.contains("subscribed: paged://report").then_some(touched)
    })
    .await;
    assert!(touched.contains("log level: warning"), "{touched}");
    let mut heard = String::new();
    let updated =
        |m: &Value| m["method"] == "notifications/resources/updated" && m["params"]["uri"] == "paged://report";
    hear_message(&mut stream, &mut heard, "the resource's update", updated).await;
    assert!(sat.satellite.shutdown().await);
}

/// On stdio a server's request names none of the calls running on it, and goes to the newest: with two running, it
/// may be the other's. Such a request is not withdrawn when the call whose stream carried it ends, and the
/// client's answer still reaches the server; withdrawn by the server later, the client hears so on its session's
/// GET stream, the one still open. (A request surely of one call, with no other running, is withdrawn with it: see
/// `a_request_the_server_withdraws_is_withdrawn_from_the_client`.)
#[tokio::test]
async fn a_request_perhaps_of_another_call_outlives_the_call_that_carried_it() {
    let sat = with_asks().await;
    let path = format!("/i/alice-asks/mcp?token={}", instance_token("alice-asks"));
    let direct = Caller::connect_with(&sat, &path, None, json!({"elicitation": {}})).await;
    let mut on_get = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let instance = sat.satellite.manager().get(&ProcessId::from("asks-acme-alice-i-asks")).expect("the instance");
    let call = |id: u64, name: &str| {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":{}}}).to_string()
    };
    // A call held, then one whose server asks the client: with two running, the question may be either's.
    let two_calls_asking = |round: u64| {
        let (direct, instance) = (&direct, &instance);
        async move {
            let holder = Caller {
                http: direct.http.clone(),
                url: direct.url.clone(),
                token: direct.token.clone(),
                session: direct.session.clone(),
            };
            let first = call(round * 10 + 1, "hold");
            let held = tokio::spawn(async move { holder.send(first, &[]).await.status() });
            wait_until(DEADLINE, "the first call in flight", || {
                let running = instance.in_flight() == 1;
                async move { running.then_some(()) }
            })
            .await;
            let response = direct.send(call(round * 10 + 2, "withdraw"), &[]).await;
            let mut stream = Box::pin(response.bytes_stream());
            let mut heard = String::new();
            let is_request = |m: &Value| m["method"] == "elicitation/create" && m.get("id").is_some();
            let request = hear_message(&mut stream, &mut heard, "the elicitation", is_request).await;
            // The call that carried it ends.
            let released = direct.tool("release", json!({})).await;
            assert!(released.to_string().contains("late answers"), "{released}");
            hear_message(&mut stream, &mut heard, "the call's answer", |m| m["id"] == round * 10 + 2).await;
            assert!(!heard.contains("notifications/cancelled"), "not withdrawn: {heard}");
            assert_eq!(held.await.expect("the first call"), StatusCode::OK, "released too");
            request
        }
    };
    // The client answers it all the same: the server gets the answer.
    let request = two_calls_asking(1).await;
    let answer = json!({"jsonrpc":"2.0","id":request["id"],"result":{"action":"decline"}});
    let (status, text) = direct.post_text(&answer).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    wait_until(DEADLINE, "the server got the client's answer", || async {
        let answers = direct.tool("answers", json!({})).await;
        answers.to_string().contains("decline").then_some(())
    })
    .await;
    // The server withdraws the next one: the client hears so on its GET stream.
    let request = two_calls_asking(2).await;
    let retracted = direct.tool("retract", json!({})).await;
    assert!(retracted.to_string().contains("retracted 1"), "{retracted}");
    let mut heard = String::new();
    let withdrawal = |m: &Value| m["method"] == "notifications/cancelled";
    let note = hear_message(&mut on_get, &mut heard, "the withdrawal", withdrawal).await;
    assert_eq!(note["params"]["requestId"], request["id"], "{note}");
    assert!(sat.satellite.shutdown().await);
}

/// An instance edited in place (here alice's gets an argument) is a new instance under the same path and process
/// id: a GET stream open on its endpoint follows it, and hears that the tools changed once the new one has listed
/// them; the session goes on, now reaching the new server. Before, the stream went on listening to the retired
/// instance and heard nothing more, and a new instance's first catalog was announced to no one.
#[tokio::test]
async fn a_get_stream_follows_its_instance_edited_in_place() {
    let sat = started().await;
    let path = format!("/i/alice-demo/mcp?token={}", instance_token("alice"));
    let direct = Caller::connect(&sat, &path, None).await;
    let mut stream = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let id = ProcessId::from("demo-acme-alice-d-acme");
    let before = sat.satellite.manager().get(&id).expect("alice's instance");
    let edited = config().replacen(
        "instance_path = \"alice-demo\"\n",
        "instance_path = \"alice-demo\"\nargs = [\"--page-size\", \"3\"]\n",
        1,
    );
    sat.rewrite_config(&edited);
    let mut heard = String::new();
    let changed = |m: &Value| m["method"] == "notifications/tools/list_changed";
    // A slow first discovery of the old instance may announce its list after the stream opened: what this test
    // waits for is the word heard once the new instance is online (each hear fails at its deadline).
    let mut announcements = 0;
    let after = loop {
        hear_message(&mut stream, &mut heard, "the tools list changed", changed).await;
        announcements += 1;
        let now = sat.satellite.manager().get(&id).expect("alice's instance, edited");
        // Each hear waits at most its deadline, so a bound here only stops a loop that keeps hearing the old one.
        if !std::sync::Arc::ptr_eq(&before, &now) || announcements == 10 {
            break now;
        }
    };
    assert!(!std::sync::Arc::ptr_eq(&before, &after), "a new instance");
    assert_eq!(after.state(), satellite::model::InstanceStatus::Online, "heard once the new one is online");
    let (status, listed) = direct.call("tools/list", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert!(listed["result"]["tools"].as_array().is_some_and(|tools| !tools.is_empty()), "{listed}");
    assert!(sat.satellite.shutdown().await);
}

/// Answer the server's `roots/list` with one root.
async fn answer_roots(caller: &Caller, request: &Value, uri: &str) {
    let answer = json!({"jsonrpc":"2.0","id":request["id"],"result":{"roots":[{"uri":uri,"name":"work"}]}});
    let (status, text) = caller.post_text(&answer).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
}

/// Wait until the `asks-client` server reports the root `uri` among its client's answers.
async fn server_heard(direct: &Caller, uri: &str) {
    wait_until(DEADLINE, "the server got the client's roots", || async move {
        let answers = direct.tool("answers", json!({})).await;
        answers.to_string().contains(uri).then_some(())
    })
    .await;
}

/// The same for a Streamable HTTP server, which asks on its own GET stream: server-everything (from npm) asks for
/// the roots again when its client says they changed, and reports the last it got with its `get-roots-list` tool.
/// Before, the satellite never answered a request on that stream, and the server waited in vain.
#[tokio::test]
async fn a_remote_servers_request_on_its_stream_is_answered_by_its_members_client() {
    let server = HttpServer::everything("streamableHttp").await;
    let extra = format!(
        "\n[[servers]]\nslug = \"every\"\ntransport = \"http\"\nurl = \"{}\"\n\
         [[installations]]\nid = \"i-every\"\nteam = \"acme\"\nserver = \"every\"\n\
         [installations.users.alice]\ninstance_path = \"alice-every\"\ninstance_token_sha256 = \"{}\"\n",
        server.url("/mcp"),
        sha256_hex(&instance_token("alice-every"))
    );
    let sat = TestSatellite::start(&(config() + &extra)).await;
    sat.wait_ready().await;
    wait_online(&sat, "every-acme-alice-i-every").await;
    let path = format!("/i/alice-every/mcp?token={}", instance_token("alice-every"));
    let direct = Caller::connect_with(&sat, &path, None, json!({"roots": {"listChanged": true}})).await;
    let mut stream = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let changed = json!({"jsonrpc":"2.0","method":"notifications/roots/list_changed"});
    let (status, text) = direct.post_text(&changed).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let request = next_request(&mut stream, "roots/list").await;
    answer_roots(&direct, &request, "file:///alice/remote").await;
    wait_until(DEADLINE, "the server got the client's roots", || async {
        let listed = direct.tool("get-roots-list", json!({})).await;
        listed.to_string().contains("file:///alice/remote").then_some(())
    })
    .await;
    assert!(sat.satellite.shutdown().await);
}

/// A 2026-07-28 client's `subscriptions/listen` on the endpoint of a handshake-era server, which has no such
/// method, is served by the satellite from what the server announces on its session: acknowledged with what the
/// server can honour, then the updates of the resources it asked for (subscribed upstream by the satellite), tagged
/// with the listen's id. Before, the request went to the server and the client got -32601, although the endpoint's
/// `server/discover` promised list changes and subscriptions.
#[tokio::test]
async fn a_listen_on_a_handshake_era_server_is_served_from_what_it_announces() {
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let notifications =
        json!({"toolsListChanged":true,"promptsListChanged":true,"resourceSubscriptions":["paged://report"]});
    let mut stream = listen_stream(&sat, &path, notifications).await;
    let ack =
        next_message(&mut stream, "an acknowledgement", |m| m["method"] == "notifications/subscriptions/acknowledged")
            .await;
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub-1", "{ack}");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged":true,"promptsListChanged":true,"resourceSubscriptions":["paged://report"]}),
        "{ack}"
    );

    // The server announces an update of every resource it watches when its tool `touch` runs.
    let direct = Caller::connect(&sat, &path, None).await;
    let touch = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"touch","arguments":{}}});
    let (_, touched) = direct.post_text(&touch).await;
    assert!(touched.contains("subscribed: paged://report"), "the satellite asked the server to watch it: {touched}");
    let update =
        next_message(&mut stream, "a resource update", |m| m["method"] == "notifications/resources/updated").await;
    assert_eq!(update["params"]["uri"], "paged://report", "{update}");
    assert_eq!(update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub-1", "{update}");
    drop(stream);
    assert!(sat.satellite.shutdown().await);
}

/// A 2026-07-28 server announces list changes only on a `subscriptions/listen` stream: the satellite keeps one
/// open on it, so the catalog follows a tool the server adds, and a handshake-era client of the instance hears the
/// change on its GET stream. Before, the satellite never listened: the new tool stayed unknown until a periodic
/// rediscovery, and the client was never told. The server is built on the official Python SDK.
#[tokio::test]
async fn a_modern_server_is_followed_like_a_handshake_era_one() {
    // The Python with the SDK: scripts/test.sh installs it in .venv.
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python3");
    assert!(python.exists(), "{} (made by scripts/test.sh)", python.display());
    let python = python.to_string_lossy().into_owned();
    let script = toml_str(&fixture("modern_server.py").to_string_lossy());
    let extra = format!(
        "\n[[servers]]\nslug = \"modern\"\ntransport = \"stdio\"\ncommand = {}\nargs = [{script}]\n\
         [[installations]]\nid = \"i-modern\"\nteam = \"acme\"\nserver = \"modern\"\n\
         [installations.users.alice]\ninstance_path = \"alice-modern\"\ninstance_token_sha256 = \"{}\"\n",
        toml_str(&python),
        sha256_hex(&instance_token("alice-modern"))
    );
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &(config() + &extra), |config| {
        config.sandbox.allowed_commands.push(python.clone());
    })
    .await;
    sat.wait_ready().await;
    let id = ProcessId::from("modern-acme-alice-i-modern");
    wait_online(&sat, &id.0).await;
    let client = sat.satellite.manager().get(&id).and_then(|i| i.client()).expect("a connection");
    assert_eq!(client.era().version(), "2026-07-28", "the server speaks only 2026-07-28");

    let path = format!("/i/alice-modern/mcp?token={}", instance_token("alice-modern"));
    let direct = Caller::connect(&sat, &path, None).await;
    let mut stream = get_stream(&sat, &path, direct.session.as_deref().expect("a session")).await;
    let grown = direct.tool("grow", json!({}));
    assert!(grown.await.to_string().contains("grown_1"), "the server added a tool");
    next_message(&mut stream, "a tools/list_changed", |m| m["method"] == "notifications/tools/list_changed").await;
    wait_until(DEADLINE, "the catalog has the new tool", || {
        let instance = sat.satellite.manager().get(&id);
        async move { instance?.catalog()?.tools.iter().any(|t| t.name() == "grown_1").then_some(()) }
    })
    .await;

    // The revision removed `logging/setLevel` and `resources/subscribe`: the satellite keeps what the client set,
    // asks for the level on each request, and watches the resource on its own listen. Before, both went to the
    // server, which refused them, and the client heard neither logs nor updates.
    let request =
        |id: u64, method: &str, params: Value| json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
    // A level that is not one of the eight is refused, not kept: kept, it went into the `_meta` of every later
    // request to this server, which refused them all.
    let (_, refused) = direct.post_text(&request(7, "logging/setLevel", json!({"level":"bogus"}))).await;
    assert!(refused.contains("-32602"), "{refused}");
    let (_, logged) = direct.post_text(&request(7, "tools/call", json!({"name":"log","arguments":{}}))).await;
    assert!(logged.contains("\"result\"") && !logged.contains("notifications/message"), "no level kept: {logged}");
    for (method, params) in
        [("logging/setLevel", json!({"level":"info"})), ("resources/subscribe", json!({"uri":"modern://note"}))]
    {
        let (status, answer) = direct.post_text(&request(8, method, params)).await;
        assert!(status == StatusCode::OK && answer.contains("\"result\""), "{method}: {status} {answer}");
    }
    let (_, logged) = direct.post_text(&request(9, "tools/call", json!({"name":"log","arguments":{}}))).await;
    assert!(logged.contains("notifications/message") && logged.contains("logged at info"), "{logged}");
    // The listen is opened again with the subscription in the background: touched until an update comes.
    use futures::StreamExt;
    let mut heard = String::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !heard.contains("notifications/resources/updated") {
        assert!(tokio::time::Instant::now() < deadline, "no update of the subscribed resource: {heard}");
        let (_, touched) = direct.post_text(&request(10, "tools/call", json!({"name":"touch","arguments":{}}))).await;
        assert!(touched.contains("touched"), "{touched}");
        let read = tokio::time::timeout(Duration::from_millis(500), async {
            while let Some(Ok(chunk)) = stream.next().await {
                heard.push_str(&String::from_utf8_lossy(&chunk));
                if heard.contains("modern://note") {
                    return;
                }
            }
        });
        let _ = read.await;
    }
    assert!(heard.contains("modern://note"), "{heard}");
    assert!(sat.satellite.shutdown().await);
}

/// A message whose `id` is `null` (or a fraction) is an invalid request, not a notification, and an `initialize`
/// that is no valid request makes no session. Before, `"id": null` was read as no id: the client was told 202 and
/// a `tools/call` went to the server as a notification; and an `initialize` without a usable id made a session
/// that worked, though its answer was a 202 or an error.
#[tokio::test]
async fn a_null_id_is_an_invalid_request_and_a_bad_initialize_makes_no_session() {
    let sat = with_paged().await;
    let bare = Caller::new(&sat, "/mcp", Some(ALICE));
    let params = json!({"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}});
    for id in [Some(Value::Null), None, Some(json!(1.5))] {
        let mut init = json!({"jsonrpc":"2.0","method":"initialize","params":params});
        if let Some(id) = &id {
            init["id"] = id.clone();
        }
        let (status, headers, body) = bare.post_raw(init.to_string(), &[]).await;
        assert_eq!((status, body["error"]["code"].as_i64()), (StatusCode::BAD_REQUEST, Some(-32600)), "{id:?}: {body}");
        assert!(headers.get("mcp-session-id").is_none(), "{id:?}: no session");
    }
    let mcp = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let null_id = json!({"jsonrpc":"2.0","id":null,"method":"tools/list"});
    let (status, _, body) = mcp.post_raw(null_id.to_string(), &[]).await;
    assert_ne!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let call = json!({"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"touch","arguments":{}}});
    let (status, _, body) = direct.post_raw(call.to_string(), &[]).await;
    assert_eq!((status == StatusCode::ACCEPTED, body["error"]["code"].as_i64()), (false, Some(-32600)), "{body}");
    assert!(sat.satellite.shutdown().await);
}

/// GET and DELETE refuse an `MCP-Protocol-Version` the endpoint does not speak with 400, as POST does (before,
/// GET opened a stream and DELETE ended the session); and `/mcp` promises a 2026-07-28 client no list changes, as
/// it serves no `subscriptions/listen`, the only way such a client hears them (before, it promised them and
/// refused the listen).
#[tokio::test]
async fn get_and_delete_check_the_version_and_mcp_promises_2026_clients_no_list_changes() {
    let sat = with_paged().await;
    let mcp = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let session = mcp.session.clone().expect("a session");
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let answer = mcp
            .http
            .request(method.clone(), &mcp.url)
            .bearer_auth(ALICE)
            .header("mcp-session-id", &session)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", "1999-01-01")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{method}");
    }
    let (_, answer) = mcp.call("ping", json!({})).await;
    assert!(answer.get("result").is_some(), "the refused DELETE left the session: {answer}");

    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let discover = json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta": meta}});
    let (_, _, body) = Caller::new(&sat, "/mcp", Some(ALICE)).post_modern(&discover).await;
    let capabilities = &body["result"]["capabilities"];
    assert!(capabilities.get("tools").is_some(), "{body}");
    assert!(!capabilities.to_string().contains("listChanged"), "{capabilities}");
    assert!(sat.satellite.shutdown().await);
}

/// One member's long-lived streams (session GET streams, legacy SSE streams, listens) are capped, one cap for all
/// kinds: past it a new one is refused with 429 and a reason, while another member still opens theirs, and a
/// stream that closes gives its place back. Before, streams had no per-member limit: one member could hold every
/// connection the satellite accepts, and nobody else got an answer.
#[tokio::test]
async fn a_members_open_streams_are_capped_and_others_still_get_theirs() {
    let sat = with_paged_and(|config| config.max_streams_per_caller = 2).await;
    let (first, second) =
        (Caller::connect(&sat, "/mcp", Some(ALICE)).await, Caller::connect(&sat, "/mcp", Some(ALICE)).await);
    let kept = get_stream_as(&sat, "/mcp", first.session.as_deref().unwrap(), Some(ALICE)).await;
    let dropped = get_stream_as(&sat, "/mcp", second.session.as_deref().unwrap(), Some(ALICE)).await;
    let third = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let open = |token: &'static str, session: Option<String>| {
        let url = format!("{}/mcp", sat.base_url());
        let sse = format!("{}/sse", sat.base_url());
        async move {
            let client = reqwest::Client::new();
            let request = match session {
                Some(session) => client.get(url).header("mcp-session-id", session),
                None => client.get(sse),
            };
            request.bearer_auth(token).header("accept", "text/event-stream").send().await.unwrap()
        }
    };
    let refused = open(ALICE, third.session.clone()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.text().await.unwrap().contains("2 streams"), "the reason names the limit");
    assert_eq!(open(ALICE, None).await.status(), StatusCode::TOO_MANY_REQUESTS, "legacy SSE counts too");
    let bob = open(BOB, None).await;
    assert_eq!(bob.status(), StatusCode::OK, "another member still opens theirs");
    drop(dropped);
    let reopened = wait_until(DEADLINE, "a place given back by the closed stream", || {
        let open = open(ALICE, third.session.clone());
        async move { Some(open.await).filter(|r| r.status() == StatusCode::OK) }
    })
    .await;
    // A 2026-07-28 listen on alice's instance endpoint is one of her streams too: refused at the cap, opened once a
    // place is free, and then it holds that place.
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}});
    let listen = json!({"jsonrpc":"2.0","id":"sub-1","method":"subscriptions/listen",
        "params":{"_meta": meta, "notifications": {"toolsListChanged": true}}});
    let instance = Caller::new(&sat, &path, None);
    let listen = || instance.send_modern(&listen);
    assert_eq!(listen().await.status(), StatusCode::TOO_MANY_REQUESTS, "a listen at the cap");
    drop(reopened);
    let listening = wait_until(DEADLINE, "a listen once a place is free", || async {
        Some(listen().await).filter(|r| r.status() == StatusCode::OK)
    })
    .await;
    assert_eq!(open(ALICE, third.session.clone()).await.status(), StatusCode::TOO_MANY_REQUESTS, "the listen holds it");
    drop((kept, listening, bob));
    assert!(sat.satellite.shutdown().await);
}

/// `subscriptions/listen` holds a stream open, so it counts against `max_streams_per_caller` like any other stream,
/// on an instance of either era (a handshake-era server's listen the satellite serves itself; a 2026-07-28
/// server's it holds open upstream): at the cap one more listen is refused with 429 and the reason, and a listen
/// the client closes gives its place back, to a listen on either instance.
#[tokio::test]
async fn listens_count_against_the_stream_cap_and_give_their_place_back() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python3");
    assert!(python.exists(), "{} (made by scripts/test.sh)", python.display());
    let python = python.to_string_lossy().into_owned();
    let (paged, modern) = (fixture("misbehaving_server.py"), fixture("modern_server.py"));
    let extra = format!(
        "\n[[servers]]\nslug = \"paged\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{}, \"paged\"]\n\
         [[servers]]\nslug = \"modern\"\ntransport = \"stdio\"\ncommand = {}\nargs = [{}]\n\
         [[installations]]\nid = \"i-paged\"\nteam = \"acme\"\nserver = \"paged\"\n\
         [installations.users.alice]\ninstance_path = \"alice-paged\"\ninstance_token_sha256 = \"{}\"\n\
         [[installations]]\nid = \"i-modern\"\nteam = \"acme\"\nserver = \"modern\"\n\
         [installations.users.alice]\ninstance_path = \"alice-modern\"\ninstance_token_sha256 = \"{}\"\n",
        toml_str(&paged.to_string_lossy()),
        toml_str(&python),
        toml_str(&modern.to_string_lossy()),
        sha256_hex(&instance_token("alice-paged")),
        sha256_hex(&instance_token("alice-modern")),
    );
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &(config() + &extra), |config| {
        config.sandbox.allowed_commands.push(python.clone());
        config.max_streams_per_caller = 2;
    })
    .await;
    sat.wait_ready().await;
    wait_online(&sat, "paged-acme-alice-i-paged").await;
    wait_online(&sat, "modern-acme-alice-i-modern").await;
    let listen = |instance: &'static str| {
        let url = format!("{}/i/{instance}/mcp?token={}", sat.base_url(), instance_token(instance));
        let body = json!({"jsonrpc":"2.0","id":"sub-1","method":"subscriptions/listen","params":{
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}},
            "notifications": {"toolsListChanged": true}}});
        let request = Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "subscriptions/listen")
            .body(body.to_string());
        async move { request.send().await.expect("a listen") }
    };
    // A listen that is not refused is a stream that stays open: its body is not read.
    let refused = |instance: &'static str| async move {
        let response = listen(instance).await;
        if response.status() != StatusCode::TOO_MANY_REQUESTS {
            return false;
        }
        let body: Value = response.json().await.unwrap_or_default();
        body["error"]["message"].as_str().is_some_and(|m| m.contains("2 streams of this caller are open already"))
    };
    let first = listen("alice-paged").await;
    let second = listen("alice-modern").await;
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    assert!(refused("alice-paged").await, "a listen past the cap, on the satellite's own listen");
    assert!(refused("alice-modern").await, "a listen past the cap, held upstream");
    drop(first);
    let third = wait_until(DEADLINE, "the place of the closed listen", || async {
        Some(listen("alice-modern").await).filter(|r| r.status() == StatusCode::OK)
    })
    .await;
    assert!(refused("alice-paged").await, "the new listen holds the place");
    drop(second);
    let fourth = wait_until(DEADLINE, "the place of the listen held upstream", || async {
        Some(listen("alice-paged").await).filter(|r| r.status() == StatusCode::OK)
    })
    .await;
    assert!(refused("alice-modern").await, "both places held again");
    drop((third, fourth));
    assert!(sat.satellite.shutdown().await);
}

/// A log level that is not one of the eight is refused with -32602 wherever the satellite answers for it, and
/// nothing is kept: a `logging/setLevel` on `/mcp` (it goes to every server of the caller's that declares logging)
/// and a 2026-07-28 request's `_meta` level. Before, `/mcp` told the client `{}` whatever its servers said, and
/// passed the level on to them.
#[tokio::test]
async fn an_unknown_log_level_is_refused_and_not_passed_on() {
    let sat = with_paged().await;
    let mcp = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    for level in [json!("bogus"), json!(3), Value::Null] {
        let (_, answer) = mcp.call("logging/setLevel", json!({"level": level})).await;
        assert_eq!(answer["error"]["code"], -32602, "{level}: {answer}");
    }
    // `touch` is not listed: only the instance's own endpoint calls it.
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let touched = direct.tool("touch", json!({})).await;
    assert!(touched.to_string().contains("log level: unset"), "no level reached the server: {touched}");
    let (_, answer) = mcp.call("logging/setLevel", json!({"level": "error"})).await;
    assert!(answer.get("result").is_some(), "{answer}");
    let touched = direct.tool("touch", json!({})).await;
    assert!(touched.to_string().contains("log level: error"), "a known level still goes on: {touched}");

    let stateless = Caller::new(&sat, "/mcp", Some(ALICE));
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}, "io.modelcontextprotocol/logLevel": "loud"});
    let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta": meta}});
    let (_, _, body) = stateless.post_modern(&list).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    assert!(sat.satellite.shutdown().await);
}

/// A legacy SSE client that stops reading its stream (it hangs, or holds the connection and goes away) while a call
/// of its sends more than the stream can hold: the call must not wait on it for ever. Before, the call's relay
/// waited for room on the stream without end, holding the instance's only call slot, so every other call of the
/// owner's to that instance was refused as busy, and the stream outlived the idle sweep and shutdown's drain.
#[tokio::test]
async fn a_legacy_client_that_stops_reading_does_not_hold_its_call_for_ever() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sat = with_paged_and(|config| config.upstream.lifecycle.max_calls_per_instance = 1).await;
    let addr = sat.base_url().trim_start_matches("http://").to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let open = format!(
        "GET /sse HTTP/1.1\r\nhost: {addr}\r\naccept: text/event-stream\r\nauthorization: Bearer {ALICE}\r\n\r\n"
    );
    stalled.write_all(open.as_bytes()).await.unwrap();
    let mut heard = String::new();
    let endpoint = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stalled.read(&mut buf).await.expect("the stream is open");
            assert!(n > 0, "the stream ended before its endpoint event: {heard}");
            heard.push_str(&String::from_utf8_lossy(&buf[..n]));
            if let Some(line) = heard.lines().find(|l| l.starts_with("data:") && l.contains("/message?session=")) {
                return line.trim_start_matches("data:").trim().to_owned();
            }
        }
    })
    .await
    .expect("the endpoint event");
    // From here on the stream is never read. The call's log messages (32 MB, paced so that none is dropped on the
    // way while the stream takes them) are far more than the socket holds.
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute_mcp_tool",
        "arguments":{"tool_path":"paged:chatty","arguments":{"count":4_000,"bytes":8_000,"pause_ms":0.25}}}});
    let posted = tokio::spawn(
        reqwest::Client::new().post(format!("{}{endpoint}", sat.base_url())).bearer_auth(ALICE).json(&call).send(),
    );
    let instance = sat.satellite.manager().get(&ProcessId::from("paged-acme-alice-i-paged")).expect("alice's instance");
    wait_until(DEADLINE, "the stalled client's call in flight", || {
        let busy = instance.in_flight() == 1;
        async move { busy.then_some(()) }
    })
    .await;
    // Alice's other client gets the instance's one slot back: the stalled call is given up.
    let other = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let ran = wait_until(DEADLINE, "a call of alice's other client through", || async {
        let ran = other.execute("paged:ok", json!({})).await;
        (ran["result"]["content"][0]["text"] == "ok").then_some(ran)
    })
    .await;
    assert!(ran["result"]["isError"] != true, "{ran}");
    posted.abort();
    drop(stalled);
    assert!(sat.satellite.shutdown().await);
}

/// A server that announces more at once than the satellite's backlog holds (here an update of each of 300
/// subscribed resources in one burst): what its client's GET stream missed is said again, as each list and each
/// subscribed resource that may have changed. Before, the missed announcements were dropped, and the client kept
/// stale resources (or a stale tool list, had a list change been among them).
#[tokio::test]
async fn announcements_missed_in_a_burst_are_said_again_not_lost() {
    const RESOURCES: usize = 300;
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let direct = Caller::connect(&sat, &path, None).await;
    let session = direct.session.clone().expect("a session");
    let uri = |n: usize| format!("paged://r/{n:03}");
    for n in 0..RESOURCES {
        let subscribe = json!({"jsonrpc":"2.0","id":n,"method":"resources/subscribe","params":{"uri":uri(n)}});
        let (status, answer) = direct.post_text(&subscribe).await;
        assert!(status == StatusCode::OK && answer.contains("\"result\""), "{status}: {answer}");
    }
    let mut stream = get_stream(&sat, &path, &session).await;
    let touch = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"touch","arguments":{}}});
    let (_, touched) = direct.post_text(&touch).await;
    assert!(touched.contains(&uri(RESOURCES - 1)), "{touched}");
    let mut heard = String::new();
    let all = |heard: &str| (0..RESOURCES).all(|n| heard.contains(&format!("\"{}\"", uri(n))));
    let told = hear(&mut stream, &mut heard, all).await;
    let missing: Vec<String> = (0..RESOURCES).map(uri).filter(|u| !heard.contains(&format!("\"{u}\""))).collect();
    assert!(told, "every subscribed resource's update reaches the GET stream; missing: {missing:?}");
    assert!(sat.satellite.shutdown().await);
}

/// A legacy SSE client is asked only what it declared it can answer, as a `/mcp` client is: during a call, a
/// server's `roots/list` and `sampling/createMessage` to a client that declared neither are answered for it (no
/// roots; -32601), and only its `ping` reaches the stream. Before, a legacy call's relay passed every request on.
#[tokio::test]
async fn a_legacy_client_is_asked_only_what_it_declared() {
    let sat = with_asks().await;
    let http = reqwest::Client::new();
    let stream = http.get(format!("{}/sse", sat.base_url())).bearer_auth(ALICE).send().await.unwrap();
    assert!(stream.status().is_success());
    let mut body = stream.bytes_stream();
    let mut heard = String::new();
    let mut taken = 0;
    macro_rules! next_data {
        () => {
            next_sse_data(&mut body, &mut heard, &mut taken).await
        };
    }
    let endpoint = next_data!();
    assert!(endpoint.contains("/message?session="), "{endpoint}");
    let url = format!("{}{endpoint}", sat.base_url());
    let post = |message: Value| http.post(&url).bearer_auth(ALICE).json(&message).send();
    let initialize = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05",
        "capabilities":{},"clientInfo":{"name":"legacy","version":"1"}}});
    assert!(post(initialize).await.unwrap().status().is_success());
    let initialized: Value = serde_json::from_str(&next_data!()).unwrap();
    assert_eq!(initialized["id"], 1, "{initialized}");
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_mcp_tool",
        "arguments":{"tool_path":"asks:ask","arguments":{}}}});
    let posted = tokio::spawn(post(call));
    let mut asked = Vec::new();
    let result = loop {
        let message: Value = serde_json::from_str(&next_data!()).unwrap();
        if message["id"] == 2 && message.get("method").is_none() {
            break message;
        }
        let Some(method) = message["method"].as_str() else { continue };
        asked.push(method.to_owned());
        let answer = match method {
            "ping" => json!({"jsonrpc":"2.0","id":message["id"],"result":{}}),
            _ => json!({"jsonrpc":"2.0","id":message["id"],"error":{"code":-32601,"message":"not declared"}}),
        };
        assert!(post(answer).await.unwrap().status().is_success());
    };
    assert_eq!(asked, ["ping"], "{result}");
    let answers: Value = serde_json::from_str(result["result"]["content"][0]["text"].as_str().expect("text")).unwrap();
    assert_eq!(answers["ping"], json!({}), "{answers}");
    assert_eq!(answers["roots/list"], json!({"roots": []}), "{answers}");
    assert_eq!(answers["sampling/createMessage"]["code"], -32601, "{answers}");
    let _ = posted.await;
    drop(body);
    assert!(sat.satellite.shutdown().await);
}

/// The next message's data on a legacy SSE stream, each once, as they come: `heard` keeps what was read, `taken`
/// how many messages were returned.
async fn next_sse_data(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    heard: &mut String,
    taken: &mut usize,
) -> String {
    use futures::StreamExt;
    tokio::time::timeout(DEADLINE, async {
        loop {
            let complete = heard.rsplit_once("\n\n").map_or("", |(complete, _)| complete);
            let data = complete
                .split("\n\n")
                .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data:")))
                .nth(*taken)
                .map(|data| data.trim().to_owned());
            if let Some(data) = data {
                *taken += 1;
                return data;
            }
            let chunk = body.next().await.expect("the stream is open").expect("readable");
            heard.push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("nothing more on the stream: {heard}"))
}

/// A legacy SSE client that goes away in the middle of a call (its stream closed while the server is still
/// sending log messages for the call) does not cancel the call: it runs on to its end upstream, as a disconnected
/// client's call does on `/mcp`, and is reported as executed. Only forwarding stops.
#[tokio::test]
async fn a_legacy_client_that_leaves_mid_call_does_not_cancel_it() {
    let sat = with_paged().await;
    let http = reqwest::Client::new();
    let stream = http.get(format!("{}/sse", sat.base_url())).bearer_auth(ALICE).send().await.unwrap();
    assert!(stream.status().is_success());
    let (mut body, mut heard, mut taken) = (stream.bytes_stream(), String::new(), 0);
    let endpoint = next_sse_data(&mut body, &mut heard, &mut taken).await;
    let url = format!("{}{endpoint}", sat.base_url());
    // Two seconds of log messages, then the answer.
    let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute_mcp_tool",
        "arguments":{"tool_path":"paged:chatty","arguments":{"count":200,"bytes":100,"pause_ms":10}}}});
    let posted = tokio::spawn(http.post(&url).bearer_auth(ALICE).json(&call).send());
    let first = next_sse_data(&mut body, &mut heard, &mut taken).await;
    assert!(first.contains("notifications/message"), "{first}");
    drop(body);
    let executed = wait_until(DEADLINE, "the call's mcp.tool.executed event", || async {
        let events = sat.satellite.store().outbox().events(Some("mcp.tool.executed"), 0, 100).await.ok()?;
        events.into_iter().find(|e| e.data["tool_name"] == "paged:chatty")
    })
    .await;
    assert_eq!(executed.data["success"], true, "the call ran to its end: {}", executed.data);
    let _ = posted.await;
    assert!(sat.satellite.shutdown().await);
}

/// Only `tools/call`, `prompts/get` and `resources/read` may end in `input_required` (2026-07-28, MRTR). A server
/// asking `roots/list` during a 2026-07-28 client's `completion/complete` is answered for the client, as one
/// without the capability would (no roots), and the completion comes back, even though the client declared
/// `roots`. Before, it was parked and answered with `input_required`, which the SDK cannot read as a completion.
#[tokio::test]
async fn a_completion_is_never_answered_with_input_required() {
    let sat = with_asks().await;
    let path = format!("/i/alice-asks/mcp?token={}", instance_token("alice-asks"));
    let modern = Caller::new(&sat, &path, None);
    let envelope = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"roots": {}}});
    let complete = json!({"jsonrpc":"2.0","id":5,"method":"completion/complete","params":{
        "ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"city","value":"pa"},"_meta":envelope}});
    let (status, _, reply) = modern.post_modern(&complete).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_ne!(reply["result"]["resultType"], "input_required", "{reply}");
    assert_eq!(reply["result"]["completion"]["values"][0], r#"{"roots": []}"#, "{reply}");
    assert!(sat.satellite.shutdown().await);
}

/// A 2026-07-28 call parked on its server's questions (MRTR) and resumed by the client's retries tells the progress
/// its server sends afterwards under the progress token of the retry it answers, as each retry is a new request.
/// Before, that progress went out under the first request's token, which the client no longer listened for.
#[tokio::test]
async fn a_resumed_calls_progress_reaches_the_retry_under_its_own_token() {
    let sat = with_asks().await;
    let path = format!("/i/alice-asks/mcp?token={}", instance_token("alice-asks"));
    let modern = Caller::new(&sat, &path, None);
    let params = |round: u64, state: Option<&Value>, responses: Option<Value>| {
        let mut params = json!({"name": "ask", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"roots": {}, "sampling": {}},
            "progressToken": format!("round-{round}")}});
        if let (Some(state), Some(responses)) = (state, responses) {
            params["requestState"] = state.clone();
            params["inputResponses"] = responses;
        }
        json!({"jsonrpc": "2.0", "id": round, "method": "tools/call", "params": params})
    };
    let mut request = params(1, None, None);
    for round in 1..=5u64 {
        let response = modern.send_modern(&request).await;
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.unwrap_or_default();
        let messages: Vec<Value> = if text.trim_start().starts_with('{') {
            vec![serde_json::from_str(&text).expect("a JSON answer")]
        } else {
            heard_messages(&text)
        };
        let reply = messages.iter().find(|m| m["id"] == round).unwrap_or_else(|| panic!("an answer: {text}"));
        if reply["result"]["resultType"] == "input_required" {
            let mut responses = serde_json::Map::new();
            for (key, asked) in reply["result"]["inputRequests"].as_object().expect("the questions") {
                let answer = match asked["method"].as_str() {
                    Some("roots/list") => json!({"roots": []}),
                    _ => json!({"role": "assistant", "model": "m", "content": {"type": "text", "text": "hi"}}),
                };
                responses.insert(key.clone(), answer);
            }
            request = params(round + 1, reply["result"].get("requestState"), Some(Value::Object(responses)));
            continue;
        }
        assert!(reply["result"]["content"][0]["text"].as_str().is_some_and(|t| t.contains("sampling")), "{text}");
        let progress: Vec<&Value> = messages.iter().filter(|m| m["method"] == "notifications/progress").collect();
        assert_eq!(progress.len(), 1, "{text}");
        assert_eq!(progress[0]["params"]["progressToken"], format!("round-{round}"), "{text}");
        assert!(round > 1, "the call was parked at least once: {text}");
        assert!(sat.satellite.shutdown().await);
        return;
    }
    panic!("the call never ended");
}

/// 2026-07-28 has a server send log messages about a request only when the request asks for them
/// (`io.modelcontextprotocol/logLevel`), at or above that level. Through the satellite, a handshake-era server's
/// log line during a 2026-07-28 client's call reaches it only so. Before, every log line went to every such call.
#[tokio::test]
async fn a_2026_client_hears_only_the_log_messages_its_request_asked_for() {
    let sat = with_paged().await;
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let modern = Caller::new(&sat, &path, None);
    for (level, heard) in [(None, false), (Some("error"), false), (Some("info"), true), (Some("debug"), true)] {
        let mut envelope = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}});
        if let Some(level) = level {
            envelope["io.modelcontextprotocol/logLevel"] = json!(level);
        }
        let call = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"log","arguments":{},"_meta":envelope}});
        let response = modern.send_modern(&call).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.text().await.unwrap_or_default();
        assert!(body.contains("logged"), "{level:?}: the answer: {body}");
        assert_eq!(body.contains("during the call"), heard, "{level:?}: {body}");
    }
    assert!(sat.satellite.shutdown().await);
}

/// Read `stream` to its end; false when `DEADLINE` passed first.
async fn ends(stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin)) -> bool {
    use futures::StreamExt;
    let drained = async {
        while let Some(chunk) = stream.next().await {
            if chunk.is_err() {
                break;
            }
        }
    };
    tokio::time::timeout(DEADLINE, drained).await.is_ok()
}

/// Every request authenticates anew, and so, while it lasts, does a stream: once an edit of the config file revokes
/// alice's token and changes her instance token, her session's GET stream on `/mcp`, her legacy SSE stream and her
/// 2026-07-28 `subscriptions/listen` on her instance's endpoint (a handshake-era server's) end, and bob's stream stays open. Before, each
/// stayed open for as long as the client held it, hearing alice's list changes and carrying her server's
/// requests to a caller the satellite no longer admits.
#[tokio::test]
async fn streams_end_once_their_credential_no_longer_admits_the_caller() {
    let sat = with_paged().await;
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE)).await;
    let bob = Caller::connect(&sat, "/mcp", Some(BOB)).await;
    let mut alice_get = get_stream_as(&sat, "/mcp", alice.session.as_deref().unwrap(), Some(ALICE)).await;
    let mut bob_get = get_stream_as(&sat, "/mcp", bob.session.as_deref().unwrap(), Some(BOB)).await;
    let sse = Client::new()
        .get(format!("{}/sse", sat.base_url()))
        .bearer_auth(ALICE)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), StatusCode::OK);
    let mut alice_sse = Box::pin(sse.bytes_stream());
    let path = format!("/i/alice-paged/mcp?token={}", instance_token("alice-paged"));
    let mut alice_listen = listen_stream(&sat, &path, json!({"toolsListChanged": true})).await;

    let revoked = std::fs::read_to_string(&sat.config_path)
        .unwrap()
        .replace(&sha256_hex(ALICE), &sha256_hex("alice-new-token-0123456789"))
        .replace(&sha256_hex(&instance_token("alice-paged")), &sha256_hex(&instance_token("alice-new")));
    sat.rewrite_config(&revoked);
    assert!(ends(&mut alice_get).await, "alice's GET stream ends");
    assert!(ends(&mut alice_sse).await, "alice's legacy SSE stream ends");
    assert!(ends(&mut alice_listen).await, "alice's listen ends");
    // Bob's token is as it was: his stream is still open, and hears his own lists change (one more server
    // installed for the team).
    let for_bob = "\n[[installations]]\nid = \"i-paged-2\"\nteam = \"acme\"\nserver = \"paged\"\n";
    sat.rewrite_config(&format!("{revoked}{for_bob}"));
    let mut heard = String::new();
    assert!(hear(&mut bob_get, &mut heard, |h| h.contains("list_changed")).await, "bob's stream stays open: {heard}");
    let (status, _) = bob.call("tools/list", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(sat.satellite.shutdown().await);
}
