//! The heartbeat (BP §3): a fixed wall-clock tick, each beat with the `mcp_status` snapshot of §3.3.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::backend::client::{BackendError, Refusal};
use crate::backend::metrics::ProcessMetrics;
use crate::backend::monitor::Channel;
use crate::backend::retry_after::{self, Hold};
use crate::backend::wire::{
    HealthStatus, HeartbeatRequest, McpInstanceStatus, McpStatus, McpStatusSummary, ProcessMetric, ProcessStatus,
    SatelliteStatus, ServerStatusCounts, SystemMetrics, ToolName, Transport,
};
use crate::instances::Instance;
use crate::model::iso;
use crate::model::{tool_path, InstanceStatus, Upstream};

use super::{ManagedDeps, ManagedStats};

pub(super) async fn heartbeat_loop(
    deps: ManagedDeps,
    metrics: Arc<Mutex<ProcessMetrics>>,
    stats: Arc<Mutex<ManagedStats>>,
    url_sent: Arc<AtomicBool>,
    cancel: CancellationToken,
) {
    let every = deps.heartbeat_every;
    let beater =
        Arc::new(Beater { deps, metrics, stats, url_sent, slim: AtomicBool::new(false), hold: Hold::default() });
    let beat = {
        let beater = beater.clone();
        move || beater.clone().beat()
    };
    beat_cadence(every, cancel, &beater.hold, beat).await;
}

/// What each beat needs, and what the beats tell the ones after them.
struct Beater {
    deps: ManagedDeps,
    metrics: Arc<Mutex<ProcessMetrics>>,
    stats: Arc<Mutex<ManagedStats>>,
    url_sent: Arc<AtomicBool>,
    /// Set once the backend refused a beat as too large (413): the beats after it leave out the lists that grow
    /// with the instances and tools (the summary and counts stay). Before, the same beat went every 30 s and was
    /// refused every time, and the backend saw the satellite as gone.
    slim: AtomicBool,
    /// The backend's `Retry-After` on a refused beat (429, 503): no beat goes before it has passed.
    hold: Hold,
}

impl Beater {
    async fn beat(self: Arc<Self>) {
        let first = !self.url_sent.load(Ordering::Acquire);
        let mut body = heartbeat_body(&self.deps, &mut self.metrics.lock(), first);
        if self.slim.load(Ordering::Relaxed) {
            slimmed(&mut body);
        }
        let err = match self.deps.client.heartbeat(&body).await {
            Ok(_) => {
                self.url_sent.store(true, Ordering::Release);
                self.stats.lock().heartbeats += 1;
                self.deps.monitor.record(Channel::Heartbeat, Ok(()));
                return;
            }
            Err(err) => err,
        };
        self.stats.lock().heartbeat_failures += 1;
        self.deps.monitor.record(Channel::Heartbeat, Err(err.to_string()));
        if matches!(&err, BackendError::Status { refusal: Refusal::TooLarge, .. }) {
            if !self.slim.swap(true, Ordering::Relaxed) {
                warn!(error = %err, "heartbeat refused as too large: later beats leave out the instance and tool lists");
            }
            return;
        }
        let asked = err.retry_after();
        self.hold.asked(asked);
        match asked {
            Some(asked) => warn!(error = %err, retry_after_s = asked.min(retry_after::CAP).as_secs(),
                                 "heartbeat refused; no beat until the backend's Retry-After has passed"),
            None => warn!(error = %err, "heartbeat failed"),
        }
    }
}

/// BP §3.1: the first beat at once, then a fixed wall-clock tick that never waits for the previous beat (each
/// beat runs on its own task, bounded by the client's 10 s timeout); a failure changes nothing, except that the
/// ticks while `hold` holds (the backend's `Retry-After`, RFC 9110 §10.2.3) send no beat.
pub async fn beat_cadence<B, F>(every: Duration, cancel: CancellationToken, hold: &Hold, mut beat: B)
where
    B: FnMut() -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The beats in flight are this loop's: finished ones are reaped each tick, the rest stop with it.
    let mut beats = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = ticker.tick() => {}
        }
        while beats.try_join_next().is_some() {}
        if !hold.holds() {
            beats.spawn(beat());
        }
    }
    beats.shutdown().await;
}

