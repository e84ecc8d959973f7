//! The performance matrix (issue 19), one run: for each upstream (the bundled demo server, twice: with request
//! logging on and off, and the Node SDK's `@modelcontextprotocol/server-everything`, all over stdio) and each
//! concurrency (1 and 32), `tools/call echo`
//! over a bare pipe to the server (the floor), through the instance router (`/i/{path}/mcp`) and through
//! `execute_mcp_tool` on `/mcp`; then `tools/list`, `initialize` and `discover_mcp_tools` on `/mcp`. Each row
//! prints req/s, p50, p99, the satellite's own CPU per request (its process, not the server's nor this load
//! generator's) and the ratio to the floor. The satellite is the release binary as operators run it, in its own
//! process. Run with `cargo bench --bench matrix`; the latest results are kept in docs/performance.md, every run in
//! docs/performance-history.md.
//! After the rows, at concurrency 32, what each process spent per call (this load generator, the gateway, the MCP
//! server with any process below it) and the gateway's budget for issue 19's 0.8x of the bare pipe: the CPU per
//! call the host's cores give at that throughput, less what the generator and the server spent.
//! Last, start to ready: spawn to `/readyz` 200, with no upstream and with one stdio instance (and that instance
//! online), against spawning its server over a bare pipe. `MATRIX_ONLY=start` runs that part alone.
//!
//! Needs tests/node installed (`npm ci --prefix tests/node`) for server-everything; without it that upstream
//! is skipped with a note.

#[path = "common/mod.rs"]
mod common;
#[path = "common/minimal.rs"]
mod minimal;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pipe::BarePipe;
use common::{measure, Figures};
use satellite::config::sha256_hex;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

const TOKEN: &str = "matrix-bench-token-0123456789abcdef";
const WARMUP: usize = 300;
/// Requests per measurement at concurrency 1 and 32.
const CALLS: [(usize, usize); 2] = [(1, 3_000), (32, 32_000)];

/// One upstream server, as the satellite runs it and as a bare pipe reaches it.
struct Upstream {
    slug: &'static str,
    command: PathBuf,
    args: Vec<String>,
    /// `tools/call` params of the echo tool with a per-call text.
    echo: fn(usize) -> Value,
    /// The installation's request logging (`mcp.request.logs`): the demo runs once with it, once without, so
    /// the matrix shows what logging costs per call.
    request_logging: bool,
}

fn instance_token(slug: &str) -> String {
    format!("ds_inst_{}", sha256_hex(slug))
}

fn upstreams() -> Vec<Upstream> {
    let demo = |slug, request_logging| Upstream {
        slug,
        command: PathBuf::from(env!("CARGO_BIN_EXE_satellite")),
        args: vec!["demo-server".into(), "--protocol".into(), "legacy".into()],
        echo: |i| json!({"name": "echo", "arguments": {"text": format!("call {i}")}}),
        request_logging,
    };
    let mut out = vec![demo("demo", true), demo("demo-nolog", false)];
    let node = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/node/node_modules/.bin/mcp-server-everything");
    if node.exists() {
        out.push(Upstream {
            slug: "everything",
            command: node,
            args: vec!["stdio".into()],
            echo: |i| json!({"name": "echo", "arguments": {"message": format!("call {i}")}}),
            request_logging: true,
        });
    } else {
        println!("(server-everything skipped: npm ci --prefix tests/node installs it)");
    }
    out
}

fn toml_str(text: &str) -> String {
    serde_json::to_string(text).expect("a string")
}

fn config(upstreams: &[Upstream]) -> String {
    let commands: Vec<String> = upstreams.iter().map(|u| toml_str(&u.command.to_string_lossy())).collect();
    let mut text = format!(
        "[satellite]\ndebug_route = true\n\n[sandbox]\nallowed_commands = [{}]\n\n[[teams]]\nid = \"bench\"\n[[users]]\nid = \"bench\"\nteams = [\"bench\"]\ntoken_sha256 = [\"{}\"]\n",
        commands.join(", "),
        sha256_hex(TOKEN)
    );
    for (u, command) in upstreams.iter().zip(&commands) {
        let args: Vec<String> = u.args.iter().map(|a| toml_str(a)).collect();
        text.push_str(&format!(
            "\n[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = {command}\nargs = [{args}]\n\
             [[installations]]\nid = \"i-{slug}\"\nteam = \"bench\"\nserver = \"{slug}\"\nrequest_logging = {logging}\n\
             [installations.users.bench]\ninstance_path = \"bench-{slug}\"\ninstance_token_sha256 = \"{hash}\"\n",
            slug = u.slug,
            args = args.join(", "),
            hash = sha256_hex(&instance_token(u.slug)),
            logging = u.request_logging,
        ));
    }
    text
}

