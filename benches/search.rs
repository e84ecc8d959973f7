//! Tool search, measured rather than assumed (issue 15). Prints, in one run:
//! 1. quality on ../shared/data/toolsearch/dev.jsonl per source (the table toolsearch_eval.py prints), for the
//!    satellite's index and for the reference gateway's Fuse.js search (../shared/tools/fuse_baseline);
//! 2. in-process latency p50/p99 at 4,500 tools (every server visible) with the caller's filter cached, with it
//!    rebuilt per query (what the satellite did before), and Fuse.js rebuilding its index per query as the
//!    reference gateway does: ratios against Fuse in the same run;
//! 3. in-process latency at 50,000 tools across 1,000 users (each user sees only their own instances);
//! 4. RSS the index adds per tool at both sizes;
//! 5. live, through HTTP, against a release satellite serving the corpus from the demo server: discover p50/p99
//!    against `tools/list` p50/p99 on the same session, the satellite's RSS per tool and per instance, and the
//!    embedded default's idle RSS.
//!
//! Run with `cargo bench --bench search` (needs ../shared/data/toolsearch; Fuse needs `npm ci` in tests/node).

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use satellite::config::sha256_hex;
use satellite::search::eval::{load_corpus, load_queries, EvalQuery, Report};
use satellite::search::{Scope, SearchIndex, ToolDoc};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TOKEN: &str = "bench-search-token-0123456789abcdef";
/// Rounds over the dev queries for each latency figure.
const ROUNDS: usize = 10;
const USERS: usize = 1_000;
/// Instances are added to a user until they have this many tools: about 50,000 tools over 1,000 users.
const TOOLS_PER_USER: usize = 40;

fn data(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/toolsearch").join(file)
}

/// This process's RSS once the allocator has handed its free memory back (what is really held).
fn rss_kib() -> u64 {
    satellite::memory::return_free_memory();
    common::process::held(std::process::id()).rss_kib
}

/// p50 and p99 in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0;
    (at(0.5), at(0.99))
}

fn ranking(hits: &[satellite::search::SearchHit]) -> Vec<String> {
    hits.iter().map(|h| format!("{}:{}", h.process_id, h.tool_name)).collect()
}

