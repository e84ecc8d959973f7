//! Prometheus metrics (`GET /metrics`): what the satellite counts as it works (requests, discovers, tool
//! calls), plus what is read when scraped (instances by status, the outbox, the backend loops, the
//! introspection cache, the process). One [`Metrics`] per satellite, cheap to clone; every family is
//! documented in docs/operations.md.
//!
//! Labels are bounded: routes are templates (never a raw path or an instance path), servers are catalogue
//! slugs, outcomes and statuses are closed sets. Nothing here ever carries a user, a token or an argument.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets in seconds: from a cached discover (~0.2 ms) to a slow tool (minutes).
const BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// How one `tools/call` to an upstream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// A result without `isError`.
    Ok,
    /// A result with `isError: true`: the tool ran and said no.
    ToolError,
    /// No result: the server was unreachable, crashed, timed out or answered a JSON-RPC error.
    Failed,
    /// Refused before reaching the server: every call slot of the instance stayed busy.
    Busy,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::ToolError => "tool_error",
            CallOutcome::Failed => "failed",
            CallOutcome::Busy => "busy",
        }
    }
}

/// One series of a counter family, held by what counts it: an increment is an atomic add, with no label lookup.
#[derive(Clone)]
pub struct Counter(IntCounter);

impl Counter {
    pub fn inc(&self) {
        self.0.inc();
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counter({})", self.0.get())
    }
}

/// The metrics the satellite updates as it works; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    discover_duration: HistogramVec,
    tool_calls: IntCounterVec,
    tool_call_duration: HistogramVec,
    stdout_junk_lines: IntCounterVec,
    limit_refusals: IntCounterVec,
}

impl Inner {
    /// The counted families and the process's own, in the satellite's registry.
    fn register(&self) -> Result<(), prometheus::Error> {
        for collector in [
            Box::new(self.http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(self.http_duration.clone()),
            Box::new(self.discover_duration.clone()),
            Box::new(self.tool_calls.clone()),
            Box::new(self.tool_call_duration.clone()),
            Box::new(self.stdout_junk_lines.clone()),
            Box::new(self.limit_refusals.clone()),
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        ] {
            self.registry.register(collector)?;
        }
        Ok(())
    }
}

/// A counter family with these labels.
fn counters(name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

/// A latency family in seconds over [`BUCKETS`], with these labels.
fn latencies(name: &str, help: &str, labels: &[&str]) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), labels)
}

