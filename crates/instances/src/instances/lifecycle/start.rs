//! Starting and stopping an instance: start (spawn within the process caps or connect, handshake, discovery),
//! manual restart, halt, rediscovery, and stop. Each runs under the instance's lifecycle lock.

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn, Instrument};

use crate::events::{CrashReport, Event, LimitedResource, StopReason};
use crate::instances::instance::Instance;
use crate::instances::limits::ProcessSlot;
use crate::instances::policy;
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::mcp::client::McpClient;
use crate::mcp::transport::relay::Asker;
use crate::mcp::transport::{Transport, UpstreamError};
use crate::model::{InstanceSpec, InstanceStatus, Upstream};

use super::connect::process_pid;
use super::Retry;

/// How a start ended.
pub(in crate::instances) enum Started {
    Online,
    /// Connected but discovery failed, or the server could not be reached.
    Failed,
    /// The stdio child died before the handshake finished: a crash of attempt `generation`, and why.
    Crashed {
        report: CrashReport,
        detail: String,
        generation: u64,
    },
    /// A process cap refused the spawn: started again when a slot frees (`retry_start`).
    AtCapacity,
    /// The GitHub deployment could not get its token or tarball for now: started again after a wait
    /// (`retry_start`).
    DeployUnavailable,
    Cancelled,
}

