//! The reconciler: one serialised pass that moves the live set of instances toward a desired state, stopping
//! what was removed or changed and starting what was added or changed, with bounded parallelism.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tracing::{debug, warn};

use crate::control::{diff, DesiredState, SnapshotDiff};
use crate::events::StopReason;
use crate::model::{Catalog, InstanceSpec, ProcessId};

use super::{Inner, Instance, InstanceManager};

/// What one reconcile did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    pub added: usize,
    pub removed: usize,
    pub modified: usize,
    pub unchanged: usize,
    pub rejected: usize,
}

impl std::fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ReconcileReport { added, removed, modified, unchanged, rejected } = self;
        write!(f, "{added} added, {removed} removed, {modified} modified, {unchanged} unchanged, {rejected} rejected")
    }
}

impl ReconcileReport {
    /// Whether any instance was added, removed or replaced.
    pub fn changed(&self) -> bool {
        self.added + self.removed + self.modified > 0
    }
}

impl InstanceManager {
    /// Move the live set to `desired`: stop what was removed or changed, start what was added or changed.
    pub async fn apply(&self, mut desired: DesiredState) -> ReconcileReport {
        let inner = &self.inner;
        let _serial = inner.roster.reconcile.lock().await;
        let current = inner.roster.desired();
        keep_refused(&current, &mut desired);
        let changes: SnapshotDiff = diff(&current, &desired.instances);
        let report = ReconcileReport::of(&changes, &desired);

        let retired_by_edit = inner.retire(&changes, &current).await;
        inner.remove_deployments(&changes, &current, &desired.instances).await;
        for id in changes.removed.iter().chain(&changes.modified) {
            inner.publisher.unindex(id).await;
        }
        inner.roster.note_uninstalled(&changes, &current, &desired.instances);

        let starting = inner.admit(&changes, &current, &desired.instances, retired_by_edit);
        inner.reporter.bump_visibility();
        // The live set is the new one (an instance edited in place is back under its path) and the directory of
        // users and tokens was replaced before the configuration was applied: the streams check their credential.
        inner.roster.bump_applied();
        for instance in &starting {
            // Tools from a previous run are searchable (when the instance is online) before rediscovery.
            if let Some(catalog) = instance.catalog() {
                inner.publisher.index(instance, &catalog).await;
            }
        }
        let first = inner.roster.mark_applied();
        if first {
            inner.roster.adopt_orphans(&desired.instances, inner.holds.installations());
        }
        // The starts run on without the reconcile lock, and this apply does not wait for them past the first one (the
        // satellite is ready once its first configuration's instances have started): a server that takes its
        // handshake timeout to start (a download, a host that never answers) holds up no later configuration, which
        // may retire it meanwhile (a retired instance's start ends at once). At most `reconcile_concurrency` start
        // at once across every apply.
        drop(_serial);
        self.run_starts(starting, first).await;
        report
    }

    /// The starts of one apply, each waiting for its turn (`Roster::starting`): awaited for the first configuration,
    /// which then makes the satellite ready; run in the background for any later one.
    async fn run_starts(&self, starting: Vec<Arc<Instance>>, first: bool) {
        let inner = &self.inner;
        let manager = self.clone();
        let starts = async move {
            let inner = &manager.inner;
            futures::stream::iter(starting)
                .for_each_concurrent(None, |instance| async move {
                    let Ok(_turn) = inner.roster.starting.acquire().await else { return };
                    inner.start(&instance).await
                })
                .await;
        };
        if first {
            starts.await;
            // Ready once the first configuration's instances have started (only then: a later apply arriving while
            // they start says nothing of them).
            inner.roster.set_ready();
        } else {
            inner.tasks.spawn(starts);
        }
    }
}

impl ReconcileReport {
    /// The counts of `changes` (and of the entries `desired` refused), logged when anything changes.
    fn of(changes: &SnapshotDiff, desired: &DesiredState) -> ReconcileReport {
        let report = ReconcileReport {
            added: changes.added.len(),
            removed: changes.removed.len(),
            modified: changes.modified.len(),
            unchanged: changes.unchanged.len(),
            rejected: desired.rejected.len(),
        };
        if !changes.is_empty() {
            debug!(
                added = report.added,
                removed = report.removed,
                modified = report.modified,
                unchanged = report.unchanged,
                "applying config"
            );
        }
        report
    }
}

/// An entry the satellite cannot read this time (a field of a type it does not expect, a value it refuses) is not an
/// uninstall: the instance it ran goes on with the last entry it could read, and the refusal is reported as before.
/// Taken as removed, the instance was stopped, its tools dropped and its deployment deleted, while the backend still
/// listed it.
fn keep_refused(current: &BTreeMap<ProcessId, Arc<InstanceSpec>>, desired: &mut DesiredState) {
    for (key, reason) in &desired.rejected {
        let id = ProcessId::from(key.as_str());
        if let Some(running) = current.get(&id).filter(|_| !desired.instances.contains_key(&id)) {
            warn!(process_id = %key, reason = %reason, "config entry refused; its instance keeps the entry it runs");
            desired.instances.insert(id, InstanceSpec::clone(running));
        }
    }
}

