//! The satellite as an invisible gateway: a call's failure is the call's, not the server's; DNS-rebinding
//! protection by Host and Origin.

use std::time::Duration;

use reqwest::StatusCode;
use satellite::model::InstanceStatus;
use serde_json::json;

use crate::common::lifecycle::{call, config, instance, text_of, wait_status, ALICE};
use crate::common::*;

/// A call that outlives its timeout fails alone: a concurrent call on the same instance succeeds and the
/// instance never leaves `online` (before, the timeout marked the healthy server offline and hid its tools).
#[tokio::test]
async fn a_slow_call_fails_alone_and_the_server_stays_online() {
    let sat = TestSatellite::start(&config("")).await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let alice = instance(&sat, ALICE);
    let manager = sat.satellite.manager();
    let slow_call = json!({"name": "slow", "arguments": {"ms": 3000}});
    let (slow, quick) =
        tokio::join!(manager.call(&alice, "tools/call", Some(slow_call), Duration::from_millis(800)), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            call(&sat, ALICE, "echo", json!({"text": "still here"})).await
        });
    let err = slow.expect_err("the slow call times out");
    assert!(err.to_string().contains("timeout"), "{err}");
    assert_eq!(text_of(&quick.expect("the concurrent call works")), "still here");
    assert_eq!(instance(&sat, ALICE).status().status, InstanceStatus::Online, "the server is not blamed");
    let after = call(&sat, ALICE, "echo", json!({"text": "after"})).await.expect("later calls work");
    assert_eq!(text_of(&after), "after");
    let changes = sat.satellite.store().outbox().events(Some("mcp.server.status_changed"), 0, 1000).await.unwrap();
    assert!(
        !changes.iter().any(|e| e.data["user_id"] == "alice" && e.data["status"] == "offline"),
        "no offline status for alice"
    );
    assert!(sat.satellite.shutdown().await);
}

/// On a loopback listener a request naming another Host, or sent by a page of another Origin, is refused with 403
/// before any route runs; the satellite's own names and local pages pass.
#[tokio::test]
async fn dns_rebinding_is_refused_by_host_and_origin() {
    let sat = TestSatellite::start(&config("")).await;
    sat.wait_ready().await;
    let port = sat.satellite.local_addr().port();
    let http = reqwest::Client::new();
    let get = |host: String, origin: Option<&'static str>| {
        let mut request = http.get(format!("{}/", sat.base_url())).header("host", host);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let evil = get("evil.example.com".into(), None).await.unwrap();
    assert_eq!(evil.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value = evil.json().await.unwrap();
    assert_eq!(body["error"]["message"], "Forbidden: Invalid Host: evil.example.com");
    assert_eq!(get(format!("evil.example.com:{port}"), None).await.unwrap().status(), StatusCode::FORBIDDEN);
    let foreign = get(format!("localhost:{port}"), Some("http://evil.example.com")).await.unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    // A Host or Origin that is not visible ASCII (obs-text bytes) matches no allowed name: 403, not a 400.
    let obs_text = reqwest::header::HeaderValue::from_bytes(b"\xe9vil.example.com").unwrap();
    let garbled_host = http.get(format!("{}/", sat.base_url())).header("host", obs_text.clone()).send().await.unwrap();
    assert_eq!(garbled_host.status(), StatusCode::FORBIDDEN);
    let garbled_origin = http
        .get(format!("{}/", sat.base_url()))
        .header("host", format!("localhost:{port}"))
        .header("origin", obs_text)
        .send()
        .await
        .unwrap();
    assert_eq!(garbled_origin.status(), StatusCode::FORBIDDEN);
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        assert_eq!(get(host.clone(), None).await.unwrap().status(), StatusCode::OK, "{host}");
    }
    assert_eq!(
        get(format!("localhost:{port}"), Some("http://localhost:6274")).await.unwrap().status(),
        StatusCode::OK,
        "a local tool's page"
    );
    // Probes and the scrape come from kubelets, load balancers and Prometheus naming the pod's address.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let probe = http.get(format!("{}{path}", sat.base_url())).header("host", "10.1.2.3:3001").send().await.unwrap();
        assert_eq!(probe.status(), StatusCode::OK, "{path} answers whatever the Host");
    }
    // The MCP endpoint itself, as the conformance scenario probes it.
    let mcp = http
        .post(format!("{}/mcp", sat.base_url()))
        .header("host", "evil.example.com")
        .header("origin", "http://evil.example.com")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status(), StatusCode::FORBIDDEN);
    assert!(sat.satellite.shutdown().await);
}

