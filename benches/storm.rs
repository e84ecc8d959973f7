//! Storm: what strangers without a token can do to a running satellite, and whether a good client is still served.
//!
//! The release binary runs on its embedded default with a descriptor limit (`STORM_NOFILE`, 256 by default: a
//! quarter of what the shipped systemd unit gets before its `LimitNOFILE`). Then:
//! 1. `STORM_REQUESTS` (10,000) malformed requests over raw TCP, 64 at a time, in 14 kinds (not HTTP, bad JSON,
//!    no or wrong token, unknown or 420 KB session ids, a 5 MB body, a JSON nesting bomb, a junk batch, ...):
//!    every one must get an HTTP answer;
//! 2. twice the descriptor limit of connections held open, half of them with half-sent headers, and while they
//!    are held a good client's initialize + tools/list (how long until it is answered);
//! 3. after the storm, what the satellite holds again and a last good request.
//!
//! Prints counts, not verdicts: answers by status, connections the satellite closed, seconds to the good answer,
//! RSS and descriptors before and after. Run with `cargo bench --bench storm`.

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{raise_own_nofile, serve, settled, USER_TOKEN};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn request(method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// The malformed request of kind `kind % KINDS`, and its name.
fn malformed(kind: usize) -> (&'static str, Vec<u8>) {
    let auth = ("Authorization", format!("Bearer {USER_TOKEN}"));
    let json_type = ("Content-Type", "application/json".to_owned());
    let accept = ("Accept", "application/json, text/event-stream".to_owned());
    let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_vec();
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"storm","version":"1"}}}"#.to_vec();
    match kind % KINDS {
        0 => ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n".to_vec()),
        1 => ("bad JSON", request("POST", "/mcp", &[auth, json_type, accept], br#"{"jsonrpc":"2.0","id":"#)),
        2 => ("no token", request("POST", "/mcp", &[json_type, accept], &init)),
        3 => (
            "wrong token",
            request("POST", "/mcp", &[("Authorization", "Bearer nope".into()), json_type, accept], &init),
        ),
        4 => {
            let session = ("Mcp-Session-Id", format!("unknown-{kind}"));
            ("unknown session", request("POST", "/mcp", &[auth, json_type, accept, session], &list))
        }
        5 => {
            let session = ("Mcp-Session-Id", "s".repeat(420 * 1024));
            ("420 KB session id", request("POST", "/mcp", &[auth, json_type, accept, session], &list))
        }
        6 => ("5 MB body", request("POST", "/mcp", &[auth, json_type, accept], &vec![b' '; 5 * 1024 * 1024])),
        7 => {
            ("text/plain body", request("POST", "/mcp", &[auth, ("Content-Type", "text/plain".into()), accept], &list))
        }
        8 => ("nesting bomb", request("POST", "/mcp", &[auth, json_type, accept], &vec![b'['; 100_000])),
        9 => {
            let junk = serde_json::to_vec(&(0..1000).collect::<Vec<_>>()).unwrap_or_default();
            ("junk batch", request("POST", "/mcp", &[auth, json_type, accept], &junk))
        }
        10 => ("PATCH /mcp", request("PATCH", "/mcp", &[auth], b"")),
        11 => ("unknown instance path", request("POST", "/i/nope/mcp", &[json_type, accept], &list)),
        12 => ("legacy /message, no token", request("POST", "/message?session=guess", &[json_type], &list)),
        _ => {
            let many: Vec<(&str, String)> = (0..1000).map(|_| ("X-Flood", "y".repeat(64))).collect();
            ("1,000 headers", request("POST", "/mcp", &many, &list))
        }
    }
}

const KINDS: usize = 14;

/// The status of the answer to `bytes`, `"closed"` when the connection ended without one, or `"timeout"`.
async fn send(addr: &str, bytes: &[u8]) -> String {
    let Ok(mut stream) = TcpStream::connect(addr).await else { return "connect failed".into() };
    // A server may answer and close before reading everything (a 413 or 431): that is an answer.
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    if read.is_err() {
        return "timeout".into();
    }
    let text = String::from_utf8_lossy(&answer);
    match text.strip_prefix("HTTP/1.1 ").and_then(|rest| rest.get(..3)) {
        Some(code) => code.to_owned(),
        None => "closed".into(),
    }
}

/// A good client's initialize + tools/list on a fresh connection; true when both are answered well.
async fn good_request(base: &str) -> bool {
    let Ok(client) = reqwest::Client::builder().timeout(Duration::from_secs(20)).pool_max_idle_per_host(0).build()
    else {
        return false;
    };
    let post = |body: Value, session: Option<String>| {
        let mut request = client
            .post(format!("{base}/mcp"))
            .bearer_auth(USER_TOKEN)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("Mcp-Session-Id", session);
        }
        request.send()
    };
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"good","version":"1"}}});
    let Ok(answer) = post(init, None).await else { return false };
    let Some(session) = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return false;
    };
    let list = json!({"jsonrpc":"2.0","id":2,"method":"tools/list"});
    match post(list, Some(session)).await {
        Ok(answer) if answer.status().is_success() => {
            answer.text().await.map(|t| t.contains("discover_mcp_tools")).unwrap_or(false)
        }
        _ => false,
    }
}

