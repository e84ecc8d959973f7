//! The Streamable HTTP and legacy SSE upstream clients against real servers.

use std::collections::BTreeMap;
use std::time::Duration;

use satellite::discovery;
use satellite::mcp::client::{Era, McpClient};
use satellite::mcp::transport::{SseTransport, StreamableHttpTransport, Transport, UpstreamError};
use serde_json::{json, Value};

use crate::common::*;

const CALL: Duration = Duration::from_secs(10);

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

async fn connect_http(url: url::Url) -> McpClient {
    let transport = StreamableHttpTransport::new("test".into(), reqwest::Client::new(), url, &BTreeMap::new()).unwrap();
    McpClient::connect(Transport::StreamableHttp(transport), &fast_options()).await.expect("connect")
}

fn session_of(client: &McpClient) -> Option<String> {
    match client.transport() {
        Transport::StreamableHttp(t) => t.session_id(),
        _ => None,
    }
}

#[tokio::test]
async fn demo_over_http_in_each_era() {
    for (protocol, stateless) in [("legacy", false), ("modern", true), ("both", true)] {
        let server = HttpServer::demo(&["--protocol", protocol]).await;
        let client = connect_http(server.url("/mcp")).await;
        assert_eq!(matches!(client.era(), Era::Stateless { .. }), stateless, "{protocol}");
        assert_eq!(session_of(&client).is_some(), !stateless, "{protocol}: session only in the handshake era");
        let catalog = discovery::discover(&client, CALL).await.unwrap();
        assert_eq!(catalog.tools.len(), 7);
        let sum = client
            .request("tools/call", Some(json!({"name": "add", "arguments": {"a": 40, "b": 2}})), CALL)
            .await
            .unwrap();
        assert_eq!(sum["structuredContent"]["sum"], 42.0);
        client.close().await;
    }
}

#[tokio::test]
async fn a_forgotten_session_is_reinitialized_once() {
    let server = HttpServer::demo(&["--protocol", "legacy"]).await;
    let client = connect_http(server.url("/mcp")).await;
    let before = session_of(&client).expect("session");
    let renewals = client.transport().session_renewals().expect("a Streamable HTTP session renews");
    assert!(!renewals.has_changed().unwrap_or(true), "not renewed yet");
    let forgotten: Value =
        reqwest::Client::new().post(server.url("/admin/forget-sessions")).send().await.unwrap().json().await.unwrap();
    assert_eq!(forgotten["forgotten"], 1);
    let echoed = client
        .request("tools/call", Some(json!({"name": "echo", "arguments": {"text": "again"}})), CALL)
        .await
        .unwrap();
    assert_eq!(text(&echoed), "again");
    let after = session_of(&client).expect("new session");
    assert_ne!(before, after);
    assert!(renewals.has_changed().unwrap_or(false), "the renewal is told: subscriptions are to be asked again");
}

