//! The reconciler: one serialised pass that moves the live set of instances toward a desired state, stopping
//! what was removed or changed and starting what was added or changed, with bounded parallelism.

use super::*;

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
        let _serial = inner.reconcile.lock().await;
        let current = inner.state.read().desired.clone();
        keep_refused(&current, &mut desired);
        let changes: SnapshotDiff = diff(&current, &desired.instances);
        let report = ReconcileReport::of(&changes, &desired);

        let retired_by_edit = inner.retire(&changes, &current).await;
        inner.remove_deployments(&changes, &current, &desired.instances).await;
        for id in changes.removed.iter().chain(&changes.modified) {
            inner.unindex(id).await;
        }
        inner.note_uninstalled(&changes, &current, &desired.instances);

        let starting = inner.admit(&changes, &current, &desired.instances, retired_by_edit);
        inner.bump_visibility();
        // The live set is the new one (an instance edited in place is back under its path) and the directory of
        // users and tokens was replaced before the configuration was applied: the streams check their credential.
        inner.applied.send_modify(|applied| *applied += 1);
        for instance in &starting {
            // Tools from a previous run are searchable (when the instance is online) before rediscovery.
            if let Some(catalog) = instance.catalog() {
                inner.index(instance, &catalog).await;
            }
        }
        let first = !std::mem::replace(&mut inner.state.write().applied_once, true);
        if first {
            inner.adopt_orphans(&desired.instances);
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

    /// The starts of one apply, each waiting for its turn (`Inner::starting`): awaited for the first configuration,
    /// which then makes the satellite ready; run in the background for any later one.
    async fn run_starts(&self, starting: Vec<Arc<Instance>>, first: bool) {
        let inner = &self.inner;
        let manager = self.clone();
        let starts = async move {
            let inner = &manager.inner;
            futures::stream::iter(starting)
                .for_each_concurrent(None, |instance| async move {
                    let Ok(_turn) = inner.starting.acquire().await else { return };
                    inner.start(&instance).await
                })
                .await;
        };
        if first {
            starts.await;
            // Ready once the first configuration's instances have started (only then: a later apply arriving while
            // they start says nothing of them).
            inner.ready_tx.send_replace(true);
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
        let retiring: Vec<(Arc<Instance>, StopReason)> = {
            let mut state = self.state.write();
            let removed =
                changes.removed.iter().filter_map(|id| state.live.remove(id)).map(|i| (i, StopReason::Removed));
            let removed: Vec<_> = removed.collect();
            let replaced =
                changes.modified.iter().filter_map(|id| state.live.remove(id)).map(|i| (i, StopReason::Replaced));
            removed.into_iter().chain(replaced.collect::<Vec<_>>()).collect()
        };
        self.bump_visibility();
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
        let concurrency = self.deps.settings.reconcile_concurrency;
        futures::stream::iter(retiring)
            .for_each_concurrent(concurrency, |(instance, reason)| async move { self.stop(&instance, reason).await })
            .await;
        // What a removed instance leaves (its stored catalog) is deleted only after `REMOVAL_GRACE`
        // (`purge_removed`): back before then, it starts with its tools, as after a restart.
        let now = std::time::Instant::now();
        let mut state = self.state.write();
        state.stored.extend(kept);
        for id in &changes.removed {
            state.removed.insert(id.clone(), (now, current.get(id).cloned()));
        }
        retired_by_edit
    }

    /// Uninstall semantics (SB §9.9): a GitHub deployment goes with the last instance of its installation.
    async fn remove_deployments(
        &self,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
        desired: &BTreeMap<ProcessId, InstanceSpec>,
    ) {
        let Some(deployer) = &self.deps.deployer else { return };
        for spec in changes.removed.iter().filter_map(|id| current.get(id)).filter(|s| s.deployment.is_some()) {
            let still_used = desired.values().any(|d| d.installation_id == spec.installation_id);
            if !still_used {
                deployer.remove(&spec.team_id, &spec.installation_id).await;
            }
        }
    }

    /// Note the installations this apply uninstalled, and forget the removals and uninstalls it brought back.
    fn note_uninstalled(
        &self,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
        desired: &BTreeMap<ProcessId, InstanceSpec>,
    ) {
        // Uninstalled: drift holds of the installation go with it (a reused id starts clean).
        let gone: std::collections::BTreeSet<&InstallationId> = changes
            .removed
            .iter()
            .filter_map(|id| current.get(id))
            .map(|s| &s.installation_id)
            .filter(|installation| !desired.values().any(|d| &d.installation_id == *installation))
            .collect();
        let now = std::time::Instant::now();
        let mut state = self.state.write();
        for installation in gone {
            state.uninstalled.insert(installation.clone(), now);
        }
        // Back within the grace: nothing of theirs is deleted. Back changed (another command, version,
        // environment under the same process id), it starts from scratch, as an instance edited in place does.
        let mut changed = Vec::new();
        state.removed.retain(|id, (_, old)| match desired.get(id) {
            None => true,
            Some(new) => {
                if old.as_deref() != Some(new) {
                    changed.push(id.clone());
                }
                false
            }
        });
        for id in changed {
            state.stored.remove(&id);
        }
        state.uninstalled.retain(|installation, _| !desired.values().any(|d| &d.installation_id == installation));
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
        let mut state = self.state.write();
        let mut starting = Vec::new();
        for id in changes.added.iter().chain(&changes.modified) {
            let spec = &desired[id];
            if !spec.enabled {
                continue;
            }
            // A changed instance starts from scratch; an added one may have tools from a previous run.
            let stored = state.stored.remove(id).filter(|_| changes.added.contains(id));
            let max_calls = self.deps.settings.lifecycle.max_calls_per_instance;
            let instance = Arc::new(Instance::new(specs[id].clone(), stored, max_calls, self.overrides.clone()));
            if let Some(predecessor) = predecessors.get(id) {
                instance.carry_client_state(predecessor);
            }
            state.live.insert(instance.clone());
            starting.push(instance);
        }
        state.desired = specs;
        starting
    }

    /// After the first apply: catalogs of instances the configuration does not name, and holds of installations it
    /// does not name, would otherwise live forever: they go the way of removed ones, deleted after `REMOVAL_GRACE` (a
    /// configuration cut short at start costs nothing either). Catalogs of a previous run are no longer handed to
    /// instances that start later.
    fn adopt_orphans(&self, desired: &BTreeMap<ProcessId, InstanceSpec>) {
        let now = std::time::Instant::now();
        let held: std::collections::BTreeSet<InstallationId> =
            self.holds.read().iter().map(|(installation, _)| installation.clone()).collect();
        let mut state = self.state.write();
        let orphans: Vec<ProcessId> = state.stored.drain().map(|(id, _)| id).collect();
        for id in orphans.into_iter().filter(|id| !desired.contains_key(id)) {
            state.removed.entry(id).or_insert((now, None));
        }
        for installation in held {
            if !desired.values().any(|d| d.installation_id == installation) {
                state.uninstalled.entry(installation).or_insert(now);
            }
        }
    }
}

impl InstanceManager {
    /// Delete what instances and installations removed more than `grace` ago left behind: stored catalogs and
    /// drift holds (the uninstall of SB §9.9, deferred: see `REMOVAL_GRACE`). Returns how many were deleted.
    pub async fn purge_removed(&self, grace: Duration) -> usize {
        let inner = &self.inner;
        // Not while an apply runs: it may be bringing them back.
        let _serial = inner.reconcile.lock().await;
        let (catalogs, installations) = {
            let mut state = inner.state.write();
            let due = |since: &std::time::Instant| since.elapsed() >= grace;
            let catalogs: Vec<ProcessId> =
                state.removed.iter().filter(|(_, (since, _))| due(since)).map(|(id, _)| id.clone()).collect();
            let installations: Vec<InstallationId> =
                state.uninstalled.iter().filter(|(_, since)| due(since)).map(|(id, _)| id.clone()).collect();
            for id in &catalogs {
                state.removed.remove(id);
                state.stored.remove(id);
            }
            for installation in &installations {
                state.uninstalled.remove(installation);
            }
            (catalogs, installations)
        };
        for id in &catalogs {
            if let Err(err) = inner.deps.store.delete_catalog(id).await {
                warn!(process_id = %id, error = %err, "deleting the stored catalog of a removed instance failed");
            }
        }
        for installation in &installations {
            // The database first, then memory (the order `sync_holds` relies on), and the held tools' switches too.
            if let Err(err) = inner.deps.store.release_holds_of(installation.as_str()).await {
                warn!(installation_id = %installation, error = %err, "releasing the holds of an uninstalled installation failed");
                continue;
            }
            let released: Vec<String> = {
                let mut holds = inner.holds.write();
                let released =
                    holds.iter().filter(|(held, _)| held == installation).map(|(_, tool)| tool.clone()).collect();
                holds.retain(|(held, _)| held != installation);
                released
            };
            if let Some(switches) = inner.overrides.write().get_mut(installation) {
                for tool in &released {
                    switches.remove(tool);
                }
            }
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
