//! A stdio child's crash (SB §9.7): counted in the instance's window, then restarted after the backoff, or given up
//! on (`permanently_failed`) at the fourth crash in five minutes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use tracing::{error, warn};

use crate::events::{CrashReport, Event};
use crate::instances::instance::Instance;
use crate::instances::policy::{self, CrashDecision};
use crate::instances::Inner;
use crate::model::InstanceStatus;

use super::start::Started;

/// A restart after a crash, due once its backoff is over.
struct CrashRestart {
    /// The crashed process's pid.
    old_pid: Option<u32>,
    after: Duration,
    attempt: u32,
    /// The start attempt that crashed: a restart, stop or dormancy since makes this restart stale.
    generation: u64,
}

impl Inner {
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
            match inner.count_crash(&instance, &mut report, &detail).await {
                CrashDecision::GiveUp { crashes } => inner.give_up(&instance, &report, &detail, crashes).await,
                CrashDecision::Restart { after, attempt } => {
                    let message = format!(
                        "Process crashed ({detail}); restart {attempt} of {} in {}ms",
                        policy::MAX_AUTO_RESTARTS,
                        after.as_millis()
                    );
                    inner.reporter.set_status(&instance, InstanceStatus::Offline, Some(message)).await;
                    drop(lifecycle);
                    let restart = CrashRestart { old_pid: report.pid, after, attempt, generation };
                    inner.restart_after_crash(instance, restart);
                }
            }
        }
        .boxed()
    }

    /// The crash counted in the instance's window and what follows decided; `mcp.server.crashed` says which.
    async fn count_crash(&self, instance: &Instance, report: &mut CrashReport, detail: &str) -> CrashDecision {
        let spec = instance.spec();
        let crashes = instance.crashes.lock().record(Instant::now());
        let decision = policy::after_crash(
            crashes,
            Duration::from_secs(report.uptime_seconds),
            &self.settings.lifecycle.restart_backoff,
        );
        report.crash_count = crashes;
        report.will_restart = matches!(decision, CrashDecision::Restart { .. });
        warn!(process_id = %spec.process_id, crashes, detail = %detail, "mcp server process crashed");
        self.reporter.emit(Event::crashed(spec, report)).await;
        decision
    }

    /// Crashed too often: `permanently_failed` until a manual restart.
    async fn give_up(&self, instance: &Instance, report: &CrashReport, detail: &str, crashes: u32) {
        let spec = instance.spec();
        error!(process_id = %spec.process_id, crashes, "mcp server crashed too often, not restarting");
        self.reporter.emit(Event::permanently_failed(spec, report)).await;
        let message =
            format!("Process crashed {crashes} times in 5 minutes. Manual restart required. Last crash: {detail}");
        self.reporter.set_status(instance, InstanceStatus::PermanentlyFailed, Some(message)).await;
    }

    /// In the background: wait out the backoff, then start the instance again (`mcp.server.restarted`), unless a
    /// manual restart or a stop got there first.
    fn restart_after_crash(self: &Arc<Self>, instance: Arc<Instance>, restart: CrashRestart) {
        let worker = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = instance.retired.cancelled() => return,
                _ = worker.shutdown.cancelled() => return,
                _ = tokio::time::sleep(restart.after) => {}
            }
            let outcome = {
                let _lifecycle = instance.lifecycle.lock().await;
                // A manual restart or a stop got there first.
                if instance.retired.is_cancelled() || instance.generation() != restart.generation {
                    return;
                }
                worker.start_locked(&instance).await
            };
            match outcome {
                Started::Online | Started::Failed if instance.client().is_some() => {
                    let new_pid = instance.pid();
                    let event = Event::restarted(instance.spec(), restart.old_pid, new_pid, restart.attempt);
                    worker.reporter.emit(event).await;
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