/// Indexes every instance, then waits until the index has merged into one segment (its idle state).
async fn index_all(index: &SearchIndex, instances: &BTreeMap<String, Vec<ToolDoc>>) {
    let writes = instances.iter().map(|(id, tools)| index.replace_instance(id, tools.clone()));
    for result in futures::future::join_all(writes).await {
        result.expect("index");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while index.num_segments() > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let servers = load_corpus(&data("corpus.jsonl")).expect("corpus");
        let queries = load_queries(&data("dev.jsonl")).expect("dev queries");
        let tools: usize = servers.values().map(Vec::len).sum();

        // 1 + 2: 4,500 tools.
        let before = rss_kib();
        let index = SearchIndex::new().expect("index");
        index_all(&index, &servers).await;
        let small_rss = rss_kib().saturating_sub(before);
        let scope = Arc::new(Scope::new(servers.keys().cloned().collect()));
        if let Some(seconds) = std::env::var("SEARCH_BENCH_PROFILE_SECONDS").ok().and_then(|s| s.parse().ok()) {
            // For a profiler: only cached-scope queries at 4,500 tools, for this long.
            let until = Instant::now() + Duration::from_secs(seconds);
            let mut samples = Vec::new();
            while Instant::now() < until {
                for query in &queries {
                    let started = Instant::now();
                    index.search(&query.query, &scope, 10).await.expect("search");
                    samples.push(started.elapsed());
                }
            }
            let (p50, p99) = percentiles(samples);
            println!(
                "{} segments; cached scope at {tools} tools: p50 {p50:.3} ms, p99 {p99:.3} ms",
                index.num_segments()
            );
            return;
        }
        let mut report = Report::default();
        for query in &queries {
            report.add(query, &ranking(&index.search(&query.query, &scope, 10).await.expect("search")));
        }
        println!("quality on dev, satellite (in-process, {tools} tools, every server visible):");
        print!("{}", report.table("satellite"));
        let cached = time_queries(&queries, |q| {
            let (index, scope) = (index.clone(), scope.clone());
            async move { index.search(&q, &scope, 10).await.map(|_| ()) }
        })
        .await;
        let rebuilt = time_queries(&queries, |q| {
            let (index, ids) = (index.clone(), scope.ids().to_vec());
            async move { index.search(&q, &Arc::new(Scope::new(ids)), 10).await.map(|_| ()) }
        })
        .await;
        let fuse = run_fuse(&queries, &["--rebuild-per-query"]);
        if let Some((fuse_report, _)) = &fuse {
            println!(
                "\nquality on dev, Fuse.js baseline (the reference gateway's search, the request passed verbatim):"
            );
            print!("{}", fuse_report.table("fuse"));
        }
        if let Some((fuse_or, _)) = run_fuse(&queries, &["--query-mode", "or"]) {
            println!("\nquality on dev, Fuse.js with the request's words OR-joined (a diagnostic, not the baseline):");
            print!("{}", fuse_or.table("fuse-or"));
        }

        match std::env::var_os("SATELLITE_SEMANTIC_MODEL") {
            Some(model) => semantic(&servers, &queries, Path::new(&model), &cached).await,
            None => println!("\n(semantic stage skipped: set SATELLITE_SEMANTIC_MODEL to a model directory)"),
        }

        // 3: 50,000 tools across 1,000 users, each seeing only their own instances.
        let (users, instances) = many_users(&servers);
        let large_tools: usize = instances.values().map(Vec::len).sum();
        let before = rss_kib();
        let large = SearchIndex::new().expect("index");
        index_all(&large, &instances).await;
        let large_rss = rss_kib().saturating_sub(before);
        let scopes: Vec<Arc<Scope>> = users.into_iter().map(|ids| Arc::new(Scope::new(ids))).collect();
        let mut first = Vec::with_capacity(scopes.len());
        for (n, scope) in scopes.iter().enumerate() {
            let started = Instant::now();
            large.search(&queries[n % queries.len()].query, scope, 10).await.expect("search");
            first.push(started.elapsed());
        }
        let per_user = time_queries_indexed(&queries, |n, q| {
            let (index, scope) = (large.clone(), scopes[n % scopes.len()].clone());
            async move { index.search(&q, &scope, 10).await.map(|_| ()) }
        })
        .await;

        println!("\nin-process discover latency, {} dev queries x {ROUNDS} rounds, limit 10:", queries.len());
        println!("{:<58}{:>10}{:>10}{:>12}", "", "p50 ms", "p99 ms", "p50 vs Fuse");
        let fuse_p50 = fuse.as_ref().map(|(_, (p50, _))| *p50);
        let line = |label: &str, (p50, p99): (f64, f64)| {
            let ratio = fuse_p50.map_or("-".to_owned(), |f| format!("{:.4}x", p50 / f));
            println!("{label:<58}{p50:>10.3}{p99:>10.3}{ratio:>12}");
        };
        line(&format!("satellite, {tools} tools, filter cached per caller"), cached);
        line(&format!("satellite, {tools} tools, filter rebuilt per query"), rebuilt);
        if let Some((_, figures)) = &fuse {
            line(&format!("Fuse.js, {tools} tools, index rebuilt per query"), *figures);
        }
        line(&format!("satellite, {large_tools} tools / {USERS} users, first query of a user"), percentiles(first));
        line(&format!("satellite, {large_tools} tools / {USERS} users, later queries"), per_user);
        println!(
            "\nindex RSS: {:.0} B/tool at {tools} tools ({:.1} MiB), {:.0} B/tool at {large_tools} tools ({:.1} MiB)",
            small_rss as f64 * 1024.0 / tools as f64,
            small_rss as f64 / 1024.0,
            large_rss as f64 * 1024.0 / large_tools as f64,
            large_rss as f64 / 1024.0
        );
        drop((index, large));

        live(&servers, &queries).await;
    });
}

async fn time_queries<F, Fut>(queries: &[EvalQuery], run: F) -> (f64, f64)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), satellite::search::SearchError>>,
{
    time_queries_indexed(queries, |_, q| run(q)).await
}

