//! `GET /metrics`: the Prometheus text exposition (docs/operations.md lists every family).
//!
//! Counted families come from `crate::metrics::Metrics`; the rest is read here when scraped from the parts
//! that already keep it (the instance manager, the session tables, the outbox, the backend monitor, the
//! introspection cache). With `SATELLITE_METRICS_TOKEN` set, the scraper must send it as a bearer token.

use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use super::session::SessionTable;
use super::sse::SseSessions;
use super::StatusDeps;
use crate::backend::monitor::{BackendMonitor, Channel};
use crate::instances::Instance;
use crate::metrics::Snapshot;
use crate::model::InstanceStatus;
use crate::store::Outbox;

/// What `/metrics` reads besides the status deps.
#[derive(Clone)]
pub struct ScrapeDeps {
    pub status: StatusDeps,
    pub sessions: Arc<SessionTable>,
    pub instance_sessions: Arc<SessionTable>,
    pub sse_sessions: Arc<SseSessions>,
    /// Required as a bearer token when set.
    pub token: Option<Arc<SecretString>>,
}

pub fn routes(deps: ScrapeDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer: warp clones a route's filters (and so what they capture) for every request it tries it on.
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    warp::path!("metrics")
        .and(super::allow::get())
        .and(warp::header::optional::<String>("authorization"))
        .and(with)
        .then(|authorization: Option<String>, deps: Arc<ScrapeDeps>| async move { scrape(&deps, authorization).await })
}

async fn scrape(deps: &ScrapeDeps, authorization: Option<String>) -> Response {
    if let Some(token) = &deps.token {
        let given = crate::auth::bearer(authorization.as_deref()).unwrap_or_default();
        let expected = token.expose_secret();
        if !bool::from(subtle::ConstantTimeEq::ct_eq(given.as_bytes(), expected.as_bytes())) {
            let reply = warp::reply::with_status(
                "metrics need the bearer token set in SATELLITE_METRICS_TOKEN\n",
                StatusCode::UNAUTHORIZED,
            );
            return warp::reply::with_header(reply, "www-authenticate", "Bearer").into_response();
        }
    }
    let snapshot = snapshot(deps).await;
    match deps.status.manager.metrics().render(&snapshot) {
        Ok(text) => {
            warp::reply::with_header(text, "content-type", "text/plain; version=0.0.4; charset=utf-8").into_response()
        }
        Err(err) => {
            tracing::warn!(error = %err, "rendering /metrics failed");
            warp::reply::with_status(format!("metrics unavailable: {err}\n"), StatusCode::INTERNAL_SERVER_ERROR)
                .into_response()
        }
    }
}

async fn snapshot(deps: &ScrapeDeps) -> Snapshot {
    let manager = &deps.status.manager;
    let instances = instance_counts(&manager.instances());
    let sessions = vec![
        ("hierarchical", deps.sessions.len() as u64),
        ("instance", deps.instance_sessions.len() as u64),
        ("sse", deps.sse_sessions.len() as u64),
    ];
    let mut snapshot = Snapshot {
        instances_by_status: instances.by_status,
        dormant: instances.dormant,
        upstream_connections: instances.connections,
        sessions,
        introspection: deps.status.analytics.auth.introspection_counts(),
        ready: *manager.ready().borrow(),
        analytics_dropped: (deps.status.analytics.recorder.dropped(), deps.status.analytics.recorder.rows_dropped()),
        ..Snapshot::default()
    };
    // The outbox is what waits for a backend: a standalone satellite has none (its events are local history).
    if let Some(monitor) = &deps.status.backend {
        snapshot.outbox = outbox(&deps.status.analytics.outbox).await;
        snapshot.backend = backend_attempts(monitor);
    }
    snapshot
}

/// What the instances are now: how many of each status, how many dormant, how many live upstream connections of
/// each transport.
struct InstanceCounts {
    by_status: Vec<(&'static str, u64)>,
    dormant: u64,
    connections: Vec<(&'static str, u64)>,
}

fn instance_counts(instances: &[Arc<Instance>]) -> InstanceCounts {
    let mut by_status: Vec<(&'static str, u64)> = InstanceStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    let mut connections: Vec<(&'static str, u64)> = vec![("stdio", 0), ("http", 0), ("sse", 0)];
    let mut dormant = 0;
    for instance in instances {
        let status = instance.state().as_str();
        if let Some(slot) = by_status.iter_mut().find(|(s, _)| *s == status) {
            slot.1 += 1;
        }
        if instance.is_dormant() {
            dormant += 1;
        }
        if instance.client().is_some() {
            let transport = instance.spec().upstream.transport_name();
            if let Some(slot) = connections.iter_mut().find(|(t, _)| *t == transport) {
                slot.1 += 1;
            }
        }
    }
    InstanceCounts { by_status, dormant, connections }
}

/// The events waiting in the outbox, and how old the oldest is; `None` when it cannot be read.
async fn outbox(outbox: &Outbox) -> Option<(u64, Duration)> {
    match outbox.outbox_summary().await {
        Ok(summary) => {
            let age = summary
                .oldest_emitted_at
                .as_deref()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .and_then(|t| (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).to_std().ok())
                .unwrap_or(Duration::ZERO);
            Some((u64::try_from(summary.count).unwrap_or(0), age))
        }
        Err(err) => {
            tracing::warn!(error = %err, "reading the outbox for /metrics failed");
            None
        }
    }
}

/// The attempts of each backend loop, as (name, ok, failed).
fn backend_attempts(monitor: &BackendMonitor) -> Vec<(&'static str, u64, u64)> {
    [
        ("heartbeat", Channel::Heartbeat),
        ("poll", Channel::Poll),
        ("config", Channel::Config),
        ("events", Channel::Events),
    ]
    .into_iter()
    .map(|(name, channel)| {
        let attempts = monitor.attempts(channel);
        (name, attempts.successes, attempts.failures)
    })
    .collect()
}
