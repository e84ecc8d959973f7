//! The legacy streams' table: each open stream's session, found again by each message, swept once idle, and the
//! report of its end.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::info;

use super::super::error::McpError;
use super::super::exchange::Exchange;
use crate::auth::Principal;
use crate::events::{ClientConnected, ClientDisconnected, Event};
use crate::mcp::transport::relay::SeatGuard;
use crate::model::UserId;

pub(super) struct SseSession {
    pub(super) principal: Principal,
    /// The `?toolset=` the stream was opened with; resolved again on every message, so an edited toolset applies.
    pub(super) toolset: Option<String>,
    pub(super) events: mpsc::Sender<warp::sse::Event>,
    pub(super) last_seen: Instant,
    pub(super) tool_calls: u64,
    /// Once the client initialized: its place among the owner's streams that a server's request outside any call
    /// reaches (`Seats`), with the capabilities it declared. Goes with the session.
    pub(super) seat: Option<SeatGuard>,
    /// What the client declared at `initialize` (`{}` past the bound a session keeps): a server's request during
    /// one of its calls reaches it only when it declared what the request needs, as on `/mcp`.
    pub(super) capabilities: Option<Arc<Value>>,
}

impl SseSession {
    /// A stream just opened: seen now, not yet initialized.
    pub(super) fn new(principal: Principal, toolset: Option<String>, events: mpsc::Sender<warp::sse::Event>) -> Self {
        Self { principal, toolset, events, last_seen: Instant::now(), tool_calls: 0, seat: None, capabilities: None }
    }
}

/// What a message reads of its stream's session.
pub(super) struct Touched {
    pub(super) toolset: Option<String>,
    pub(super) events: mpsc::Sender<warp::sse::Event>,
    pub(super) capabilities: Option<Arc<Value>>,
}

/// `mcp.client.connected` events of one user (in one team) reported per minute; the streams past it open alike
/// but are reported neither connected nor disconnected, so a client opening and closing streams in a loop cannot
/// flood the outbox (and push out other events). Real clients open a few a minute.
const CONNECTION_EVENTS_PER_MINUTE: u32 = 30;
/// Users whose connection events are counted at once.
const COUNTED_USERS: usize = 10_000;

pub struct SseSessions {
    pub(super) sessions: Mutex<HashMap<String, SseSession>>,
    /// Server requests awaiting the client's answer and calls it may cancel, per stream.
    pub(super) exchange: Arc<Exchange>,
    /// Connection events reported per user.
    reported: crate::events::Throttle,
}

impl Default for SseSessions {
    fn default() -> Self {
        Self {
            sessions: Mutex::default(),
            exchange: Arc::default(),
            reported: crate::events::Throttle::with_burst(
                Duration::from_secs(60),
                CONNECTION_EVENTS_PER_MINUTE,
                COUNTED_USERS,
            ),
        }
    }
}

impl SseSessions {
    /// Shutdown: end every legacy stream now (their senders go; requests in flight finish on their own).
    pub fn close_streams(&self) {
        self.sessions.lock().clear();
    }

    /// Open legacy SSE streams.
    pub fn len(&self) -> usize {
        self.sessions.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn sweep(&self, idle: Duration) -> usize {
        let mut sessions = self.sessions.lock();
        let before = sessions.len();
        sessions.retain(|_, s| s.last_seen.elapsed() < idle && !s.events.is_closed());
        before - sessions.len()
    }

    /// The session a message names, seen now, its tool call counted. It must be the identity that opened the
    /// stream.
    pub(super) fn touch(&self, id: &str, caller: &Principal, tool_call: bool) -> Result<Touched, McpError> {
        let mut table = self.sessions.lock();
        let session = table.get_mut(id).ok_or(McpError::SseSessionNotFound)?;
        if caller.user != session.principal.user || caller.team != session.principal.team {
            return Err(McpError::SseSessionOfAnother);
        }
        session.last_seen = Instant::now();
        session.tool_calls += u64::from(tool_call);
        Ok(Touched {
            toolset: session.toolset.clone(),
            events: session.events.clone(),
            capabilities: session.capabilities.clone(),
        })
    }

    /// The stream is gone or not keeping up: its session ends (and the stream with it).
    pub(super) fn end(&self, id: &str) {
        self.sessions.lock().remove(id);
    }

    /// Report a stream's connection, within its user's budget of reports; whether it was (only then is its end).
    pub(super) async fn report_connected(
        &self,
        events: &crate::events::Emitter,
        connected: ClientConnected,
        user: &UserId,
    ) -> bool {
        let user_key = super::super::callers::member_key(user.as_str(), &connected.team_id);
        let Some(held) = self.reported.allow(&user_key, Instant::now()) else { return false };
        if held > 0 {
            let team_id = &connected.team_id;
            info!(user = %user, team = %team_id, held, "legacy SSE streams opened past the reporting budget were not reported as connections");
        }
        events.emit(Event::client_connected(&connected)).await;
        true
    }
}

/// Removes the session when its stream is dropped (client gone) and reports `mcp.client.disconnected`.
pub(super) struct Unregister {
    pub(super) id: String,
    pub(super) sessions: Arc<SseSessions>,
    pub(super) emitter: crate::events::Emitter,
    /// Owns the task that records the disconnection (awaited at shutdown).
    pub(super) tasks: tokio_util::task::TaskTracker,
    pub(super) team_id: String,
    pub(super) opened: Instant,
    /// Whether the connection was reported; only then is its end.
    pub(super) reported: bool,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        let removed = self.sessions.sessions.lock().remove(&self.id);
        if !self.reported {
            return;
        }
        // A session the idle sweep already forgot timed out; otherwise the client went away.
        let (reason, tool_calls) = match &removed {
            Some(session) => ("client_close", session.tool_calls),
            None => ("timeout", 0),
        };
        let event = Event::client_disconnected(&ClientDisconnected {
            session_id: crate::secrets::session_reference(&self.id),
            team_id: self.team_id.clone(),
            connection_duration_seconds: self.opened.elapsed().as_secs(),
            tool_execution_count: tool_calls,
            disconnect_reason: reason,
        });
        let emitter = self.emitter.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            self.tasks.spawn(async move {
                emitter.emit(event).await;
            });
        }
    }
}
