//! What a large tool answer costs the satellite in memory on its way from a stdio server to the client: the
//! satellite binary, standalone, with one stdio instance of tests/fixtures/misbehaving_server.py (whose unlisted
//! tool `large` answers a text result of the size asked), called through the instance router
//! (`/i/big/mcp`, a handshake-era session). Request logging is on, as it is by default.
//!
//! Per round: the satellite's RSS once it settled (`base`), then its peak RSS (`VmHWM`, reset before the round
//! through `/proc/<pid>/clear_refs`) while `k` calls of `SIZE_MB` each (15) are answered at once, and the
//! difference per answer, also as a multiple of the answer's size. The first round is the instance's first large
//! answer (what a buffer that grows and stays costs shows there); RSS after each round settles is printed too.
//!
//!     cargo bench --bench large_answer
//!     SATELLITE_BIN=/path/to/other/satellite cargo bench --bench large_answer   # another build, same rounds
//!
//! Needs python3. `ROUNDS` (`1,1,4`): the `k` of each round.

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::process::held;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

const TOKEN: &str = "ds_inst_large_answer_bench_0123456789abcdef";
const MIB: f64 = 1024.0 * 1024.0;

fn satellite_bin() -> PathBuf {
    std::env::var_os("SATELLITE_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_satellite")), PathBuf::from)
}

fn fixture() -> String {
    format!("{}/tests/fixtures/misbehaving_server.py", env!("CARGO_MANIFEST_DIR"))
}

fn config(port: u16) -> String {
    format!(
        "[satellite]\nport = {port}\nhandshake_timeout_seconds = 30\n\
         [[teams]]\nid = \"bench\"\n[[users]]\nid = \"bench\"\nteams = [\"bench\"]\n\
         [[servers]]\nslug = \"big\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [\"{}\", \"verbatim\"]\n\
         [[installations]]\nid = \"i-big\"\nteam = \"bench\"\nserver = \"big\"\n\
         [installations.users.bench]\ninstance_path = \"big\"\ninstance_token_sha256 = \"{}\"\n",
        fixture(),
        satellite::config::sha256_hex(TOKEN)
    )
}

/// The satellite on `port`, its log in `dir`; ready once `/readyz` answers 200.
async fn start(dir: &std::path::Path, port: u16) -> Child {
    let path = dir.join("satellite.toml");
    std::fs::write(&path, config(port)).expect("config");
    let log = std::fs::File::create(dir.join("satellite.log")).expect("log file");
    let child = Command::new(satellite_bin())
        .args(["serve", "--config", path.to_str().expect("utf-8 path")])
        .current_dir(dir)
        .env_remove("SATELLITE_CONFIG")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("satellite starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await.is_ok_and(|r| r.status() == 200) {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the satellite did not become ready");
}

/// POST `body` on the session; the answer's text.
async fn post(client: &reqwest::Client, url: &str, session: Option<&str>, body: &Value) -> (Option<String>, String) {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let answer = request.body(body.to_string()).send().await.expect("answered");
    let session = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (session, answer.text().await.expect("a body"))
}

async fn open_session(client: &reqwest::Client, url: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
        "capabilities": {}, "clientInfo": {"name": "large-answer-bench", "version": "1"}}});
    let (session, _) = post(client, url, None, &init).await;
    let session = session.expect("a session");
    post(client, url, Some(&session), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    session
}

/// One `large` call; the length of the answer's body.
async fn call(client: &reqwest::Client, url: &str, session: &str, id: usize, bytes: usize) -> usize {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "large", "arguments": {"bytes": bytes}}});
    let (_, text) = post(client, url, Some(session), &body).await;
    assert!(text.len() >= bytes / 2 && text.contains("\"result\""), "an answer: {}", &text[..text.len().min(300)]);
    text.len()
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// RSS once two readings a second apart differ by less than 1 MiB, read from 3 s on (mimalloc gives memory back
/// every 2 s, and the request log is written to the database within 3 s).
async fn settled_rss(pid: u32) -> u64 {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut last = held(pid).rss_kib;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = held(pid).rss_kib;
        if now.abs_diff(last) < 1024 {
            return now;
        }
        last = now;
    }
    last
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let size_mb: usize = std::env::var("SIZE_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
    let rounds: Vec<usize> = std::env::var("ROUNDS")
        .unwrap_or_else(|_| "1,1,4".into())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    let bytes = size_mb * 1_000_000;
    let dir = tempfile::tempdir().expect("scratch directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let child = start(dir.path(), port).await;
    let pid = child.id().expect("pid");
    let url = format!("http://127.0.0.1:{port}/i/big/mcp?token={TOKEN}");
    let client = reqwest::Client::new();
    let session = open_session(&client, &url).await;
    call(&client, &url, &session, 1, 1000).await;
    println!(
        "{} MB answers through {} (stdio server, instance router, request logging on)",
        size_mb,
        satellite_bin().display()
    );
    println!(
        "{:<6} {:>10} {:>10} {:>14} {:>16} {:>10} {:>12}",
        "k", "base MiB", "peak MiB", "peak-base MiB", "per answer MiB", "x size", "after MiB"
    );
    for (round, k) in rounds.into_iter().enumerate() {
        let base = settled_rss(pid).await;
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak (clear_refs)");
        let calls = (0..k).map(|i| call(&client, &url, &session, 100 * (round + 1) + i, bytes));
        let lengths = futures::future::join_all(calls).await;
        let peak = status_kib(pid, "VmHWM:").max(base);
        let after = settled_rss(pid).await;
        let per_answer = (peak - base) as f64 * 1024.0 / k as f64;
        println!(
            "{:<6} {:>10.1} {:>10.1} {:>14.1} {:>16.1} {:>10.2} {:>12.1}",
            k,
            base as f64 / 1024.0,
            peak as f64 / 1024.0,
            (peak - base) as f64 / 1024.0,
            per_answer / MIB,
            per_answer / lengths[0] as f64,
            after as f64 / 1024.0,
        );
    }
    drop(child);
}
