//! Issue 75, item 5, at the front door: a 405 names what its route accepts (`Allow`), a body that never finishes
//! is answered 408 soon after the satellite starts waiting for it, and a 2025-03-26 client on the legacy SSE
//! transport may POST a JSON-RPC batch to `/message`.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
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
    // Nor a session to DELETE, whatever session id it names.
    for session in [None, Some("0123456789abcdef")] {
        let mut delete = http
            .delete(format!("{}/mcp", sat.base_url()))
            .bearer_auth(ALICE)
            .header("mcp-protocol-version", "2026-07-28");
        if let Some(session) = session {
            delete = delete.header("mcp-session-id", session);
        }
        let answer = delete.send().await.expect("answer");
        assert_eq!(answer.status(), StatusCode::METHOD_NOT_ALLOWED, "DELETE naming {session:?}");
        assert_eq!(allowed(answer.headers()), Some(set(&["POST", "OPTIONS"])), "{:?}", answer.headers());
        let body: Value = answer.json().await.expect("a JSON error body");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("no sessions")), "{body}");
    }
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

/// A legacy SSE stream's events, read as they come: `next` returns each message's data once.
struct Legacy {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    heard: String,
    taken: usize,
}

impl Legacy {
    async fn open(sat: &TestSatellite, http: &Client) -> (Legacy, String) {
        let stream = http.get(format!("{}/sse", sat.base_url())).bearer_auth(ALICE).send().await.expect("a stream");
        assert!(stream.status().is_success(), "{}", stream.status());
        let mut legacy = Legacy { body: Box::pin(stream.bytes_stream()), heard: String::new(), taken: 0 };
        let endpoint = legacy.next().await;
        assert!(endpoint.contains("/message?session="), "{endpoint}");
        (legacy, format!("{}{endpoint}", sat.base_url()))
    }

    async fn next(&mut self) -> String {
        let (heard, taken, body) = (&mut self.heard, &mut self.taken, &mut self.body);
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
}

/// A 2025-03-26 client on the legacy transport may POST a JSON-RPC batch to `/message` (2025-03-26 basic: a
/// receiver MUST support batches). Each message is handled as if posted alone; the batch's responses go on the
/// stream as one JSON array (JSON-RPC 2.0 §6, the schema's `JSONRPCBatchResponse`), as `/mcp` answers a batch; a
/// batch of notifications only is accepted with 202 and answered nothing; an empty batch, one over the cap and one
/// carrying `initialize` are refused as `/mcp` refuses them. Before, a batch got an Invalid Request error.
#[tokio::test]
async fn a_legacy_client_may_post_a_batch() {
    let sat = TestSatellite::start(&config()).await;
    let http = Client::new();
    let (mut legacy, url) = Legacy::open(&sat, &http).await;
    let post = |message: Value| http.post(&url).bearer_auth(ALICE).json(&message).send();
    let initialize = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26",
        "capabilities":{},"clientInfo":{"name":"legacy-batch","version":"1"}}});
    assert!(post(initialize).await.expect("posted").status().is_success());
    let initialized: Value = serde_json::from_str(&legacy.next().await).expect("JSON");
    assert_eq!(initialized["result"]["protocolVersion"], "2025-03-26", "{initialized}");

    let batch = json!([
        {"jsonrpc":"2.0","method":"notifications/initialized"},
        {"jsonrpc":"2.0","id":2,"method":"tools/list"},
        {"jsonrpc":"2.0","id":"three","method":"ping"},
        {"jsonrpc":"2.0","id":4,"method":"no/such/method"},
    ]);
    let posted = post(batch).await.expect("posted");
    assert_eq!(posted.status(), StatusCode::OK);
    let answers: Value = serde_json::from_str(&legacy.next().await).expect("JSON");
    let answers = answers.as_array().unwrap_or_else(|| panic!("one JSON array of the batch's answers: {answers}"));
    let by_id = |id: Value| answers.iter().find(|a| a["id"] == id).unwrap_or_else(|| panic!("{id}: {answers:?}"));
    assert_eq!(answers.len(), 3, "one answer per request, none for the notification: {answers:?}");
    assert_eq!(by_id(json!(2))["result"]["tools"].as_array().map(Vec::len), Some(4), "{answers:?}");
    assert_eq!(by_id(json!("three"))["result"], json!({}), "{answers:?}");
    assert_eq!(by_id(json!(4))["error"]["code"], -32601, "{answers:?}");

    // Notifications (and responses) only: accepted, nothing answered on the stream.
    let quiet = json!([{"jsonrpc":"2.0","method":"notifications/initialized"},
        {"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}]);
    assert_eq!(post(quiet).await.expect("posted").status(), StatusCode::ACCEPTED);

    // Refused as `/mcp` refuses them: empty, over the cap, with `initialize`.
    let ping = |id: usize| json!({"jsonrpc":"2.0","id":id,"method":"ping"});
    let over = Value::Array((0..101).map(ping).collect());
    let init_batch = json!([{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"protocolVersion":"2025-03-26",
        "capabilities":{},"clientInfo":{"name":"x","version":"1"}}}, ping(6)]);
    for refused in [json!([]), over, init_batch] {
        let answer = post(refused.clone()).await.expect("posted");
        assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "{refused}");
        let body: Value = answer.json().await.expect("a JSON-RPC error");
        assert_eq!(body["error"]["code"], -32600, "{body}");
    }
    // The stream carried nothing for those: the next thing on it is the answer to the next request.
    assert_eq!(post(ping(7)).await.expect("posted").status(), StatusCode::OK);
    let next: Value = serde_json::from_str(&legacy.next().await).expect("JSON");
    assert_eq!(next["id"], 7, "{next}");
    assert!(sat.satellite.shutdown().await);
}

