//! What governance costs a call (issue 76 item 6): `execute_mcp_tool demo:echo` through one satellite for three
//! users of one team, in one run, interleaved: `open` (no rule names them), `ruled` (access rules that allow the
//! tool, and a rate limit no call reaches) and `quota` (the same, plus a daily quota no call reaches: one database
//! statement per call). Prints each row and its ratios against `open`.
//! Run with `cargo bench --bench governance`.

#[path = "common/mod.rs"]
mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{header, measure, row, Figures};
use satellite::app::Satellite;
use satellite::config::{env, sha256_hex, Config, Flags};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const USERS: [&str; 3] = ["open", "ruled", "quota"];

fn token(user: &str) -> String {
    format!("governance-bench-{user}-0123456789abcdef")
}

fn config(demo: &str) -> String {
    let mut config = format!(
        "[[teams]]\nid = \"bench\"\n[[servers]]\nslug = \"demo\"\ntransport = \"http\"\nurl = \"{demo}/mcp\"\n\
         [[installations]]\nid = \"demo\"\nteam = \"bench\"\nserver = \"demo\"\n"
    );
    for user in USERS {
        config += &format!(
            "[[users]]\nid = \"{user}\"\nteams = [\"bench\"]\ntoken_sha256 = [\"{}\"]\n",
            sha256_hex(&token(user))
        );
    }
    for user in ["ruled", "quota"] {
        config += &format!(
            "[[access]]\nuser = \"{user}\"\nallow = [\"demo:*\"]\ndeny = [\"demo:exit_*\", \"other:*\"]\n\
             [[limits]]\nname = \"{user}-rate\"\nuser = \"{user}\"\ntools = [\"demo:*\"]\n\
             rate = {{ calls = 1000000, per_seconds = 1, burst = 1000000 }}\n"
        );
    }
    config + "[[limits]]\nname = \"quota-day\"\nuser = \"quota\"\nquota = { calls = 1000000000, per = \"day\" }\n"
}

struct Session {
    client: reqwest::Client,
    url: String,
    token: String,
    session: String,
}

impl Session {
    async fn open(client: &reqwest::Client, url: &str, user: &str) -> Session {
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}});
        let response = client
            .post(url)
            .bearer_auth(token(user))
            .header("accept", "application/json, text/event-stream")
            .json(&init)
            .send()
            .await
            .expect("initialize");
        let session =
            response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).expect("a session").to_owned();
        Session { client: client.clone(), url: url.to_owned(), token: token(user), session }
    }

    async fn echo(&self, i: usize) {
        let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":{"text":format!("c{i}")}}}});
        let response = self
            .client
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .json(&body)
            .send()
            .await
            .expect("call");
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        // JSON, or an SSE stream whose last message is the answer.
        let answer = text.lines().filter_map(|l| l.strip_prefix("data:")).next_back().unwrap_or(&text);
        let reply: Value = serde_json::from_str(answer.trim()).unwrap_or(Value::Null);
        assert!(reply["result"]["content"].is_array(), "{status}: {text}");
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut demo = Command::new(env!("CARGO_BIN_EXE_satellite"))
            .args(["demo-server", "--http", "127.0.0.1:0", "--protocol", "legacy"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn demo server");
        let line =
            BufReader::new(demo.stdout.take().expect("stdout")).lines().next_line().await.expect("read").expect("line");
        let demo_base = line.split_whitespace().find(|w| w.starts_with("http://")).expect("address").to_owned();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench.toml");
        std::fs::write(&path, config(&demo_base)).expect("config");
        let process_env = env::from_process();
        let flags = Flags { config: Some(path), port: Some(0), host: None, data_dir: Some(dir.path().join("data")) };
        let config = Config::load(&process_env, &flags).expect("config");
        let satellite = Satellite::start(config, &process_env).await.expect("start");
        let _ = satellite.manager().ready().wait_for(|r| *r).await;
        let url = format!("http://{}/mcp", satellite.local_addr());
        let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
        println!("governance, release build: execute_mcp_tool demo:echo (HTTP demo server), one satellite, SQLite");
        header();
        for concurrency in [1usize, 16] {
            // Three rounds, the users interleaved, so a drift of the host's speed falls on all three alike.
            let mut best: Vec<Option<Figures>> = vec![None, None, None];
            for _round in 0..3 {
                for (at, user) in USERS.iter().enumerate() {
                    let session = Arc::new(Session::open(&client, &url, user).await);
                    let figures = measure(200, 3_000, concurrency, move |i| {
                        let session = session.clone();
                        async move { session.echo(i).await }
                    })
                    .await;
                    if best[at].as_ref().is_none_or(|b| figures.p50_us < b.p50_us) {
                        best[at] = Some(figures);
                    }
                }
            }
            let open = best[0].take().expect("measured");
            row("no rule (open)", concurrency, &open);
            for (at, label) in [(1, "access rules + a rate (ruled)"), (2, "... + a daily quota (quota)")] {
                let figures = best[at].take().expect("measured");
                row(label, concurrency, &figures);
                println!(
                    "{:<40} {concurrency:>4} p50 {:.2}x, req/s {:.2}x of open",
                    "  against open",
                    figures.p50_us / open.p50_us,
                    figures.per_sec / open.per_sec
                );
            }
        }
        tokio::time::timeout(Duration::from_secs(30), satellite.shutdown()).await.ok();
    });
}
