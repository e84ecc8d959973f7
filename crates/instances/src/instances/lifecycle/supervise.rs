//! Watching a stdio child (crash → restart policy, list changes, stderr warnings), dormancy of idle
//! children and their single-flight respawn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;
use tracing::{error, info, warn, Instrument};

use crate::events::{CrashReport, Event};
use crate::instances::instance::{Instance, InstanceError};
use crate::instances::policy::{self, CrashDecision};
use crate::instances::{Inner, RefreshReport};
use crate::mcp::client::{Era, McpClient};
use crate::mcp::transport::{Announcement, ExitInfo, Inbound, Relay, Transport, UpstreamError};
use crate::model::{InstanceStatus, Upstream};

use super::connect::process_pid;
use super::start::Started;

/// Notifications a server sends outside any request that its client sessions hear about as it sends them. Tool
/// and resource list changes are not among them: the catalog is discovered again first, and only a change it
/// really finds is announced (`announce_list_changes`), so a client that lists at once sees the new list.
const ANNOUNCED: [&str; 4] = [
    "notifications/resources/updated",
    "notifications/prompts/list_changed",
    "notifications/message",
    "notifications/tasks/status",
];

/// Notifications that change what the catalog holds, so the satellite discovers the instance again.
const CHANGES_CATALOG: [&str; 2] = ["notifications/tools/list_changed", "notifications/resources/list_changed"];

/// A burst of list changes (a server announcing once per tool it adds) is collected this long, then one
/// rediscovery covers it.
pub(in crate::instances) const LIST_CHANGE_DEBOUNCE: Duration = Duration::from_millis(250);
/// How long the satellite's own `subscriptions/listen` on a 2026-07-28 server stays open before it is opened anew.
const UPSTREAM_LISTEN_LIMIT: Duration = Duration::from_secs(60 * 60);
/// The first wait before opening again a listen the server ended or refused; doubled after each failure, to
/// `UPSTREAM_LISTEN_RETRY_MAX`.
const UPSTREAM_LISTEN_RETRY: Duration = Duration::from_secs(5);
const UPSTREAM_LISTEN_RETRY_MAX: Duration = Duration::from_secs(5 * 60);
/// A listen open this long before it ended is opened again at once.
const UPSTREAM_LISTEN_LASTED: Duration = Duration::from_secs(60);

/// The filter the satellite listens to a 2026-07-28 server with: the list changes it declares, which the catalog
/// and the instance's clients follow. `None` for a handshake-era server, which announces them on its session, or
/// one that declares none.
fn upstream_listen_filter(client: &McpClient, instance: &Instance) -> Option<Value> {
    let declared = client.capabilities();
    let mut filter = serde_json::Map::new();
    for (capability, flag) in
        [("tools", "toolsListChanged"), ("prompts", "promptsListChanged"), ("resources", "resourcesListChanged")]
    {
        if declared.get(capability).and_then(|c| c.get("listChanged")).and_then(Value::as_bool) == Some(true) {
            filter.insert(flag.into(), Value::Bool(true));
        }
    }
    // The resources the instance's clients subscribed to (`resources/subscribe`, kept by the satellite).
    let watched = instance.subscriptions();
    if declared.pointer("/resources/subscribe").and_then(Value::as_bool) == Some(true) && !watched.is_empty() {
        filter.insert("resourceSubscriptions".into(), serde_json::json!(watched));
    }
    (!filter.is_empty()).then_some(Value::Object(filter))
}

