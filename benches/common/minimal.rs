//! The least an HTTP gateway to a stdio MCP server can do, as a process of its own: the matrix's second floor.
//!
//! The bare pipe measures the server alone; a call through any gateway makes two more hops between processes
//! (client to gateway, gateway to client) and pays for HTTP. This gateway pays for exactly that and nothing the
//! satellite adds on top: one hyper HTTP/1.1 server, each POST's JSON-RPC request parsed, given an id of its own,
//! written to the child's stdin (lines that arrive together share one write, as the satellite's writer does),
//! the answer matched by id, its own id restored, written back as `application/json`. No authentication, no
//! sessions, no routing, no logging, no limits. What the satellite costs beyond it is the satellite's own; what it
//! costs itself is what this host charges any gateway.
//!
//! The matrix runs it by starting its own executable with [`ENV`] set to the server's argv as a JSON array;
//! [`serve_if_asked`] is the first thing its `main` does.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// Set to the upstream's argv (a JSON array of strings): the process serves as the minimal gateway and exits.
pub const ENV: &str = "MATRIX_MINIMAL_GATEWAY";

/// Calls written and not yet answered: the gateway's id → the client's id and where its answer goes.
type Pending = Arc<Mutex<HashMap<u64, (Value, oneshot::Sender<Value>)>>>;

struct Gateway {
    pending: Pending,
    lines: mpsc::UnboundedSender<Vec<u8>>,
    next: AtomicU64,
}

impl Gateway {
    /// `request` to the server under an id of the gateway's, and its answer under the client's id again.
    async fn call(&self, mut request: Value) -> Option<Value> {
        let ours = self.next.fetch_add(1, Ordering::Relaxed);
        let theirs = std::mem::replace(&mut request["id"], json!(ours));
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(ours, (theirs, tx));
        let mut line = serde_json::to_vec(&request).ok()?;
        line.push(b'\n');
        self.lines.send(line).ok()?;
        rx.await.ok()
    }
}

/// When [`ENV`] is set: serve as the minimal gateway (printing the port it listens on as the first line of
/// stdout), and never return.
pub fn serve_if_asked() {
    let Ok(spec) = std::env::var(ENV) else { return };
    let argv: Vec<String> = serde_json::from_str(&spec).expect("the upstream's argv, a JSON array");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(serve(argv));
    std::process::exit(0);
}

async fn serve(argv: Vec<String>) {
    let (program, args) = argv.split_first().expect("a program");
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the upstream starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, mut queued) = mpsc::unbounded_channel::<Vec<u8>>();
    // The writer: what has queued up by the time it runs goes out in one write.
    tokio::spawn(async move {
        let mut batch = Vec::new();
        while let Some(line) = queued.recv().await {
            batch.extend_from_slice(&line);
            while let Ok(more) = queued.try_recv() {
                batch.extend_from_slice(&more);
            }
            if stdin.write_all(&batch).await.is_err() {
                return;
            }
            batch.clear();
        }
    });
    let pending: Pending = Arc::default();
    let answers = pending.clone();
    tokio::spawn(async move {
        let mut stdout = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match stdout.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let Ok(mut answer) = serde_json::from_slice::<Value>(&line) else { continue };
            let Some(ours) = answer.get("id").and_then(Value::as_u64) else { continue };
            if let Some((theirs, tx)) = answers.lock().remove(&ours) {
                answer["id"] = theirs;
                let _ = tx.send(answer);
            }
        }
    });
    let gateway = Arc::new(Gateway { pending, lines: lines.clone(), next: AtomicU64::new(1) });
    let handshake = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
        "capabilities": {}, "clientInfo": {"name": "minimal-gateway", "version": "0"}}});
    let initialized = gateway.call(handshake).await.expect("the upstream answers initialize");
    let _ = lines.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n".to_vec());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let mut out = std::io::stdout();
    writeln!(out, "{port}").and_then(|_| out.flush()).expect("the port printed");
    let initialize_result = Arc::new(initialized["result"].clone());
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let (gateway, initialize_result) = (gateway.clone(), initialize_result.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let (gateway, initialize_result) = (gateway.clone(), initialize_result.clone());
                async move { Ok::<_, Infallible>(answer(&gateway, &initialize_result, request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

async fn answer(
    gateway: &Gateway,
    initialize_result: &Value,
    request: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
        response
    };
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return reply(StatusCode::BAD_REQUEST, Vec::new());
    };
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return reply(StatusCode::BAD_REQUEST, Vec::new());
    };
    if message.get("id").is_none() {
        return reply(StatusCode::ACCEPTED, Vec::new());
    }
    // The server was initialized once, at start; a client's own handshake is answered with what it said then.
    let answered = match message["method"].as_str() {
        Some("initialize") => Some(json!({"jsonrpc": "2.0", "id": message["id"], "result": initialize_result})),
        _ => gateway.call(message).await,
    };
    match answered.and_then(|a| serde_json::to_vec(&a).ok()) {
        Some(body) => reply(StatusCode::OK, body),
        None => reply(StatusCode::BAD_GATEWAY, Vec::new()),
    }
}