async fn time_queries_indexed<F, Fut>(queries: &[EvalQuery], run: F) -> (f64, f64)
where
    F: Fn(usize, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), satellite::search::SearchError>>,
{
    let mut samples = Vec::with_capacity(queries.len() * ROUNDS);
    for round in 0..=ROUNDS {
        for (n, query) in queries.iter().enumerate() {
            let started = Instant::now();
            run(round * queries.len() + n, query.query.clone()).await.expect("search");
            if round > 0 {
                samples.push(started.elapsed()); // round 0 warms up
            }
        }
    }
    percentiles(samples)
}

/// 1,000 users, each with instances of corpus servers (a deterministic walk over the servers) until they
/// have at least 50 tools: the scopes, and every instance's tools under its own process id.
fn many_users(servers: &BTreeMap<String, Vec<ToolDoc>>) -> (Vec<Vec<String>>, BTreeMap<String, Vec<ToolDoc>>) {
    let slugs: Vec<&String> = servers.keys().collect();
    let mut instances = BTreeMap::new();
    let mut users = Vec::with_capacity(USERS);
    let mut next = 0usize;
    for user in 0..USERS {
        let (mut ids, mut count) = (Vec::new(), 0);
        while count < TOOLS_PER_USER {
            next = (next + 7919) % slugs.len();
            let slug = slugs[next];
            let process_id = format!("{slug}-team-u{user}-{next}");
            if ids.contains(&process_id) {
                continue;
            }
            let tools: Vec<ToolDoc> =
                servers[slug].iter().map(|t| ToolDoc { process_id: process_id.clone(), ..t.clone() }).collect();
            count += tools.len();
            instances.insert(process_id.clone(), tools);
            ids.push(process_id);
        }
        users.push(ids);
    }
    (users, instances)
}

/// The Fuse.js baseline over the same files: its rankings scored like ours, and its p50/p99 (ms) with the
/// index rebuilt per query. `None` (with a note) when node or fuse.js is missing.
fn run_fuse(queries: &[EvalQuery], extra: &[&str]) -> Option<(Report, (f64, f64))> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("../shared/tools/fuse_baseline/fuse_baseline.js");
    let output = std::process::Command::new("node")
        .env("NODE_PATH", root.join("tests/node/node_modules"))
        .arg(&script)
        .args(["--corpus", &data("corpus.jsonl").to_string_lossy(), "--queries", &data("dev.jsonl").to_string_lossy()])
        .args(extra)
        .output();
    let output = match output {
        Ok(output) if output.status.success() => output,
        Ok(output) => {
            println!(
                "(Fuse.js baseline skipped: {})",
                String::from_utf8_lossy(&output.stderr).lines().next().unwrap_or("")
            );
            return None;
        }
        Err(error) => {
            println!("(Fuse.js baseline skipped: node: {error})");
            return None;
        }
    };
    let mut report = Report::default();
    let mut latencies = Vec::new();
    let by_id: BTreeMap<&str, &EvalQuery> = queries.iter().map(|q| (q.id.as_str(), q)).collect();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(line) = serde_json::from_str::<Value>(line) else { continue };
        let Some(query) = line["id"].as_str().and_then(|id| by_id.get(id)) else { continue };
        let results: Vec<String> =
            line["results"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
        report.add(query, &results);
        if let Some(ms) = line["latency_ms"].as_f64() {
            latencies.push(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    (!latencies.is_empty()).then(|| (report, percentiles(latencies)))
}

struct Session {
    client: reqwest::Client,
    url: String,
    session: Option<String>,
}

impl Session {
    async fn open(client: reqwest::Client, url: String) -> Session {
        let mut session = Session { client, url, session: None };
        let response = session
            .request(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}))
            .send()
            .await
            .expect("initialize");
        session.session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        session
    }

    fn request(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .json(body);
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        request
    }

    async fn call(&self, body: &Value) -> Value {
        let text = self.request(body).send().await.expect("send").text().await.expect("an answer");
        // JSON, or an SSE stream whose last `data:` line is the answer.
        let json = text.lines().rev().find_map(|l| l.strip_prefix("data:")).unwrap_or(&text);
        let answer: Value = serde_json::from_str(json.trim()).expect("a JSON-RPC answer");
        assert!(answer.get("result").is_some(), "an answer with a result: {answer}");
        answer
    }
}

async fn spawn(args: &[&str], env: &[(&str, &str)], dir: &Path) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_satellite"));
    command.args(args).current_dir(dir).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true);
    command.env_remove("SATELLITE_CONFIG").env_remove("DEPLOYSTACK_BACKEND_URL");
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("spawn the satellite binary")
}

