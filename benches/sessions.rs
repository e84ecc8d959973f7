//! Sessions: `SOAK_SESSIONS` (1,000) MCP sessions at once for `SOAK_SECONDS` (60 s) against the release binary on
//! its embedded default, half on the 2025 handshake (initialize, `Mcp-Session-Id`) and half on 2026-07-28
//! (stateless, `_meta` envelope, no session), each cycling through all four meta-tools and `tools/list` on `/mcp`
//! and a direct call through the instance router (`/i/demo/mcp`).
//!
//! Prints per operation: calls, errors, p50 and p99; and RSS, descriptors, threads and children of the satellite
//! before, at the end of the load, and after it settles. Run with `cargo bench --bench sessions`.

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::{held, raise_own_nofile, serve, settled, INSTANCE_TOKEN, USER_TOKEN};
use parking_lot::Mutex;
use serde_json::{json, Value};

const MODERN: &str = "2026-07-28";
const OPS: [&str; 6] = [
    "tools/list",
    "discover_mcp_tools",
    "execute_mcp_tool",
    "list_mcp_resources",
    "read_mcp_resource",
    "instance router tools/call",
];

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Tally {
    latencies: BTreeMap<&'static str, Vec<Duration>>,
    errors: BTreeMap<(&'static str, String), usize>,
}

/// One client's view of one endpoint: the era it speaks and, on the handshake era, its session.
struct Endpoint {
    url: String,
    token: &'static str,
    modern: bool,
    session: Option<String>,
}

impl Endpoint {
    async fn open(client: &reqwest::Client, url: String, token: &'static str, modern: bool) -> Result<Self, String> {
        let mut endpoint = Endpoint { url, token, modern, session: None };
        if !modern {
            let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"soak","version":"1"}}});
            let answer = endpoint.post(client, &init).await?;
            endpoint.session = answer.0;
            if endpoint.session.is_none() {
                return Err("initialize gave no session".into());
            }
            endpoint.post(client, &json!({"jsonrpc":"2.0","method":"notifications/initialized"})).await?;
        }
        Ok(endpoint)
    }

    async fn post(&self, client: &reqwest::Client, body: &Value) -> Result<(Option<String>, Value), String> {
        let mut body = body.clone();
        let mut request =
            client.post(&self.url).bearer_auth(self.token).header("Accept", "application/json, text/event-stream");
        if self.modern {
            request = request.header("MCP-Protocol-Version", MODERN);
            if body.get("method").and_then(Value::as_str).is_some_and(|m| !m.starts_with("notifications/")) {
                if let Some(params) =
                    body.as_object_mut().and_then(|b| b.entry("params").or_insert_with(|| json!({})).as_object_mut())
                {
                    params.insert(
                        "_meta".into(),
                        json!({"io.modelcontextprotocol/protocolVersion": MODERN,
                               "io.modelcontextprotocol/clientCapabilities": {},
                               "io.modelcontextprotocol/clientInfo": {"name": "soak", "version": "1"}}),
                    );
                }
            }
        }
        if let Some(session) = &self.session {
            request = request.header("Mcp-Session-Id", session);
        }
        let answer = request.json(&body).send().await.map_err(|e| format!("transport: {}", kind_of(&e)))?;
        let status = answer.status();
        let session = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        if status == reqwest::StatusCode::ACCEPTED {
            return Ok((session, Value::Null));
        }
        let text = answer.text().await.map_err(|e| format!("body: {}", kind_of(&e)))?;
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        // A JSON body, or an SSE body whose last data line is the answer.
        let value = serde_json::from_str::<Value>(&text).ok().or_else(|| {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str(d.trim()).ok())
                .next_back()
        });
        let value = value.ok_or_else(|| "unparseable answer".to_owned())?;
        if let Some(error) = value.get("error") {
            return Err(format!("JSON-RPC {}", error["code"]));
        }
        if value.pointer("/result/isError") == Some(&Value::Bool(true)) {
            return Err("tool error".into());
        }
        Ok((session, value))
    }
}

fn kind_of(err: &reqwest::Error) -> &'static str {
    if err.is_timeout() {
        "timeout"
    } else if err.is_connect() {
        "connect"
    } else {
        "other"
    }
}

fn body_for(op: usize, id: u64) -> Value {
    let call = |name: &str, arguments: Value| json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}});
    match op {
        0 => json!({"jsonrpc":"2.0","id":id,"method":"tools/list"}),
        1 => call("discover_mcp_tools", json!({"query": "echo text"})),
        2 => call("execute_mcp_tool", json!({"tool_path": "demo:echo", "arguments": {"text": format!("m{id}")}})),
        3 => call("list_mcp_resources", json!({})),
        4 => call("read_mcp_resource", json!({"uri": "demo://readme"})),
        _ => call("echo", json!({"text": format!("i{id}")})),
    }
}

