//! `GET /`, `/healthz`, `/readyz` and `/api/status/debug` (SB §18).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use warp::http::StatusCode;
use warp::reply::Response;
use warp::{Filter, Reply};

use super::StatusDeps;
use crate::instances::{Instance, StatusEntry};
use crate::model::{tool_path, InstanceSpec, InstanceStatus};
use crate::secrets;

pub fn routes(deps: StatusDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer: warp clones a route's filters (and so what they capture) for every request it tries it on.
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    let root = warp::path::end().and(super::allow::get()).and(with.clone()).map(root);
    let debug = warp::path!("api" / "status" / "debug").and(super::allow::get()).and(with.clone()).map(debug);
    let backend = warp::path!("api" / "status" / "backend").and(super::allow::get()).and(with).then(backend);
    root.or(debug).unify().or(backend).unify()
}

/// `/healthz` and `/readyz`: asked by kubelets, load balancers and container health checks, which name the pod
/// or `127.0.0.1` in `Host`, so they are served outside the Host/Origin guard (they say nothing a page could use).
pub fn probes(deps: StatusDeps) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let deps = Arc::new(deps);
    let with = warp::any().map(move || deps.clone());
    let healthz = warp::path!("healthz")
        .and(super::allow::get())
        .map(|| warp::reply::json(&json!({"status": "ok"})).into_response());
    let readyz = warp::path!("readyz").and(super::allow::get()).and(with).map(readyz);
    healthz.or(readyz).unify()
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn root(deps: Arc<StatusDeps>) -> Response {
    let mut body = json!({"service": "satellite", "status": "healthy", "timestamp": now(), "mode": deps.mode});
    if deps.show_version {
        body["version"] = json!(env!("CARGO_PKG_VERSION"));
        body["source"] = json!(if cfg!(debug_assertions) { "debug" } else { "release" });
    }
    if deps.show_uptime {
        body["uptime"] = json!(deps.started.elapsed().as_secs());
    }
    warp::reply::json(&body).into_response()
}

/// SB §18.2: the backend connection (a live health check, cached for a few seconds), the satellite id, what the
/// heartbeat, poller, config fetch and uploader last did, and the outbox. Never a key. A standalone satellite has
/// no backend and says so.
async fn backend(deps: Arc<StatusDeps>) -> Response {
    match &deps.backend {
        Some(monitor) => {
            let mut report = monitor.report().await;
            report["token_checks"] = token_checks(&deps);
            warp::reply::json(&report).into_response()
        }
        None => {
            warp::reply::json(&json!({"mode": "standalone", "connection_status": "not_configured"})).into_response()
        }
    }
}

/// Managed mode: whether the control plane can check tokens now, and how many requests were admitted on tokens it
/// vouched for earlier while it could not.
fn token_checks(deps: &StatusDeps) -> Value {
    let auth = &deps.analytics.auth;
    let stale = auth.introspection_counts().map_or(0, |(_, _, stale)| stale);
    match auth.introspection_outage() {
        Some(outage) => json!({
            "state": "degraded",
            "since_seconds": outage.since.elapsed().as_secs(),
            "reason": outage.reason,
            "message": "the control plane cannot check tokens: tokens it accepted within the stale bound keep working, new ones get 503",
            "stale_answers": stale,
        }),
        None => json!({"state": "ok", "stale_answers": stale}),
    }
}

fn readyz(deps: Arc<StatusDeps>) -> Response {
    if *deps.manager.ready().borrow() {
        let mut body = json!({"status": "ready"});
        // Serving goes on; what is degraded is said, not hidden behind a 503 that would take the pod out.
        let mut degraded = serde_json::Map::new();
        if deps.analytics.auth.introspection_outage().is_some() {
            degraded.insert("token_checks".into(), token_checks(&deps));
        }
        if deps.analytics.volume.in_memory() {
            degraded.insert(
                "storage".into(),
                json!({"state": "memory", "message": "the data volume refuses the database file (read-only or full): calls are served; what is recorded is kept in memory and lost at the next stop"}),
            );
        } else if deps.analytics.volume.reserve().is_some_and(|r| r.volume_full()) {
            degraded.insert(
                "storage".into(),
                json!({"state": "volume_full", "message": "the data volume is full: calls are served; what the satellite records is written as space allows (the disk reserve was given back)"}),
            );
        }
        if !degraded.is_empty() {
            body["degraded"] = Value::Object(degraded);
        }
        warp::reply::json(&body).into_response()
    } else {
        let body = warp::reply::json(&json!({"status": "starting", "reason": "first configuration not applied yet"}));
        warp::reply::with_status(body, StatusCode::SERVICE_UNAVAILABLE).into_response()
    }
}

