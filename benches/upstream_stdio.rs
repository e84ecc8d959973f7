//! `tools/call` through the satellite's stdio upstream client against a bare
//! pipe to the same demo server, in one run: calls/s, p50 and p99 at
//! concurrency 1 and 32. Run with `cargo bench --bench upstream_stdio`.
//!
//! The bare pipe is the least a client must do (write a line, read lines,
//! match ids), so the difference is what the satellite's client adds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[path = "common/mod.rs"]
mod common;
use common::measure;
use common::pipe::BarePipe;

use satellite::mcp::client::{ClientOptions, McpClient};
use satellite::mcp::transport::{ResourceLimits, StdioLaunch, StdioTransport, Transport};
use serde_json::{json, Value};

const WARMUP: usize = 500;

fn demo_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_satellite"))
}

fn echo_params(i: usize) -> Value {
    json!({"name": "echo", "arguments": {"text": format!("call {i}")}})
}

async fn satellite_client() -> McpClient {
    let launch = StdioLaunch {
        label: "bench".into(),
        command: demo_exe().to_string_lossy().into_owned(),
        args: vec!["demo-server".into(), "--protocol".into(), "legacy".into()],
        env: std::env::vars().collect(),
        cwd: None,
        close_grace: Duration::from_secs(1),
        stderr: Default::default(),
        stderr_sink: None,
        junk: Default::default(),
        junk_lines: None,
        limits: ResourceLimits::default(),
        secrets: Vec::new(),
        asker: None,
    };
    let transport = Transport::Stdio(StdioTransport::spawn(launch).expect("spawn"));
    McpClient::connect(transport, &ClientOptions::default()).await.expect("connect")
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        println!("tools/call echo to the demo server over stdio (release build, {} cores)", num_cpus());
        println!(
            "{:<12} {:<22} {:>10} {:>10} {:>10} {:>14}",
            "concurrency", "client", "calls/s", "p50 us", "p99 us", "vs bare pipe"
        );
        for (concurrency, calls) in [(1usize, 5_000usize), (32, 32_000)] {
            let bare = Arc::new(BarePipe::start_demo().await);
            let b = bare.clone();
            let base = measure(WARMUP, calls, concurrency, move |i| {
                let b = b.clone();
                async move {
                    b.call("tools/call", echo_params(i)).await;
                }
            })
            .await;
            let client = Arc::new(satellite_client().await);
            let c = client.clone();
            let ours = measure(WARMUP, calls, concurrency, move |i| {
                let c = c.clone();
                async move {
                    c.request("tools/call", Some(echo_params(i)), Duration::from_secs(30)).await.expect("call");
                }
            })
            .await;
            client.close().await;
            for (name, f) in [("bare pipe", &base), ("satellite stdio client", &ours)] {
                println!(
                    "{:<12} {:<22} {:>10.0} {:>10.1} {:>10.1} {:>13.2}x",
                    concurrency,
                    name,
                    f.per_sec,
                    f.p50_us,
                    f.p99_us,
                    f.per_sec / base.per_sec
                );
            }
            println!(
                "{:<12} added latency p50 {:+.1} us, p99 {:+.1} us",
                concurrency,
                ours.p50_us - base.p50_us,
                ours.p99_us - base.p99_us
            );
        }
        reference_upstreams().await;
    });
}

/// The demo server as a reference upstream (issue 19): its calls per second over the same bare pipe as a Node
/// SDK server's (`@modelcontextprotocol/server-everything`, installed by `scripts/test.sh` in tests/node), in
/// the same run. Skipped with a note when the Node server is not installed.
async fn reference_upstreams() {
    let node = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node/node_modules/.bin/mcp-server-everything");
    if !node.exists() {
        println!("(the Node reference row needs tests/node installed: npm ci --prefix tests/node)");
        return;
    }
    println!();
    println!("echo over a bare pipe: the demo server against a Node SDK server (server-everything)");
    println!(
        "{:<12} {:<22} {:>10} {:>10} {:>10} {:>14}",
        "concurrency", "server", "calls/s", "p50 us", "p99 us", "vs Node"
    );
    for (concurrency, calls) in [(1usize, 5_000usize), (32, 32_000)] {
        let pipe = Arc::new(BarePipe::start_command(&node, &["stdio"]).await);
        let p = pipe.clone();
        let nodejs = measure(WARMUP, calls, concurrency, move |i| {
            let p = p.clone();
            async move {
                p.call("tools/call", json!({"name": "echo", "arguments": {"message": format!("call {i}")}})).await;
            }
        })
        .await;
        let pipe = Arc::new(BarePipe::start_demo().await);
        let p = pipe.clone();
        let demo = measure(WARMUP, calls, concurrency, move |i| {
            let p = p.clone();
            async move {
                p.call("tools/call", echo_params(i)).await;
            }
        })
        .await;
        for (name, f) in [("node server-everything", &nodejs), ("satellite demo-server", &demo)] {
            println!(
                "{:<12} {:<22} {:>10.0} {:>10.1} {:>10.1} {:>13.2}x",
                concurrency,
                name,
                f.per_sec,
                f.p50_us,
                f.p99_us,
                f.per_sec / nodejs.per_sec
            );
        }
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