impl Inner {
    /// Take the removed and the changed instances out of the live set and stop them (`reconcile_concurrency` at
    /// once), then note the removed ones as such. Returns the instances an edit replaced.
    async fn retire(
        &self,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
    ) -> Vec<Arc<Instance>> {
        let retiring = self.roster.take_retiring(changes);
        self.reporter.bump_visibility();
        let retired_by_edit: Vec<Arc<Instance>> = retiring
            .iter()
            .filter(|(_, reason)| *reason == StopReason::Replaced)
            .map(|(instance, _)| instance.clone())
            .collect();
        let kept: Vec<(ProcessId, Arc<Catalog>)> = retiring
            .iter()
            .filter(|(_, reason)| *reason == StopReason::Removed)
            .filter_map(|(instance, _)| Some((instance.spec().process_id.clone(), instance.catalog()?)))
            .collect();
        let concurrency = self.settings.reconcile_concurrency;
        futures::stream::iter(retiring)
            .for_each_concurrent(concurrency, |(instance, reason)| async move { self.stop(&instance, reason).await })
            .await;
        self.roster.keep_removed(kept, changes, current);
        retired_by_edit
    }

    /// Uninstall semantics (SB §9.9): a GitHub deployment goes with the last instance of its installation.
    async fn remove_deployments(
        &self,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
        desired: &BTreeMap<ProcessId, InstanceSpec>,
    ) {
        let Some(deployer) = self.connector.deployer() else { return };
        for spec in changes.removed.iter().filter_map(|id| current.get(id)).filter(|s| s.deployment.is_some()) {
            let still_used = desired.values().any(|d| d.installation_id == spec.installation_id);
            if !still_used {
                deployer.remove(&spec.team_id, &spec.installation_id).await;
            }
        }
    }

    /// Put the added and the changed instances that are enabled in the live set (not started yet), and make the
    /// applied specs the desired ones. Returns the instances to start.
    fn admit(
        &self,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
        desired: &BTreeMap<ProcessId, InstanceSpec>,
        retired_by_edit: Vec<Arc<Instance>>,
    ) -> Vec<Arc<Instance>> {
        let specs = kept_specs(current, desired);
        // An instance edited in place keeps what its clients asked of the server (their sessions outlive the edit).
        let predecessors: std::collections::HashMap<ProcessId, Arc<Instance>> =
            retired_by_edit.into_iter().map(|instance| (instance.spec().process_id.clone(), instance)).collect();
        let max_calls = self.settings.lifecycle.max_calls_per_instance;
        self.roster.admit(changes, specs, |spec, stored| {
            let instance = Arc::new(Instance::new(spec, stored, max_calls, self.holds.overrides()));
            if let Some(predecessor) = predecessors.get(&instance.spec().process_id) {
                instance.carry_client_state(predecessor);
            }
            instance
        })
    }
}

impl InstanceManager {
    /// Delete what instances and installations removed more than `grace` ago left behind: stored catalogs and
    /// drift holds (the uninstall of SB §9.9, deferred: see `REMOVAL_GRACE`). Returns how many were deleted.
    pub async fn purge_removed(&self, grace: Duration) -> usize {
        let inner = &self.inner;
        // Not while an apply runs: it may be bringing them back.
        let _serial = inner.roster.reconcile.lock().await;
        let (catalogs, installations) = inner.roster.take_purgeable(grace);
        for id in &catalogs {
            inner.publisher.delete_catalog(id).await;
        }
        for installation in &installations {
            inner.holds.release_installation(installation).await;
        }
        catalogs.len() + installations.len()
    }
}

/// The specs kept once `next` is applied over `current`: an unchanged one stays the very `Arc` its live instance
/// holds, so each spec is held once however often the same state is applied.
fn kept_specs(
    current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
    next: &BTreeMap<ProcessId, InstanceSpec>,
) -> BTreeMap<ProcessId, Arc<InstanceSpec>> {
    next.iter()
        .map(|(id, spec)| {
            let kept = current.get(id).filter(|old| ***old == *spec).cloned();
            (id.clone(), kept.unwrap_or_else(|| Arc::new(spec.clone())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_spec_stays_the_one_its_instance_holds() {
        let spec = |id: &str, enabled: bool| {
            let mut spec = crate::model::sample_spec();
            spec.process_id = ProcessId::from(id);
            spec.enabled = enabled;
            spec
        };
        let first: BTreeMap<ProcessId, InstanceSpec> =
            [("a", true), ("b", true), ("gone", true)].map(|(id, on)| (ProcessId::from(id), spec(id, on))).into();
        let current = kept_specs(&BTreeMap::new(), &first);
        let next: BTreeMap<ProcessId, InstanceSpec> =
            [("a", true), ("b", false), ("new", true)].map(|(id, on)| (ProcessId::from(id), spec(id, on))).into();
        let kept = kept_specs(&current, &next);
        let id = |id: &str| ProcessId::from(id);
        assert!(Arc::ptr_eq(&kept[&id("a")], &current[&id("a")]), "unchanged: the same Arc");
        assert!(!Arc::ptr_eq(&kept[&id("b")], &current[&id("b")]), "changed: its own");
        assert!(!kept[&id("b")].enabled);
        assert!(kept.contains_key(&id("new")) && !kept.contains_key(&id("gone")));
        assert_eq!(kept.len(), 3);
    }
}
