//! The supervisor of each instance: start, stop, the watcher of a stdio
//! child (crash → restart policy, list changes, stderr warnings), dormancy
//! and respawn, calls with their limits and retries, and recovery of remote
//! servers. Every status change goes through `Inner::set_status`.
//!
//! Locking: an instance's `lifecycle` lock is held while it is started,
//! stopped, restarted, put to sleep, woken or rediscovered. Crash handling
//! and probes run outside it and take it again for each attempt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::Value;
use tracing::{error, info, warn, Instrument};

use super::instance::{Instance, InstanceError};
use super::limits::ProcessSlot;
use super::policy::{self, CrashDecision};
use super::status::{status_for, Failure};
use super::{Inner, STDIO_CLOSE_GRACE};
use crate::discovery;
use crate::events::{CrashReport, Event};
use crate::logcapture::RequestRecord;
use crate::mcp::client::McpClient;
use crate::mcp::transport::stderr::{level_of, StderrSettings};
use crate::mcp::transport::{
    ExitInfo, SseTransport, StderrSink, StdioTransport, StreamableHttpTransport, Transport, UpstreamError,
};
use crate::model::{Catalog, InstanceSpec, InstanceStatus, ProcessId, Upstream};
use crate::search::ToolDoc;
use crate::store::CatalogOwner;

/// How a start ended.
enum Started {
    Online,
    /// Connected but discovery failed, or the server could not be reached.
    Failed,
    /// The stdio child died before the handshake finished: a crash of attempt `generation`, and why.
    Crashed {
        report: CrashReport,
        detail: String,
        generation: u64,
    },
    Cancelled,
}

impl Inner {
    /// Start a new instance (reconciler).
    pub(super) async fn start(self: &Arc<Self>, instance: &Arc<Instance>) {
        let span = tracing::info_span!("instance", process_id = %instance.spec().process_id, server = %instance.spec().server_slug);
        async {
            let outcome = {
                let _lifecycle = instance.lifecycle.lock().await;
                if instance.retired.is_cancelled() {
                    return;
                }
                self.start_locked(instance).await
            };
            self.after_start(instance, outcome).await;
        }
        .instrument(span)
        .await
    }

    /// Manual restart: stop, forget crashes and dormancy, start again.
    pub(super) async fn restart(self: &Arc<Self>, instance: &Arc<Instance>, reason: &str) {
        let outcome = {
            let _lifecycle = instance.lifecycle.lock().await;
            if instance.retired.is_cancelled() {
                return;
            }
            if let Some(client) = instance.take_client() {
                client.close().await;
            }
            instance.crashes.lock().clear();
            instance.clear_dormant();
            info!(process_id = %instance.spec().process_id, reason, "restarting instance");
            self.set_status(instance, InstanceStatus::Restarting, Some(reason.to_owned())).await;
            self.start_locked(instance).await
        };
        self.after_start(instance, outcome).await;
    }

    /// Stop the process or connection without a restart (a `kill` command); the instance stays configured.
    pub(super) async fn halt(&self, instance: &Arc<Instance>, reason: &str) {
        let _lifecycle = instance.lifecycle.lock().await;
        instance.next_generation();
        instance.clear_dormant();
        if let Some(client) = instance.take_client() {
            client.close().await;
        }
        self.set_status(instance, InstanceStatus::Offline, Some(reason.to_owned())).await;
    }

    /// Reconnect if needed and rediscover; true when the instance is online afterwards.
    pub(super) async fn rediscover(self: &Arc<Self>, instance: &Arc<Instance>) -> bool {
        let outcome = {
            let _lifecycle = instance.lifecycle.lock().await;
            if instance.retired.is_cancelled() {
                return false;
            }
            match instance.client() {
                Some(client) => {
                    let message = "Server recovered, satellite initiating tool re-discovery".to_owned();
                    self.set_status(instance, InstanceStatus::Connecting, Some(message)).await;
                    if self.discover_into(instance, &client, true).await {
                        Started::Online
                    } else {
                        Started::Failed
                    }
                }
                None => self.start_locked(instance).await,
            }
        };
        let online = matches!(outcome, Started::Online);
        self.after_start(instance, outcome).await;
        online
    }