/// Values read when `/metrics` is scraped, from the parts that already keep them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Instances by status (`online`, `dormant`'s underlying status is counted too).
    pub instances_by_status: Vec<(&'static str, u64)>,
    /// Stdio instances asleep (no process; the next call wakes them).
    pub dormant: u64,
    /// Live upstream connections by transport (`stdio` processes, `http`, `sse`).
    pub upstream_connections: Vec<(&'static str, u64)>,
    /// Open MCP sessions by kind (`hierarchical`, `instance`, `sse`).
    pub sessions: Vec<(&'static str, u64)>,
    /// Managed mode: events waiting in the outbox, and how old the oldest is (zero when empty).
    pub outbox: Option<(u64, Duration)>,
    /// Managed mode: attempts per backend loop (`heartbeat`, `poll`, `config`, `events`) as (ok, failed).
    pub backend: Vec<(&'static str, u64, u64)>,
    /// Managed mode: bearer tokens answered from the introspection cache, those asked of the backend, and those
    /// admitted on a stale entry while the backend could not be asked.
    pub introspection: Option<(u64, u64, u64)>,
    /// Whether the first configuration has been applied (what `/readyz` says).
    pub ready: bool,
    /// Analytics facts dropped with the recorder's queue full, and rows dropped past what is kept for a database
    /// that refuses them.
    pub analytics_dropped: (u64, u64),
}

impl Metrics {
    /// The families, registered once; fails only if two had the same name (a programming error).
    pub fn new() -> Result<Self, prometheus::Error> {
        let inner = Inner {
            registry: Registry::new(),
            http_requests: counters(
                "satellite_http_requests_total",
                "HTTP requests answered, by route template, method and status",
                &["route", "method", "status"],
            )?,
            http_duration: latencies(
                "satellite_http_request_duration_seconds",
                "Time until the response started, by route template and method",
                &["route", "method"],
            )?,
            discover_duration: latencies(
                "satellite_discover_duration_seconds",
                "discover_mcp_tools searches, by whether it found any tool",
                &["found"],
            )?,
            tool_calls: counters(
                "satellite_tool_calls_total",
                "tools/call forwarded to an MCP server, by server slug and outcome",
                &["server", "outcome"],
            )?,
            tool_call_duration: latencies(
                "satellite_tool_call_duration_seconds",
                "tools/call round trips to MCP servers, by server slug",
                &["server"],
            )?,
            stdout_junk_lines: counters(
                "satellite_stdio_junk_lines_total",
                "Lines stdio MCP servers wrote on stdout that are not JSON-RPC (logged or not), by server slug",
                &["server"],
            )?,
            limit_refusals: counters(
                "satellite_limit_refusals_total",
                "Tool calls a rate limit or quota refused ([[limits]]), by rule",
                &["rule"],
            )?,
        };
        inner.register()?;
        Ok(Metrics { inner: Arc::new(inner) })
    }

    /// One HTTP request answered.
    pub fn http_request(&self, route: &str, method: &str, status: u16, took: Duration) {
        let status = status_label(status);
        self.inner.http_requests.with_label_values(&[route, method, status]).inc();
        self.inner.http_duration.with_label_values(&[route, method]).observe(took.as_secs_f64());
    }

    /// One `discover_mcp_tools` search.
    pub fn discover(&self, took: Duration, found: bool) {
        let found = if found { "true" } else { "false" };
        self.inner.discover_duration.with_label_values(&[found]).observe(took.as_secs_f64());
    }

    /// One `tools/call` to an upstream server.
    pub fn tool_call(&self, server: &str, outcome: CallOutcome, took: Duration) {
        self.inner.tool_calls.with_label_values(&[server, outcome.as_str()]).inc();
        if outcome != CallOutcome::Busy {
            self.inner.tool_call_duration.with_label_values(&[server]).observe(took.as_secs_f64());
        }
    }

    /// A tool call a rate limit or quota refused, under the rule's name.
    pub fn limit_refusal(&self, rule: &str) {
        self.inner.limit_refusals.with_label_values(&[rule]).inc();
    }

    /// The count of a stdio server's stdout lines that are not JSON-RPC, for its transport to hold.
    pub fn stdout_junk_lines(&self, server: &str) -> Counter {
        Counter(self.inner.stdout_junk_lines.with_label_values(&[server]))
    }

    /// The Prometheus text exposition: the counted families, then the scrape-time `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> Result<String, prometheus::Error> {
        let mut families = self.inner.registry.gather();
        families.extend(snapshot_registry(snapshot)?.gather());
        let mut out = Vec::new();
        TextEncoder::new().encode(&families, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// Status codes as their own text; only the three-digit codes HTTP has.
fn status_label(status: u16) -> &'static str {
    const CODES: [(u16, &str); 17] = [
        (200, "200"),
        (202, "202"),
        (204, "204"),
        (301, "301"),
        (304, "304"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (405, "405"),
        (406, "406"),
        (413, "413"),
        (415, "415"),
        (429, "429"),
        (500, "500"),
        (503, "503"),
        (504, "504"),
    ];
    match CODES.iter().find(|(code, _)| *code == status) {
        Some((_, label)) => label,
        None => match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        },
    }
}

/// The scrape-time values as families of their own registry (built per scrape: a few dozen series).
fn snapshot_registry(snapshot: &Snapshot) -> Result<Registry, prometheus::Error> {
    let registry = Registry::new();
    let instances = ("satellite_instances", "MCP server instances by status");
    register_gauges(&registry, instances, "status", &snapshot.instances_by_status)?;
    let dormant = IntGauge::new("satellite_instances_dormant", "Stdio instances asleep; the next call wakes them")?;
    dormant.set(gauge(snapshot.dormant));
    registry.register(Box::new(dormant))?;
    let connections = ("satellite_upstream_connections", "Live connections to MCP servers, by transport");
    register_gauges(&registry, connections, "transport", &snapshot.upstream_connections)?;
    let sessions = ("satellite_mcp_sessions", "Open MCP client sessions, by endpoint kind");
    register_gauges(&registry, sessions, "kind", &snapshot.sessions)?;
    if let Some((count, age)) = snapshot.outbox {
        register_outbox(&registry, count, age)?;
    }
    register_backend(&registry, &snapshot.backend)?;
    if let Some((hits, misses, stale)) = snapshot.introspection {
        let cache = (
            "satellite_introspection_cache_total",
            "Managed mode: bearer tokens answered from the introspection cache (hit), asked of the backend (miss), \
             or admitted on an expired entry while the backend could not be asked (stale)",
        );
        register_counts(&registry, cache, "result", &[("hit", hits), ("miss", misses), ("stale", stale)])?;
    }
    let analytics = (
        "satellite_analytics_dropped_total",
        "Token-savings facts lost: queue (the recorder's queue was full) or store (the database refused them past \
         what is kept for it)",
    );
    let (queue, store) = snapshot.analytics_dropped;
    register_counts(&registry, analytics, "stage", &[("queue", queue), ("store", store)])?;
    let ready = IntGauge::new("satellite_ready", "1 once the first configuration is applied (what /readyz says)")?;
    ready.set(i64::from(snapshot.ready));
    registry.register(Box::new(ready))?;
    let info = IntGaugeVec::new(Opts::new("satellite_build_info", "The running version"), &["version"])?;
    info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    registry.register(Box::new(info))?;
    Ok(registry)
}

/// A family's name and help.
type Family = (&'static str, &'static str);

/// A gauge family of one label, a series per value.
fn register_gauges(
    registry: &Registry,
    (name, help): Family,
    label: &str,
    values: &[(&'static str, u64)],
) -> Result<(), prometheus::Error> {
    let gauges = IntGaugeVec::new(Opts::new(name, help), &[label])?;
    for (value, count) in values {
        gauges.with_label_values(&[value]).set(gauge(*count));
    }
    registry.register(Box::new(gauges))
}

/// A counter family of one label, a series per value.
fn register_counts(
    registry: &Registry,
    (name, help): Family,
    label: &str,
    values: &[(&str, u64)],
) -> Result<(), prometheus::Error> {
    let counts = IntCounterVec::new(Opts::new(name, help), &[label])?;
    for (value, count) in values {
        counts.with_label_values(&[value]).inc_by(*count);
    }
    registry.register(Box::new(counts))
}

/// Managed mode: how many events wait in the outbox, and how old the oldest is.
fn register_outbox(registry: &Registry, count: u64, age: Duration) -> Result<(), prometheus::Error> {
    let depth = IntGauge::new("satellite_outbox_events", "Managed mode: events waiting in the outbox for the backend")?;
    depth.set(gauge(count));
    registry.register(Box::new(depth))?;
    let oldest = prometheus::Gauge::new(
        "satellite_outbox_oldest_age_seconds",
        "Managed mode: age of the oldest event waiting in the outbox (0 when empty)",
    )?;
    oldest.set(age.as_secs_f64());
    registry.register(Box::new(oldest))
}

/// Managed mode: each backend loop's attempts, as ok and failed.
fn register_backend(registry: &Registry, loops: &[(&'static str, u64, u64)]) -> Result<(), prometheus::Error> {
    let backend = IntCounterVec::new(
        Opts::new("satellite_backend_requests_total", "Managed mode: exchanges with the backend, by loop and outcome"),
        &["operation", "outcome"],
    )?;
    for (operation, ok, failed) in loops {
        backend.with_label_values(&[operation, "ok"]).inc_by(*ok);
        backend.with_label_values(&[operation, "failed"]).inc_by(*failed);
    }
    registry.register(Box::new(backend))
}

fn gauge(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_renders_with_bounded_labels() -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        metrics.http_request("/mcp", "POST", 200, Duration::from_millis(2));
        metrics.http_request("/mcp", "POST", 299, Duration::from_millis(2));
        metrics.discover(Duration::from_micros(300), true);
        metrics.tool_call("demo", CallOutcome::ToolError, Duration::from_millis(5));
        let junk = metrics.stdout_junk_lines("noisy");
        junk.inc();
        junk.inc();
        let snapshot = Snapshot {
            analytics_dropped: (4, 5),
            instances_by_status: vec![("online", 2)],
            dormant: 1,
            upstream_connections: vec![("stdio", 1)],
            sessions: vec![("hierarchical", 3)],
            outbox: Some((4, Duration::from_secs(9))),
            backend: vec![("heartbeat", 5, 1)],
            introspection: Some((1, 2, 3)),
            ready: true,
        };
        let text = metrics.render(&snapshot)?;
        for line in [
            "satellite_http_requests_total{method=\"POST\",route=\"/mcp\",status=\"200\"} 1",
            "satellite_http_requests_total{method=\"POST\",route=\"/mcp\",status=\"2xx\"} 1",
            "satellite_discover_duration_seconds_count{found=\"true\"} 1",
            "satellite_tool_calls_total{outcome=\"tool_error\",server=\"demo\"} 1",
            "satellite_stdio_junk_lines_total{server=\"noisy\"} 2",
            "satellite_introspection_cache_total{result=\"miss\"} 2",
            "satellite_introspection_cache_total{result=\"stale\"} 3",
            "satellite_analytics_dropped_total{stage=\"queue\"} 4",
            "satellite_analytics_dropped_total{stage=\"store\"} 5",
            "satellite_instances{status=\"online\"} 2",
            "satellite_instances_dormant 1",
            "satellite_upstream_connections{transport=\"stdio\"} 1",
            "satellite_outbox_events 4",
            "satellite_outbox_oldest_age_seconds 9",
            "satellite_backend_requests_total{operation=\"heartbeat\",outcome=\"failed\"} 1",
            "satellite_ready 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(text.contains("process_resident_memory_bytes"), "process metrics: {text}");
        Ok(())
    }
}