/// Requests that find the session forgotten together replay the handshake once between them: the server is left
/// with one session, not one per request (each an orphan it keeps until it expires), and the restore of
/// subscriptions and log level that follows a renewal runs once.
#[tokio::test]
async fn requests_finding_the_session_forgotten_together_renew_it_once() {
    let server = HttpServer::demo(&["--protocol", "legacy"]).await;
    let client = connect_http(server.url("/mcp")).await;
    let forget = || async {
        let forgotten: Value = reqwest::Client::new()
            .post(server.url("/admin/forget-sessions"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        forgotten["forgotten"].as_u64()
    };
    assert_eq!(forget().await, Some(1));
    let calls =
        (0..8).map(|n| {
            let text = format!("again {n}");
            let client = &client;
            async move {
                client.request("tools/call", Some(json!({"name": "echo", "arguments": {"text": text}})), CALL).await
            }
        });
    for (n, echoed) in futures::future::join_all(calls).await.into_iter().enumerate() {
        assert_eq!(text(&echoed.expect("answered on the new session")), format!("again {n}"));
    }
    assert_eq!(forget().await, Some(1), "one new session, no orphans");
}

/// A renewal that fails (the server, restarting, refuses the new handshake once) leaves no session. The next
/// request renews it before it is sent, and is answered. Before, every later request went without a session, was
/// refused with 400, and nothing ever renewed it: the instance stayed online and every call failed.
#[tokio::test]
async fn a_session_whose_renewal_failed_is_renewed_by_the_next_request() {
    let server = HttpServer::demo(&["--protocol", "legacy"]).await;
    let client = connect_http(server.url("/mcp")).await;
    let admin = |path: &str| reqwest::Client::new().post(server.url(path)).send();
    assert!(admin("/admin/forget-sessions").await.unwrap().status().is_success());
    assert!(admin("/admin/refuse-initialize/1").await.unwrap().status().is_success());
    let echo =
        |text: &str| client.request("tools/call", Some(json!({"name": "echo", "arguments": {"text": text}})), CALL);
    let err = echo("refused").await.expect_err("the renewal is refused");
    assert!(err.to_string().contains("503"), "{err}");
    for n in 0..3 {
        let echoed = echo(&format!("renewed {n}")).await.expect("answered on a renewed session");
        assert_eq!(text(&echoed), format!("renewed {n}"));
    }
}

#[tokio::test]
async fn unreachable_servers_fail_with_a_connect_error() {
    let url = url::Url::parse(&format!("http://127.0.0.1:{}/mcp", free_port())).unwrap();
    let transport = StreamableHttpTransport::new("test".into(), reqwest::Client::new(), url, &BTreeMap::new()).unwrap();
    let err = McpClient::connect(Transport::StreamableHttp(transport), &fast_options()).await.unwrap_err();
    assert!(matches!(err, UpstreamError::Connect(_)), "{err}");
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let server = HttpServer::everything("streamableHttp").await;
    let client = connect_http(server.url("/mcp")).await;
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    assert!(catalog.tools.iter().any(|t| t.name() == "echo"));
    let echoed = client
        .request("tools/call", Some(json!({"name": "echo", "arguments": {"message": "streamed"}})), CALL)
        .await
        .unwrap();
    assert!(text(&echoed).contains("streamed"), "{echoed}");
    client.close().await;
}

#[tokio::test]
async fn server_everything_over_legacy_sse() {
    let server = HttpServer::everything("sse").await;
    let transport =
        SseTransport::connect("test".into(), reqwest::Client::new(), server.url("/sse"), &BTreeMap::new(), CALL, None)
            .await
            .unwrap();
    let client = McpClient::connect(Transport::Sse(transport), &fast_options()).await.unwrap();
    assert!(matches!(client.era(), Era::Handshake { .. }));
    let catalog = discovery::discover(&client, CALL).await.unwrap();
    assert!(catalog.tools.iter().any(|t| t.name() == "echo"));
    let echoed = client
        .request("tools/call", Some(json!({"name": "echo", "arguments": {"message": "over sse"}})), CALL)
        .await
        .unwrap();
    assert!(text(&echoed).contains("over sse"), "{echoed}");
    client.close().await;
}

/// A handshake-era server that ends a call's reply stream after a priming event (an id and a `retry`) and
/// delivers the response on the stream the client resumes with GET and `Last-Event-ID`, as 2025-11-25 allows.
/// The satellite resumes the way a direct client would; the call succeeds, with no error and no status change.
#[tokio::test]
async fn a_reply_stream_the_server_closes_early_is_resumed() {
    use warp::Filter;
    let resumed_with = std::sync::Arc::new(parking_lot::Mutex::new(None::<(String, String)>));
    let seen = resumed_with.clone();
    let post = warp::post().and(warp::body::json()).map(|body: Value| {
        let sse = |text: String| {
            warp::http::Response::builder()
                .header("content-type", "text/event-stream")
                .header("mcp-session-id", "s-1")
                .body(text)
                .unwrap()
        };
        match body["method"].as_str().unwrap_or_default() {
            "initialize" => sse(format!(
                "data: {}\n\n",
                json!({"jsonrpc": "2.0", "id": body["id"], "result": {
                    "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "closes-early", "version": "1"}}})
            )),
            // The priming event, then the stream ends before the response.
            "tools/call" => sse(format!("id: call-{}-0\nretry: 20\ndata: \n\n", body["id"])),
            "notifications/initialized" => warp::http::Response::builder().status(202).body(String::new()).unwrap(),
            _ => warp::http::Response::builder().status(400).body(String::new()).unwrap(),
        }
    });
    let get = warp::get()
        .and(warp::header::<String>("last-event-id"))
        .and(warp::header::<String>("mcp-session-id"))
        .map(move |last: String, session: String| {
            *seen.lock() = Some((last.clone(), session));
            let id: i64 = last.trim_start_matches("call-").trim_end_matches("-0").parse().unwrap_or(-1);
            let response =
                json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "resumed"}]}});
            warp::http::Response::builder()
                .header("content-type", "text/event-stream")
                .body(format!("id: call-{id}-1\ndata: {response}\n\n"))
                .unwrap()
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(warp::path("mcp").and(post.or(get))).incoming(listener).run());

    let client = connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await;
    assert!(matches!(client.era(), Era::Handshake { .. }));
    let result = client.request("tools/call", Some(json!({"name": "slow", "arguments": {}})), CALL).await.unwrap();
    assert_eq!(text(&result), "resumed");
    let (last, session) = resumed_with.lock().clone().expect("the client resumed with GET");
    assert!(last.starts_with("call-") && last.ends_with("-0"), "{last}");
    assert_eq!(session, "s-1", "the resumed stream belongs to the session");
}

/// What a remote server sends outside any request reaches the satellite: resource updates for a subscription,
/// on the session's GET stream (Streamable HTTP) or on the one event stream (legacy SSE).
#[tokio::test]
async fn remote_servers_announce_resource_updates() {
    for kind in ["streamableHttp", "sse"] {
        let server = HttpServer::everything(kind).await;
        let client = match kind {
            "sse" => {
                let transport = SseTransport::connect(
                    "test".into(),
                    reqwest::Client::new(),
                    server.url("/sse"),
                    &BTreeMap::new(),
                    CALL,
                    None,
                )
                .await
                .unwrap();
                McpClient::connect(Transport::Sse(transport), &fast_options()).await.unwrap()
            }
            _ => connect_http(server.url("/mcp")).await,
        };
        let mut announcements = client.transport().announcements();
        let resources = client.request("resources/list", None, CALL).await.unwrap();
        let uri = resources["resources"][0]["uri"].as_str().unwrap().to_owned();
        client.request("resources/subscribe", Some(json!({"uri": uri})), CALL).await.unwrap();
        client
            .request("tools/call", Some(json!({"name": "toggle-subscriber-updates", "arguments": {}})), CALL)
            .await
            .unwrap();
        let update = next_update(&mut announcements, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("{kind}: no resource update announced"));
        assert_eq!(update["params"]["uri"], uri.as_str(), "{kind}");
        client.close().await;
    }
}

/// The next `notifications/resources/updated` a transport announces within `within`.
async fn next_update(
    announcements: &mut tokio::sync::broadcast::Receiver<satellite::mcp::transport::Announcement>,
    within: Duration,
) -> Option<satellite::mcp::transport::Announcement> {
    let update = async {
        loop {
            let note = announcements.recv().await.expect("announcements open");
            if note["method"] == "notifications/resources/updated" {
                return note;
            }
        }
    };
    tokio::time::timeout(within, update).await.ok()
}

/// A handshake-era request that ends unanswered is cancelled upstream, as a direct client would cancel it: on
/// a timeout, and when the caller gives up (its future dropped), the server gets `notifications/cancelled`
/// naming the request, on the session.
#[tokio::test]
async fn abandoned_requests_are_cancelled_upstream() {
    use warp::{Filter, Reply};
    let cancelled = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<(Value, Option<String>)>::new()));
    let seen = cancelled.clone();
    let post = warp::post().and(warp::header::optional::<String>("mcp-session-id")).and(warp::body::json()).map(
        move |session: Option<String>, body: Value| match body["method"].as_str().unwrap_or_default() {
            "initialize" => warp::http::Response::builder()
                .header("content-type", "application/json")
                .header("mcp-session-id", "s-1")
                .body(
                    json!({"jsonrpc": "2.0", "id": body["id"], "result": {
                        "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "never-answers", "version": "1"}}})
                    .to_string(),
                )
                .unwrap()
                .into_response(),
            // A reply stream that stays open and never carries the response.
            "tools/call" => {
                let events = futures::stream::pending::<Result<warp::sse::Event, std::convert::Infallible>>();
                warp::sse::reply(events).into_response()
            }
            // Any other request (the client's `server/discover` probe first) is not known here.
            _ if body.get("id").is_some() => warp::reply::json(&json!({"jsonrpc": "2.0", "id": body["id"],
                "error": {"code": -32601, "message": "Method not found"}}))
            .into_response(),
            method => {
                if method == "notifications/cancelled" {
                    seen.lock().push((body["params"].clone(), session));
                }
                warp::http::Response::builder().status(202).body(String::new()).unwrap().into_response()
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(warp::path("mcp").and(post)).incoming(listener).run());
    let client = connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await;
    assert!(matches!(client.era(), Era::Handshake { .. }));

    let call = Some(json!({"name": "slow", "arguments": {}}));
    let timed_out = client.request("tools/call", call.clone(), Duration::from_millis(300)).await;
    assert!(matches!(timed_out, Err(UpstreamError::Timeout { .. })), "{timed_out:?}");
    let first = wait_until(Duration::from_secs(10), "a cancellation after the timeout", || async {
        cancelled.lock().first().cloned()
    })
    .await;
    assert_eq!(first.1.as_deref(), Some("s-1"), "sent on the session");
    let first_id = first.0["requestId"].as_i64().expect("names the request by its id");

    // The caller gives up: its request future is dropped while the server is still working.
    let given_up = tokio::time::timeout(Duration::from_millis(300), client.request("tools/call", call, CALL)).await;
    assert!(given_up.is_err(), "the request was still running");
    let second = wait_until(Duration::from_secs(10), "a cancellation after the caller gave up", || async {
        cancelled.lock().get(1).cloned()
    })
    .await;
    let second_id = second.0["requestId"].as_i64().expect("names the request by its id");
    assert!(second_id > first_id, "each cancellation names its own request: {first_id} then {second_id}");
    assert_eq!(cancelled.lock().len(), 2, "initialize and answered requests are never cancelled");
}

/// A remote server's answer reaches the satellite's client as the server wrote it, whether it comes as a JSON
/// body or as an event of an SSE reply: a number beyond a double's precision, `1.10`, escapes, spacing and
/// member order are not rewritten (before, each answer was parsed into a tree and written again).
#[tokio::test]
async fn a_remote_answer_is_passed_on_as_the_server_wrote_it() {
    use warp::Filter;
    const RESULT: &str = r#"{ "content": [{"type": "text", "text": "caf\u00e9"}], "z": 1, "big": 123456789012345678901234567890, "exact": 1.10 }"#;
    let post = warp::post().and(warp::body::json()).map(|body: Value| {
        let reply = |content_type: &str, text: String| {
            warp::http::Response::builder()
                .header("content-type", content_type)
                .header("mcp-session-id", "s-1")
                .body(text)
                .unwrap()
        };
        let answer = |result: &str| format!(r#"{{"result": {result}, "jsonrpc": "2.0", "id": {}}}"#, body["id"]);
        match (body["method"].as_str().unwrap_or_default(), body["params"]["name"].as_str()) {
            ("initialize", _) => reply(
                "application/json",
                answer(r#"{"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "verbatim", "version": "1"}}"#),
            ),
            ("tools/call", Some("json")) => reply("application/json", answer(RESULT)),
            ("tools/call", Some("sse")) => reply("text/event-stream", format!("id: e-1\ndata: {}\n\n", answer(RESULT))),
            ("notifications/initialized", _) => warp::http::Response::builder().status(202).body(String::new()).unwrap(),
            _ => warp::http::Response::builder().status(400).body(String::new()).unwrap(),
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(warp::path("mcp").and(post)).incoming(listener).run());

    let client = connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await;
    for reply in ["json", "sse"] {
        let params = json!({"name": reply, "arguments": {}});
        let result = client.request_relayed("tools/call", Some(params), CALL, None).await.expect("answered");
        assert_eq!(serde_json::to_string(&result).unwrap(), RESULT, "{reply}");
        assert_eq!(result.json_len(), RESULT.len(), "{reply}");
    }
}

/// A JSON body may arrive in pieces (here two HTTP chunks), and a piece may end at a `}` inside the object (here
/// the end of the first content item). The fast path must take only a whole response: the answer is the server's
/// text, complete.
/// A raw HTTP/1.1 server on loopback, for answers no well-behaved server library writes: each connection's one
/// request (its head, then the body its length names) goes to `serve` with the path, the body as JSON and the
/// socket to answer on (`connection: close`).
async fn raw_server<F, Fut>(serve: F) -> std::net::SocketAddr
where
    F: Fn(String, Value, tokio::net::TcpStream) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let serve = serve.clone();
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
                let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while raw.len() < head_end + length {
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                let body: Value = serde_json::from_slice(&raw[head_end..head_end + length]).unwrap_or_default();
                serve(path, body, socket).await;
            });
        }
    });
    addr
}

/// The raw server's answers to the handshake: `initialize` answered (handshake era, with a session), a
/// notification accepted, any other request but `tools/call` (`server/discover`) refused. `None` for `tools/call`.
async fn answer_handshake(body: &Value, socket: &mut tokio::net::TcpStream) -> Option<()> {
    use tokio::io::AsyncWriteExt;
    let answer = match body["method"].as_str().unwrap_or_default() {
        "tools/call" => return None,
        "initialize" => {
            let init = json!({"jsonrpc": "2.0", "id": body["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "1"}}})
            .to_string();
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s-1\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{init}",
                init.len()
            )
        }
        _ => {
            let status = if body.get("id").is_some() { "400 Bad Request" } else { "202 Accepted" };
            format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        }
    };
    let _ = socket.write_all(answer.as_bytes()).await;
    Some(())
}

/// A session's GET stream refused for a moment (a proxy's 503 while the server restarts) is asked for again, and
/// what the server announces on it afterwards arrives. Before, any refusal but a success ended the stream for
/// the session's life: list changes and resource updates were lost until the session itself was renewed.
#[tokio::test]
async fn a_server_stream_refused_for_a_moment_is_asked_for_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let gets = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = gets.clone();
    let addr = raw_server(move |_path, body, mut socket| {
        let seen = seen.clone();
        async move {
            if !body.is_null() {
                answer_handshake(&body, &mut socket).await;
                return;
            }
            // The GET stream: refused the first time, then open with one announcement.
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = socket
                    .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                return;
            }
            let note =
                json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "raw://r"}});
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let _ = socket.write_all(format!("{head}{}", chunk(&format!("data: {note}\n\n"))).as_bytes()).await;
            std::future::pending::<()>().await;
        }
    })
    .await;
    let client = connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await;
    let mut announcements = client.transport().announcements();
    let update = next_update(&mut announcements, Duration::from_secs(30))
        .await
        .expect("the announcement on the stream asked for again");
    assert_eq!(update["params"]["uri"], "raw://r");
    assert!(gets.load(Ordering::SeqCst) >= 2);
    client.close().await;
}