/// The release satellite in its own process on `config`, once every instance is online.
struct Served {
    _child: Child,
    pid: u32,
    base: String,
    _dir: tempfile::TempDir,
}

/// The release satellite spawned on `config` in a scratch directory (its log in `satellite.log` there): the
/// directory, the process and its base URL.
fn spawn_satellite(config: &str) -> (tempfile::TempDir, Child, String) {
    let dir = tempfile::tempdir().expect("scratch directory");
    let path = dir.path().join("satellite.toml");
    std::fs::write(&path, config).expect("config written");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let log = std::fs::File::create(dir.path().join("satellite.log")).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_satellite"))
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .env("PORT", port.to_string())
        // At the default log level (info), as the satellite runs unless told otherwise.
        .env_remove("LOG_LEVEL")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("satellite starts");
    (dir, child, format!("http://127.0.0.1:{port}"))
}

async fn serve(config: &str, instances: usize) -> Served {
    let (dir, child, base) = spawn_satellite(config);
    let pid = child.id().expect("pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let online = match reqwest::get(format!("{base}/api/status/debug")).await {
            Ok(answer) => {
                answer.json::<Value>().await.ok().and_then(|d| d["server_status"]["stats"]["online"].as_u64())
            }
            Err(_) => None,
        };
        if online == Some(instances as u64) {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.path().join("satellite.log")).unwrap_or_default();
            panic!("the satellite's {instances} instances did not come online; its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Served { _child: child, pid, base, _dir: dir }
}

/// A client of one MCP endpoint on the 2025-11-25 handshake (one session for the whole measurement), over
/// HTTP/1.1 keep-alive connections of its own: one per request in flight, reused. A lighter generator than
/// reqwest (no pool, URL or JSON work per request beyond the body): on 2 cores it shares with the satellite and the
/// server, what it costs is taken from what is measured. Every answer is checked: 2xx, and a JSON-RPC result.
struct Endpoint {
    addr: std::net::SocketAddr,
    /// Path and query.
    target: String,
    authorization: String,
    session: Option<String>,
    idle: parking_lot::Mutex<Vec<Connection>>,
}

type Connection = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// An answer: its head and its whole body.
struct Answer {
    headers: hyper::HeaderMap,
    body: bytes::Bytes,
}

impl Endpoint {
    async fn open(url: String, token: String) -> Endpoint {
        let url = url::Url::parse(&url).expect("an endpoint URL");
        let addr = url.socket_addrs(|| None).expect("an address")[0];
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        let mut endpoint = Endpoint {
            addr,
            target,
            authorization: format!("Bearer {token}"),
            session: None,
            idle: parking_lot::Mutex::new(Vec::new()),
        };
        endpoint.session = endpoint.initialize().await;
        endpoint
    }

    async fn initialize(&self) -> Option<String> {
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
            "capabilities": {}, "clientInfo": {"name": "matrix", "version": "0"}}});
        let answer = self.request(&body, None).await;
        answer.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned)
    }

    async fn connection(&self) -> Connection {
        if let Some(connection) = self.idle.lock().pop().filter(|c| !c.is_closed()) {
            return connection;
        }
        let stream = tokio::net::TcpStream::connect(self.addr).await.expect("a connection");
        stream.set_nodelay(true).expect("nodelay");
        let io = hyper_util::rt::TokioIo::new(stream);
        let (sender, connection) = hyper::client::conn::http1::handshake(io).await.expect("an HTTP/1.1 connection");
        tokio::spawn(connection);
        sender
    }

    async fn request(&self, body: &Value, session: Option<&str>) -> Answer {
        use http_body_util::BodyExt;
        let mut connection = self.connection().await;
        connection.ready().await.expect("a connection ready");
        let mut request = hyper::Request::post(self.target.as_str())
            .header("host", self.addr.to_string())
            .header("authorization", self.authorization.as_str())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let body = bytes::Bytes::from(serde_json::to_vec(body).expect("a body"));
        let request = request.body(http_body_util::Full::new(body)).expect("a request");
        let response = connection.send_request(request).await.expect("answered");
        let status = response.status();
        let (head, body) = response.into_parts();
        let body = body.collect().await.expect("a whole answer").to_bytes();
        assert!(status.is_success(), "{} answered {status}: {}", self.target, String::from_utf8_lossy(&body));
        self.idle.lock().push(connection);
        Answer { headers: head.headers, body }
    }

    async fn call(&self, method: &str, params: Value) {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let answer = self.request(&body, self.session.as_deref()).await;
        // A JSON answer, or an SSE stream whose last event is it: either way a result, not an error. Read as its
        // envelope only (the result skipped over, not built).
        #[derive(serde::Deserialize)]
        struct Envelope<'a> {
            #[serde(borrow)]
            result: Option<&'a serde_json::value::RawValue>,
        }
        let text = std::str::from_utf8(&answer.body).expect("UTF-8");
        let json = match text.trim_start().starts_with('{') {
            true => Some(text),
            false => text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).rfind(|d| !d.is_empty()),
        };
        let result = json.and_then(|j| serde_json::from_str::<Envelope>(j).ok()).and_then(|e| e.result);
        assert!(result.is_some(), "{method}: {text}");
    }
}

