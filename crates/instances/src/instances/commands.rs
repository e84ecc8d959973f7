//! Commands on instances (BP §6): restart, stop, redeploy, recover, refresh their tools, put idle ones to sleep,
//! and the manager's own shutdown.

use std::sync::Arc;

use futures::StreamExt;

use crate::events::StopReason;
use crate::model::{InstallationId, ProcessId, UserId};

use super::{Instance, InstanceManager, KeepAwake, ManagerError, RefreshReport};

impl InstanceManager {
    /// Restart one instance now (SB §9.7 manual restart): stop it, forget its crashes and start again.
    /// The way out of `permanently_failed`.
    pub async fn restart(&self, process_id: &ProcessId) -> Result<(), ManagerError> {
        let instance = self.get(process_id).ok_or_else(|| ManagerError::NotFound(process_id.0.clone()))?;
        self.inner.restart(&instance, "Restart requested").await;
        Ok(())
    }

    /// Connect an instance that waits for re-authorisation afresh, with the credentials held now (BP §6.2's
    /// credential check); nothing when it no longer waits by the time its lifecycle lock is held.
    pub async fn reconnect_waiting_for_reauth(&self, process_id: &ProcessId) -> Result<(), ManagerError> {
        let instance = self.get(process_id).ok_or_else(|| ManagerError::NotFound(process_id.0.clone()))?;
        let reason = "Credential check";
        self.inner.restart_from(&instance, reason, Some(crate::model::InstanceStatus::RequiresReauth)).await;
        Ok(())
    }

    /// BP §6.3 `restart`: every enabled instance of the installation, or only `user`'s. Returns how many.
    pub async fn restart_installation(
        &self,
        installation: &InstallationId,
        user: Option<&UserId>,
    ) -> Result<usize, ManagerError> {
        let targets = self.of_installation(installation, user)?;
        let inner = &self.inner;
        futures::stream::iter(targets.iter())
            .for_each_concurrent(inner.settings.reconcile_concurrency, |instance| async move {
                inner.restart(instance, "Restart requested").await
            })
            .await;
        Ok(targets.len())
    }

    /// BP §6.1.3 `mcp_redeploy`: every instance of the installation stops, its deployment directory goes, and
    /// each starts again (deploying afresh). Returns how many instances there were.
    pub async fn redeploy(&self, installation: &InstallationId) -> Result<usize, ManagerError> {
        let targets = self.of_installation(installation, None)?;
        let inner = &self.inner;
        for instance in &targets {
            inner.halt(instance, "Redeploying from GitHub").await;
        }
        if let (Some(deployer), Some(first)) = (inner.connector.deployer(), targets.first()) {
            deployer.remove(&first.spec().team_id, installation).await;
        }
        futures::stream::iter(targets.iter())
            .for_each_concurrent(inner.settings.reconcile_concurrency, |instance| async move {
                inner.restart(instance, "Redeploying from GitHub").await
            })
            .await;
        Ok(targets.len())
    }

    /// BP §6.3 `kill`: stop the instances of an installation (or one user's) until a restart or config change.
    pub async fn stop_installation(
        &self,
        installation: &InstallationId,
        user: Option<&UserId>,
    ) -> Result<usize, ManagerError> {
        let targets = self.of_installation(installation, user)?;
        for instance in &targets {
            self.inner.halt(instance, "Stopped by command").await;
        }
        Ok(targets.len())
    }

    /// A credential check found the server refusing this user's credentials (BP §6.2).
    pub async fn require_reauth(&self, instance: &Arc<Instance>, message: String) {
        self.inner.reporter.set_status(instance, crate::model::InstanceStatus::RequiresReauth, Some(message)).await;
    }

    /// BP §6.1.2 `mcp_recovery`: reconnect and rediscover; true when the instance came back online.
    pub async fn rediscover(&self, instance: &Arc<Instance>) -> bool {
        self.inner.rediscover(instance).await
    }

    /// Discover `instances` again now, serving their current tools meanwhile; instances not running are
    /// reported, not started.
    pub async fn refresh_tools(&self, instances: Vec<Arc<Instance>>) -> RefreshReport {
        self.inner.refresh_tools(instances).await
    }

    /// Discover again the online instances whose server asks for it periodically and whose catalog is older
    /// than that period; returns how many.
    pub async fn rediscover_stale(&self) -> usize {
        self.inner.rediscover_stale().await
    }

    /// Stop stdio instances idle past the timeout (SB §9.8), except those `keep_awake` names (a client still
    /// subscribed to what the server announces); returns how many went dormant.
    pub async fn sweep_idle(&self, keep_awake: impl Fn(&Instance) -> bool + Sync) -> usize {
        self.inner.sweep_idle(&keep_awake).await
    }

    /// What keeps an idle instance awake when room is made for a start over the process cap (the idle sweep is
    /// given its own each round).
    pub fn keep_awake(&self, keep_awake: KeepAwake) {
        self.inner.room.set_keep_awake(keep_awake);
    }

    /// Stop every instance and background task.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        let all: Vec<Arc<Instance>> = inner.roster.drain();
        futures::stream::iter(all)
            .for_each_concurrent(32, |instance| async move { inner.stop(&instance, StopReason::Shutdown).await })
            .await;
        inner.tasks.close();
        inner.tasks.wait().await;
    }
}