impl Inner {
    /// Start a new instance (reconciler).
    pub(in crate::instances) async fn start(self: &Arc<Self>, instance: &Arc<Instance>) {
        let span = tracing::info_span!("instance", process_id = %instance.spec().process_id, server = %instance.spec().server_slug);
        async {
            let outcome = {
                let _lifecycle = instance.lifecycle.lock().await;
                // Retired meanwhile, or started already (a restart while this start waited its turn): nothing to do.
                if instance.retired.is_cancelled() || instance.client().is_some() {
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
    pub(in crate::instances) async fn restart(self: &Arc<Self>, instance: &Arc<Instance>, reason: &str) {
        self.restart_from(instance, reason, None).await
    }

    /// [`restart`](Self::restart), when `only_from` is given only if the instance is still in that status once
    /// its lifecycle lock is held (not a healthy connection someone brought back meanwhile).
    pub(in crate::instances) async fn restart_from(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        reason: &str,
        only_from: Option<InstanceStatus>,
    ) {
        let outcome = {
            let _lifecycle = instance.lifecycle.lock().await;
            // A conditional restart (a credential check's) never brings back an instance a kill stopped.
            let stale = only_from.is_some_and(|status| instance.state() != status || instance.is_halted());
            if instance.retired.is_cancelled() || stale {
                return;
            }
            if let Some(client) = instance.take_client() {
                client.close().await;
            }
            instance.crashes.lock().clear();
            instance.clear_dormant();
            info!(process_id = %instance.spec().process_id, reason, "restarting instance");
            self.reporter.set_status(instance, InstanceStatus::Restarting, Some(reason.to_owned())).await;
            self.start_locked(instance).await
        };
        self.after_start(instance, outcome).await;
    }

    /// Stop the process or connection without a restart (a `kill` command); the instance stays configured.
    pub(in crate::instances) async fn halt(&self, instance: &Arc<Instance>, reason: &str) {
        let _lifecycle = instance.lifecycle.lock().await;
        instance.next_generation();
        instance.set_halted(true);
        self.end_running(instance, StopReason::Killed).await;
        // Only a restart leaves `permanently_failed`: a kill leaves it as it is (halted all the same).
        if instance.state() != InstanceStatus::PermanentlyFailed {
            self.reporter.set_status(instance, InstanceStatus::Offline, Some(reason.to_owned())).await;
        }
    }

    /// Reconnect if needed and rediscover; true when the instance is online afterwards. An instance a kill stopped
    /// stays stopped (BP §6.3: no automatic restart): a recovery says its server is back, not that it may run.
    pub(in crate::instances) async fn rediscover(self: &Arc<Self>, instance: &Arc<Instance>) -> bool {
        let outcome = {
            let _lifecycle = instance.lifecycle.lock().await;
            if instance.retired.is_cancelled() || instance.is_halted() {
                return false;
            }
            match instance.client() {
                Some(client) => {
                    let message = "Server recovered, satellite initiating tool re-discovery".to_owned();
                    self.reporter.set_status(instance, InstanceStatus::Connecting, Some(message)).await;
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

    pub(in crate::instances) async fn after_start(self: &Arc<Self>, instance: &Arc<Instance>, outcome: Started) {
        match outcome {
            Started::Crashed { report, detail, generation } => {
                self.on_crash(instance.clone(), report, detail, generation).await
            }
            Started::Failed => self.maybe_probe(instance),
            Started::AtCapacity => self.retry_start(instance, Retry::Slot),
            Started::DeployUnavailable => self.retry_start(instance, Retry::Deployment),
            Started::Online | Started::Cancelled => {}
        }
    }

    /// Connect, handshake and discover; the caller holds the lifecycle lock.
    pub(in crate::instances) async fn start_locked(self: &Arc<Self>, instance: &Arc<Instance>) -> Started {
        let spec = instance.spec();
        let stdio = matches!(spec.upstream, Upstream::Stdio { .. });
        let generation = instance.next_generation();
        instance.set_halted(false);
        let connecting = if stdio { "Connecting to MCP server process" } else { "Connecting to MCP server" };
        self.reporter.set_status(instance, InstanceStatus::Connecting, Some(connecting.into())).await;
        let began = Instant::now();
        let connected = tokio::select! {
            _ = instance.retired.cancelled() => return Started::Cancelled,
            _ = self.shutdown.cancelled() => return Started::Cancelled,
            connected = self.connect(spec) => connected,
        };
        let (client, slot) = match connected {
            Ok(connected) => connected,
            Err(err) => return self.start_failed(instance, err, generation).await,
        };
        let client = Arc::new(client);
        instance.set_connection(client.clone(), slot);
        instance.touch();
        if stdio {
            let pid = process_pid(&client);
            self.connector.server_line(spec, "info", "MCP Server started successfully");
            self.reporter.emit(Event::started(spec, pid, began.elapsed().as_millis() as u64)).await;
        }
        self.watch(instance.clone(), client.clone(), generation);
        if self.discover_into(instance, &client, true).await {
            self.restore_client_state(instance, &client);
            Started::Online
        } else {
            Started::Failed
        }
    }

    /// A start whose connect failed: a stdio child that could not start, died or stayed silent during its
    /// handshake is a crash of attempt `generation`; anything else takes the status it maps to.
    async fn start_failed(&self, instance: &Instance, err: UpstreamError, generation: u64) -> Started {
        let spec = instance.spec();
        let stdio = matches!(spec.upstream, Upstream::Stdio { .. });
        if let (true, Some((exit_code, signal))) = (stdio, policy::handshake_crash(&err)) {
            let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
            let detail = match &err {
                UpstreamError::Spawn { .. } => status_for(&spec.upstream, &Failure::Connect(&err)).1,
                _ => error.clone(),
            };
            warn!(process_id = %spec.process_id, error = %error, "mcp server process failed to start, died or stayed silent during the handshake; retrying under the restart policy");
            let report =
                CrashReport { pid: None, exit_code, signal, uptime_seconds: 0, crash_count: 0, will_restart: false };
            return Started::Crashed { report, detail, generation };
        }
        let (status, message) =
            self.connector.oauth_aware(spec, &err, status_for(&spec.upstream, &Failure::Connect(&err)));
        self.reporter.set_status(instance, status, Some(message)).await;
        match err {
            UpstreamError::AtCapacity(_) => Started::AtCapacity,
            UpstreamError::Deployment { transient: true, .. } => Started::DeployUnavailable,
            _ => Started::Failed,
        }
    }

    /// Spawn (within the process caps and the sandbox) or connect, then negotiate.
    pub(in crate::instances) async fn connect(
        &self,
        spec: &InstanceSpec,
    ) -> Result<(McpClient, Option<ProcessSlot>), UpstreamError> {
        let asker = Some(self.connector.asker(spec));
        let (transport, slot) = match &spec.upstream {
            Upstream::Stdio { .. } => {
                let (transport, slot) = self.spawn_stdio(spec, asker).await?;
                (transport, Some(slot))
            }
            Upstream::StreamableHttp { url, headers, .. } => {
                (self.connector.streamable_http(spec, url, headers, asker).await?, None)
            }
            Upstream::Sse { url, headers, timeout } => {
                (self.connector.sse(spec, url, headers, *timeout, asker).await?, None)
            }
        };
        let client = self.connector.handshake(spec, transport).await?;
        Ok((client, slot))
    }

    /// A stdio server's child, spawned within the user's process cap (the slot it holds) and the sandbox; a
    /// GitHub-deployed server runs its deployment's entry point, deployed first when needed.
    async fn spawn_stdio(
        &self,
        spec: &InstanceSpec,
        asker: Option<Asker>,
    ) -> Result<(Transport, ProcessSlot), UpstreamError> {
        let deployed = self.connector.deployed_launch(spec).await?;
        let slot = match self.room.slot_for(spec, || self.roster.running_stdio()).await {
            Ok(slot) => slot,
            Err(err) => {
                let limit = err.limit() as u64;
                self.reporter.limit_exceeded(spec, LimitedResource::Processes, limit, limit, err.to_string()).await;
                return Err(UpstreamError::AtCapacity(err.to_string()));
            }
        };
        let transport = self.connector.spawn_stdio(spec, deployed.as_ref(), asker)?;
        Ok((transport, slot))
    }

    /// Retire the instance for good: its process or connection ends, and `mcp.server.stopped` says why. A dormant
    /// instance, up with no process, reports its stop too.
    pub(in crate::instances) async fn stop(&self, instance: &Arc<Instance>, reason: StopReason) {
        instance.retired.cancel();
        let _lifecycle = instance.lifecycle.lock().await;
        self.end_running(instance, reason).await;
    }

    /// Close the instance's process or connection and report `mcp.server.stopped`, if it was running. A dormant
    /// instance is up (it wakes on the next call) with no process: it counts as running. Under the lifecycle lock.
    async fn end_running(&self, instance: &Arc<Instance>, reason: StopReason) {
        let was_dormant = instance.clear_dormant().is_some();
        let client = instance.take_client();
        if let Some(client) = &client {
            client.close().await;
        }
        if client.is_some() || was_dormant {
            self.reporter.emit(Event::server_stopped(instance.spec(), reason)).await;
        }
    }
}