fn debug(deps: Arc<StatusDeps>) -> Response {
    if !deps.debug_route {
        let body = json!({
            "error": "Access Denied",
            "message": "Debug endpoint is disabled. Set DEPLOYSTACK_STATUS_SHOW_MCP_DEBUG_ROUTE=true to enable.",
        });
        return warp::reply::with_status(warp::reply::json(&body), StatusCode::FORBIDDEN).into_response();
    }
    warp::reply::json(&debug_body(&deps)).into_response()
}

fn debug_body(deps: &StatusDeps) -> Value {
    let manager = &deps.manager;
    let desired = manager.desired();
    let instances = manager.instances();
    let (mut teams, mut servers, mut tools) = (Teams::default(), ServerStatus::default(), Tools::default());
    for instance in &instances {
        // Read once: what the lists say of an instance agrees.
        let status = instance.status();
        teams.add(instance, &status);
        servers.add(instance.spec(), &status);
        tools.add(instance);
    }
    let (total_running, total_dormant, total_configured) = teams.totals();
    let servers_by_team = teams.into_json();
    json!({
        "timestamp": now(),
        "satellite_info": {"satellite_id": null, "mode": deps.mode, "version": env!("CARGO_PKG_VERSION"), "uptime_ms": deps.started.elapsed().as_millis() as u64},
        "servers_by_team": servers_by_team,
        "summary": {
            "total_teams": servers_by_team.len(),
            "total_running": total_running,
            "total_dormant": total_dormant,
            "processes": manager.processes(),
            "total_configured": total_configured,
            "total_servers": instances.len(),
        },
        "server_status": servers.into_json(instances.len()),
        "tools": tools.into_json(),
        "jobs": deps.jobs.stats(),
        "configuration": configuration(&desired),
    })
}

/// Where an instance stands: running (it has a process), dormant, or only configured.
#[derive(Clone, Copy)]
enum Standing {
    Running,
    Dormant,
    Configured,
}

impl Standing {
    fn of(pid: Option<u32>, dormant: bool) -> Self {
        match (pid.is_some(), dormant) {
            (true, _) => Self::Running,
            (false, true) => Self::Dormant,
            (false, false) => Self::Configured,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Dormant => "dormant",
            Self::Configured => "configured",
        }
    }
}

/// The instances of each team, by where they stand: the debug page's `servers_by_team`.
#[derive(Default)]
struct Teams(BTreeMap<String, Lists>);

/// (running, dormant, configured) of one team.
type Lists = (Vec<Value>, Vec<Value>, Vec<Value>);

impl Teams {
    fn add(&mut self, instance: &Instance, status: &StatusEntry) {
        let pid = instance.pid();
        let standing = Standing::of(pid, instance.is_dormant());
        let info = instance_info(instance, pid, standing, status);
        let team = self.0.entry(instance.spec().team_id.0.clone()).or_default();
        match standing {
            Standing::Running => team.0.push(info),
            Standing::Dormant => team.1.push(info),
            Standing::Configured => team.2.push(info),
        }
    }

    /// How many instances run, are dormant, and are only configured, across the teams.
    fn totals(&self) -> (usize, usize, usize) {
        let teams = self.0.values();
        let running = teams.clone().map(|t| t.0.len()).sum();
        let dormant = teams.clone().map(|t| t.1.len()).sum();
        let configured = teams.map(|t| t.2.len()).sum();
        (running, dormant, configured)
    }

    fn into_json(self) -> Map<String, Value> {
        self.0
            .into_iter()
            .map(|(team, (running, dormant, configured))| {
                (team, json!({"running": running, "dormant": dormant, "configured": configured}))
            })
            .collect()
    }
}

/// An instance as the debug page lists it under its team: its `ServerInfo`, where it stands, and how it fares.
fn instance_info(instance: &Instance, pid: Option<u32>, standing: Standing, status: &StatusEntry) -> Value {
    let mut info = server_info(instance.spec());
    info["status"] = json!(standing.name());
    info["in_flight_calls"] = json!(instance.in_flight());
    info["recent_crashes"] = json!(instance.recent_crashes());
    info["idle_ms"] = json!(instance.idle().0.as_millis() as u64);
    info["instance_status"] = json!(status.status.as_str());
    info["message"] = json!(status.message);
    if let Some(pid) = pid {
        info["pid"] = json!(pid);
    }
    if let Some(uptime) = instance.uptime() {
        info["uptime_ms"] = json!(uptime.as_millis() as u64);
    }
    // How its catalog departs from a compliant listing (a partial listing kept, another shape, the config's list).
    if let Some(fallbacks) = instance.catalog().map(|c| c.fallbacks.clone()).filter(|f| !f.is_empty()) {
        info["discovery_fallbacks"] = json!(fallbacks);
    }
    let tail = instance.stderr_tail();
    if !tail.is_empty() {
        info["stderr_tail"] = json!(tail.iter().rev().take(20).rev().collect::<Vec<_>>());
    }
    info
}

