//! The session: what `initialize` set up is kept, and replayed on a new session when the server forgets it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use tracing::info;

use super::{StreamableHttpTransport, SESSION_HEADER};
use crate::mcp::protocol::codes;
use crate::mcp::transport::{RequestHeaders, UpstreamError};

impl StreamableHttpTransport {
    /// Keep what `initialize` set up: the session the server handed out, and the request to replay on a new one.
    pub(super) fn remember_handshake(
        &self,
        response: &reqwest::Response,
        params: Option<Value>,
        headers: &RequestHeaders,
    ) {
        if let Some(session) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
            *self.session.lock() = Some(session.to_owned());
        }
        *self.handshake.lock() = Some(Box::new((params, headers.clone())));
    }

    /// Replay the handshake on a new session, the server having forgotten `gone`; nothing to do when another
    /// request already replaced it. (Each request that found it gone replaying it left the server an orphan
    /// session per request, and ran the restore of subscriptions and log level once each.)
    pub(super) async fn reinitialize(&self, gone: Option<String>) -> Result<(), UpstreamError> {
        let _one = self.renewing.lock().await;
        // Replaced by another request's renewal meanwhile. No session at all (a renewal that failed) is renewed
        // again here, or nothing would ever renew it.
        if self.session.lock().as_ref().is_some_and(|current| Some(current) != gone.as_ref()) {
            return Ok(());
        }
        info!(process_id = %self.label, "mcp session expired upstream, re-initializing once");
        *self.session.lock() = None;
        // Set before the handshake is replayed, cleared only once it succeeded: a renewal cut short (its request's
        // timeout, its caller gone) leaves no session either, and the next request must renew it.
        self.renewal_failed.store(true, Ordering::Release);
        let Some((params, headers)) = self.handshake.lock().clone().map(|kept| *kept) else {
            return Err(UpstreamError::Protocol("session lost before any initialize".into()));
        };
        let renewed = async {
            self.request_once("initialize", params, &headers, None, Duration::from_secs(30))
                .await
                .map_err(SendError::into_upstream)?;
            self.notify("notifications/initialized", None, &headers).await
        }
        .await;
        renewed?;
        self.renewal_failed.store(false, Ordering::Release);
        self.renewals.send_modify(|renewed| *renewed += 1);
        Ok(())
    }
}

/// Whether a 400's error says the server does not know the session it was sent. The spec answers an unknown
/// session with 404, but the SDKs' example servers, which many servers are built from, answer 400 "Bad Request: No
/// valid session ID provided" (server-everything among them): a server restarted that way would otherwise fail
/// every call until the instance is restarted, where a 404 costs one replayed handshake. Only a refusal of the
/// transport's kind counts: no request `id` (the server did not read the request), the SDKs' transport codes
/// (-32000, -32001), and a message saying the session is unknown; an application error worded alike is an answer.
pub(super) fn forgot_session(body: &Value) -> bool {
    let unread = body.get("id").is_none_or(Value::is_null);
    let code = body.pointer("/error/code").and_then(Value::as_i64);
    let transport = matches!(code, Some(codes::TRANSPORT_ERROR | codes::UNAUTHORIZED));
    let message = body.pointer("/error/message").and_then(Value::as_str).unwrap_or_default().to_ascii_lowercase();
    let unknown = message.contains("session") && (message.contains("no valid") || message.contains("not found"));
    unread && transport && unknown
}

/// An internal signal that the server no longer knows our session.
pub(super) enum SendError {
    SessionGone,
    Upstream(UpstreamError),
}

impl From<UpstreamError> for SendError {
    fn from(err: UpstreamError) -> Self {
        SendError::Upstream(err)
    }
}

impl SendError {
    pub(super) fn into_upstream(self) -> UpstreamError {
        match self {
            SendError::SessionGone => UpstreamError::HttpStatus { status: 404, body: "session not found".into() },
            SendError::Upstream(err) => err,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::forgot_session;

    #[test]
    fn a_400_saying_the_session_is_unknown_is_a_forgotten_session() {
        let refusal = |id: Value, code: i64, message: &str| json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        // server-everything's, as the TypeScript SDK's example servers answer.
        assert!(forgot_session(&refusal(Value::Null, -32000, "Bad Request: No valid session ID provided")));
        assert!(forgot_session(&json!({"jsonrpc": "2.0", "error": {"code": -32001, "message": "Session not found"}})));
        let required = refusal(Value::Null, -32000, "Bad Request: Mcp-Session-Id header is required");
        assert!(!forgot_session(&required), "asked for one, not forgotten");
        assert!(!forgot_session(&refusal(Value::Null, -32602, "Invalid params: uri not found")));
        let answered = refusal(json!(7), -32000, "session not found in the tenant's store");
        assert!(!forgot_session(&answered), "an answer to the request, not a refusal of the session");
        assert!(!forgot_session(&refusal(Value::Null, -32603, "Session not found")), "an application's error code");
    }
}