/// The processes whose CPU a row reads besides this one (the load generator): the gateway (none on the floor)
/// and the MCP server behind it, counted with any process below it.
#[derive(Clone, Copy, Default)]
struct Watch {
    gateway: Option<u32>,
    server: Option<u32>,
}

/// One measured row: figures, and the CPU per request of each process over the same requests.
struct Row {
    figures: Figures,
    /// The gateway's own process (the satellite's, or the minimal gateway's).
    cpu_us: Option<f64>,
    /// The MCP server's processes.
    server_us: Option<f64>,
    /// This process: the load generator (and, on the floor, the bare pipe's client).
    generator_us: f64,
}

async fn measured<F, Fut>(watch: Watch, concurrency: usize, calls: usize, op: F) -> Row
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    use common::process::{process, tree_cpu};
    let own = std::process::id();
    let own_cpu = |pid: u32| process(pid).map_or(Duration::ZERO, |p| p.cpu);
    let (gateway, server, generator) = (watch.gateway.map(own_cpu), watch.server.map(tree_cpu), own_cpu(own));
    let figures = measure(WARMUP, calls, concurrency, op).await;
    let per_request = |used: Duration| used.as_secs_f64() * 1e6 / (WARMUP + calls) as f64;
    Row {
        figures,
        cpu_us: watch.gateway.zip(gateway).map(|(pid, before)| per_request(own_cpu(pid).saturating_sub(before))),
        server_us: watch.server.zip(server).map(|(pid, before)| per_request(tree_cpu(pid).saturating_sub(before))),
        generator_us: per_request(own_cpu(own).saturating_sub(generator)),
    }
}

/// The process id of the satellite's instance at `path`, from its debug route (none while it is dormant).
async fn instance_pid(base: &str, path: &str) -> Option<u32> {
    fn find(value: &Value, path: &str) -> Option<u32> {
        match value {
            Value::Object(map) if map.get("instance_path").and_then(Value::as_str) == Some(path) => {
                map.get("pid").and_then(Value::as_u64).map(|p| p as u32)
            }
            Value::Object(map) => map.values().find_map(|v| find(v, path)),
            Value::Array(items) => items.iter().find_map(|v| find(v, path)),
            _ => None,
        }
    }
    let debug = reqwest::get(format!("{base}/api/status/debug")).await.ok()?.json::<Value>().await.ok()?;
    find(&debug, path)
}

