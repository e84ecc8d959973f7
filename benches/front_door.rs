//! Load generator for the client-facing endpoint, printing req/s, p50 and p99:
//! initialize + tools/list; discover_mcp_tools over the 4,500-tool corpus;
//! execute_mcp_tool to the demo server; and the same call straight to the demo
//! server, so the latency the satellite adds is a difference taken in one run.
//! Run with `cargo bench --bench front_door` (needs ../shared/data/toolsearch).

#[path = "common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{header, measure, row};
use satellite::app::Satellite;
use satellite::config::{env, sha256_hex, Config, Flags};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TOKEN: &str = "bench-token-0123456789abcdef";

async fn demo_http(extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_satellite"))
        .args(["demo-server", "--http", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn demo server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = lines.next_line().await.expect("read").expect("line");
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).expect("address").to_owned();
    (child, base)
}

struct Http {
    client: reqwest::Client,
    url: String,
    token: Option<&'static str>,
    session: Option<String>,
}

impl Http {
    async fn post(&self, body: &Value) -> Value {
        let mut request =
            self.client.post(&self.url).header("accept", "application/json, text/event-stream").json(body);
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let response = request.send().await.expect("send");
        response.json().await.unwrap_or(Value::Null)
    }

    async fn initialize(&mut self) {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}});
        let mut request =
            self.client.post(&self.url).header("accept", "application/json, text/event-stream").json(&body);
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("initialize");
        self.session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    }
}

fn queries() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/toolsearch/dev.jsonl");
    let text = std::fs::read_to_string(path).expect("dev.jsonl");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()?.get("query")?.as_str().map(str::to_owned))
        .collect()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/toolsearch/corpus.jsonl");
        let (_corpus_child, corpus_base) = demo_http(&["--corpus", corpus.to_str().expect("path")]).await;
        let (_demo_child, demo_base) = demo_http(&["--protocol", "legacy"]).await;
        let corpus_text = std::fs::read_to_string(&corpus).expect("corpus");
        let mut slugs: Vec<String> = Vec::new();
        for line in corpus_text.lines() {
            if let Some(slug) = serde_json::from_str::<Value>(line).ok().and_then(|v| v["server"].as_str().map(str::to_owned)) {
                if !slugs.contains(&slug) {
                    slugs.push(slug);
                }
            }
        }
        let mut config = format!(
            "[satellite]\nreconcile_concurrency = 16\n[[teams]]\nid = \"bench\"\n[[users]]\nid = \"bench\"\nteams = [\"bench\"]\ntoken_sha256 = [\"{}\"]\n\
             [[servers]]\nslug = \"demo\"\ntransport = \"http\"\nurl = \"{demo_base}/mcp\"\n[[installations]]\nid = \"demo\"\nteam = \"bench\"\nserver = \"demo\"\n",
            sha256_hex(TOKEN)
        );
        for (i, slug) in slugs.iter().enumerate() {
            config += &format!(
                "[[servers]]\nslug = \"{slug}\"\ntransport = \"http\"\nurl = \"{corpus_base}/servers/{slug}/mcp\"\n[[installations]]\nid = \"c{i}\"\nteam = \"bench\"\nserver = \"{slug}\"\n"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench.toml");
        std::fs::write(&path, config).expect("config");
        let process_env = env::from_process();
        let flags = Flags { config: Some(path), port: Some(0), host: None, data_dir: Some(dir.path().join("data")) };
        let satellite = Satellite::start(Config::load(&process_env, &flags).expect("config"), &process_env).await.expect("start");
        let mut ready = satellite.manager().ready();
        let _ = ready.wait_for(|r| *r).await;
        let tools: usize = satellite.manager().instances().iter().filter_map(|i| i.catalog()).map(|c| c.tools.len()).sum();
        let base = format!("http://{}", satellite.local_addr());
        println!("front door, release build: {tools} tools on {} instances for one user", satellite.manager().instances().len());
        header();

        let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
        for concurrency in [1usize, 16] {
            let http = Arc::new(Http { client: client.clone(), url: format!("{base}/mcp"), token: Some(TOKEN), session: None });
            let init_list = measure(50, 2_000, concurrency, move |_| {
                let http = http.clone();
                async move {
                    let mut fresh = Http { client: http.client.clone(), url: http.url.clone(), token: http.token, session: None };
                    fresh.initialize().await;
                    fresh.post(&json!({"jsonrpc":"2.0","id":1,"method":"tools/list"})).await;
                }
            })
            .await;
            row("initialize + tools/list", concurrency, &init_list);
        }

        let queries = Arc::new(queries());
        for concurrency in [1usize, 16] {
            let mut http = Http { client: client.clone(), url: format!("{base}/mcp"), token: Some(TOKEN), session: None };
            http.initialize().await;
            let http = Arc::new(http);
            let queries = queries.clone();
            let discover = measure(150, 3_000, concurrency, move |i| {
                let http = http.clone();
                let query = queries[i % queries.len()].clone();
                async move {
                    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"discover_mcp_tools","arguments":{"query":query}}});
                    let reply = http.post(&body).await;
                    assert!(reply.get("result").is_some(), "{reply}");
                }
            })
            .await;
            row(&format!("discover_mcp_tools ({tools} tools)"), concurrency, &discover);
        }

        for concurrency in [1usize, 16] {
            let mut direct = Http { client: client.clone(), url: format!("{demo_base}/mcp"), token: None, session: None };
            direct.initialize().await;
            let direct = Arc::new(direct);
            let straight = measure(200, 4_000, concurrency, move |i| {
                let direct = direct.clone();
                async move {
                    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":format!("c{i}")}}});
                    direct.post(&body).await;
                }
            })
            .await;
            let mut via = Http { client: client.clone(), url: format!("{base}/mcp"), token: Some(TOKEN), session: None };
            via.initialize().await;
            let via = Arc::new(via);
            let through = measure(200, 4_000, concurrency, move |i| {
                let via = via.clone();
                async move {
                    let body = json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":{"text":format!("c{i}")}}}});
                    let reply = via.post(&body).await;
                    assert!(reply.get("result").is_some(), "{reply}");
                }
            })
            .await;
            row("echo straight to the demo server", concurrency, &straight);
            row("execute_mcp_tool demo:echo via satellite", concurrency, &through);
            println!(
                "{:<40} {concurrency:>4} added p50 {:+.1} us, p99 {:+.1} us",
                "  satellite overhead",
                through.p50_us - straight.p50_us,
                through.p99_us - straight.p99_us
            );
        }
        tokio::time::timeout(Duration::from_secs(30), satellite.shutdown()).await.ok();
    });
}