/// A beat without what grows with the instances and tools: `processes_by_team`, and `mcp_status`'s `instances`
/// and `tool_names` (empty: the schema requires both). The summary and counts still say how many there are.
fn slimmed(body: &mut HeartbeatRequest) {
    body.processes_by_team = None;
    if let Some(status) = body.mcp_status.as_mut() {
        status.instances.clear();
        status.tool_names.clear();
    }
}

/// The heartbeat of BP §3.2 with the `mcp_status` snapshot of §3.3. Each tool is named once, however many of its
/// server's instances (one per member) list it: with one entry per instance the beat grew with users x tools, past
/// what a backend takes (1 MiB, Fastify's default) at a few dozen members of one large server.
pub fn heartbeat_body(deps: &ManagedDeps, metrics: &mut ProcessMetrics, first: bool) -> HeartbeatRequest {
    let sample = metrics.sample();
    let seen = InstancesSeen::of(&deps.manager.instances());
    let summary = seen.summary();
    HeartbeatRequest {
        status: SatelliteStatus::Active,
        system_metrics: SystemMetrics {
            cpu_usage_percent: sample.cpu_usage_percent,
            memory_usage_mb: sample.memory_usage_mb,
            disk_usage_percent: Some(0.0),
            uptime_seconds: Some(sample.uptime_seconds),
            network_rx_bytes: None,
            network_tx_bytes: None,
        },
        processes: Vec::new(),
        processes_by_team: Some(seen.by_team),
        mcp_status: Some(McpStatus {
            summary,
            instances: seen.running,
            tool_names: seen.tool_names,
            server_status_counts: seen.counts,
        }),
        normalized_data: None,
        error_count: Some(0),
        version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        satellite_url: first.then(|| deps.satellite_url.clone()),
    }
}

/// What a beat says of the instances, gathered in one pass over them.
#[derive(Default)]
struct InstancesSeen {
    /// The running processes, by team (`processes_by_team`).
    by_team: BTreeMap<String, Vec<ProcessMetric>>,
    /// The running processes (`mcp_status.instances`).
    running: Vec<McpInstanceStatus>,
    counts: ServerStatusCounts,
    tool_names: Vec<ToolName>,
    /// The tools named so far, each once per transport.
    named: HashSet<(String, Transport)>,
    dormant: u64,
}

impl InstancesSeen {
    fn of(instances: &[Arc<Instance>]) -> Self {
        let mut seen = Self::default();
        for instance in instances {
            seen.add(instance);
        }
        seen
    }

    fn add(&mut self, instance: &Instance) {
        let status = instance.state();
        match status {
            InstanceStatus::Online => self.counts.online += 1,
            InstanceStatus::Offline => self.counts.offline += 1,
            InstanceStatus::Error | InstanceStatus::PermanentlyFailed => self.counts.error += 1,
            InstanceStatus::RequiresReauth => self.counts.requires_reauth += 1,
            _ => {}
        }
        if instance.is_dormant() {
            self.dormant += 1;
        }
        if status.tools_visible() {
            self.name_tools(instance);
        }
        if let Some(pid) = instance.pid() {
            self.add_running(instance, pid);
        }
    }