async fn session(index: usize, base: Arc<String>, client: reqwest::Client, until: Instant, tally: Arc<Mutex<Tally>>) {
    let modern = index % 2 == 1;
    let router = Endpoint::open(&client, format!("{base}/mcp"), USER_TOKEN, modern).await;
    let instance = Endpoint::open(&client, format!("{base}/i/demo/mcp"), INSTANCE_TOKEN, modern).await;
    let (router, instance) = match (router, instance) {
        (Ok(router), Ok(instance)) => (router, instance),
        (Err(err), _) | (_, Err(err)) => {
            *tally.lock().errors.entry(("open", err)).or_insert(0) += 1;
            return;
        }
    };
    let mut id = 1u64;
    let mut op = index % OPS.len();
    while Instant::now() < until {
        let endpoint = if op == 5 { &instance } else { &router };
        let started = Instant::now();
        let result = endpoint.post(&client, &body_for(op, id)).await;
        let elapsed = started.elapsed();
        let mut tally = tally.lock();
        match result {
            Ok(_) => tally.latencies.entry(OPS[op]).or_default().push(elapsed),
            Err(err) => *tally.errors.entry((OPS[op], err)).or_insert(0) += 1,
        }
        drop(tally);
        id += 1;
        op = (op + 1) % OPS.len();
    }
    // Handshake sessions end as a polite client ends them, so what is held afterwards is not theirs.
    for endpoint in [&router, &instance] {
        if let Some(session) = &endpoint.session {
            let _ =
                client.delete(&endpoint.url).bearer_auth(endpoint.token).header("Mcp-Session-Id", session).send().await;
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let sessions = env_number("SOAK_SESSIONS", 1000) as usize;
        let seconds = env_number("SOAK_SECONDS", 60);
        raise_own_nofile();
        let served = serve(8192, &[]).await;
        let before = settled(served.pid).await;
        println!("sessions: {sessions} for {seconds} s, half 2025-06-18 (handshake) and half {MODERN} (stateless)");
        println!("before        {before}");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(sessions * 2)
            .build()
            .expect("http client");
        let tally = Arc::new(Mutex::new(Tally::default()));
        let base = Arc::new(served.base.clone());
        let until = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let tasks: Vec<_> = (0..sessions)
            .map(|i| tokio::spawn(session(i, base.clone(), client.clone(), until, tally.clone())))
            .collect();
        // What the satellite holds at the height of the load.
        tokio::time::sleep(Duration::from_secs(seconds.saturating_sub(2).max(1))).await;
        let peak = held(served.pid);
        for task in tasks {
            let _ = task.await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        drop(client);
        let after = settled(served.pid).await;

        let tally = tally.lock();
        println!("\n{:<28} {:>9} {:>8} {:>9} {:>9}", "operation", "ok", "errors", "p50 ms", "p99 ms");
        let mut total_ok = 0;
        let mut total_errors = 0;
        for op in OPS {
            let mut latencies = tally.latencies.get(op).cloned().unwrap_or_default();
            latencies.sort();
            let errors: usize = tally.errors.iter().filter(|((o, _), _)| *o == op).map(|(_, n)| n).sum();
            let pct = |p: f64| {
                latencies
                    .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
                    .map(|d| d.as_secs_f64() * 1e3)
                    .unwrap_or(f64::NAN)
            };
            println!("{op:<28} {:>9} {errors:>8} {:>9.1} {:>9.1}", latencies.len(), pct(0.5), pct(0.99));
            total_ok += latencies.len();
            total_errors += errors;
        }
        let opened: usize = tally.errors.iter().filter(|((o, _), _)| *o == "open").map(|(_, n)| n).sum();
        println!(
            "{:<28} {total_ok:>9} {total_errors:>8}   ({:.0} calls/s over {elapsed:.0} s; {opened} sessions failed to open)",
            "all",
            total_ok as f64 / elapsed
        );
        for ((op, err), n) in tally.errors.iter() {
            println!("  error  {op:<28} {err:<24} {n}");
        }
        println!("\nbefore        {before}\nat peak       {peak}\nafter         {after}");
        println!(
            "descriptors after/before: {:.2}, RSS after/before: {:.2}",
            after.fds as f64 / before.fds.max(1) as f64,
            after.rss_kib as f64 / before.rss_kib.max(1) as f64
        );
    });
}