/// Hold the satellite's own `subscriptions/listen` open on a 2026-07-28 server for as long as the connection is
/// watched, and announce what comes on it as a handshake-era server's announcements are (the watch then follows
/// list changes the same way). It is opened again after the server ends it, after a growing wait when it failed.
/// Never completes; pending for ever when the server needs no listen.
async fn listen_upstream(client: Arc<McpClient>, instance: Arc<Instance>) {
    let (client, instance) = (&*client, &*instance);
    if !matches!(client.era(), Era::Stateless { .. }) {
        return futures::future::pending().await;
    }
    let mut changes = instance.subscription_changes();
    let mut wait = UPSTREAM_LISTEN_RETRY;
    loop {
        changes.mark_unchanged();
        let Some(filter) = upstream_listen_filter(client, instance) else {
            // Nothing to listen to until a client subscribes to a resource.
            if changes.changed().await.is_err() {
                return futures::future::pending().await;
            }
            continue;
        };
        let (relay, mut heard) = Relay::channel(false);
        let params = Some(serde_json::json!({"notifications": filter}));
        let listen = client.request_relayed("subscriptions/listen", params, UPSTREAM_LISTEN_LIMIT, Some(&relay));
        tokio::pin!(listen);
        let opened = Instant::now();
        let ended = loop {
            tokio::select! {
                ended = &mut listen => break Some(ended),
                // Subscriptions changed: the listen is opened again with them (the old one is dropped, cancelled).
                Ok(()) = changes.changed() => break None,
                Some(inbound) = heard.recv() => {
                    let Inbound::Notification { method, mut params, .. } = inbound else { continue };
                    if method == "notifications/subscriptions/acknowledged" {
                        continue;
                    }
                    // The subscription's id is ours; the instance's clients get the notification without it.
                    if let Some(meta) = params.as_mut().and_then(|p| p.get_mut("_meta")).and_then(Value::as_object_mut) {
                        meta.remove(crate::mcp::protocol::meta_keys::SUBSCRIPTION_ID);
                    }
                    client.transport().announce(Arc::new(crate::mcp::protocol::notification(&method, params)));
                }
            }
        };
        // Subscriptions changed: opened again at once with them.
        let Some(ended) = ended else { continue };
        if let Err(err) = &ended {
            tracing::debug!(error = %err, "the server's subscriptions/listen ended");
        }
        // A listen that lasted (to the server's end or the satellite's own limit) is opened again at once; one
        // ended or refused soon after it opened waits first, longer each time, or until the subscriptions change.
        if opened.elapsed() >= UPSTREAM_LISTEN_LASTED {
            wait = UPSTREAM_LISTEN_RETRY;
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            Ok(()) = changes.changed() => {}
        }
        wait = (wait * 2).min(UPSTREAM_LISTEN_RETRY_MAX);
    }
}

