//! What the manager answers about its instances: readiness, lookups of the live set, and the signals callers
//! follow (visibility, applied configurations, members' list changes).

use std::sync::Arc;

use tokio::sync::watch;

use crate::model::{InstallationId, InstanceSpec, ProcessId, TeamId, UserId};

use super::{Instance, InstanceManager, ManagerError, ViewChange};

impl InstanceManager {
    /// True once a first desired state has been applied.
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.inner.roster.ready()
    }

    /// Ready with no desired state applied yet: a managed satellite whose first config fetch failed serves (with
    /// no servers) while it asks again. Nothing stored by a previous run is swept as orphaned until a config
    /// says what exists.
    pub fn ready_before_config(&self) {
        self.inner.roster.set_ready();
    }

    /// Whether a desired state was applied (by the first config fetch, a retry of it, or a command).
    pub fn has_applied(&self) -> bool {
        self.inner.roster.has_applied()
    }

    /// Changes whenever the instances some caller can see, their statuses or their catalogs may have
    /// changed; a view of [`InstanceManager::instances_for`] taken at one value is good until it moves.
    pub fn visibility_version(&self) -> u64 {
        self.inner.reporter.visibility()
    }

    pub fn get(&self, process_id: &ProcessId) -> Option<Arc<Instance>> {
        self.inner.roster.get(process_id)
    }

    /// The enabled instances of one user in one team (SB §7.2).
    pub fn instances_for(&self, user: &UserId, team: &TeamId) -> Vec<Arc<Instance>> {
        self.inner.roster.of_owner(user, team)
    }

    pub fn by_instance_path(&self, path: &str) -> Option<Arc<Instance>> {
        self.inner.roster.by_path(path)
    }

    /// Every enabled instance, ordered by process id.
    pub fn instances(&self) -> Vec<Arc<Instance>> {
        let mut all: Vec<Arc<Instance>> = self.inner.roster.all();
        all.sort_by(|a, b| a.spec().process_id.cmp(&b.spec().process_id));
        all
    }

    /// Every configured entry, enabled or not.
    pub fn desired(&self) -> Vec<InstanceSpec> {
        self.inner.roster.desired().values().map(|spec| InstanceSpec::clone(spec)).collect()
    }

    /// The enabled instances of an installation, or only `user`'s.
    pub fn of_installation(
        &self,
        installation: &InstallationId,
        user: Option<&UserId>,
    ) -> Result<Vec<Arc<Instance>>, ManagerError> {
        let targets: Vec<Arc<Instance>> = self
            .instances()
            .into_iter()
            .filter(|i| &i.spec().installation_id == installation && user.is_none_or(|u| &i.spec().user_id == u))
            .collect();
        if targets.is_empty() {
            return Err(ManagerError::NoInstallation(installation.0.clone()));
        }
        Ok(targets)
    }

    /// The client streams on which the servers' requests made outside any call reach their owners' clients.
    pub fn seats(&self) -> &Arc<crate::mcp::transport::relay::Seats> {
        self.inner.connector.seats()
    }

    /// Changes each time a configuration is applied (its users, tokens and instances are then current).
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.inner.roster.applied()
    }

    /// Members' list changes as they happen (the hierarchical router's session streams follow them).
    pub fn view_changes(&self) -> tokio::sync::broadcast::Receiver<ViewChange> {
        self.inner.reporter.view_changes()
    }

    /// The satellite's metrics (the routers count discovers here too).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        self.inner.call_log.metrics()
    }

    /// Live stdio children counted against the process caps.
    pub fn processes(&self) -> usize {
        self.inner.room.in_use()
    }
}