async fn first_line(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout).lines().next_line().await.expect("read").expect("a line")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

async fn until_ready(base: &str, tools: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        if let Ok(answer) = reqwest::get(format!("{base}/api/status/debug")).await {
            if let Ok(debug) = answer.json::<Value>().await {
                if debug["tools"]["total_tools"].as_u64() == Some(tools as u64) {
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// What `pid` holds once its token encoder has surely been released: the satellite lets it go after a minute
/// without counting, checked every 20 s, so 90 s after the last count. (Waiting for the RSS to drop by some
/// amount stopped at the first drop, which a purge of the queries' garbage alone could make.)
async fn after_encoder_release(pid: u32) -> common::process::Held {
    tokio::time::sleep(Duration::from_secs(90)).await;
    common::process::held(pid)
}

/// 5: the live figures.
async fn live(servers: &BTreeMap<String, Vec<ToolDoc>>, queries: &[EvalQuery]) {
    let dir = tempfile::tempdir().expect("scratch directory");
    let tools: usize = servers.values().map(Vec::len).sum();

    let idle = common::process::serve(1024, &[]).await;
    let started_held = common::process::settled(idle.pid).await;
    let idle_held = after_encoder_release(idle.pid).await;
    drop(idle);

    let corpus = data("corpus.jsonl");
    let mut demo =
        spawn(&["demo-server", "--http", "127.0.0.1:0", "--corpus", &corpus.to_string_lossy()], &[], dir.path()).await;
    let line = first_line(&mut demo).await;
    let corpus_base = line.split_whitespace().find(|w| w.starts_with("http://")).expect("address").to_owned();
    let mut config = format!(
        "[satellite]\ndebug_route = true\nreconcile_concurrency = 16\n[[teams]]\nid = \"bench\"\n[[users]]\nid = \"bench\"\nteams = [\"bench\"]\ntoken_sha256 = [\"{}\"]\n",
        sha256_hex(TOKEN)
    );
    for (i, slug) in servers.keys().enumerate() {
        config += &format!(
            "[[servers]]\nslug = \"{slug}\"\ntransport = \"http\"\nurl = \"{corpus_base}/servers/{slug}/mcp\"\n[[installations]]\nid = \"c{i}\"\nteam = \"bench\"\nserver = \"{slug}\"\n"
        );
    }
    let path = dir.path().join("corpus.toml");
    std::fs::write(&path, config).expect("config");
    let port = free_port();
    let data_dir = dir.path().join("data");
    let satellite = spawn(
        &["serve", "--config", &path.to_string_lossy(), "--port", &port.to_string()],
        &[("SATELLITE_DATA_DIR", &data_dir.to_string_lossy())],
        dir.path(),
    )
    .await;
    let pid = satellite.id().expect("pid");
    let base = format!("http://127.0.0.1:{port}");
    if !until_ready(&base, tools).await {
        println!("\n(live figures skipped: the corpus satellite did not list {tools} tools in time)");
        return;
    }
    let loaded = common::process::settled(pid).await;

    let client = reqwest::Client::new();
    let session = Session::open(client, format!("{base}/mcp")).await;
    let mut list = Vec::new();
    let mut discover = Vec::new();
    let mut budgeted = Vec::new();
    for round in 0..=ROUNDS {
        for (n, query) in queries.iter().enumerate() {
            let started = Instant::now();
            session.call(&json!({"jsonrpc":"2.0","id":n,"method":"tools/list"})).await;
            let listed = started.elapsed();
            let started = Instant::now();
            let body = json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{"name":"discover_mcp_tools","arguments":{"query":query.query,"limit":10}}});
            session.call(&body).await;
            let limited = started.elapsed();
            // The default answer: shaped by a budget of 1,000 tokens (issue 72).
            let started = Instant::now();
            let body = json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{"name":"discover_mcp_tools","arguments":{"query":query.query}}});
            session.call(&body).await;
            if round > 0 {
                list.push(listed);
                discover.push(limited);
                budgeted.push(started.elapsed());
            }
        }
    }
    let after = common::process::held(pid);
    let (list_p50, list_p99) = percentiles(list);
    let (discover_p50, discover_p99) = percentiles(discover);
    let (budget_p50, budget_p99) = percentiles(budgeted);
    println!(
        "\nlive, HTTP, one session, {} requests each (release build, {tools} tools on {} instances):",
        queries.len() * ROUNDS,
        servers.len()
    );
    println!("{:<40}{:>10}{:>10}", "", "p50 ms", "p99 ms");
    println!("{:<40}{list_p50:>10.3}{list_p99:>10.3}", "tools/list (the four meta-tools)");
    println!("{:<40}{discover_p50:>10.3}{discover_p99:>10.3}", "discover_mcp_tools, limit 10");
    println!("{:<40}{budget_p50:>10.3}{budget_p99:>10.3}", "discover_mcp_tools, budget 1,000 (default)");
    println!(
        "discover p50 / tools/list p50 = {:.2}x at limit 10, {:.2}x at the default budget",
        discover_p50 / list_p50,
        budget_p50 / list_p50
    );
    let base_kib = idle_held.rss_kib as f64;
    println!(
        "\nRSS: embedded default {:.1} MiB once started, {:.1} MiB idle (encoder released); corpus loaded {:.1} MiB, after the queries {:.1} MiB",
        started_held.rss_kib as f64 / 1024.0,
        base_kib / 1024.0,
        loaded.rss_kib as f64 / 1024.0,
        after.rss_kib as f64 / 1024.0
    );
    let rested = after_encoder_release(pid).await;
    println!("corpus satellite idle again (encoder released): {:.1} MiB", rested.rss_kib as f64 / 1024.0);
    let added = (rested.rss_kib as f64 - base_kib).max(0.0) * 1024.0;
    println!(
        "idle, over the idle embedded default: {:.0} B per tool, {:.1} KiB per instance ({} threads)",
        added / tools as f64,
        added / 1024.0 / servers.len() as f64,
        rested.threads
    );
    drop(satellite);
    drop(demo);
}