    async fn after_start(self: &Arc<Self>, instance: &Arc<Instance>, outcome: Started) {
        match outcome {
            Started::Crashed { report, detail, generation } => {
                self.on_crash(instance.clone(), report, detail, generation).await
            }
            Started::Failed => self.maybe_probe(instance),
            Started::Online | Started::Cancelled => {}
        }
    }

    /// Connect, handshake and discover; the caller holds the lifecycle lock.
    async fn start_locked(self: &Arc<Self>, instance: &Arc<Instance>) -> Started {
        let spec = instance.spec();
        let stdio = matches!(spec.upstream, Upstream::Stdio { .. });
        let generation = instance.next_generation();
        let connecting = if stdio { "Connecting to MCP server process" } else { "Connecting to MCP server" };
        self.set_status(instance, InstanceStatus::Connecting, Some(connecting.into())).await;
        let began = Instant::now();
        let connected = tokio::select! {
            _ = instance.retired.cancelled() => return Started::Cancelled,
            _ = self.shutdown.cancelled() => return Started::Cancelled,
            connected = self.connect(spec) => connected,
        };
        let (client, slot) = match connected {
            Ok(connected) => connected,
            Err(err) => {
                if stdio && matches!(err, UpstreamError::Closed(_)) {
                    warn!(process_id = %spec.process_id, error = %err, "mcp server process died during the handshake");
                    let report = CrashReport {
                        pid: None,
                        exit_code: exit_code_in(&err.to_string()),
                        signal: None,
                        uptime_seconds: 0,
                        crash_count: 0,
                        will_restart: false,
                    };
                    return Started::Crashed { report, detail: err.to_string(), generation };
                }
                let (status, message) =
                    self.oauth_aware(spec, &err, status_for(&spec.upstream, &Failure::Connect(&err)));
                self.set_status(instance, status, Some(message)).await;
                return Started::Failed;
            }
        };
        let client = Arc::new(client);
        instance.set_connection(client.clone(), slot);
        instance.touch();
        if stdio {
            let pid = process_pid(&client);
            self.deps.logs.server_line(spec, "info", "MCP Server started successfully");
            self.emit(Event::started(spec, pid, began.elapsed().as_millis() as u64)).await;
            self.watch(instance.clone(), client.clone(), generation);
        }
        if self.discover_into(instance, &client, true).await {
            Started::Online
        } else {
            Started::Failed
        }
    }

    pub(super) async fn stop(&self, instance: &Arc<Instance>) {
        instance.retired.cancel();
        let _lifecycle = instance.lifecycle.lock().await;
        if let Some(client) = instance.take_client() {
            client.close().await;
        }
    }

    /// Spawn (within the process caps and the sandbox) or connect, then negotiate.
    async fn connect(&self, spec: &InstanceSpec) -> Result<(McpClient, Option<ProcessSlot>), UpstreamError> {
        let label = spec.process_id.0.clone();
        let mut slot = None;
        let transport = match &spec.upstream {
            Upstream::Stdio { .. } => {
                slot = Some(self.slots.acquire(&spec.user_id).map_err(|err| UpstreamError::Spawn(err.to_string()))?);
                let prepared = self.deps.sandbox.prepare(spec, &self.deps.inherited_env).map_err(|err| {
                    warn!(process_id = %label, error = %err, "mcp server refused by the sandbox");
                    UpstreamError::Spawn(err.to_string())
                })?;
                if !prepared.dropped_env.is_empty() {
                    warn!(process_id = %label, dropped = ?prepared.dropped_env, "refused environment variables for mcp server");
                }
                let lifecycle = &self.deps.settings.lifecycle;
                let stderr = StderrSettings {
                    per_second: lifecycle.log_rate_limit,
                    max_line_bytes: lifecycle.log_max_line_bytes,
                    warning_interval: lifecycle.log_rate_warning_interval,
                };
                let mut launch = prepared.into_stdio_launch(label, STDIO_CLOSE_GRACE, stderr);
                let (logs, owner) = (self.deps.logs.clone(), spec.clone());
                launch.stderr_sink = Some(StderrSink(Arc::new(move |line: &str| {
                    logs.server_line(&owner, level_of(line), line);
                })));
                Transport::Stdio(StdioTransport::spawn(launch)?)
            }
            Upstream::StreamableHttp { url, headers, .. } => {
                let headers = self.remote_headers(spec, headers).await?;
                Transport::StreamableHttp(StreamableHttpTransport::new(
                    label,
                    self.deps.http.clone(),
                    url.clone(),
                    &headers,
                )?)
            }
            Upstream::Sse { url, headers, timeout } => {
                let headers = self.remote_headers(spec, headers).await?;
                Transport::Sse(
                    SseTransport::connect(label, self.deps.http.clone(), url.clone(), &headers, *timeout).await?,
                )
            }
        };
        let mut options = self.deps.client_options.clone();
        options.handshake_timeout = self.deps.settings.handshake_timeout;
        let stderr = match &transport {
            Transport::Stdio(stdio) => Some(stdio.stderr_handle()),
            _ => None,
        };
        let client = McpClient::connect(transport, &options).await.map_err(|err| {
            // The child's stderr usually says why a handshake failed.
            match stderr.and_then(|tail| tail.lines().pop()) {
                Some(last) => err.with_detail(&format!("last stderr line: {last}")),
                None => err,
            }
        })?;
        Ok((client, slot))
    }

