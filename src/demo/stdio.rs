//! The demo server over stdio: newline-delimited JSON-RPC, requests handled
//! concurrently, one writer owning stdout.
//!
//! Reading and writing run on two plain threads with blocking IO, not on tokio's stdin/stdout (which hand every
//! read and write to the blocking pool): the reader hands each line to the runtime, the writer writes every
//! reply that is ready and flushes once per batch. The demo is the reference upstream of the benchmarks, so it
//! must cost less than what it measures (issue 19: at least a Node SDK server's calls per second).

use std::io::{BufRead, Write};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{DemoServer, Reply, Session};
use crate::mcp::protocol::{self, codes, RpcError};

/// Lines waiting for the writer (replies and notifications).
const OUTBOUND: usize = 1024;

/// Serve until stdin closes.
pub async fn serve(server: DemoServer) -> std::io::Result<()> {
    let (out_tx, out_rx) = mpsc::channel::<String>(OUTBOUND);
    let writer = std::thread::Builder::new().name("demo-stdout".into()).spawn(move || write_lines(out_rx))?;
    let mut in_rx = read_lines()?;
    *server.live.notify.lock() = Some(out_tx.clone());
    let session = Arc::new(Mutex::new(Session::default()));
    let mut outcome = Ok(());
    // The requests being handled; each holds a sender, so the writer waits for them too.
    let mut handling = tokio::task::JoinSet::new();
    while let Some(line) = in_rx.recv().await {
        while handling.try_join_next().is_some() {}
        let line = match line {
            Ok(line) => line,
            Err(err) => {
                outcome = Err(err);
                break;
            }
        };
        let Some(value) = parse_line(&line, &out_tx).await else {
            continue;
        };
        let is_initialize = value.get("method").and_then(Value::as_str) == Some("initialize");
        let handle = answer(server.clone(), session.clone(), value, out_tx.clone());
        // The handshake is answered in order; everything else runs concurrently.
        if is_initialize {
            handle.await;
        } else {
            handling.spawn(handle);
        }
    }
    while handling.join_next().await.is_some() {}
    drop(out_tx);
    server.live.notify.lock().take();
    // The writer ends once every sender is gone: after the replies still being worked on are written.
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    outcome
}

/// Stdin's lines, read on a thread of their own.
fn read_lines() -> std::io::Result<mpsc::Receiver<std::io::Result<String>>> {
    let (in_tx, in_rx) = mpsc::channel::<std::io::Result<String>>(OUTBOUND);
    // The reader blocks on stdin for as long as it is open; it ends with stdin (or when no one takes lines).
    std::thread::Builder::new().name("demo-stdin".into()).spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let failed = line.is_err();
            if in_tx.blocking_send(line).is_err() || failed {
                break;
            }
        }
    })?;
    Ok(in_rx)
}

/// The message on a line; none on a blank line, nor on one that is not JSON (answered with a parse error).
async fn parse_line(line: &str, out: &mpsc::Sender<String>) -> Option<Value> {
    if line.trim().is_empty() {
        return None;
    }
    match serde_json::from_str(line) {
        Ok(value) => Some(value),
        Err(err) => {
            let reply =
                protocol::error_response(None, RpcError::new(codes::PARSE_ERROR, format!("Parse error: {err}")));
            let _ = out.send(reply.to_string()).await;
            None
        }
    }
}

/// Handle one message in the connection's session and send the reply; a handshake initializes the session.
async fn answer(server: DemoServer, session: Arc<Mutex<Session>>, value: Value, out: mpsc::Sender<String>) {
    let current = session.lock().clone();
    match server.handle(value, &current).await {
        Reply::Response(response) => {
            let _ = out.send(response.to_string()).await;
        }
        Reply::Initialized { response, version } => {
            *session.lock() = Session { initialized: true, version: Some(version) };
            let _ = out.send(response.to_string()).await;
        }
        Reply::Nothing => {}
    }
}

/// Write each line as it comes, and every other line already waiting with it, then flush once.
fn write_lines(mut lines: mpsc::Receiver<String>) {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, stdout.lock());
    while let Some(line) = lines.blocking_recv() {
        let mut next = Some(line);
        while let Some(line) = next {
            if out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n")).is_err() {
                return;
            }
            next = lines.try_recv().ok();
        }
        if out.flush().is_err() {
            return;
        }
    }
}