/// The semantic stage on the whole corpus: embedding throughput, quality per source, latency of request-shaped
/// discovers (keyword queries do not run it), and the RSS of the model and the vectors.
async fn semantic(servers: &BTreeMap<String, Vec<ToolDoc>>, queries: &[EvalQuery], model: &Path, lexical: &(f64, f64)) {
    let before = rss_kib();
    let stage = match satellite::search::Semantic::load(model, None) {
        Ok(stage) => stage,
        Err(error) => return println!("\n(semantic stage skipped: {error})"),
    };
    let model_rss = rss_kib().saturating_sub(before);
    let index = SearchIndex::new().expect("index").with_semantic(stage.clone());
    let started = Instant::now();
    index_all(&index, servers).await;
    while stage.pending() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let embedding = started.elapsed();
    let vectors_rss = rss_kib().saturating_sub(before + model_rss);
    let tools: usize = servers.values().map(Vec::len).sum();
    let scope = Arc::new(Scope::new(servers.keys().cloned().collect()));
    let mut report = Report::default();
    for query in queries {
        report.add(query, &ranking(&index.search(&query.query, &scope, 10).await.expect("search")));
    }
    println!("\nquality on dev, satellite with the semantic stage ({}):", index.describe_stages());
    print!("{}", report.table("lexical+semantic"));
    let requests: Vec<EvalQuery> =
        queries.iter().filter(|q| satellite::search::semantic::semantic_weight(&q.query) < 1.0).cloned().collect();
    let fused = time_queries(&requests, |q| {
        let (index, scope) = (index.clone(), scope.clone());
        async move { index.search(&q, &scope, 10).await.map(|_| ()) }
    })
    .await;
    println!(
        "semantic stage: {tools} tools embedded in {:.1} s ({:.0} tools/s); {} of {} dev queries are request-shaped",
        embedding.as_secs_f64(),
        tools as f64 / embedding.as_secs_f64(),
        requests.len(),
        queries.len()
    );
    println!(
        "request-shaped discover p50 / p99: {:.2} / {:.2} ms (lexical alone, all queries: {:.3} / {:.3} ms)",
        fused.0, fused.1, lexical.0, lexical.1
    );
    println!(
        "semantic RSS: model {:.1} MiB, vectors and index {:.0} B/tool",
        model_rss as f64 / 1024.0,
        vectors_rss as f64 * 1024.0 / tools as f64
    );
}
