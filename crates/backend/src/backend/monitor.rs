//! What the managed runtime last did with the backend, for `GET /api/status/backend`: the outcome and time of
//! the last heartbeat, poll, config fetch and event batch, a live reachability check (cached briefly, so the
//! route cannot be used to flood the backend), and the outbox. Never a key or a token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{json, Value};

use super::client::BackendClient;
use crate::model::iso;
use crate::store::Outbox;

/// A live reachability check is reused this long.
const HEALTH_CACHE: Duration = Duration::from_secs(5);

/// One exchange with the backend the runtime repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Heartbeat,
    Poll,
    Config,
    Events,
}

/// The last attempt on one channel, with running counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Attempts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ok: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<String>,
    pub successes: u64,
    pub failures: u64,
    pub consecutive_failures: u64,
}

impl Attempts {
    fn record(&mut self, outcome: Result<(), String>) {
        let now = iso(Utc::now());
        self.last_at = Some(now.clone());
        match outcome {
            Ok(()) => {
                self.successes += 1;
                self.consecutive_failures = 0;
                self.last_ok = Some(true);
                self.last_error = None;
                self.last_success_at = Some(now);
            }
            Err(error) => {
                self.failures += 1;
                self.consecutive_failures += 1;
                self.last_ok = Some(false);
                self.last_error = Some(error);
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    heartbeat: Attempts,
    poll: Attempts,
    config: Attempts,
    events: Attempts,
    health: Option<(Instant, Value)>,
    role: Role,
}

/// What this satellite does among replicas on one database (docs/scale-out.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The only satellite on its (SQLite) database: it does everything.
    #[default]
    Single,
    /// Holds the leader lock: heartbeats, command polling and results.
    Leader,
    /// Serves, uploads events and runs the leader's commands; waits for the lock.
    Follower,
}

pub struct BackendMonitor {
    client: Arc<BackendClient>,
    /// This process among replicas (`ManagedDeps::replica_id`), set once the runtime starts.
    replica_id: Mutex<Option<String>>,
    /// The event outbox, whose depth the report shows.
    outbox: Outbox,
    state: Mutex<State>,
}

impl BackendMonitor {
    pub fn new(client: Arc<BackendClient>, outbox: Outbox) -> Self {
        Self { client, outbox, state: Mutex::new(State::default()), replica_id: Mutex::new(None) }
    }

    /// Record one attempt; `Err` carries the error text (never a credential: `BackendError` has none).
    pub fn record(&self, channel: Channel, outcome: Result<(), String>) {
        let mut state = self.state.lock();
        let attempts = match channel {
            Channel::Heartbeat => &mut state.heartbeat,
            Channel::Poll => &mut state.poll,
            Channel::Config => &mut state.config,
            Channel::Events => &mut state.events,
        };
        attempts.record(outcome);
    }

    pub fn set_replica_id(&self, id: &str) {
        *self.replica_id.lock() = Some(id.to_owned());
    }

    pub fn set_role(&self, role: Role) {
        self.state.lock().role = role;
    }

    pub fn role(&self) -> Role {
        self.state.lock().role
    }

    /// The attempts on one channel so far.
    pub fn attempts(&self, channel: Channel) -> Attempts {
        let state = self.state.lock();
        match channel {
            Channel::Heartbeat => state.heartbeat.clone(),
            Channel::Poll => state.poll.clone(),
            Channel::Config => state.config.clone(),
            Channel::Events => state.events.clone(),
        }
    }

    /// The `GET /api/status/backend` body (SB §18.2 plus the runtime's own view).
    pub async fn report(&self) -> Value {
        let health = self.health().await;
        let outbox = match self.outbox.outbox_summary().await {
            Ok(summary) => {
                let oldest_age = summary
                    .oldest_emitted_at
                    .as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| (Utc::now() - t.with_timezone(&Utc)).num_seconds().max(0));
                json!({"depth": summary.count, "held": summary.held, "oldest_age_seconds": oldest_age})
            }
            Err(err) => json!({"error": err.to_string()}),
        };
        let state = self.state.lock();
        let mut body = health;
        body["satellite_id"] = json!(self.client.satellite_id());
        body["replica_role"] = json!(state.role);
        body["replica_id"] = json!(*self.replica_id.lock());
        body["heartbeat"] = json!(state.heartbeat);
        body["poll"] = json!(state.poll);
        body["config"] = json!(state.config);
        body["events"] = json!(state.events);
        body["outbox"] = outbox;
        body
    }

    /// A live `GET /api/health` (BP E1), reused for a few seconds.
    async fn health(&self) -> Value {
        if let Some((at, cached)) = &self.state.lock().health {
            if at.elapsed() < HEALTH_CACHE {
                return cached.clone();
            }
        }
        let began = Instant::now();
        let answer = self.client.health().await;
        let mut body = json!({
            "backend_url": self.client.base_url(),
            "response_time_ms": began.elapsed().as_millis() as u64,
            "last_check": iso(Utc::now()),
        });
        match answer {
            Ok(_) => body["connection_status"] = json!("connected"),
            Err(err @ (super::client::BackendError::Network { .. } | super::client::BackendError::Timeout { .. })) => {
                body["connection_status"] = json!("disconnected");
                body["error_message"] = json!(err.to_string());
            }
            Err(err) => {
                body["connection_status"] = json!("error");
                body["error_message"] = json!(err.to_string());
            }
        }
        self.state.lock().health = Some((Instant::now(), body.clone()));
        body
    }
}