/// The operator's `allowed_hosts` and `allowed_origins` replace the loopback defaults: the named host and origin
/// pass, other hosts and origins are refused, and `"*"` turns each check off.
#[tokio::test]
async fn host_and_origin_settings_replace_the_defaults() {
    let narrowed = config("").replace(
        "[satellite]\n",
        "[satellite]\nallowed_hosts = [\"mcp.example.com\"]\nallowed_origins = [\"https://app.example.com\"]\n",
    );
    let sat = TestSatellite::start(&narrowed).await;
    sat.wait_ready().await;
    let port = sat.satellite.local_addr().port();
    let http = reqwest::Client::new();
    let status = |host: String, origin: Option<&'static str>| {
        let mut request = http.get(format!("{}/", sat.base_url())).header("host", host);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        async move { request.send().await.expect("answered").status() }
    };
    assert_eq!(status(format!("mcp.example.com:{port}"), None).await, StatusCode::OK);
    assert_eq!(status(format!("mcp.example.com:{port}"), Some("https://app.example.com")).await, StatusCode::OK);
    assert_eq!(status(format!("localhost:{port}"), None).await, StatusCode::FORBIDDEN, "not named: refused");
    assert_eq!(
        status(format!("mcp.example.com:{port}"), Some("https://evil.example.com")).await,
        StatusCode::FORBIDDEN
    );
    assert!(sat.satellite.shutdown().await);

    let open = config("").replace("[satellite]\n", "[satellite]\nallowed_hosts = [\"*\"]\nallowed_origins = [\"*\"]\n");
    let sat = TestSatellite::start(&open).await;
    sat.wait_ready().await;
    let http = reqwest::Client::new();
    let anything = http
        .get(format!("{}/", sat.base_url()))
        .header("host", "evil.example.com")
        .header("origin", "http://evil.example.com")
        .send()
        .await
        .expect("answered");
    assert_eq!(anything.status(), StatusCode::OK, "\"*\" accepts any host and origin");
    assert!(sat.satellite.shutdown().await);
}

/// The result the `verbatim` mode of tests/fixtures/misbehaving_server.py writes, byte for byte.
const VERBATIM_RESULT: &str = r#"{ "content" : [ {"type": "text", "text": "caf\u00e9 \ud83d\ude00"} ], "structuredContent": {"z": 1, "big": 123456789012345678901234567890, "exact": 1.10, "tiny": 1e-400, "a": [ ]} }"#;