    /// The configured headers, plus the user's OAuth bearer token when the server requires one (BP §11: it
    /// overrides any configured `Authorization`). No token is a 401-like refusal: `requires_reauth`.
    async fn remote_headers(
        &self,
        spec: &InstanceSpec,
        headers: &std::collections::BTreeMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, String>, UpstreamError> {
        let (true, Some(oauth)) = (spec.requires_oauth, self.deps.oauth.as_ref()) else { return Ok(headers.clone()) };
        let token =
            oauth.bearer(spec).await.map_err(|reason| UpstreamError::HttpStatus { status: 401, body: reason })?;
        Ok(with_bearer(headers, &token))
    }

    /// A 401 from a server that needs the user's OAuth token: forget the token and say what to do (BP §11 rule 5).
    fn oauth_aware(
        &self,
        spec: &InstanceSpec,
        err: &UpstreamError,
        mapped: (InstanceStatus, String),
    ) -> (InstanceStatus, String) {
        match (err, self.deps.oauth.as_ref()) {
            (UpstreamError::HttpStatus { status: 401, body }, Some(oauth)) if spec.requires_oauth => {
                oauth.invalidate(spec);
                let message = if body.starts_with("OAuth") {
                    body.clone()
                } else {
                    format!(
                        "OAuth token expired or invalid for {}. Please re-authorize this MCP server in the dashboard.",
                        spec.server_name
                    )
                };
                (InstanceStatus::RequiresReauth, message)
            }
            _ => mapped,
        }
    }

    /// Run discovery on a connected instance and publish the result; true when it went online.
    /// With `announce` the instance passes through `discovering_tools`; a rediscovery of an online
    /// instance (tool list changed) keeps serving its current tools until the new ones are in.
    async fn discover_into(&self, instance: &Arc<Instance>, client: &Arc<McpClient>, announce: bool) -> bool {
        let online = instance.status().status == InstanceStatus::Online;
        if announce || !online {
            self.set_status(
                instance,
                InstanceStatus::DiscoveringTools,
                Some("Discovering available tools from MCP server".into()),
            )
            .await;
        }
        let request_timeout = self.request_timeout(instance.spec());
        let budget = self.deps.settings.discovery_timeout;
        let discovered = tokio::select! {
            _ = instance.retired.cancelled() => return false,
            found = tokio::time::timeout(budget, discovery::discover(client, request_timeout)) => found,
        };
        match discovered {
            Ok(Ok(catalog)) => {
                let catalog = Arc::new(catalog);
                if let Err(err) = self.deps.store.save_catalog(&CatalogOwner::from(instance.spec()), &catalog).await {
                    warn!(process_id = %instance.spec().process_id, error = %err, "saving catalog failed");
                }
                info!(process_id = %instance.spec().process_id, tools = catalog.tools.len(), resources = catalog.resources.len(), "tools discovered");
                self.report_discovery(instance.spec(), &catalog).await;
                if let Some(previous) = instance.catalog() {
                    self.report_change(instance.spec(), &previous, &catalog).await;
                }
                self.index(instance, &catalog).await;
                instance.set_catalog(catalog);
                if instance.status().status != InstanceStatus::Online {
                    self.set_status(instance, InstanceStatus::Online, Some("MCP server is online and ready".into()))
                        .await;
                }
                true
            }
            Ok(Err(err)) => {
                let (status, message) = status_for(&instance.spec().upstream, &Failure::Discovery(&err));
                self.set_status(instance, status, Some(message)).await;
                false
            }
            Err(_) => {
                let message = format!("Process error: discovery timed out after {}s", budget.as_secs());
                self.set_status(instance, InstanceStatus::Offline, Some(message)).await;
                false
            }
        }
    }

    /// `mcp.tools.discovered` with each tool's token count (SB §15), counted on the blocking pool.
    async fn report_discovery(&self, spec: &InstanceSpec, catalog: &Catalog) {
        match crate::tokens::count_tools(catalog.tools.clone()).await {
            Ok(counts) => {
                let tools: Vec<(String, String, Value, usize)> = catalog
                    .tools
                    .iter()
                    .zip(counts)
                    .map(|(t, n)| (t.name.clone(), t.description.clone(), t.input_schema.clone(), n))
                    .collect();
                self.emit(Event::tools_discovered(spec, &tools)).await;
            }
            Err(err) => {
                warn!(process_id = %spec.process_id, error = %err, "counting tool tokens failed; no discovery event")
            }
        }
    }

    /// `mcp.tools.updated` when a remote instance's re-discovery changed its tool set (BP §8.5-5).
    async fn report_change(&self, spec: &InstanceSpec, previous: &Catalog, current: &Catalog) {
        if matches!(spec.upstream, Upstream::Stdio { .. }) {
            return;
        }
        let before: std::collections::BTreeSet<&str> = previous.tools.iter().map(|t| t.name.as_str()).collect();
        let after: std::collections::BTreeSet<&str> = current.tools.iter().map(|t| t.name.as_str()).collect();
        if before == after {
            return;
        }
        let data = serde_json::json!({
            "server_id": spec.installation_id.0,
            "server_slug": spec.server_slug,
            "team_id": spec.team_id.0,
            "added_tools": after.difference(&before).collect::<Vec<_>>(),
            "removed_tools": before.difference(&after).collect::<Vec<_>>(),
            "total_tools": after.len(),
        });
        let mut event = Event::raw("mcp.tools.updated", data);
        event.process_id = Some(spec.process_id.0.clone());
        self.emit(event).await;
    }

    pub(super) async fn index(&self, instance: &Instance, catalog: &Catalog) {
        let spec = instance.spec();
        let docs = catalog
            .tools
            .iter()
            .filter(|tool| !instance.tool_disabled(&tool.name))
            .map(|tool| ToolDoc {
                process_id: spec.process_id.0.clone(),
                server_slug: spec.server_slug.clone(),
                tool_name: tool.name.clone(),
                description: tool.description.clone(),
                input_schema: tool.input_schema.clone(),
            })
            .collect();
        if let Err(err) = self.deps.search.replace_instance(&spec.process_id.0, docs).await {
            warn!(process_id = %spec.process_id, error = %err, "indexing tools failed");
        }
    }

    pub(super) async fn unindex(&self, id: &ProcessId) {
        if let Err(err) = self.deps.search.remove_instance(&id.0).await {
            warn!(process_id = %id, error = %err, "removing tools from the index failed");
        }
    }

    fn request_timeout(&self, spec: &InstanceSpec) -> Duration {
        match &spec.upstream {
            Upstream::Stdio { .. } => self.deps.settings.call_timeout,
            Upstream::StreamableHttp { timeout, .. } | Upstream::Sse { timeout, .. } => *timeout,
        }
    }

    /// Follow a stdio child: a crash when it dies unasked, rediscovery when its tool list changes,
    /// an event when its stderr goes over the rate limit.
    fn watch(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>, generation: u64) {
        let Transport::Stdio(stdio) = client.transport() else { return };
        let mut notifications = stdio.subscribe();
        let inner = self.clone();
        let span = tracing::info_span!("instance.watch", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let Transport::Stdio(stdio) = client.transport() else { return };
                let since = Instant::now();
                let pid = stdio.pid();
                loop {
                    tokio::select! {
                        biased;
                        _ = instance.retired.cancelled() => return,
                        _ = inner.shutdown.cancelled() => return,
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
                            inner.on_crash(instance, report, detail, generation).await;
                            return;
                        }
                        dropped = stdio.stderr_dropped() => {
                            let lifecycle = &inner.deps.settings.lifecycle;
                            let window = lifecycle.log_rate_warning_interval.as_secs().max(1);
                            inner.emit(Event::log_rate_limited(instance.spec(), dropped, window, lifecycle.log_rate_limit)).await;
                        }
                        note = notifications.recv() => match note {
                            Ok(note) if note.get("method").and_then(Value::as_str) == Some("notifications/tools/list_changed") => {
                                let _lifecycle = instance.lifecycle.lock().await;
                                if instance.retired.is_cancelled() {
                                    return;
                                }
                                info!("tool list changed upstream, rediscovering");
                                inner.discover_into(&instance, &client, false).await;
                            }
                            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                // The owner task is gone; the exit branch reports it.
                                stdio.exited().await;
                            }
                        },
                    }
                }
            }
            .instrument(span),
        );
    }

    /// SB §9.7: count the crash, then restart after the backoff or give up on the fourth in five minutes.
    /// Runs under the lifecycle lock and only for the current attempt: a crash that a restart, a stop or
    /// dormancy already replaced is stale and ignored.
    fn on_crash(
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
                            _ => {}
                        }
                    });
                }
            }
        }
        .boxed()
    }

    /// Stop stdio instances that are online, past the spawn grace, with no call running and idle too long.
    pub(super) async fn sweep_idle(&self) -> usize {
        let lifecycle = &self.deps.settings.lifecycle;
        let Some(timeout) = lifecycle.idle_timeout else { return 0 };
        let candidates: Vec<Arc<Instance>> = self
            .state
            .read()
            .live
            .values()
            .filter(|i| matches!(i.spec().upstream, Upstream::Stdio { .. }))
            .cloned()
            .collect();
        let mut slept = 0;
        for instance in candidates {
            let idle = |i: &Instance| {
                i.status().status == InstanceStatus::Online
                    && i.uptime().is_some_and(|up| up >= lifecycle.spawn_grace)
                    && i.idle().0 >= timeout
            };
            if !idle(&instance) || instance.in_flight() > 0 {
                continue;
            }
            // Busy with a start, restart or rediscovery: try next round.
            let Ok(_lifecycle) = instance.lifecycle.try_lock() else { continue };
            // Hold every call slot while the process goes, so no call can pick up the closing connection;
            // getting them all proves no call is running.
            let Ok(_all_slots) = instance.calls.try_acquire_many(instance.max_calls as u32) else { continue };
            if !idle(&instance) || instance.retired.is_cancelled() {
                continue;
            }
            let pid = instance.pid();
            let (idle_for, last_activity) = instance.idle();
            let Some(client) = instance.take_client() else { continue };
            // Whatever the old process does from here on is not a crash.
            instance.next_generation();
            instance.set_dormant();
            info!(process_id = %instance.spec().process_id, idle_s = idle_for.as_secs(), "instance idle, stopping its process (dormant)");
            self.emit(Event::dormant(instance.spec(), pid, idle_for.as_secs(), last_activity)).await;
            client.close().await;
            slept += 1;
        }
        slept
    }

    /// The live client, respawning a dormant instance first. Concurrent callers wait on the lifecycle lock,
    /// so a dormant instance starts one process however many calls arrive.
    pub(super) async fn ensure_connected(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
    ) -> Result<Arc<McpClient>, InstanceError> {
        let slug = || instance.spec().server_slug.clone();
        if let Some(client) = instance.client() {
            return Ok(client);
        }
        if !instance.is_dormant() {
            return Err(InstanceError::NotConnected(instance.spec().process_id.0.clone()));
        }
        let _lifecycle = instance.lifecycle.lock().await;
        if let Some(client) = instance.client() {
            return Ok(client);
        }
        if !instance.is_dormant() || instance.retired.is_cancelled() {
            return Err(InstanceError::NotConnected(instance.spec().process_id.0.clone()));
        }
        let began = Instant::now();
        let (client, slot) =
            self.connect(instance.spec()).await.map_err(|source| InstanceError::Respawn { slug: slug(), source })?;
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
        Ok(client)
    }

    pub(super) async fn call(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, InstanceError> {
        let queue = self.deps.settings.lifecycle.call_queue_timeout;
        let _permit = match tokio::time::timeout(queue, instance.calls.acquire()).await {
            Ok(Ok(permit)) => permit,
            _ => {
                return Err(InstanceError::Busy {
                    slug: instance.spec().server_slug.clone(),
                    limit: instance.max_calls,
                    waited: queue,
                })
            }
        };
        instance.touch();
        let began = Instant::now();
        let logged = method == "tools/call";
        let client = match self.ensure_connected(instance).await {
            Ok(client) => client,
            Err(err) => {
                if logged {
                    self.log_request(instance, params.as_ref(), Err(err.to_string()), began);
                }
                return Err(err);
            }
        };
        let before = instance.status().status;
        let remote = !matches!(instance.spec().upstream, Upstream::Stdio { .. });
        let mut attempt = 0;
        let result = loop {
            let result = client.request(method, params.clone(), timeout).await;
            match &result {
                Err(err) if remote && policy::retryable(err) && attempt < policy::REMOTE_RETRY_WAITS.len() => {
                    tokio::time::sleep(policy::REMOTE_RETRY_WAITS[attempt]).await;
                    attempt += 1;
                }
                _ => break result,
            }
        };
        instance.touch();
        if logged {
            self.log_request(instance, params.as_ref(), result.as_ref().map_err(ToString::to_string), began);
        }
        match &result {
            Ok(_) if matches!(before, InstanceStatus::Offline | InstanceStatus::Error) => {
                self.recovered(instance.clone(), client);
            }
            // A dead stdio child is the watcher's to report (crash policy); a connection that was replaced
            // meanwhile says nothing about the current one.
            Err(UpstreamError::Closed(_)) if !remote => {}
            Err(err)
                if policy::instance_failure(err) && instance.client().is_some_and(|c| Arc::ptr_eq(&c, &client)) =>
            {
                let spec = instance.spec();
                let (status, message) = self.oauth_aware(spec, err, status_for(&spec.upstream, &Failure::Call(err)));
                warn!(process_id = %instance.spec().process_id, error = %err, status = %status, "call failed, marking instance");
                self.set_status(instance, status, Some(message)).await;
                self.maybe_probe(instance);
            }
            _ => {}
        }
        Ok(result?)
    }

    /// One `tools/call` for the request log: the external tool path, the arguments, and the result or error.
    /// A result with `isError` counts as a failure.
    fn log_request(&self, instance: &Instance, params: Option<&Value>, result: Result<&Value, String>, began: Instant) {
        let spec = instance.spec();
        if !spec.request_logging_enabled {
            // Nothing is logged for this installation: skip copying arguments and results.
            return;
        }
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
        let arguments = params.and_then(|p| p.get("arguments")).cloned().unwrap_or(Value::Null);
        let (response, error) = match result {
            Ok(value) if value.get("isError").and_then(Value::as_bool) == Some(true) => {
                let text = value.pointer("/content/0/text").and_then(Value::as_str).unwrap_or("tool returned an error");
                (None, Some(text.to_owned()))
            }
            Ok(value) => (Some(value.clone()), None),
            Err(message) => (None, Some(message)),
        };
        self.deps.logs.request(
            spec,
            RequestRecord {
                tool_path: crate::model::tool_path(&spec.server_slug, name),
                params: arguments,
                response,
                error,
                duration: began.elapsed(),
            },
        );
    }

    /// A call succeeded while the instance was offline or in error: rediscover in the background (SB §11.2).
    fn recovered(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>) {
        if !instance.try_begin_recovery() {
            return;
        }
        let inner = self.clone();
        self.tasks.spawn(async move {
            {
                let _lifecycle = instance.lifecycle.lock().await;
                if !instance.retired.is_cancelled()
                    && matches!(instance.status().status, InstanceStatus::Offline | InstanceStatus::Error)
                {
                    let message = "Server recovered, re-discovering tools".to_owned();
                    inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                    if !inner.discover_into(&instance, &client, true).await {
                        info!(process_id = %instance.spec().process_id, "re-discovery after recovery failed");
                    }
                }
            }
            instance.end_recovery();
        });
    }

    /// Remote instances that are offline or in error get a background probe that reconnects with backoff
    /// until the server answers again (SB §11.2). One probe per instance at a time.
    fn maybe_probe(self: &Arc<Self>, instance: &Arc<Instance>) {
        let remote = !matches!(instance.spec().upstream, Upstream::Stdio { .. });
        let probing = matches!(instance.status().status, InstanceStatus::Offline | InstanceStatus::Error);
        if !remote || !probing || !instance.try_begin_recovery() {
            return;
        }
        let inner = self.clone();
        let instance = instance.clone();
        let span = tracing::info_span!("instance.probe", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let mut attempt = 0;
                loop {
                    tokio::select! {
                        _ = instance.retired.cancelled() => break,
                        _ = inner.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(policy::probe_wait(attempt)) => {}
                    }
                    attempt += 1;
                    if !matches!(instance.status().status, InstanceStatus::Offline | InstanceStatus::Error) {
                        break;
                    }
                    let connected = tokio::select! {
                        _ = instance.retired.cancelled() => break,
                        connected = inner.connect(instance.spec()) => connected,
                    };
                    let Ok((client, slot)) = connected else { continue };
                    let _lifecycle = instance.lifecycle.lock().await;
                    if instance.retired.is_cancelled() {
                        break;
                    }
                    info!(attempt, "server answers again, re-discovering tools");
                    let client = Arc::new(client);
                    if let Some(old) = instance.take_client() {
                        old.close().await;
                    }
                    instance.set_connection(client.clone(), slot);
                    let message = "Server recovered, re-discovering tools".to_owned();
                    inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                    if inner.discover_into(&instance, &client, true).await {
                        break;
                    }
                }
                instance.end_recovery();
            }
            .instrument(span),
        );
    }

    /// Move an instance to `status` through the transition function, recording the change and its event
    /// in one transaction. An impossible move is refused and logged.
    pub(super) async fn set_status(&self, instance: &Instance, status: InstanceStatus, message: Option<String>) {
        let spec = instance.spec();
        let entry = match instance.set_status(status, message) {
            Ok(entry) => entry,
            Err((from, to)) => {
                error!(process_id = %spec.process_id, from = %from, to = %to, "refused impossible status transition");
                return;
            }
        };
        match status {
            InstanceStatus::Error
            | InstanceStatus::Offline
            | InstanceStatus::RequiresReauth
            | InstanceStatus::PermanentlyFailed => {
                warn!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, message = ?entry.message, "instance status changed")
            }
            _ => {
                info!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, "instance status changed")
            }
        }
        if let Err(err) =
            self.deps.events.status_changed(spec, status, entry.message.as_deref(), entry.updated_at).await
        {
            error!(process_id = %spec.process_id, status = %status, error = %err, "recording status change failed");
        }
    }

    async fn emit(&self, event: Event) {
        self.deps.events.emit(event).await;
    }
}

