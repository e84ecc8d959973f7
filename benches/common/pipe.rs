//! The least a client of a stdio MCP server can do, the floor the satellite's own client is measured against:
//! one writer, one reader matching ids, nothing else.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::oneshot;

/// The least a client can do: one writer, one reader matching ids.
pub struct BarePipe {
    stdin: tokio::sync::Mutex<ChildStdin>,
    waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    next: std::sync::atomic::AtomicU64,
    child: tokio::process::Child,
}

impl BarePipe {
    pub async fn start_demo() -> BarePipe {
        Self::start_command(Path::new(env!("CARGO_BIN_EXE_satellite")), &["demo-server", "--protocol", "legacy"]).await
    }

    pub async fn start_command(program: &Path, args: &[&str]) -> BarePipe {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {}: {err}", program.display()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let reader_waiters = waiters.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(value) = serde_json::from_str::<Value>(&line) else { continue };
                if let Some(id) = value.get("id").and_then(Value::as_u64) {
                    if let Some(tx) = reader_waiters.lock().remove(&id) {
                        let _ = tx.send(value);
                    }
                }
            }
        });
        let pipe = BarePipe { stdin: tokio::sync::Mutex::new(stdin), waiters, next: 1.into(), child };
        pipe.call("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bare", "version": "0"}}))
            .await;
        pipe.send_line(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        pipe
    }

    async fn send_line(&self, value: Value) {
        let mut line = value.to_string();
        line.push('\n');
        let mut stdin = self.stdin.lock().await;
        stdin.write_all(line.as_bytes()).await.expect("write");
        stdin.flush().await.expect("flush");
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub async fn call(&self, method: &str, params: Value) -> Value {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(id, tx);
        self.send_line(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        rx.await.expect("answer")
    }
}
