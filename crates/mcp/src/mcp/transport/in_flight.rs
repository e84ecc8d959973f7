//! One request of ours that a server has not answered yet, on any transport. When it ends unanswered (it timed
//! out, or the caller's future was dropped), the transport forgets it and, unless it may not be cancelled
//! (`initialize`, which MCP forbids cancelling), tells the server to stop with `notifications/cancelled`, each
//! transport in its own way: a line on stdin, a POST to the legacy endpoint, a POST on the session.

use serde_json::{json, Value};

use crate::mcp::protocol;

/// What a transport does when one of its requests ends.
pub(super) trait Withdraw {
    /// The request ended, answered or not.
    fn ended(&self, _id: i64) {}
    /// It ended unanswered: forget it and, with a `notice`, tell the server to stop.
    fn abandoned(&self, id: i64, notice: Option<Value>);
}

/// A request in flight; `answered` is set once its answer came (or it never reached the server).
pub(super) struct InFlight<T: Withdraw> {
    id: i64,
    transport: T,
    pub answered: bool,
    cancellable: bool,
}

impl<T: Withdraw> InFlight<T> {
    pub fn new(transport: T, id: i64, method: &str) -> Self {
        InFlight { id, transport, answered: false, cancellable: method != "initialize" }
    }
}

impl<T: Withdraw> Drop for InFlight<T> {
    fn drop(&mut self) {
        self.transport.ended(self.id);
        if self.answered {
            return;
        }
        let notice = self.cancellable.then(|| {
            protocol::notification(
                "notifications/cancelled",
                Some(json!({"requestId": self.id, "reason": "the client gave up or the request timed out"})),
            )
        });
        self.transport.abandoned(self.id, notice);
    }
}
