//! Issue 75, item 5, at the front door: a 405 names what its route accepts (`Allow`), and a body that never
//! finishes is answered 408 soon after the satellite starts waiting for it.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);
const ALICE: &str = "corners-alice-token-0123456789";

/// One user with a token and an instance path (no server: none of these corners reaches one).
fn config() -> String {
    format!(
        "[[teams]]\nid = \"acme\"\n[[users]]\nid = \"alice\"\nteams = [\"acme\"]\ntoken_sha256 = [\"{}\"]\n",
        satellite::config::sha256_hex(ALICE),
    )
}

/// The methods an `Allow` header names, as a set (RFC 9110 §10.2.1: a list; order and case of spacing are free).
fn allowed(headers: &reqwest::header::HeaderMap) -> Option<BTreeSet<String>> {
    let value = headers.get("allow")?.to_str().ok()?;
    Some(value.split(',').map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()).collect())
}

fn set(methods: &[&str]) -> BTreeSet<String> {
    methods.iter().map(|m| (*m).to_owned()).collect()
}

/// RFC 9110 §15.5.6: a 405 carries `Allow` naming the methods the target accepts. Each route names its own (the
/// MCP and legacy routes, open to browsers, OPTIONS too: their CORS preflight is served), and a GET from a
/// 2026-07-28 client (which has no server stream) names what that era accepts. Before, no 405 carried `Allow`.
#[tokio::test]
async fn a_405_names_the_methods_its_route_accepts() {
    let sat = TestSatellite::start(&config()).await;
    let http = Client::new();
    let mcp = ["GET", "POST", "DELETE", "OPTIONS"];
    for (method, path, expected) in [
        ("PUT", "/mcp", &mcp[..]),
        ("PATCH", "/i/alice-demo/mcp", &mcp[..]),
        ("POST", "/sse", &["GET", "OPTIONS"][..]),
        ("GET", "/message?session=x", &["POST", "OPTIONS"][..]),
        ("DELETE", "/healthz", &["GET"][..]),
        ("POST", "/readyz", &["GET"][..]),
        ("PATCH", "/api/status/debug", &["GET"][..]),
        ("POST", "/api/toolsets/mine", &["GET", "PUT", "DELETE"][..]),
        ("PUT", "/api/tools/refresh", &["GET", "POST"][..]),
        ("OPTIONS", "/healthz", &["GET"][..]),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let answer = http
            .request(method.clone(), format!("{}{path}", sat.base_url()))
            .bearer_auth(ALICE)
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(allowed(answer.headers()), Some(set(expected)), "{method} {path}: {:?}", answer.headers());
        let body: Value = answer.json().await.expect("a JSON error body");
        assert!(body["error"]["message"].is_string(), "{method} {path}: {body}");
    }
    // A 2026-07-28 client has no server stream to GET: only POST (and the preflight) are of its era.
    let answer = http
        .get(format!("{}/mcp", sat.base_url()))
        .bearer_auth(ALICE)
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(allowed(answer.headers()), Some(set(&["POST", "OPTIONS"])), "{:?}", answer.headers());
    // OPTIONS, named in the MCP routes' `Allow`, is answered there (with what they accept), not refused.
    let answer =
        http.request(reqwest::Method::OPTIONS, format!("{}/mcp", sat.base_url())).send().await.expect("answer");
    assert!(answer.status().is_success(), "{}", answer.status());
    assert_eq!(allowed(answer.headers()), Some(set(&mcp)), "{:?}", answer.headers());
    assert!(sat.satellite.shutdown().await);
}

/// A body that never finishes (its `Content-Length` promising more than comes) is answered 408 with
/// `Connection: close` once the body-read timeout (`SATELLITE_BODY_READ_TIMEOUT_SECONDS`, here 1 s) has passed, long
/// before the request timeout (here 30 s): on `/mcp`, on legacy `/message`, and on the admin API (whose body warp
/// reads before the handler runs). Before, it got 504 at the request timeout. (A chunked body is refused at once
/// with 411 on every route: none takes a body of unknown length.)
#[tokio::test]
async fn a_body_that_never_finishes_is_answered_408() {
    let sat = TestSatellite::start_with_env(
        tempfile::tempdir().expect("dir"),
        &config(),
        |config| config.http_timeout = Duration::from_secs(30),
        &[("SATELLITE_BODY_READ_TIMEOUT_SECONDS", "1".to_owned())],
    )
    .await;
    let addr = sat.satellite.local_addr();
    let session = "0123456789abcdef0123456789abcdef";
    for target in ["POST /mcp", &format!("POST /message?session={session}"), "PUT /api/toolsets/mine"] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let half_sent = format!(
            "{target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: 200\r\n\r\n{{\"jsonrpc\":\"2.0\","
        );
        stream.write_all(half_sent.as_bytes()).await.expect("a head and half a body");
        // The client stalls; the whole answer is read, up to the connection's close.
        let mut answer = Vec::new();
        let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(read.is_ok(), "{target}: no answer, or the connection stayed open: {answer}");
        assert!(answer.starts_with("http/1.1 408"), "{target}: {answer}");
        assert!(answer.contains("\r\nconnection: close\r\n"), "{target}: {answer}");
        assert!(answer.contains("request body did not arrive"), "{target}: the error says why: {answer}");
    }
    // The satellite serves on.
    let health = reqwest::get(format!("{}/healthz", sat.base_url())).await.expect("answer");
    assert_eq!(health.status(), StatusCode::OK);
    assert!(sat.satellite.shutdown().await);
}
