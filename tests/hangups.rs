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