/// Each server's status, and how many are in each: the debug page's `server_status`.
#[derive(Default)]
struct ServerStatus {
    stats: BTreeMap<&'static str, u64>,
    servers: Map<String, Value>,
}

impl ServerStatus {
    fn add(&mut self, spec: &InstanceSpec, status: &StatusEntry) {
        let bucket = match status.status {
            InstanceStatus::Online => "online",
            InstanceStatus::Offline => "offline",
            InstanceStatus::Error => "error",
            InstanceStatus::RequiresReauth => "requires_reauth",
            _ => "other",
        };
        *self.stats.entry(bucket).or_default() += 1;
        self.servers.insert(
            spec.process_id.0.clone(),
            json!({"status": status.status.as_str(), "last_updated": status.updated_at.to_rfc3339_opts(SecondsFormat::Millis, true), "message": status.message}),
        );
    }

    fn into_json(self, total: usize) -> Value {
        let count = |bucket: &str| self.stats.get(bucket).copied().unwrap_or(0);
        json!({
            "stats": {
                "total": total,
                "online": count("online"),
                "offline": count("offline"),
                "error": count("error"),
                "requires_reauth": count("requires_reauth"),
                "other": count("other"),
            },
            "servers": self.servers,
        })
    }
}

/// The tools the instances discovered: the debug page's `tools`.
#[derive(Default)]
struct Tools {
    all: Vec<Value>,
    by_transport: BTreeMap<&'static str, u64>,
    by_server: Map<String, Value>,
}

impl Tools {
    fn add(&mut self, instance: &Instance) {
        let Some(catalog) = instance.catalog() else { return };
        let spec = instance.spec();
        let transport = spec.upstream.transport_name();
        *self.by_transport.entry(transport).or_default() += catalog.tools.len() as u64;
        self.by_server.insert(spec.process_id.0.clone(), json!(catalog.tools.len()));
        for tool in &catalog.tools {
            self.all.push(json!({
                "namespaced_name": tool_path(&spec.server_slug, tool.name()),
                "original_name": tool.name(),
                "server_name": spec.process_id.0,
                "server_slug": spec.server_slug,
                "user_id": spec.user_id.0,
                "transport": transport,
                "description": tool.description(),
                "content_hash": tool.content_hash(),
                "discovered_at": catalog.discovered_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            }));
        }
    }

    fn into_json(self) -> Value {
        json!({
            "total_tools": self.all.len(),
            "tools_by_transport": self.by_transport,
            "tools_by_server": self.by_server,
            "all_tools": self.all,
        })
    }
}

/// The servers the configuration lists, enabled or not, and by transport: the debug page's `configuration`.
fn configuration(desired: &[InstanceSpec]) -> Value {
    let mut by_transport: BTreeMap<&str, u64> = BTreeMap::new();
    for spec in desired {
        *by_transport.entry(spec.upstream.transport_name()).or_default() += 1;
    }
    let enabled = desired.iter().filter(|s| s.enabled).count();
    json!({
        "total_servers_configured": desired.len(),
        "enabled_servers": enabled,
        "disabled_servers": desired.len() - enabled,
        "servers_by_transport": by_transport,
    })
}

/// `ServerInfo` of SB §18.3, secrets masked.
fn server_info(spec: &InstanceSpec) -> Value {
    let mut info = json!({
        "installation_name": spec.process_id.0,
        "installation_id": spec.installation_id.0,
        "team_id": spec.team_id.0,
        "team_slug": spec.team_slug,
        "user_id": spec.user_id.0,
        "server_slug": spec.server_slug,
        "instance_path": spec.instance_path,
        "transport_type": spec.upstream.transport_name(),
    });
    let listed = secrets::masked_upstream(spec);
    for key in ["command", "args", "url"] {
        if let Some(value) = listed.get(key) {
            info[key] = value.clone();
        }
    }
    info
}