fn print_row(upstream: &str, route: &str, concurrency: usize, row: &Row, floor: Option<&Figures>) {
    let cpu = row.cpu_us.map_or("-".to_owned(), |c| format!("{c:.1}"));
    let ratio = floor.map_or("-".to_owned(), |f| format!("{:.2}x", row.figures.per_sec / f.per_sec));
    // What the satellite adds to a call's median time (issue 19: at most 0.1 ms at concurrency 1).
    let added = floor
        .filter(|f| !std::ptr::eq(*f, &row.figures))
        .map_or("-".to_owned(), |f| format!("{:.1}", row.figures.p50_us - f.p50_us));
    println!(
        "{upstream:<11} {route:<26} {concurrency:>3} {:>9.0} {:>9.1} {:>9.1} {cpu:>10} {ratio:>9} {added:>10}",
        row.figures.per_sec, row.figures.p50_us, row.figures.p99_us
    );
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} cores, {model}")
}

/// The minimal gateway (common/minimal.rs) in a process of its own, in front of one upstream.
struct Minimal {
    _child: Child,
    pid: u32,
    /// Its MCP server's process id.
    server: Option<u32>,
    url: String,
}

async fn start_minimal(upstream: &Upstream) -> Minimal {
    use tokio::io::AsyncBufReadExt;
    let mut argv = vec![upstream.command.to_string_lossy().into_owned()];
    argv.extend(upstream.args.iter().cloned());
    let mut child = Command::new(std::env::current_exe().expect("this benchmark's executable"))
        .env(minimal::ENV, serde_json::to_string(&argv).expect("argv"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the minimal gateway starts");
    let pid = child.id().expect("pid");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut port = String::new();
    tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut port))
        .await
        .expect("the minimal gateway prints its port")
        .expect("its stdout");
    // It printed its port once its server had answered `initialize`: the server runs by now.
    let server = common::process::processes().into_iter().find(|p| p.parent == pid && !p.zombie).map(|p| p.pid);
    Minimal { _child: child, pid, server, url: format!("http://127.0.0.1:{}/mcp", port.trim()) }
}