async fn storm(addr: &str, total: usize) -> BTreeMap<(&'static str, String), usize> {
    let gate = Arc::new(Semaphore::new(64));
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let permit = gate.clone().acquire_owned().await;
        let addr = addr.to_owned();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let (name, bytes) = malformed(i);
            (name, send(&addr, &bytes).await)
        }));
    }
    let mut counts = BTreeMap::new();
    for task in tasks {
        if let Ok(key) = task.await {
            *counts.entry(key).or_insert(0) += 1;
        }
    }
    counts
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let nofile = env_number("STORM_NOFILE", 256);
        let total = env_number("STORM_REQUESTS", 10_000) as usize;
        let own = raise_own_nofile();
        println!("storm: satellite descriptor limit {nofile}, this load generator's {own}");
        let served = serve(nofile, &[]).await;
        let addr = served.base.trim_start_matches("http://").to_owned();
        let before = settled(served.pid).await;
        println!("before                         {before}");

        // 1. Malformed requests.
        let started = Instant::now();
        let counts = storm(&addr, total).await;
        let seconds = started.elapsed().as_secs_f64();
        println!("\n{total} malformed requests in {seconds:.1} s ({:.0}/s), answers by kind:", total as f64 / seconds);
        let mut unanswered = 0;
        for ((kind, outcome), n) in &counts {
            println!("  {kind:<28} {outcome:<16} {n:>6}");
            if outcome.parse::<u16>().is_err() {
                unanswered += n;
            }
        }
        println!("  unanswered (closed, timeout, connect failed): {unanswered}");
        println!("after malformed requests       {}", settled(served.pid).await);

        // 2. Held connections past the descriptor limit, half of them half-sent.
        let hold = (nofile * 2) as usize;
        let mut held_streams = Vec::with_capacity(hold);
        let mut refused = 0;
        for i in 0..hold {
            match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&addr)).await {
                Ok(Ok(mut stream)) => {
                    if i % 2 == 0 {
                        let _ = stream.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le").await;
                    }
                    held_streams.push(stream);
                }
                _ => refused += 1,
            }
        }
        println!("\nheld {} connections ({} half-sent), {refused} not connected", held_streams.len(), hold / 2);
        let during = Instant::now();
        let mut good = false;
        while !good && during.elapsed() < Duration::from_secs(60) {
            good = good_request(&served.base).await;
        }
        println!(
            "good client while they are held: {} after {:.2} s",
            if good { "answered" } else { "NOT answered" },
            during.elapsed().as_secs_f64()
        );
        // Which of the held connections the satellite closes by itself (header and idle timeouts, the cap).
        let waited = Instant::now();
        let mut closed = 0;
        for stream in &mut held_streams {
            let left = Duration::from_secs(20).saturating_sub(waited.elapsed());
            let mut buf = [0u8; 512];
            if let Ok(Ok(_)) = tokio::time::timeout(left, stream.read(&mut buf)).await {
                closed += 1;
            }
        }
        println!(
            "held connections the satellite closed within {:.0} s: {closed} of {}",
            waited.elapsed().as_secs_f64(),
            held_streams.len()
        );
        println!("warn lines about the connection cap: {}", served.log_lines("warn", "connection"));
        drop(held_streams);

        // 3. Afterwards.
        let after = settled(served.pid).await;
        let last = good_request(&served.base).await;
        println!("\nafter                          {after}");
        println!("good request after the storm: {}", if last { "answered" } else { "NOT answered" });
        println!(
            "descriptors after/before: {:.2}, RSS after/before: {:.2}",
            after.fds as f64 / before.fds.max(1) as f64,
            after.rss_kib as f64 / before.rss_kib.max(1) as f64
        );
    });
}
