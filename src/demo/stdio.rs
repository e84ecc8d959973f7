//! The demo server over stdio: newline-delimited JSON-RPC, requests handled
//! concurrently, one writer owning stdout.

use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::{DemoServer, Reply, Session};
use crate::mcp::protocol::{self, codes, RpcError};

/// Serve until stdin closes.
pub async fn serve(server: DemoServer) -> std::io::Result<()> {
    let (out_tx, mut out_rx) = mpsc::channel::<String>(1024);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(mut line) = out_rx.recv().await {
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    *server.live.notify.lock() = Some(out_tx.clone());
    let session = Arc::new(Mutex::new(Session::default()));
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(&line) {
            Ok(value) => value,
            Err(err) => {
                let reply =
                    protocol::error_response(None, RpcError::new(codes::PARSE_ERROR, format!("Parse error: {err}")));
                let _ = out_tx.send(reply.to_string()).await;
                continue;
            }
        };
        let is_initialize = value.get("method").and_then(Value::as_str) == Some("initialize");
        let server = server.clone();
        let session = session.clone();
        let out_tx = out_tx.clone();
        let handle = async move {
            let current = session.lock().clone();
            match server.handle(value, &current).await {
                Reply::Response(response) => {
                    let _ = out_tx.send(response.to_string()).await;
                }
                Reply::Initialized { response, version } => {
                    *session.lock() = Session { initialized: true, version: Some(version) };
                    let _ = out_tx.send(response.to_string()).await;
                }
                Reply::Nothing => {}
            }
        };
        // The handshake is answered in order; everything else runs concurrently.
        if is_initialize {
            handle.await;
        } else {
            tokio::spawn(handle);
        }
    }
    drop(out_tx);
    server.live.notify.lock().take();
    let _ = writer.await;
    Ok(())
}
