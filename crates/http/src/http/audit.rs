//! `security.auth.failed` (BP §8.5-20) for refused callers of the MCP endpoints: an invalid or expired bearer,
//! a missing scope, a wrong instance token or path, a legacy SSE session used by another identity. A first
//! request without any token is the normal start of the OAuth flow and is not reported. At most one event per
//! source (the TCP peer, which a client cannot forge) per minute, with the count of those held back. The token
//! itself never appears; at most the first 8 hex digits of its SHA-256.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warp::http::HeaderMap;
use warp::reply::Response;

use super::error::McpError;
use super::stack::PeerAddr;
use super::Gate;
use crate::auth::{self, AuthError};

use crate::events::{AuthFailure, Emitter, Event, Throttle};

/// At most one event per source in this window.
const WINDOW: Duration = Duration::from_secs(60);
/// Sources remembered at once.
const SOURCES: usize = 10_000;

pub struct AuthAudit {
    events: Emitter,
    throttle: Throttle,
}

/// One refused request.
pub struct Refusal<'a> {
    /// `mcp`, `instance` or `sse`.
    pub endpoint: &'static str,
    pub peer: Option<SocketAddr>,
    pub headers: &'a HeaderMap,
    /// The credential presented, if any: only its hash prefix is reported.
    pub token: Option<&'a str>,
    pub reason: String,
    pub team_id: Option<String>,
    pub client_id: Option<String>,
}

impl AuthAudit {
    pub fn new(events: Emitter) -> Self {
        Self { events, throttle: Throttle::new(WINDOW, SOURCES) }
    }

    pub async fn refused(&self, refusal: Refusal<'_>) {
        let source = refusal.peer.map(|p| p.ip().to_string()).unwrap_or_else(|| "unknown".into());
        let Some(suppressed) = self.throttle.allow(&source, Instant::now()) else { return };
        let header = |name: &str| refusal.headers.get(name).and_then(|v| v.to_str().ok());
        // The connection's own address, which the caller cannot choose; a forwarding header's is kept beside it.
        // Before, the header's address stood in for it: anyone guessing tokens could record any address they liked.
        let forwarded = crate::activity::ip_address(header("x-forwarded-for"), header("x-real-ip"));
        let forwarded_for = (forwarded != "unknown" && forwarded != source).then_some(forwarded);
        let failure = AuthFailure {
            reason: refusal.reason,
            team_id: refusal.team_id,
            client_id: refusal.client_id,
            ip_address: source,
            forwarded_for,
            endpoint: refusal.endpoint,
            token_sha256_prefix: refusal
                .token
                .filter(|t| !t.is_empty())
                .map(|t| crate::config::sha256_hex(t)[..8].to_owned()),
            suppressed_count: suppressed,
        };
        tracing::warn!(endpoint = failure.endpoint, ip = %failure.ip_address, forwarded_for = failure.forwarded_for.as_deref(), reason = %failure.reason,
                       suppressed = failure.suppressed_count, "request refused: authentication failed");
        self.events.emit(Event::auth_failed(&failure)).await;
    }
}

/// The one place an MCP endpoint's outcome becomes a response; a refused credential is audited on the way.
pub(super) async fn finish(
    gate: &Gate,
    endpoint: &'static str,
    peer: Option<PeerAddr>,
    headers: &HeaderMap,
    query_token: Option<&str>,
    answer: Result<Response, McpError>,
) -> Response {
    let err = match answer {
        Ok(response) => return response,
        Err(err) => err,
    };
    let reason = match &err {
        // The control plane could not be asked: not a failed authentication of the client.
        McpError::Auth(AuthError::Missing | AuthError::Unavailable(_)) => None,
        McpError::Auth(other) => Some(other.to_string()),
        McpError::InstanceAuth(other) => Some(other.to_string()),
        McpError::SseSessionOfAnother => Some("legacy SSE session used by another identity".to_owned()),
        _ => None,
    };
    if let Some(reason) = reason {
        let token = query_token.or_else(|| auth::bearer(headers.get("authorization").and_then(|v| v.to_str().ok())));
        gate.audit
            .refused(Refusal {
                endpoint,
                peer: peer.map(|p| p.0),
                headers,
                token,
                reason,
                team_id: None,
                client_id: headers.get("x-mcp-client-name").and_then(|v| v.to_str().ok()).map(str::to_owned),
            })
            .await;
    }
    err.into_response(&gate.urls)
}