/// `headers` with `Authorization: Bearer <token>`, replacing any configured authorization header.
pub(super) fn with_bearer(
    headers: &std::collections::BTreeMap<String, String>,
    token: &str,
) -> std::collections::BTreeMap<String, String> {
    let mut out: std::collections::BTreeMap<String, String> = headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert("Authorization".into(), format!("Bearer {token}"));
    out
}

fn process_pid(client: &McpClient) -> Option<u32> {
    match client.transport() {
        Transport::Stdio(stdio) => stdio.pid(),
        _ => None,
    }
}

/// `exit code N` in a transport's description of a dead child.
fn exit_code_in(message: &str) -> Option<i32> {
    let rest = message.split("exit code ").nth(1)?;
    rest.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect::<String>().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oauth_token_replaces_any_configured_authorization() {
        let configured: std::collections::BTreeMap<String, String> =
            [("authorization".to_owned(), "Bearer team".to_owned()), ("X-Api-Key".to_owned(), "k".to_owned())]
                .into_iter()
                .collect();
        let headers = with_bearer(&configured, "ya29.user");
        assert_eq!(headers.len(), 2);
        assert_eq!(headers["Authorization"], "Bearer ya29.user");
        assert_eq!(headers["X-Api-Key"], "k");
    }

    #[test]
    fn exit_codes_are_read_from_transport_messages() {
        assert_eq!(exit_code_in("process x is not running: child process has died (exit code 2)"), Some(2));
        assert_eq!(exit_code_in("child process has died (signal 9)"), None);
    }
}
