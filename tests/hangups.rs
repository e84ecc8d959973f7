//! Issue 73, item 8: clients that stop reading. A client that asks for a large answer and then reads nothing is cut
//! once a write has waited the write timeout (`SATELLITE_WRITE_TIMEOUT_SECONDS`, here 1 s), so it holds neither the
//! answer nor its connection for ever; other clients are served meanwhile.

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::common::*;

const MEMBER: &str = "hangups-member-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(60);

fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    format!(
        "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n\
         [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n\
         [[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
         [[installations]]\nid = \"demo-t\"\nteam = \"t\"\nserver = \"demo\"\n",
        satellite::config::sha256_hex(MEMBER),
    )
}

#[tokio::test]
async fn a_client_that_stops_reading_a_large_answer_is_cut() {
    let sat = TestSatellite::start_with(tempfile::tempdir().expect("dir"), &config(), |config| {
        config.write_timeout = Duration::from_secs(1);
    })
    .await;
    let member = Caller::connect(&sat, "/mcp", Some(MEMBER)).await;
    wait_until(DEADLINE, "the demo server callable", || async {
        let reply = member.execute("demo:echo", json!({"text": "up"})).await;
        (reply["result"]["content"][0]["text"] == "up").then_some(())
    })
    .await;

    // Nearly 4 MB echoed back as one JSON answer: far more than an unread socket takes.
    let text = "x".repeat(3_900_000);
    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
        "params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":{"text": text}}}})
    .to_string();
    let addr = sat.base_url().trim_start_matches("http://").to_owned();
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let session = member.session.clone().expect("a session");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         authorization: Bearer {MEMBER}\r\nmcp-session-id: {session}\r\nmcp-protocol-version: 2025-06-18\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stalled.write_all(head.as_bytes()).await.expect("head");
    stalled.write_all(body.as_bytes()).await.expect("body");
    // The answer is never read. Once the satellite has cut the connection, what the client sends next fails.
    wait_until(DEADLINE, "the satellite cut the client that stopped reading", || {
        let sent = stalled.try_write(b"GET /healthz HTTP/1.1\r\n\r\n");
        async move { matches!(sent, Err(ref err) if err.kind() != std::io::ErrorKind::WouldBlock).then_some(()) }
    })
    .await;
    // Others were served all along.
    let reply = member.execute("demo:echo", json!({"text": "still here"})).await;
    assert_eq!(reply["result"]["content"][0]["text"], "still here");
    assert!(sat.satellite.shutdown().await);
}

/// A client that hangs up in the middle of a call (handshake era, its answer due on the POST) has the call
/// cancelled upstream, and the instance's call slot is free again at once: the answer has nowhere to go, since a
/// request's answer is not resumed on another stream. Before, the slot stayed held until the tool ended.
#[tokio::test]
async fn a_client_that_hangs_up_mid_call_frees_its_slot() {
    let sat = TestSatellite::start_with(tempfile::tempdir().expect("dir"), &config(), |config| {
        config.upstream.lifecycle.max_calls_per_instance = 1;
    })
    .await;
    let member = Caller::connect(&sat, "/mcp", Some(MEMBER)).await;
    wait_until(DEADLINE, "the demo server callable", || async {
        let reply = member.execute("demo:echo", json!({"text": "up"})).await;
        (reply["result"]["content"][0]["text"] == "up").then_some(())
    })
    .await;
    let instance =
        sat.satellite.manager().instances().into_iter().find(|i| i.spec().server_slug == "demo").expect("demo");
    // A minute-long call, given up on by its client once it is running.
    let session = member.session.clone().expect("a session");
    let call = json!({"jsonrpc":"2.0","id":9,"method":"tools/call",
        "params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:slow","arguments":{"ms": 60_000}}}});
    let request = reqwest::Client::new()
        .post(format!("{}/mcp", sat.base_url()))
        .bearer_auth(MEMBER)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-06-18")
        .header("accept", "application/json, text/event-stream")
        .json(&call)
        .send();
    let hung_up = tokio::spawn(request);
    wait_until(DEADLINE, "the long call running", || {
        let busy = instance.in_flight() == 1;
        async move { busy.then_some(()) }
    })
    .await;
    hung_up.abort();
    let _ = hung_up.await;
    // Well inside the minute the call would take.
    wait_until(Duration::from_secs(20), "the slot free again", || {
        let free = instance.in_flight() == 0;
        async move { free.then_some(()) }
    })
    .await;
    let reply = member.execute("demo:echo", json!({"text": "next"})).await;
    assert_eq!(reply["result"]["content"][0]["text"], "next", "the one slot serves the next call: {reply}");
    assert!(sat.satellite.shutdown().await);
}