    /// The instance's enabled tools not named yet.
    fn name_tools(&mut self, instance: &Instance) {
        let spec = instance.spec();
        let transport = match spec.upstream {
            Upstream::Stdio { .. } => Transport::Stdio,
            Upstream::StreamableHttp { .. } => Transport::Http,
            Upstream::Sse { .. } => Transport::Sse,
        };
        for tool in instance.catalog().iter().flat_map(|c| c.tools.iter()) {
            let namespaced_name = tool_path(&spec.server_slug, tool.name());
            if !instance.tool_disabled(tool.name()) && self.named.insert((namespaced_name.clone(), transport)) {
                self.tool_names.push(ToolName { namespaced_name, server_slug: spec.server_slug.clone(), transport });
            }
        }
    }

    /// A running process (`pid`), in both of the beat's lists of them.
    fn add_running(&mut self, instance: &Instance, pid: u32) {
        let spec = instance.spec();
        let uptime = instance.uptime().unwrap_or_default().as_secs();
        let (_, last_activity) = instance.idle();
        self.by_team.entry(spec.team_id.0.clone()).or_default().push(ProcessMetric {
            installation_id: spec.installation_id.0.clone(),
            installation_name: spec.process_id.0.clone(),
            status: ProcessStatus::Running,
            pid: Some(pid),
            uptime_seconds: uptime,
            message_count: 0,
            error_count: 0,
            health_status: HealthStatus::Unknown,
            last_activity: iso(last_activity),
        });
        self.running.push(McpInstanceStatus {
            installation_id: spec.installation_id.0.clone(),
            installation_name: spec.process_id.0.clone(),
            // BP §3.3: the backend's instance row id, "unknown" when it sent none.
            instance_id: spec.instance_id.clone().unwrap_or_else(|| "unknown".to_owned()),
            user_id: spec.user_id.0.clone(),
            team_id: spec.team_id.0.clone(),
            status: ProcessStatus::Running,
            transport_type: Transport::Stdio,
            uptime_seconds: uptime,
            message_count: 0,
            error_count: 0,
            health_status: HealthStatus::Unknown,
            pid: Some(pid),
        });
    }

    fn summary(&self) -> McpStatusSummary {
        McpStatusSummary {
            total_instances: self.running.len() as u64,
            active_instances: self.running.len() as u64,
            dormant_instances: self.dormant,
            total_tools: self.tool_names.len() as u64,
            online_servers: self.counts.online,
            offline_servers: self.counts.offline,
            error_servers: self.counts.error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn heartbeats_tick_every_thirty_seconds_even_when_one_is_slow() {
        let times = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (t, c) = (times.clone(), cancel.clone());
        let beat = move || {
            let mut times = t.lock();
            times.push((tokio::time::Instant::now() - start).as_secs());
            if times.len() == 4 {
                c.cancel();
            }
            let slow = times.len() == 1;
            async move {
                // The first beat hangs for 25 s; the next still goes on time.
                if slow {
                    tokio::time::sleep(Duration::from_secs(25)).await;
                }
            }
        };
        beat_cadence(Duration::from_secs(30), cancel, &Hold::default(), beat).await;
        assert_eq!(*times.lock(), [0, 30, 60, 90]);
    }

    /// With paused time: a beat refused with `Retry-After: 3` (every 1 s) leaves the ticks before it passed without
    /// a beat; the tick it passed at beats again, and the cadence goes on.
    #[tokio::test(start_paused = true)]
    async fn no_beat_goes_before_the_retry_after_of_a_refused_one_has_passed() {
        let times = Arc::new(Mutex::new(Vec::new()));
        let hold = Arc::new(Hold::default());
        let cancel = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (t, h, c) = (times.clone(), hold.clone(), cancel.clone());
        let beat = move || {
            let mut times = t.lock();
            times.push((tokio::time::Instant::now() - start).as_secs());
            if times.len() == 4 {
                c.cancel();
            }
            let refused = times.len() == 1;
            let hold = h.clone();
            async move {
                if refused {
                    hold.asked(Some(Duration::from_secs(3)));
                }
            }
        };
        beat_cadence(Duration::from_secs(1), cancel, &hold, beat).await;
        assert_eq!(*times.lock(), [0, 3, 4, 5]);
    }
}
