//! What an upstream server says while one of our requests runs, on its way to the client that made the request:
//! notifications about the request (progress, log messages) and requests to the client (sampling, elicitation,
//! roots, ping), whose answers go back upstream under the server's own id. The transport that reads the server
//! hands these to the request's `Relay`; the HTTP edge turns them into messages on the client's stream.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::mcp::protocol::{codes, RpcError};

/// Messages queued for one client request before the server waits.
const CAPACITY: usize = 64;

/// One message from the server for the client.
#[derive(Debug)]
pub enum Inbound {
    Notification { method: String, params: Option<Value> },
    Request { method: String, params: Option<Value>, reply: oneshot::Sender<Result<Value, RpcError>> },
}

/// The way from an upstream request back to its client; cheap to clone.
#[derive(Debug, Clone)]
pub struct Relay {
    tx: mpsc::Sender<Inbound>,
    /// Whether requests reach the client end at all.
    answers: bool,
    /// Whether the client takes the server's requests as requests (a handshake-era session). A 2026-07-28
    /// client instead gets `input_required` results, which it answers by retrying.
    handshake: bool,
    /// What a handshake-era client declared at `initialize`, declared on its behalf to a 2026-07-28 server.
    capabilities: Option<std::sync::Arc<Value>>,
}

impl Relay {
    /// A relay and the receiving end the client's stream reads. `answers`: whether server requests can reach
    /// the client at all.
    pub fn channel(answers: bool) -> (Relay, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        (Relay { tx, answers, handshake: answers, capabilities: None }, rx)
    }

    /// A relay for a handshake-era client that declared `capabilities` at `initialize`.
    pub fn for_client(capabilities: std::sync::Arc<Value>) -> (Relay, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        let capabilities = Some(capabilities).filter(|c| c.is_object());
        (Relay { tx, answers: true, handshake: true, capabilities }, rx)
    }

    /// The capabilities of a handshake-era client, when known.
    pub fn client_capabilities(&self) -> Option<&Value> {
        self.capabilities.as_deref()
    }

    /// A relay for a 2026-07-28 request: requests reach the receiving end, which turns them into
    /// `input_required` results.
    pub fn stateless_channel() -> (Relay, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(CAPACITY);
        (Relay { tx, answers: true, handshake: false, capabilities: None }, rx)
    }

    /// Whether the client takes server requests as requests (handshake era), so the satellite answers an
    /// upstream's `input_required` result by asking it and retrying on its behalf.
    pub fn takes_requests(&self) -> bool {
        self.handshake
    }

    /// Pass a notification on; dropped when the client is gone or not keeping up (notifications are advisory).
    pub fn notify(&self, method: &str, params: Option<Value>) {
        let _ = self.tx.try_send(Inbound::Notification { method: method.to_owned(), params });
    }

    /// Ask the client and wait at most `timeout` for its answer. A client that cannot answer, is gone or does
    /// not answer in time makes this an error the server receives as the answer.
    pub async fn ask(&self, method: &str, params: Option<Value>, timeout: Duration) -> Result<Value, RpcError> {
        if !self.answers {
            return Err(unsupported(method));
        }
        let (reply, answer) = oneshot::channel();
        let request = Inbound::Request { method: method.to_owned(), params, reply };
        if self.tx.send(request).await.is_err() {
            return Err(RpcError::new(codes::INTERNAL_ERROR, "the client is gone"));
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(RpcError::new(codes::INTERNAL_ERROR, "the client is gone")),
            Err(_) => Err(RpcError::new(
                codes::INTERNAL_ERROR,
                format!("the client did not answer {method} within {}s", timeout.as_secs()),
            )),
        }
    }

    /// Whether the client end is still there.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The answer to a server request no client can take: what a client without that capability answers, except
/// for `ping` and `roots/list`, which have harmless answers.
pub fn local_answer(method: &str) -> Result<Value, RpcError> {
    match method {
        "ping" => Ok(json!({})),
        "roots/list" => Ok(json!({"roots": []})),
        other => Err(unsupported(other)),
    }
}

fn unsupported(method: &str) -> RpcError {
    RpcError::new(codes::METHOD_NOT_FOUND, format!("the client cannot take {method} here"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_reach_the_client_and_its_answer_comes_back() {
        let (relay, mut rx) = Relay::channel(true);
        let client = tokio::spawn(async move {
            match rx.recv().await {
                Some(Inbound::Request { method, reply, .. }) => {
                    assert_eq!(method, "sampling/createMessage");
                    let _ = reply.send(Ok(json!({"content": {"type": "text", "text": "hi"}})));
                }
                other => panic!("{other:?}"),
            }
        });
        let answer = relay.ask("sampling/createMessage", None, Duration::from_secs(5)).await.unwrap();
        assert_eq!(answer["content"]["text"], "hi");
        client.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_fails_after_its_timeout() {
        let (relay, _rx) = Relay::channel(true);
        let err = relay.ask("elicitation/create", None, Duration::from_secs(30)).await.unwrap_err();
        assert!(err.message.contains("did not answer"), "{}", err.message);
        let (stateless, _rx) = Relay::channel(false);
        assert_eq!(
            stateless.ask("sampling/createMessage", None, Duration::from_secs(1)).await.unwrap_err().code,
            -32601
        );
        let (gone, rx) = Relay::channel(true);
        drop(rx);
        assert!(gone.ask("roots/list", None, Duration::from_secs(1)).await.is_err());
    }
}