/// The next renewal of a Streamable HTTP session; never for a transport without them, or once it is gone.
async fn renewed(renewals: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(receiver) = renewals {
        if receiver.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// When a rediscovery is due, if one is.
async fn due(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Inner {
    /// Follow a stdio child: a crash when it dies unasked, rediscovery when its tool list changes,
    /// an event when its stderr goes over the rate limit.
    pub(in crate::instances) fn watch(
        self: &Arc<Self>,
        instance: Arc<Instance>,
        client: Arc<McpClient>,
        generation: u64,
    ) {
        let Transport::Stdio(stdio) = client.transport() else {
            self.watch_remote(instance, client);
            return;
        };
        let mut notifications = stdio.subscribe();
        let inner = self.clone();
        let span = tracing::info_span!("instance.watch", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let Transport::Stdio(stdio) = client.transport() else { return };
                let since = Instant::now();
                let pid = stdio.pid();
                let mut rediscover: Option<tokio::time::Instant> = None;
                let mut listening = Box::pin(listen_upstream(client.clone(), instance.clone()));
                loop {
                    tokio::select! {
                        biased;
                        _ = instance.retired.cancelled() => return,
                        _ = inner.shutdown.cancelled() => return,
                        () = &mut listening => {}
                        exit = stdio.exited() => {
                            let ExitInfo::Exited { code, signal } = exit else { return };
                            if instance.retired.is_cancelled() {
                                return;
                            }
                            let report = CrashReport {
                                pid,
                                exit_code: code,
                                signal,
                                uptime_seconds: since.elapsed().as_secs(),
                                crash_count: 0,
                                will_restart: false,
                            };
                            let mut detail = exit.describe();
                            if let Some(last) = stdio.stderr_tail().last() {
                                detail.push_str(&format!("; last stderr line: {last}"));
                            }
                            Box::pin(inner.on_crash(instance, report, detail, generation)).await;
                            return;
                        }
                        dropped = stdio.stderr_dropped() => {
                            let lifecycle = &inner.deps.settings.lifecycle;
                            let window = lifecycle.log_rate_warning_interval.as_secs().max(1);
                            Box::pin(inner.emit(Event::log_rate_limited(instance.spec(), dropped, window, lifecycle.log_rate_limit))).await;
                        }
                        note = notifications.recv() => match note {
                            Ok(note) => {
                                if inner.on_announcement(&instance, note) {
                                    rediscover.get_or_insert(tokio::time::Instant::now() + LIST_CHANGE_DEBOUNCE);
                                }
                            }
                            // Missed notifications may have been list changes (and the client sessions missed
                            // them too).
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                                rediscover.get_or_insert(tokio::time::Instant::now() + LIST_CHANGE_DEBOUNCE);
                                instance.announce_missed();
                            }
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                // The owner task is gone; the exit branch reports it.
                                stdio.exited().await;
                            }
                        },
                        _ = due(rediscover) => {
                            rediscover = None;
                            if !Box::pin(inner.rediscover_after_change(&instance, &client)).await {
                                return;
                            }
                        }
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Follow a remote server's announcements for as long as this connection lives.
    pub(in crate::instances) fn watch_remote(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>) {
        let mut notifications = client.transport().announcements();
        let mut renewals = client.transport().session_renewals();
        let mut connections = instance.connection_changes();
        let inner = self.clone();
        let span = tracing::info_span!("instance.watch", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let mut rediscover: Option<tokio::time::Instant> = None;
                let mut listening = Box::pin(listen_upstream(client.clone(), instance.clone()));
                loop {
                    let note = tokio::select! {
                        biased;
                        _ = instance.retired.cancelled() => return,
                        _ = inner.shutdown.cancelled() => return,
                        // Restarted, stopped or recovered on a new connection: this one is no longer the instance's.
                        _ = connections.changed() => {
                            if instance.client().is_some_and(|current| Arc::ptr_eq(&current, &client)) {
                                continue;
                            }
                            return;
                        }
                        () = &mut listening => continue,
                        note = notifications.recv() => note,
                        // The server forgot the session (restarted): it forgot its subscriptions and log level with it.
                        () = renewed(&mut renewals) => {
                            inner.restore_client_state(&instance, &client);
                            continue;
                        }
                        _ = due(rediscover) => {
                            rediscover = None;
                            if !Box::pin(inner.rediscover_after_change(&instance, &client)).await {
                                return;
                            }
                            continue;
                        }
                    };
                    match note {
                        Ok(note) => {
                            if inner.on_announcement(&instance, note) {
                                rediscover.get_or_insert(tokio::time::Instant::now() + LIST_CHANGE_DEBOUNCE);
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            rediscover.get_or_insert(tokio::time::Instant::now() + LIST_CHANGE_DEBOUNCE);
                            // The client sessions missed them too.
                            instance.announce_missed();
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
            .instrument(span),
        );
    }

    /// A notification the server sent outside any request: the instance's client sessions hear of list changes
    /// and resource updates. True when it changes the catalog (a rediscovery is then due).
    fn on_announcement(&self, instance: &Arc<Instance>, note: Announcement) -> bool {
        let method = note.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
        if method == "notifications/prompts/list_changed" {
            self.view_changed(instance.spec(), false, true);
        }
        if ANNOUNCED.contains(&method.as_str()) {
            instance.announce(note);
        }
        CHANGES_CATALOG.contains(&method.as_str())
    }

    /// Discover a running instance again after its lists changed; it keeps serving its current tools meanwhile.
    /// False once the instance is retired.
    async fn rediscover_after_change(self: &Arc<Self>, instance: &Arc<Instance>, client: &Arc<McpClient>) -> bool {
        info!("the server's lists changed, discovering it again");
        self.refresh_catalog(instance, client).await.is_some()
    }

    /// Discover a connected instance again, serving its current tools meanwhile: whether it is online after
    /// it, or `None` once the instance is retired or `client` is no longer its connection. A discovery waits for
    /// the lifecycle lock, and meanwhile a restart, dormancy or a kill may have closed the connection it was
    /// given: discovered on that, it failed and made a healthy (or sleeping) instance `offline`.
    pub(in crate::instances) async fn refresh_catalog(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        client: &Arc<McpClient>,
    ) -> Option<bool> {
        let _lifecycle = instance.lifecycle.lock().await;
        if instance.retired.is_cancelled() || !instance.is_connection(client) {
            return None;
        }
        Some(self.discover_into(instance, client, false).await)
    }

    /// Online instances whose server asks for periodic discovery (`rediscover_every`) and whose catalog is
    /// older than that: discovered again, a few at a time. Returns how many.
    pub(in crate::instances) async fn rediscover_stale(self: &Arc<Self>) -> usize {
        use futures::StreamExt;
        let now = chrono::Utc::now();
        let due: Vec<(Arc<Instance>, Arc<McpClient>)> = self
            .state
            .read()
            .live
            .values()
            .filter(|instance| instance.state() == InstanceStatus::Online)
            .filter_map(|instance| {
                let every = chrono::Duration::from_std(instance.spec().rediscover_every?).ok()?;
                let age = now - instance.catalog()?.discovered_at;
                if age < every {
                    return None;
                }
                Some((instance.clone(), instance.client()?))
            })
            .collect();
        let count = due.len();
        futures::stream::iter(due)
            .for_each_concurrent(4, |(instance, client)| async move {
                tracing::debug!(process_id = %instance.spec().process_id, "periodic re-discovery");
                self.refresh_catalog(&instance, &client).await;
            })
            .await;
        count
    }

    /// Discover `instances` again now (the refresh command, `POST /api/tools/refresh`), a few at a time: each
    /// online one keeps serving its current tools meanwhile; one that is not running (dormant, offline, in
    /// error) is left as it is and reported with its status, since its catalog is discovered when it starts; one
    /// whose discovery fails is reported with the status that failure gave it.
    pub(in crate::instances) async fn refresh_tools(self: &Arc<Self>, instances: Vec<Arc<Instance>>) -> RefreshReport {
        use futures::StreamExt;
        let outcomes: Vec<(Arc<Instance>, bool)> = futures::stream::iter(instances)
            .map(|instance| async move {
                let client = instance.client().filter(|_| instance.state() == InstanceStatus::Online);
                let refreshed = match client {
                    Some(client) => self.refresh_catalog(&instance, &client).await == Some(true),
                    None => false,
                };
                (instance, refreshed)
            })
            .buffer_unordered(4)
            .collect()
            .await;
        let mut report = RefreshReport::default();
        for (instance, refreshed) in outcomes {
            let id = instance.spec().process_id.0.clone();
            if refreshed {
                report.tools += instance.catalog().map_or(0, |c| c.tools.len());
                report.refreshed.push(id);
            } else {
                report.skipped.push((id, instance.state()));
            }
        }
        report.refreshed.sort();
        report.skipped.sort_by(|a, b| a.0.cmp(&b.0));
        report
    }

    /// SB §9.7: count the crash, then restart after the backoff or give up on the fourth in five minutes.
    /// Runs under the lifecycle lock and only for the current attempt: a crash that a restart, a stop or
    /// dormancy already replaced is stale and ignored.
    pub(in crate::instances) fn on_crash(
        self: &Arc<Self>,
        instance: Arc<Instance>,
        mut report: CrashReport,
        detail: String,
        generation: u64,
    ) -> BoxFuture<'static, ()> {
        let inner = self.clone();
        async move {
            let lifecycle = instance.lifecycle.lock().await;
            if instance.retired.is_cancelled() || instance.generation() != generation {
                return;
            }
            // The dead connection gives back its process slot.
            instance.take_client();
            let spec = instance.spec();
            let crashes = instance.crashes.lock().record(Instant::now());
            let decision = policy::after_crash(
                crashes,
                Duration::from_secs(report.uptime_seconds),
                &inner.deps.settings.lifecycle.restart_backoff,
            );
            report.crash_count = crashes;
            report.will_restart = matches!(decision, CrashDecision::Restart { .. });
            warn!(process_id = %spec.process_id, crashes, detail = %detail, "mcp server process crashed");
            inner.emit(Event::crashed(spec, &report)).await;
            match decision {
                CrashDecision::GiveUp { crashes } => {
                    error!(process_id = %spec.process_id, crashes, "mcp server crashed too often, not restarting");
                    inner.emit(Event::permanently_failed(spec, &report)).await;
                    let message = format!(
                        "Process crashed {crashes} times in 5 minutes. Manual restart required. Last crash: {detail}"
                    );
                    inner.set_status(&instance, InstanceStatus::PermanentlyFailed, Some(message)).await;
                }
                CrashDecision::Restart { after, attempt } => {
                    let message = format!(
                        "Process crashed ({detail}); restart {attempt} of {} in {}ms",
                        policy::MAX_AUTO_RESTARTS,
                        after.as_millis()
                    );
                    inner.set_status(&instance, InstanceStatus::Offline, Some(message)).await;
                    drop(lifecycle);
                    let worker = inner.clone();
                    inner.tasks.spawn(async move {
                        tokio::select! {
                            _ = instance.retired.cancelled() => return,
                            _ = worker.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(after) => {}
                        }
                        let outcome = {
                            let _lifecycle = instance.lifecycle.lock().await;
                            // A manual restart or a stop got there first.
                            if instance.retired.is_cancelled() || instance.generation() != generation {
                                return;
                            }
                            worker.start_locked(&instance).await
                        };
                        match outcome {
                            Started::Online | Started::Failed if instance.client().is_some() => {
                                let new_pid = instance.pid();
                                worker.emit(Event::restarted(instance.spec(), report.pid, new_pid, attempt)).await;
                            }
                            Started::Crashed { report, detail, generation } => {
                                worker.on_crash(instance, report, detail, generation).await
                            }
                            outcome @ (Started::AtCapacity | Started::DeployUnavailable) => {
                                worker.after_start(&instance, outcome).await
                            }
                            _ => {}
                        }
                    });
                }
            }
        }
        .boxed()
    }

    /// Stop stdio instances that are online, past the spawn grace, with no call or listen running, idle too long
    /// and not kept awake by `keep_awake`.
    pub(in crate::instances) async fn sweep_idle(&self, keep_awake: &(dyn Fn(&Instance) -> bool + Sync)) -> usize {
        let lifecycle = &self.deps.settings.lifecycle;
        let Some(timeout) = lifecycle.idle_timeout else { return 0 };
        let mut slept = 0;
        for instance in self.running_stdio() {
            if self.put_to_sleep(&instance, timeout, lifecycle.spawn_grace, keep_awake).await {
                slept += 1;
            }
        }
        slept
    }

    /// The stdio instances of the live set (running or not).
    pub(in crate::instances) fn running_stdio(&self) -> Vec<Arc<Instance>> {
        let state = self.state.read();
        state.live.values().filter(|i| matches!(i.spec().upstream, Upstream::Stdio { .. })).cloned().collect()
    }

    /// Stops `instance`'s process (dormant: its tools stay, the next call wakes it) if it is online, up at least
    /// `grace`, idle at least `idle_for`, with no call or listen running and not kept awake. True when it did.
    pub(in crate::instances) async fn put_to_sleep(
        &self,
        instance: &Arc<Instance>,
        idle_for: std::time::Duration,
        grace: std::time::Duration,
        keep_awake: &(dyn Fn(&Instance) -> bool + Sync),
    ) -> bool {
        let idle = |i: &Instance| {
            i.state() == InstanceStatus::Online && i.uptime().is_some_and(|up| up >= grace) && i.idle().0 >= idle_for
        };
        if !idle(instance) || instance.in_flight() > 0 || instance.listens() > 0 || keep_awake(instance) {
            return false;
        }
        // Busy with a start, restart or rediscovery: not now.
        let Ok(_lifecycle) = instance.lifecycle.try_lock() else { return false };
        // Hold every call slot while the process goes, so no call can pick up the closing connection;
        // getting them all proves no call is running.
        let Ok(_all_slots) = instance.calls.try_acquire_many(instance.max_calls as u32) else { return false };
        if !idle(instance) || instance.retired.is_cancelled() {
            return false;
        }
        let pid = instance.pid();
        let (idle_for, last_activity) = instance.idle();
        let Some(client) = instance.take_client() else { return false };
        // Whatever the old process does from here on is not a crash.
        instance.next_generation();
        instance.set_dormant();
        info!(process_id = %instance.spec().process_id, idle_s = idle_for.as_secs(), "instance idle, stopping its process (dormant)");
        self.emit(Event::dormant(instance.spec(), pid, idle_for.as_secs(), last_activity)).await;
        client.close().await;
        true
    }

    /// The live client, respawning a dormant instance first. Concurrent callers wait on the lifecycle lock,
    /// so a dormant instance starts one process however many calls arrive.
    pub(in crate::instances) async fn ensure_connected(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
    ) -> Result<Arc<McpClient>, InstanceError> {
        if let Some(client) = instance.client() {
            return Ok(client);
        }
        if !instance.is_dormant() {
            return Err(InstanceError::NotConnected(instance.spec().process_id.0.clone()));
        }
        // Boxed: respawning is a ~6 KB future, and every call's future (boxed per call) carried it inline.
        Box::pin(self.respawn(instance)).await
    }

    /// A respawn that the process cap would refuse waits for a slot to be given back (another of the user's
    /// processes going dormant or ending), as a call waits for a call slot: up to `call_queue_timeout`, then the
    /// start is tried and refused with the reason. The wait ends early when the instance is removed or the
    /// satellite stops (the respawn then finds it so and starts nothing).
    async fn wait_for_process_slot(&self, instance: &Instance) {
        let user = &instance.spec().user_id;
        let mut releases = self.slots.releases();
        let room = async {
            while !self.slots.has_room(user) {
                if releases.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::timeout(self.deps.settings.lifecycle.call_queue_timeout, room) => {}
            _ = instance.retired.cancelled() => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// [`Self::ensure_connected`] for a dormant instance: start its process again.
    async fn respawn(self: &Arc<Self>, instance: &Arc<Instance>) -> Result<Arc<McpClient>, InstanceError> {
        let slug = || instance.spec().server_slug.clone();
        // Before the lifecycle lock: the calls queued behind it wait for the same slot at once, not one after
        // another, and a stop, kill or restart is not held up by the wait.
        self.wait_for_process_slot(instance).await;
        // Single flight: an attempt that began while this caller waited for the lock answers for it too. Before, the
        // callers queued behind a respawn that failed (a server hanging at its handshake) each tried again in
        // turn, one handshake timeout after another, spawning a process each.
        let tried_before = instance.respawns.lock().0;
        let _lifecycle = instance.lifecycle.lock().await;
        if let Some(client) = instance.client() {
            return Ok(client);
        }
        if !instance.is_dormant() || instance.retired.is_cancelled() || self.shutdown.is_cancelled() {
            return Err(InstanceError::NotConnected(instance.spec().process_id.0.clone()));
        }
        if let (tried, Some(failed)) = &*instance.respawns.lock() {
            if *tried != tried_before {
                return Err(InstanceError::Respawn { slug: slug(), source: failed.clone() });
            }
        }
        let began = Instant::now();
        let connected = self.connect(instance.spec()).await;
        {
            let mut respawns = instance.respawns.lock();
            *respawns = (respawns.0 + 1, connected.as_ref().err().cloned());
        }
        let (client, slot) = connected.map_err(|source| InstanceError::Respawn { slug: slug(), source })?;
        let client = Arc::new(client);
        instance.set_connection(client.clone(), slot);
        instance.touch();
        let generation = instance.next_generation();
        let dormant_for = instance.clear_dormant().unwrap_or_default();
        let pid = process_pid(&client);
        info!(process_id = %instance.spec().process_id, pid, respawn_ms = began.elapsed().as_millis() as u64, "dormant instance respawned");
        self.emit(Event::respawned(instance.spec(), pid, dormant_for.as_secs(), began.elapsed().as_millis() as u64))
            .await;
        self.watch(instance.clone(), client.clone(), generation);
        self.restore_client_state(instance, &client);
        Ok(client)
    }

    /// Ask a server that started anew (after a crash, a restart or dormancy) for what its clients asked of the old
    /// one: to log at the level a client set (`logging/setLevel`), and to watch again the resources they subscribed
    /// to. Its new process or connection knows nothing of either, and the clients' sessions, which outlive it, would
    /// get its default log level and wait for updates in vain. Each resource watched again is announced as updated to
    /// the sessions that subscribed to it, since updates were lost while the server was down. In the background: a
    /// server slow to answer holds up neither its start nor its calls. A server that refuses a subscription (the
    /// resource is gone) no longer has it asked again; one that does not answer is asked again at its next start.
    pub(in crate::instances) fn restore_client_state(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        client: &Arc<McpClient>,
    ) {
        // A 2026-07-28 server is asked for both on every request and on the satellite's own listen; updates sent
        // while it was down were lost all the same.
        if matches!(client.era(), Era::Stateless { .. }) {
            for uri in instance.subscriptions() {
                let note = serde_json::json!({"uri": uri});
                let note = crate::mcp::protocol::notification("notifications/resources/updated", Some(note));
                instance.announce(Arc::new(note));
            }
            return;
        }
        // One restore waiting is enough (a load balancer that drops sessions renews them in bursts): it reads the
        // state and the connection when it runs, so it sends the latest of both.
        if instance.restore_for.lock().replace(client.clone()).is_some() {
            return;
        }
        let instance = instance.clone();
        let timeout = self.request_timeout(instance.spec());
        let span = tracing::info_span!("instance.restore", process_id = %instance.spec().process_id);
        let (retired, shutdown) = (instance.retired.clone(), self.shutdown.clone());
        let restore = async move {
            // Serialised with the clients' own `logging/setLevel` and `resources/(un)subscribe` (`Inner::call`):
            // one sent while the restore runs is neither overwritten by it nor sent before it.
            let _state = instance.client_state.lock().await;
            let Some(client) = instance.restore_for.lock().take() else { return };
            // Read under the lock: a client's change that was on its way is in it.
            let (level, uris) = (instance.log_level(), instance.subscriptions());
            if level.is_none() && uris.is_empty() {
                return;
            }
            info!(resources = uris.len(), level = ?level, "asking the restarted server for its clients' log level and subscriptions again");
            if let Some(level) = level {
                let params = serde_json::json!({ "level": level });
                if let Err(err) = client.request("logging/setLevel", Some(params), timeout).await {
                    let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
                    warn!(error = %error, "the restarted server did not take its clients' log level again");
                }
            }
            for uri in uris {
                let params = serde_json::json!({ "uri": uri });
                match client.request("resources/subscribe", Some(params), timeout).await {
                    Ok(_) => instance.announce(Arc::new(crate::mcp::protocol::notification(
                        "notifications/resources/updated",
                        Some(serde_json::json!({ "uri": uri })),
                    ))),
                    Err(UpstreamError::Rpc(err)) => {
                        let error = crate::secrets::hide(&err.message, instance.secret_values());
                        warn!(uri = %uri, error = %error, "the restarted server refused a subscription again; dropped");
                        instance.note_subscription(&uri, false);
                    }
                    Err(err) => {
                        let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
                        warn!(error = %error, "the restarted server did not take its subscriptions again; asked at its next start");
                        return;
                    }
                }
            }
        };
        // Not past the instance's removal nor the satellite's shutdown, which waits for its tasks.
        self.tasks.spawn(
            async move {
                tokio::select! {
                    _ = retired.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                    () = restore => {}
                }
            }
            .instrument(span),
        );
    }
}