/// A batch on `/message` is answered as one request alone is: as soon as the server asks the client something
/// during one of its calls (here `ping`), so that a client that POSTs one message at a time can answer it; the
/// batch's array follows once every call has its response. And it takes the caller's places as any message does:
/// at her limit, a batch holding a request is refused (429), one of notifications only still gets through (202).
#[tokio::test]
async fn a_legacy_batch_is_answered_when_its_call_asks_and_takes_the_callers_places() {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let asks = format!(
        "[[servers]]\nslug = \"asks\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"asks-client\"]\n\
         [[installations]]\nid = \"i-asks\"\nteam = \"acme\"\nserver = \"asks\"\n"
    );
    let config = format!("[satellite]\nmax_concurrent_requests_per_caller = 1\n{}{asks}", config());
    let limits = [("SATELLITE_BODY_READ_TIMEOUT_SECONDS", "600".to_owned())];
    let sat = TestSatellite::start_with_env(tempfile::tempdir().expect("dir"), &config, |_| {}, &limits).await;
    sat.wait_ready().await;
    let http = Client::new();
    let (mut legacy, url) = Legacy::open(&sat, &http).await;
    let post = |message: Value| http.post(&url).bearer_auth(ALICE).json(&message).send();
    let initialize = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26",
        "capabilities":{},"clientInfo":{"name":"legacy-batch","version":"1"}}});
    assert!(post(initialize).await.expect("posted").status().is_success());
    legacy.next().await;
    let call = json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_mcp_tool",
        "arguments":{"tool_path":"asks:ask","arguments":{}}}});
    let batch = json!([call, {"jsonrpc":"2.0","id":3,"method":"ping"}]);
    // The instance starts with the first call: until it is up, the call is answered with an error instead.
    let began = std::time::Instant::now();
    let answers = loop {
        assert!(began.elapsed() < DEADLINE, "the batch's call was never answered by the server");
        // Answered while the call waits for the client's answer to the server's ping (or once all are answered).
        assert_eq!(post(batch.clone()).await.expect("posted").status(), StatusCode::OK);
        let answers = loop {
            let message: Value = serde_json::from_str(&legacy.next().await).expect("JSON");
            if message.is_array() {
                break message;
            }
            assert_eq!(message["method"], "ping", "only what the client declared is asked: {message}");
            let pong = json!({"jsonrpc":"2.0","id":message["id"],"result":{}});
            assert_eq!(post(pong).await.expect("posted").status(), StatusCode::ACCEPTED);
        };
        let said =
            answers[0]["result"]["content"][0]["text"].as_str().and_then(|t| serde_json::from_str::<Value>(t).ok());
        if said.is_some_and(|said| said["ping"] == json!({})) {
            break answers;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((answers[0]["id"].clone(), answers[1]["id"].clone()), (json!(2), json!(3)), "{answers}");
    assert_eq!(answers[1]["result"], json!({}), "{answers}");

    // Alice's one place, held by a body she trickles in.
    let mut trickling = tokio::net::TcpStream::connect(sat.satellite.local_addr()).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{{\"jsonrpc\""
    );
    trickling.write_all(head.as_bytes()).await.expect("a head and the start of a body");
    let pings = json!([{"jsonrpc":"2.0","id":4,"method":"ping"}]);
    wait_until(DEADLINE, "alice's batch refused at her limit", || {
        let posted = post(pings.clone());
        async move { (posted.await.ok()?.status() == StatusCode::TOO_MANY_REQUESTS).then_some(()) }
    })
    .await;
    let cancels = json!([{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}]);
    assert_eq!(post(cancels).await.expect("posted").status(), StatusCode::ACCEPTED, "notifications get through");
    drop(trickling);
    assert!(sat.satellite.shutdown().await);
}