/// A server that refuses a session's GET stream for the credentials it was opened with (401, 403) is not asked
/// again with the same ones, while one refusing it for a moment (503) is: by the time the 503 server has been asked
/// twice, the others have been asked once each. (A renewal, with new credentials, opens a new stream.)
#[tokio::test]
async fn a_server_stream_refused_for_its_credentials_is_not_asked_for_again() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let refusing = |status: &'static str| {
        let gets = std::sync::Arc::new(AtomicUsize::new(0));
        let seen = gets.clone();
        let server = raw_server(move |_path, body, mut socket| {
            let seen = seen.clone();
            async move {
                if !body.is_null() {
                    answer_handshake(&body, &mut socket).await;
                    return;
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let refusal = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(refusal.as_bytes()).await;
            }
        });
        async move { (server.await, gets) }
    };
    let (unauthorized, unauthorized_gets) = refusing("401 Unauthorized").await;
    let (forbidden, forbidden_gets) = refusing("403 Forbidden").await;
    let (unavailable, unavailable_gets) = refusing("503 Service Unavailable").await;
    let mut clients = Vec::new();
    for addr in [unauthorized, forbidden, unavailable] {
        clients.push(connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await);
    }
    wait_until(Duration::from_secs(30), "the 503 server asked twice", || {
        let asked = unavailable_gets.load(Ordering::SeqCst);
        async move { (asked >= 2).then_some(()) }
    })
    .await;
    assert_eq!(unauthorized_gets.load(Ordering::SeqCst), 1, "401: asked once");
    assert_eq!(forbidden_gets.load(Ordering::SeqCst), 1, "403: asked once");
    for client in clients {
        client.close().await;
    }
}