/// A client gets a result as the server wrote it: a number beyond a double's precision, `1.10`, `1e-400`,
/// escapes, member order and spacing all come through as they were sent. (Before, the satellite parsed each
/// result into a tree and wrote it out again, turning the number into 1.2345678901234568e29 and `1e-400` into
/// 0.0.) The call's event counts the bytes the server sent.
#[tokio::test]
async fn a_result_reaches_the_client_byte_for_byte_as_the_server_wrote_it() {
    const TOKEN: &str = "ds_inst_fidelity_verbatim_0123456789abcdef";
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"verbatim\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"verbatim\"]\n\
         [[installations]]\nid = \"i-verbatim\"\nteam = \"acme\"\nserver = \"verbatim\"\n\
         [installations.users.alice]\ninstance_path = \"alice-verbatim\"\ninstance_token_sha256 = \"{}\"\n",
        satellite::config::sha256_hex(TOKEN)
    );
    let sat = TestSatellite::start(&config(&extra)).await;
    wait_status(&sat, "verbatim-acme-alice-i-verbatim", InstanceStatus::Online).await;
    let caller = Caller::connect(&sat, &format!("/i/alice-verbatim/mcp?token={TOKEN}"), None).await;
    let body =
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "verbatim", "arguments": {}}});
    let (status, text) = caller.post_text(&body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text, format!(r#"{{"jsonrpc":"2.0","id":7,"result":{VERBATIM_RESULT}}}"#));

    let executed = wait_until(Duration::from_secs(60), "the call's mcp.tool.executed event", || async {
        let events = sat.satellite.store().outbox().events(Some("mcp.tool.executed"), 0, 100).await.ok()?;
        events.into_iter().find(|e| e.data["tool_name"] == "verbatim:verbatim")
    })
    .await;
    assert_eq!(executed.data["response_bytes"], VERBATIM_RESULT.len(), "{}", executed.data);

    // A text cut inside an emoji by a JavaScript server (a lone surrogate escape): passed on as written where the
    // result goes as text; read with U+FFFD for it where the satellite must build the answer (a 2026-07-28 answer
    // carries its `_meta`). Before, that answer's result was `null`.
    let cut = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "cut", "arguments": {}}});
    let (status, text) = caller.post_text(&cut).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains(r#""text": "cut \ud83d""#), "as written: {text}");
    let stateless = Caller::new(&sat, &format!("/i/alice-verbatim/mcp?token={TOKEN}"), None);
    let envelope = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let body =
        json!({"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"cut","arguments":{},"_meta":envelope}});
    let (status, _, reply) = stateless.post_modern(&body).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["result"]["content"][0]["text"], "cut \u{fffd}", "{reply}");
    assert_eq!(reply["result"]["resultType"], "complete", "{reply}");
    assert!(sat.satellite.shutdown().await);
}

/// MCP asks for a string or integer id, and a Python server answers an id beyond `i64` (`2**64 - 1`) with the id as
/// the client wrote it. Through the satellite too: on the fixed listing, a proxied call, a ping and a 2026-07-28
/// request. (Before, each was refused with -32600 "invalid id".) A fraction stays refused, as the SDKs refuse it.
#[tokio::test]
async fn an_integer_id_beyond_i64_comes_back_as_written() {
    const TOKEN: &str = "ds_inst_fidelity_wide_ids_0123456789abcdef";
    let extra = format!(
        "[installations.users.alice]\ninstance_path = \"alice-demo\"\ninstance_token_sha256 = \"{}\"\n",
        satellite::config::sha256_hex(TOKEN)
    );
    let sat = TestSatellite::start(&config(&extra)).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let path = format!("/i/alice-demo/mcp?token={TOKEN}");
    let caller = Caller::connect(&sat, &path, None).await;
    let requests = [
        ("18446744073709551615", r#""method":"tools/list""#),
        ("18446744073709551614", r#""method":"tools/call","params":{"name":"echo","arguments":{"text":"wide"}}"#),
        ("9223372036854775808", r#""method":"ping""#),
    ];
    for (id, rest) in requests {
        let (status, _, reply) = caller.post_raw(format!(r#"{{"jsonrpc":"2.0","id":{id},{rest}}}"#), &[]).await;
        assert_eq!(status, StatusCode::OK, "id {id}: {reply}");
        assert!(reply.get("result").is_some(), "id {id}: {reply}");
        assert_eq!(reply["id"], serde_json::from_str::<serde_json::Value>(id).unwrap(), "id {id}: {reply}");
    }
    let (_, _, refused) = caller.post_raw(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#.into(), &[]).await;
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let stateless = Caller::new(&sat, &path, None);
    let envelope = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let params = json!({"name": "echo", "arguments": {"text": "wide"}, "_meta": envelope});
    let body = format!(r#"{{"jsonrpc":"2.0","id":9223372036854775808,"method":"tools/call","params":{params}}}"#);
    let sent = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "echo")];
    let (status, _, reply) = stateless.post_raw(body, &sent).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["id"], json!(9_223_372_036_854_775_808_u64), "{reply}");
    assert_eq!(reply["result"]["content"][0]["text"], "wide", "{reply}");
    assert!(sat.satellite.shutdown().await);
}

/// The unit of the text of a `large` answer of tests/fixtures/misbehaving_server.py, as JSON text.
const LARGE_UNIT: &str = r#"caf\u00e9 \ud83d\ude00 \"quoted\" 0123456789abcdef\n"#;

/// The result the fixture writes for a `large` call of `size` bytes, byte for byte.
fn large_result(size: usize) -> String {
    let filler = LARGE_UNIT.repeat(size.saturating_sub(64) / LARGE_UNIT.len());
    format!(r#"{{"content": [{{"type": "text", "text": "{filler}"}}]}}"#)
}

/// A 15 MB answer reaches the client byte for byte, as one of 100 KB does (both moved out of the line they came
/// in, not copied), and the request log keeps the smaller whole and only the size of the larger (more than a
/// request log keeps: `logcapture::MAX_LOGGED_TEXT_BYTES`). What the large answer costs in memory is measured by
/// `cargo bench --bench large_answer`.
#[tokio::test]
async fn a_large_answer_reaches_the_client_byte_for_byte() {
    const TOKEN: &str = "ds_inst_fidelity_large_0123456789abcdef";
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"big\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"verbatim\"]\n\
         [[installations]]\nid = \"i-big\"\nteam = \"acme\"\nserver = \"big\"\n\
         [installations.users.alice]\ninstance_path = \"alice-big\"\ninstance_token_sha256 = \"{}\"\n",
        satellite::config::sha256_hex(TOKEN)
    );
    let sat = TestSatellite::start(&config(&extra)).await;
    wait_status(&sat, "big-acme-alice-i-big", InstanceStatus::Online).await;
    let caller = Caller::connect(&sat, &format!("/i/alice-big/mcp?token={TOKEN}"), None).await;
    for (id, size) in [(7, 15_000_000), (8, 100_000)] {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "large", "arguments": {"bytes": size}}});
        let (status, text) = caller.post_text(&body).await;
        assert_eq!(status, StatusCode::OK);
        let expected = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#, large_result(size));
        assert!(text == expected, "{size}: {} bytes came, {} expected", text.len(), expected.len());
    }
    let logs = wait_until(Duration::from_secs(60), "both calls' request logs", || async {
        let events = sat.satellite.store().outbox().events(Some("mcp.request.logs"), 0, 100).await.ok()?;
        let entries: Vec<serde_json::Value> = events
            .iter()
            .flat_map(|e| e.data["requests"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["tool_name"] == "big:large")
            .collect();
        (entries.len() == 2).then_some(entries)
    })
    .await;
    let large = large_result(15_000_000).len();
    let omitted = logs.iter().find(|r| r["tool_params"]["bytes"] == 15_000_000).expect("the large call's entry");
    assert_eq!(omitted["tool_response"]["bytes"], large, "{}", omitted["tool_response"]);
    assert!(omitted["tool_response"]["omitted"].is_string(), "{}", omitted["tool_response"]);
    let kept = logs.iter().find(|r| r["tool_params"]["bytes"] == 100_000).expect("the smaller call's entry");
    let logged: serde_json::Value = serde_json::from_str(&large_result(100_000)).unwrap();
    assert_eq!(kept["tool_response"], logged, "kept whole");
    assert!(sat.satellite.shutdown().await);
}