fn main() {
    // The matrix starts itself again as the minimal gateway (common/minimal.rs); that process serves, never returns.
    minimal::serve_if_asked();
    common::process::raise_own_nofile();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let upstreams = upstreams();
        if std::env::var("MATRIX_ONLY").as_deref() == Ok("start") {
            start_to_ready(&upstreams[0]).await;
            return;
        }
        let served = serve(&config(&upstreams), upstreams.len()).await;
        println!("performance matrix (release build, {}); CPU = the satellite process's own, per request", machine());
        println!(
            "{:<11} {:<26} {:>3} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}",
            "upstream", "route", "c", "req/s", "p50 us", "p99 us", "CPU us/req", "vs floor", "+p50 us"
        );
        // The instance router's rows beside the minimal gateway's: (upstream, concurrency, satellite, minimal).
        let mut beside: Vec<Rows> = Vec::new();
        for upstream in &upstreams {
            let args: Vec<&str> = upstream.args.iter().map(String::as_str).collect();
            let pipe = Arc::new(BarePipe::start_command(&upstream.command, &args).await);
            let least = start_minimal(upstream).await;
            let least_endpoint = Arc::new(Endpoint::open(least.url.clone(), String::new()).await);
            let instance = Arc::new(
                Endpoint::open(format!("{}/i/bench-{}/mcp", served.base, upstream.slug), instance_token(upstream.slug))
                    .await,
            );
            let hierarchical = Arc::new(Endpoint::open(format!("{}/mcp", served.base), TOKEN.to_owned()).await);
            for (concurrency, calls) in CALLS {
                let (p, echo) = (pipe.clone(), upstream.echo);
                let floor = measured(Watch { gateway: None, server: pipe.pid() }, concurrency, calls, move |i| {
                    let p = p.clone();
                    async move {
                        p.call("tools/call", echo(i)).await;
                    }
                })
                .await;
                print_row(upstream.slug, "bare pipe (floor)", concurrency, &floor, Some(&floor.figures));
                let e = least_endpoint.clone();
                let watch = Watch { gateway: Some(least.pid), server: least.server };
                let least_row = measured(watch, concurrency, calls, move |i| {
                    let e = e.clone();
                    async move {
                        e.call("tools/call", echo(i)).await;
                    }
                })
                .await;
                print_row(upstream.slug, "minimal gateway", concurrency, &least_row, Some(&floor.figures));
                let e = instance.clone();
                let server = instance_pid(&served.base, &format!("bench-{}", upstream.slug)).await;
                let watch = Watch { gateway: Some(served.pid), server };
                let instance_row = measured(watch, concurrency, calls, move |i| {
                    let e = e.clone();
                    async move {
                        e.call("tools/call", echo(i)).await;
                    }
                })
                .await;
                print_row(upstream.slug, "instance router", concurrency, &instance_row, Some(&floor.figures));
                let (h, slug) = (hierarchical.clone(), upstream.slug);
                let row = measured(watch, concurrency, calls, move |i| {
                    let h = h.clone();
                    async move {
                        let inner = echo(i);
                        let arguments = json!({"tool_path": format!("{slug}:echo"), "arguments": inner["arguments"]});
                        h.call("tools/call", json!({"name": "execute_mcp_tool", "arguments": arguments})).await;
                    }
                })
                .await;
                print_row(upstream.slug, "execute_mcp_tool", concurrency, &row, Some(&floor.figures));
                let rows = [
                    ("bare pipe (floor)", floor),
                    ("minimal gateway", least_row),
                    ("instance router", instance_row),
                    ("execute_mcp_tool", row),
                ];
                beside.push((upstream.slug, concurrency, rows));
            }
        }
        for (concurrency, calls) in CALLS {
            let hierarchical = Arc::new(Endpoint::open(format!("{}/mcp", served.base), TOKEN.to_owned()).await);
            let h = hierarchical.clone();
            let row = measured(Watch { gateway: Some(served.pid), server: None }, concurrency, calls, move |_| {
                let h = h.clone();
                async move {
                    h.call("tools/list", json!({})).await;
                }
            })
            .await;
            print_row("-", "/mcp tools/list", concurrency, &row, None);
            let h = hierarchical.clone();
            let row = measured(Watch { gateway: Some(served.pid), server: None }, concurrency, calls, move |i| {
                let h = h.clone();
                let query = ["echo a message", "add two numbers", "sleep for a while", "read a resource"][i % 4];
                async move {
                    h.call("tools/call", json!({"name": "discover_mcp_tools", "arguments": {"query": query}})).await;
                }
            })
            .await;
            print_row("-", "/mcp discover_mcp_tools", concurrency, &row, None);
            // Last: each makes a session, and enough of them push the measuring session out of a full table.
            let h = hierarchical.clone();
            let row = measured(Watch { gateway: Some(served.pid), server: None }, concurrency, calls, move |_| {
                let h = h.clone();
                async move {
                    assert!(h.initialize().await.is_some(), "initialize gives a session");
                }
            })
            .await;
            print_row("-", "/mcp initialize", concurrency, &row, None);
        }
        // What the satellite costs beyond the least any HTTP gateway must do, on the same host in the same run.
        println!("instance router against the minimal gateway (common/minimal.rs), same run:");
        for (slug, concurrency, [_, (_, least), (_, satellite), _]) in &beside {
            let cpu = satellite
                .cpu_us
                .zip(least.cpu_us)
                .map_or("-".to_owned(), |(s, l)| format!("{:.2}x ({s:.1} against {l:.1} us)", s / l));
            println!(
                "  {slug:<11} c={concurrency:<3} CPU per call {cpu}, req/s {:.2}x, +p50 {:.1} us",
                satellite.figures.per_sec / least.figures.per_sec,
                satellite.figures.p50_us - least.figures.p50_us
            );
        }
        budgets(&beside);
        let held = common::process::held(served.pid);
        println!("satellite after the run: {held}");
        drop(served);
        start_to_ready(&upstreams[0]).await;
    });
}

/// One upstream's rows at one concurrency: (upstream, concurrency, [floor, minimal gateway, instance router,
/// `execute_mcp_tool`]), each with its route's name.
type Rows = (&'static str, usize, [(&'static str, Row); 4]);

