//! Starting and stopping an instance: start (spawn or connect, handshake, discovery), manual restart,
//! halt, rediscovery, and stop. Each runs under the instance's lifecycle lock.

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn, Instrument};

use crate::events::{CrashReport, Event, StopReason};
use crate::instances::instance::Instance;
use crate::instances::policy::{self};
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::mcp::transport::UpstreamError;
use crate::model::{InstanceStatus, Upstream};

use super::connect::process_pid;

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

/// What a start that could not happen yet waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// A process slot given back.
    Slot,
    /// Time: the backend or GitHub may answer later ([`policy::probe_wait`]).
    Deployment,
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
            self.set_status(instance, InstanceStatus::Restarting, Some(reason.to_owned())).await;
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
            self.set_status(instance, InstanceStatus::Offline, Some(reason.to_owned())).await;
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

    /// A start that could not happen yet is tried again: one a process cap refused each time a process slot is
    /// given back (a process of the user's, or of anyone's for the satellite-wide cap, stopped, went dormant or
    /// crashed); a GitHub deployment that could not get its token or tarball after a wait. Until it starts, fails
    /// for another reason, or something else starts, stops or kills the instance. One at a time per instance.
    fn retry_start(self: &Arc<Self>, instance: &Arc<Instance>, mut why: Retry) {
        if !instance.try_begin_recovery() {
            return;
        }
        let (inner, instance) = (self.clone(), instance.clone());
        let span = tracing::info_span!("instance.retry_start", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let mut releases = inner.slots.releases();
                let mut attempt = 0;
                let outcome = loop {
                    match why {
                        Retry::Slot if inner.slots.has_room(&instance.spec().user_id) => {}
                        Retry::Slot => {
                            tokio::select! {
                                _ = instance.retired.cancelled() => break None,
                                _ = inner.shutdown.cancelled() => break None,
                                _ = releases.changed() => continue,
                                // No slot given back, but a process may have fallen idle: room can be made.
                                _ = tokio::time::sleep(super::room::ROOM_CHECK) => {
                                    if !inner.room_likely(instance.spec()) {
                                        continue;
                                    }
                                }
                            }
                        }
                        Retry::Deployment => {
                            tokio::select! {
                                _ = instance.retired.cancelled() => break None,
                                _ = inner.shutdown.cancelled() => break None,
                                _ = tokio::time::sleep(policy::probe_wait(attempt)) => attempt += 1,
                            }
                        }
                    }
                    let _lifecycle = instance.lifecycle.lock().await;
                    // Started, restarted, stopped or killed meanwhile: no longer this task's to start.
                    let waiting = instance.state() == InstanceStatus::Error && instance.client().is_none();
                    if instance.retired.is_cancelled() || instance.is_halted() || !waiting {
                        break None;
                    }
                    info!(?why, attempt, "starting the instance again");
                    match inner.start_locked(&instance).await {
                        Started::AtCapacity => why = Retry::Slot,
                        Started::DeployUnavailable => why = Retry::Deployment,
                        outcome => break Some(outcome),
                    }
                };
                instance.end_recovery();
                if let Some(outcome) = outcome {
                    inner.after_start(&instance, outcome).await;
                }
            }
            .instrument(span),
        );
    }

    /// Connect, handshake and discover; the caller holds the lifecycle lock.
    pub(in crate::instances) async fn start_locked(self: &Arc<Self>, instance: &Arc<Instance>) -> Started {
        let spec = instance.spec();
        let stdio = matches!(spec.upstream, Upstream::Stdio { .. });
        let generation = instance.next_generation();
        instance.set_halted(false);
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
                if let (true, Some((exit_code, signal))) = (stdio, policy::handshake_crash(&err)) {
                    let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
                    let detail = match &err {
                        UpstreamError::Spawn { .. } => status_for(&spec.upstream, &Failure::Connect(&err)).1,
                        _ => error.clone(),
                    };
                    warn!(process_id = %spec.process_id, error = %error, "mcp server process failed to start, died or stayed silent during the handshake; retrying under the restart policy");
                    let report = CrashReport {
                        pid: None,
                        exit_code,
                        signal,
                        uptime_seconds: 0,
                        crash_count: 0,
                        will_restart: false,
                    };
                    return Started::Crashed { report, detail, generation };
                }
                let (status, message) =
                    self.oauth_aware(spec, &err, status_for(&spec.upstream, &Failure::Connect(&err)));
                self.set_status(instance, status, Some(message)).await;
                return match err {
                    UpstreamError::AtCapacity(_) => Started::AtCapacity,
                    UpstreamError::Deployment { transient: true, .. } => Started::DeployUnavailable,
                    _ => Started::Failed,
                };
            }
        };
        let client = Arc::new(client);
        instance.set_connection(client.clone(), slot);
        instance.touch();
        if stdio {
            let pid = process_pid(&client);
            self.deps.logs.server_line(spec, "info", "MCP Server started successfully");
            self.emit(Event::started(spec, pid, began.elapsed().as_millis() as u64)).await;
        }
        self.watch(instance.clone(), client.clone(), generation);
        if self.discover_into(instance, &client, true).await {
            self.restore_client_state(instance, &client);
            Started::Online
        } else {
            Started::Failed
        }
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
            self.emit(Event::server_stopped(instance.spec(), reason)).await;
        }
    }
}