/// A server's request during a call (an elicitation, waiting on a person) holds up neither what the server says
/// after it on the same reply stream (progress) nor its cancelling that very request: the satellite reads on while
/// the client is asked, and when the server cancels its request the client is no longer asked and no answer is
/// sent; the cancellation itself, whose id is the server's, is not passed on (a client would take it for one of its
/// own requests). Before, the stream was not read until the client answered or the call timed out.
#[tokio::test]
async fn a_servers_request_during_a_call_holds_up_nothing_after_it() {
    use satellite::mcp::transport::{Inbound, Relay};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;
    let answers = Arc::new(parking_lot::Mutex::new(Vec::<Value>::new()));
    let finish = Arc::new(tokio::sync::Notify::new());
    let (seen, go) = (answers.clone(), finish.clone());
    let addr = raw_server(move |_path, body, mut socket| {
        let (seen, go) = (seen.clone(), go.clone());
        async move {
            if body.get("method").is_none() && body.get("id").is_some() {
                // An answer to the server's own request.
                seen.lock().push(body);
                let _ =
                    socket.write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
                return;
            }
            if answer_handshake(&body, &mut socket).await.is_some() {
                return;
            }
            let event = |value: Value| chunk(&format!("data: {value}\n\n"));
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let ask = json!({"jsonrpc": "2.0", "id": "e1", "method": "elicitation/create",
                "params": {"message": "Which one?", "requestedSchema": {"type": "object", "properties": {}}}});
            let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "t", "progress": 1}});
            let _ = socket.write_all(format!("{head}{}{}", event(ask), event(progress)).as_bytes()).await;
            // The person is slow: the server gives up on its question, then answers the call when told.
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": "e1", "reason": "took too long"}});
            let _ = socket.write_all(event(cancel).as_bytes()).await;
            go.notified().await;
            let result =
                json!({"jsonrpc": "2.0", "id": body["id"], "result": {"content": [{"type": "text", "text": "done"}]}});
            let _ = socket.write_all(format!("{}0\r\n\r\n", event(result)).as_bytes()).await;
        }
    })
    .await;
    let client = Arc::new(connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await);
    let (relay, mut inbound) = Relay::for_client(Arc::new(json!({"elicitation": {}})));
    let calling = client.clone();
    let call = tokio::spawn(async move {
        let params = Some(json!({"name": "ask", "arguments": {}, "_meta": {"progressToken": "t"}}));
        calling.request_relayed("tools/call", params, Duration::from_secs(120), Some(&relay)).await
    });
    let wait = Duration::from_secs(30);
    let first = tokio::time::timeout(wait, inbound.recv()).await.ok().flatten();
    let Some(Inbound::Request { method, reply, .. }) = first else { panic!("the elicitation") };
    assert_eq!(method, "elicitation/create");
    // Unanswered, the progress after it still comes.
    let second = tokio::time::timeout(wait, inbound.recv()).await.ok().flatten();
    let Some(Inbound::Notification { method, .. }) = second else { panic!("the progress") };
    assert_eq!(method, "notifications/progress");
    // The server cancelled its question: the client is no longer asked (what waits for its answer is gone).
    wait_until(Duration::from_secs(30), "the elicitation withdrawn", || {
        let closed = reply.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    finish.notify_one();
    let done = call.await.unwrap().expect("the call's answer");
    assert!(done.to_value().unwrap().to_string().contains("done"));
    while let Ok(extra) = inbound.try_recv() {
        if let Inbound::Notification { method, .. } = extra {
            assert_ne!(method, "notifications/cancelled", "the server's cancellation is not passed on");
        }
    }
    assert!(answers.lock().is_empty(), "no answer to a cancelled request: {:?}", answers.lock());
    drop(reply);
}

fn chunk(text: &str) -> String {
    format!("{:x}\r\n{text}\r\n", text.len())
}

#[tokio::test]
async fn a_json_answer_cut_at_an_inner_brace_is_read_whole() {
    use tokio::io::AsyncWriteExt;
    const HEAD: &str = r#"{"jsonrpc": "2.0", "id": ID, "result": {"content": [{"type": "text", "text": "first"}"#;
    const TAIL: &str = r#", {"type": "text", "text": "second"}], "n": 1.10}}"#;
    let addr = raw_server(|_, body, mut socket| async move {
        if answer_handshake(&body, &mut socket).await.is_some() {
            return;
        }
        let start = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s-1\r\n\
                     connection: close\r\ntransfer-encoding: chunked\r\n\r\n";
        let _ = socket.write_all(start.as_bytes()).await;
        // Each HTTP chunk reaches the reader as a piece of its own, however the TCP segments fall.
        for piece in [HEAD.replace("ID", &body["id"].to_string()), TAIL.to_owned()] {
            let _ = socket.write_all(chunk(&piece).as_bytes()).await;
        }
        let _ = socket.write_all(b"0\r\n\r\n").await;
    })
    .await;

    let client = connect_http(url::Url::parse(&format!("http://{addr}/mcp")).unwrap()).await;
    let result = client.request_relayed("tools/call", Some(json!({"name": "x"})), CALL, None).await.expect("answered");
    let expected = r#"{"content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}], "n": 1.10}"#;
    assert_eq!(serde_json::to_string(&result).unwrap(), expected);
}

/// A server that answers a call with a body that does not end (an error page, a JSON value, one SSE event) is cut
/// off at the bound on one message, with an error that says so, instead of being read into memory until the call
/// times out. Here each body stops growing at 40 MiB and then stalls, so the satellite before the bound read
/// 40 MiB and waited for the call's timeout.
#[tokio::test]
async fn an_answer_that_never_ends_is_cut_off_at_the_message_bound() {
    use tokio::io::AsyncWriteExt;
    let addr = raw_server(|path, body, mut socket| async move {
        if answer_handshake(&body, &mut socket).await.is_some() {
            return;
        }
        let (status, kind, start) = match path.as_str() {
            "/error/mcp" => ("500 Internal Server Error", "text/plain", String::new()),
            "/json/mcp" => {
                ("200 OK", "application/json", format!(r#"{{"jsonrpc":"2.0","id":{},"result":{{"text":""#, body["id"]))
            }
            _ => ("200 OK", "text/event-stream", "data: ".to_owned()),
        };
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\nmcp-session-id: s-1\r\nconnection: close\r\n\
             transfer-encoding: chunked\r\n\r\n{}",
            chunk(&start)
        );
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let piece = chunk(&"x".repeat(64 * 1024));
        for _ in 0..640 {
            if socket.write_all(piece.as_bytes()).await.is_err() {
                return;
            }
        }
        // Stalled, not closed.
        std::future::pending::<()>().await;
    })
    .await;

    for (path, expected) in
        [("/error/mcp", "http status 500"), ("/json/mcp", "longer than"), ("/sse/mcp", "longer than")]
    {
        let client = connect_http(url::Url::parse(&format!("http://{addr}{path}")).unwrap()).await;
        let call = client.request_relayed("tools/call", Some(json!({"name": "x"})), Duration::from_secs(60), None);
        let err = tokio::time::timeout(Duration::from_secs(50), call)
            .await
            .unwrap_or_else(|_| panic!("{path}: still reading when the call's time was nearly up"))
            .expect_err("no answer");
        assert!(!matches!(err, UpstreamError::Timeout { .. }), "{path}: {err}");
        assert!(err.to_string().contains(expected), "{path}: {err}");
    }
}

/// Over the legacy SSE transport too, a result reaches the satellite's caller as the server wrote it.
#[tokio::test]
async fn a_legacy_sse_answer_is_passed_on_as_the_server_wrote_it() {
    use std::sync::Arc;
    use warp::sse::Event;
    use warp::Filter;
    const RESULT: &str = r#"{ "content": [{"type": "text", "text": "caf\u00e9"}], "big": 123456789012345678901234567890, "exact": 1.10 }"#;
    type Stream = tokio::sync::mpsc::UnboundedSender<Event>;
    let stream: Arc<parking_lot::Mutex<Option<Stream>>> = Arc::default();
    let sse = legacy_sse_stream(stream.clone());
    let messages = warp::path("messages").and(warp::post()).and(warp::body::json()).map(move |body: Value| {
        let answer = |result: &str| format!(r#"{{"result": {result}, "jsonrpc": "2.0", "id": {}}}"#, body["id"]);
        let message = match body["method"].as_str().unwrap_or_default() {
            "initialize" => Some(answer(
                r#"{"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "verbatim", "version": "1"}}"#,
            )),
            "tools/call" => Some(answer(RESULT)),
            _ => None,
        };
        if let (Some(message), Some(tx)) = (message, stream.lock().as_ref()) {
            let _ = tx.send(Event::default().event("message").data(message));
        }
        warp::http::StatusCode::ACCEPTED
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(sse.or(messages)).incoming(listener).run());

    let url = url::Url::parse(&format!("http://{addr}/sse")).unwrap();
    let transport = SseTransport::connect("test".into(), reqwest::Client::new(), url, &BTreeMap::new(), CALL, None)
        .await
        .expect("connect");
    let client = McpClient::connect(Transport::Sse(transport), &fast_options()).await.expect("initialize");
    let result = client.request_relayed("tools/call", Some(json!({"name": "x"})), CALL, None).await.expect("answered");
    assert_eq!(serde_json::to_string(&result).unwrap(), RESULT);
    assert_eq!(result.json_len(), RESULT.len());
}

/// A legacy SSE server names its endpoint once. Should it send a second `endpoint` event, the satellite goes on
/// sending everything where the first said: its requests and its answers to the server's own requests alike.
/// (Before, the answers moved and the requests did not, so a server's `ping` was answered somewhere else.)
#[tokio::test]
async fn a_second_legacy_sse_endpoint_event_moves_nothing() {
    use std::sync::Arc;
    use warp::sse::Event;
    use warp::Filter;
    type Stream = tokio::sync::mpsc::UnboundedSender<Event>;
    let stream: Arc<parking_lot::Mutex<Option<Stream>>> = Arc::default();
    let received: Arc<parking_lot::Mutex<Vec<Value>>> = Arc::default();
    let elsewhere: Arc<parking_lot::Mutex<Vec<Value>>> = Arc::default();
    let sse = legacy_sse_stream(stream.clone());
    let (to, kept) = (stream.clone(), received.clone());
    let messages = warp::path("messages").and(warp::post()).and(warp::body::json()).map(move |body: Value| {
        kept.lock().push(body.clone());
        let answer = |result: &str| format!(r#"{{"result": {result}, "jsonrpc": "2.0", "id": {}}}"#, body["id"]);
        let message = match body["method"].as_str().unwrap_or_default() {
            "initialize" => Some(answer(
                r#"{"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "moving", "version": "1"}}"#,
            )),
            "tools/call" => Some(answer(r#"{"content": []}"#)),
            _ => None,
        };
        if let (Some(message), Some(tx)) = (message, to.lock().as_ref()) {
            let _ = tx.send(Event::default().event("message").data(message));
        }
        warp::http::StatusCode::ACCEPTED
    });
    let moved = elsewhere.clone();
    let other = warp::path("elsewhere").and(warp::post()).and(warp::body::json()).map(move |body: Value| {
        moved.lock().push(body);
        warp::http::StatusCode::ACCEPTED
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(sse.or(messages).or(other)).incoming(listener).run());

    let url = url::Url::parse(&format!("http://{addr}/sse")).unwrap();
    let transport = SseTransport::connect("test".into(), reqwest::Client::new(), url, &BTreeMap::new(), CALL, None)
        .await
        .expect("connect");
    let client = McpClient::connect(Transport::Sse(transport), &fast_options()).await.expect("initialize");
    let sent = stream.lock().clone().expect("the stream is open");
    let _ = sent.send(Event::default().event("endpoint").data("/elsewhere?session=2"));
    let _ = sent.send(Event::default().event("message").data(r#"{"jsonrpc":"2.0","id":"s1","method":"ping"}"#));
    client.request_relayed("tools/call", Some(json!({"name": "x"})), CALL, None).await.expect("answered");
    wait_until(Duration::from_secs(20), "the answer to the server's ping", || {
        let answered = received.lock().iter().any(|m| m["id"] == "s1" && m.get("result").is_some());
        let strayed = elsewhere.lock().first().cloned();
        assert!(strayed.is_none(), "sent to the second endpoint: {strayed:?}");
        async move { answered.then_some(()) }
    })
    .await;
    assert!(elsewhere.lock().is_empty(), "nothing goes to the second endpoint: {:?}", elsewhere.lock());
}

/// The `GET /sse` route of a legacy SSE server: its stream starts with the `endpoint` event naming
/// `/messages?session=1`, and what is sent on `stream` (set when a client opens it) follows.
fn legacy_sse_stream(
    stream: std::sync::Arc<parking_lot::Mutex<Option<tokio::sync::mpsc::UnboundedSender<warp::sse::Event>>>>,
) -> impl warp::Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone {
    use futures::StreamExt;
    use warp::{Filter, Reply};
    warp::path("sse").and(warp::get()).map(move || {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(warp::sse::Event::default().event("endpoint").data("/messages?session=1"));
        *stream.lock() = Some(tx);
        let events = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
        warp::sse::reply(events).into_response()
    })
}

/// A loopback listener that only counts the connections made to it (each is closed at once): where a server must
/// not send the satellite.
async fn elsewhere() -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = reached.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(socket);
        }
    });
    (addr, reached)
}

/// The headers of a remote server (here its `X-API-Key`) go to its origin only: a redirect to another origin is
/// not followed (reqwest strips `Authorization` there, but not a custom header), while one within the origin still
/// is. Before, the satellite followed the server anywhere with its key.
#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed() {
    use tokio::io::AsyncWriteExt;
    let (other, reached) = elsewhere().await;
    let addr = raw_server(move |path, body, mut socket| async move {
        let location = match path.as_str() {
            "/mcp" => return answer_handshake(&body, &mut socket).await.unwrap_or(()),
            "/moved/mcp" => "/mcp".to_owned(),
            _ => format!("http://{other}/mcp"),
        };
        let answer = format!("HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n");
        let _ = socket.write_all(answer.as_bytes()).await;
    })
    .await;
    let headers = BTreeMap::from([("X-API-Key".to_owned(), "sk-remote-key".to_owned())]);
    let connect = |path: &str| {
        let url = url::Url::parse(&format!("http://{addr}{path}")).unwrap();
        let http = satellite::instances::remote_http_client().unwrap();
        let transport = StreamableHttpTransport::new("test".into(), http, url, &headers).unwrap();
        async move { McpClient::connect(Transport::StreamableHttp(transport), &fast_options()).await }
    };
    let err = connect("/away/mcp").await.expect_err("not followed");
    assert!(err.to_string().contains("redirected to another origin"), "{err}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was sent to the other origin");
    connect("/moved/mcp").await.expect("a redirect within the origin is followed");
}

/// A legacy SSE server's `endpoint` event must name its own origin: messages carry its headers and every call.
/// Before, the satellite posted them wherever the event pointed.
#[tokio::test]
async fn a_legacy_sse_endpoint_of_another_origin_is_refused() {
    use futures::StreamExt;
    use std::convert::Infallible;
    use warp::sse::Event;
    use warp::Filter;
    let (other, reached) = elsewhere().await;
    let sse = warp::path("sse").and(warp::get()).map(move || {
        let endpoint = Event::default().event("endpoint").data(format!("http://{other}/messages?session=1"));
        let events = futures::stream::iter([Ok::<_, Infallible>(endpoint)]).chain(futures::stream::pending());
        warp::sse::reply(events)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(sse).incoming(listener).run());

    let url = url::Url::parse(&format!("http://{addr}/sse")).unwrap();
    let headers = BTreeMap::from([("X-API-Key".to_owned(), "sk-remote-key".to_owned())]);
    let connected = SseTransport::connect("test".into(), reqwest::Client::new(), url, &headers, CALL, None).await;
    let err = match connected {
        Ok(transport) => {
            let client = McpClient::connect(Transport::Sse(transport), &fast_options()).await;
            panic!("the endpoint was taken (handshake: {:?})", client.err())
        }
        Err(err) => err,
    };
    assert!(err.to_string().contains("another origin"), "{err}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// A connect to a legacy SSE server that is given up before the server's `endpoint` event (the instance removed or
/// replaced meanwhile, or the satellite stopping) takes its reader, and so its stream, with it. Before, the reader
/// read on until the server closed the stream, which may be never: one open connection left per attempt.
#[tokio::test]
async fn a_legacy_sse_connect_given_up_closes_its_stream() {
    use futures::StreamExt;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use warp::sse::Event;
    use warp::Filter;
    /// Set when the server's stream is dropped: its client went away.
    struct Gone(Arc<AtomicBool>);
    impl Drop for Gone {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let gone = Arc::new(AtomicBool::new(false));
    let served = gone.clone();
    let sse = warp::path("sse").and(warp::get()).map(move || {
        let guard = Gone(served.clone());
        // Never an endpoint event; the pings are written so that a client that left is noticed.
        let events = futures::stream::pending::<Result<Event, Infallible>>().map(move |event| {
            let _ = &guard;
            event
        });
        warp::sse::reply(warp::sse::keep_alive().interval(Duration::from_millis(100)).stream(events))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(sse).incoming(listener).run());

    let url = url::Url::parse(&format!("http://{addr}/sse")).unwrap();
    let headers = BTreeMap::new();
    let connect = SseTransport::connect("test".into(), reqwest::Client::new(), url, &headers, CALL, None);
    assert!(tokio::time::timeout(Duration::from_millis(500), connect).await.is_err(), "no endpoint event came");
    wait_until(Duration::from_secs(10), "the server's stream closed", || {
        let closed = gone.load(Ordering::SeqCst);
        async move { closed.then_some(()) }
    })
    .await;
}

/// A server whose error page echoes the request's credentials (a debugging proxy, a framework's error page): the
/// error the satellite keeps (status message, events, request log) shows them masked. A user's OAuth token reaches
/// the transport as its `Authorization` header and is not among the instance's configured secrets, so before it
/// went into the error whole.
#[tokio::test]
async fn an_error_page_echoing_the_credentials_sent_is_kept_masked() {
    use tokio::io::AsyncWriteExt;
    const TOKEN: &str = "ya29.a-users-oauth-token";
    const KEY: &str = "sk-remote-key-0123";
    let addr = raw_server(|_path, body, mut socket| async move {
        if answer_handshake(&body, &mut socket).await.is_some() {
            return;
        }
        let page = format!("<h1>500</h1><pre>authorization: Bearer {TOKEN}\nx-api-key: {KEY}</pre>");
        let answer = format!("HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\r\n{page}", page.len());
        let _ = socket.write_all(answer.as_bytes()).await;
    })
    .await;
    let url = url::Url::parse(&format!("http://{addr}/mcp")).unwrap();
    let headers = BTreeMap::from([
        ("Authorization".to_owned(), format!("Bearer {TOKEN}")),
        ("X-API-Key".to_owned(), KEY.to_owned()),
    ]);
    let transport = StreamableHttpTransport::new("test".into(), reqwest::Client::new(), url, &headers).unwrap();
    let client = McpClient::connect(Transport::StreamableHttp(transport), &fast_options()).await.expect("connect");
    let err = client.request("tools/call", Some(json!({"name": "x", "arguments": {}})), CALL).await.unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("500") && shown.contains("<pre>authorization: "), "the page is still shown: {shown}");
    assert!(!shown.contains(TOKEN) && !shown.contains(KEY), "a credential in the error: {shown}");
}

/// The same for a 4xx whose body is a JSON-RPC error (how 2026-07-28 servers refuse), whose message and data
/// echo the credentials: it reaches the client as a JSON-RPC error, with them masked. Before, its text went on
/// whole.
#[tokio::test]
async fn a_json_rpc_refusal_echoing_the_credentials_sent_is_kept_masked() {
    use tokio::io::AsyncWriteExt;
    const TOKEN: &str = "ya29.a-users-oauth-token";
    let addr = raw_server(|_path, body, mut socket| async move {
        if answer_handshake(&body, &mut socket).await.is_some() {
            return;
        }
        let refusal = json!({"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32602,
            "message": format!("bad request from Bearer {TOKEN}"), "data": {"authorization": format!("Bearer {TOKEN}")}}})
        .to_string();
        let answer =
            format!("HTTP/1.1 422 Unprocessable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{refusal}", refusal.len());
        let _ = socket.write_all(answer.as_bytes()).await;
    })
    .await;
    let url = url::Url::parse(&format!("http://{addr}/mcp")).unwrap();
    let headers = BTreeMap::from([("Authorization".to_owned(), format!("Bearer {TOKEN}"))]);
    let transport = StreamableHttpTransport::new("test".into(), reqwest::Client::new(), url, &headers).unwrap();
    let client = McpClient::connect(Transport::StreamableHttp(transport), &fast_options()).await.expect("connect");
    let err = client.request("tools/call", Some(json!({"name": "x", "arguments": {}})), CALL).await.unwrap_err();
    let UpstreamError::Rpc(refusal) = &err else { panic!("a JSON-RPC error: {err}") };
    assert_eq!(refusal.code, -32602);
    assert!(refusal.message.starts_with("bad request from "), "{}", refusal.message);
    let shown = format!("{} {:?}", refusal.message, refusal.data);
    assert!(!shown.contains(TOKEN), "a credential in the error: {shown}");
}