/// What each process spent per call at concurrency 32, and what a gateway may spend for issue 19's 0.8x of the
/// bare pipe's throughput: a call through any gateway costs the load generator its HTTP request and the server
/// its answer, and the host has only so many cores for the three of them. At 0.8x the floor's req/s, the cores give
/// `cores / (0.8 x floor)` of CPU per call; what the generator and the server spent in that row leaves the rest to
/// the gateway. When even the minimal gateway spends more than that, no HTTP gateway meets the aim on this host.
fn budgets(rows: &[Rows]) {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    let us = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    println!(
        "CPU per call by process at c=32 (us; generator = this load generator), and the gateway's budget for 0.8x the \
         floor's req/s ({cores} cores / (0.8 x floor req/s) - generator - server):"
    );
    for (slug, _, rows) in rows.iter().filter(|(_, concurrency, _)| *concurrency == 32) {
        let per_call = cores * 1e6 / (0.8 * rows[0].1.figures.per_sec);
        for (route, row) in rows {
            let (gateway, server) = (row.cpu_us, row.server_us);
            let total = row.generator_us + gateway.unwrap_or(0.0) + server.unwrap_or(0.0);
            let budget = server
                .filter(|_| gateway.is_some())
                .map_or(String::new(), |server| format!("  budget {:.1}", per_call - row.generator_us - server));
            println!(
                "  {slug:<11} {route:<18} generator {:>6.1}  server {:>6}  gateway {:>6}  total {total:>6.1}{budget}",
                row.generator_us,
                us(server),
                us(gateway)
            );
        }
    }
}

/// Runs of each start measurement; the median is printed.
const STARTS: usize = 7;

/// Start to ready (issue 19, aim 6): from spawning the satellite to `/readyz` answering 200, with no upstream to
/// spawn and with one stdio instance; and to that instance being online, against the floor of spawning the same
/// server over a bare pipe and having its `initialize` answered, in the same run.
async fn start_to_ready(upstream: &Upstream) {
    let client = reqwest::Client::new();
    let empty = config(&[]);
    let one = config(std::slice::from_ref(upstream));
    let (mut bare, mut empty_ready, mut one_ready, mut one_online) = (vec![], vec![], vec![], vec![]);
    for _ in 0..STARTS {
        let args: Vec<&str> = upstream.args.iter().map(String::as_str).collect();
        let began = Instant::now();
        drop(BarePipe::start_command(&upstream.command, &args).await);
        bare.push(began.elapsed());
        let (ready, _) = time_start(&client, &empty, 0).await;
        empty_ready.push(ready);
        let (ready, online) = time_start(&client, &one, 1).await;
        one_ready.push(ready);
        one_online.push(online);
    }
    let median = |mut runs: Vec<Duration>| {
        runs.sort();
        runs[runs.len() / 2].as_secs_f64() * 1000.0
    };
    let floor = median(bare);
    println!("start to ready (median of {STARTS} starts, ms):");
    println!("  no upstream to spawn: /readyz 200 after {:.1}", median(empty_ready));
    println!(
        "  one {} stdio instance: /readyz 200 after {:.1}, instance online after {:.1}; its server alone \
         (spawn + initialize over a bare pipe) {floor:.1}",
        upstream.slug,
        median(one_ready),
        median(one_online)
    );
}

/// One start of the release satellite on `config`: the time to `/readyz` 200 and to `instances` online,
/// polled as fast as the satellite answers.
async fn time_start(client: &reqwest::Client, config: &str, instances: u64) -> (Duration, Duration) {
    // From just before the scratch directory and the config file are written (a fraction of a millisecond).
    let began = Instant::now();
    let (_dir, _child, base) = spawn_satellite(config);
    let deadline = began + Duration::from_secs(60);
    let mut ready = None;
    loop {
        if ready.is_none() {
            let answer = client.get(format!("{base}/readyz")).send().await;
            if answer.is_ok_and(|a| a.status() == 200) {
                ready = Some(began.elapsed());
            }
        }
        if let Some(ready) = ready {
            let online = match client.get(format!("{base}/api/status/debug")).send().await {
                Ok(answer) => {
                    answer.json::<Value>().await.ok().and_then(|d| d["server_status"]["stats"]["online"].as_u64())
                }
                Err(_) => None,
            };
            if online == Some(instances) {
                return (ready, began.elapsed());
            }
        }
        assert!(Instant::now() < deadline, "the satellite did not become ready with {instances} instances online");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}
