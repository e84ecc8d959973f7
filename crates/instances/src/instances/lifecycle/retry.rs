//! A start that could not happen yet, tried again: one a process cap refused, when a slot is given back or room can
//! be made; a GitHub deployment that could not get its token or tarball, after a growing wait.

use std::sync::Arc;

use tracing::{info, Instrument};

use crate::instances::instance::Instance;
use crate::instances::policy;
use crate::instances::Inner;
use crate::model::InstanceStatus;

use super::room::ROOM_CHECK;
use super::start::Started;
use super::Retry;

impl Inner {
    /// A start that could not happen yet is tried again: one a process cap refused each time a process slot is
    /// given back (a process of the user's, or of anyone's for the satellite-wide cap, stopped, went dormant or
    /// crashed); a GitHub deployment that could not get its token or tarball after a wait. Until it starts, fails
    /// for another reason, or something else starts, stops or kills the instance. One at a time per instance.
    pub(in crate::instances) fn retry_start(self: &Arc<Self>, instance: &Arc<Instance>, why: Retry) {
        if !instance.try_begin_recovery() {
            return;
        }
        let span = tracing::info_span!("instance.retry_start", process_id = %instance.spec().process_id);
        self.tasks.spawn(self.clone().retry_until_started(instance.clone(), why).instrument(span));
    }

    /// The task of [`Self::retry_start`]: it ends the recovery, however it ends.
    async fn retry_until_started(self: Arc<Self>, instance: Arc<Instance>, mut why: Retry) {
        let mut releases = self.room.releases();
        let mut attempt = 0;
        let outcome = loop {
            if !self.wait_to_retry(&instance, why, &mut releases, &mut attempt).await {
                break None;
            }
            let _lifecycle = instance.lifecycle.lock().await;
            // Started, restarted, stopped or killed meanwhile: no longer this task's to start.
            let waiting = instance.state() == InstanceStatus::Error && instance.client().is_none();
            if instance.retired.is_cancelled() || instance.is_halted() || !waiting {
                break None;
            }
            info!(?why, attempt, "starting the instance again");
            match self.start_locked(&instance).await {
                Started::AtCapacity => why = Retry::Slot,
                Started::DeployUnavailable => why = Retry::Deployment,
                outcome => break Some(outcome),
            }
        };
        instance.end_recovery();
        if let Some(outcome) = outcome {
            self.after_start(&instance, outcome).await;
        }
    }

    /// Wait until the start held back for `why` may be tried again: true then, false once the instance is retired
    /// or the satellite stops. `attempt` counts the waits for a deployment.
    async fn wait_to_retry(
        &self,
        instance: &Instance,
        why: Retry,
        releases: &mut tokio::sync::watch::Receiver<()>,
        attempt: &mut u32,
    ) -> bool {
        match why {
            Retry::Slot => loop {
                if self.room.has_room(&instance.spec().user_id) {
                    return true;
                }
                tokio::select! {
                    _ = instance.retired.cancelled() => return false,
                    _ = self.shutdown.cancelled() => return false,
                    _ = releases.changed() => continue,
                    // No slot given back, but a process may have fallen idle: room can be made.
                    _ = tokio::time::sleep(ROOM_CHECK) => {
                        if self.room.room_likely(instance.spec(), || self.roster.running_stdio()) {
                            return true;
                        }
                    }
                }
            },
            Retry::Deployment => {
                tokio::select! {
                    _ = instance.retired.cancelled() => false,
                    _ = self.shutdown.cancelled() => false,
                    _ = tokio::time::sleep(policy::probe_wait(*attempt)) => {
                        *attempt += 1;
                        true
                    }
                }
            }
        }
    }
}
