//! The roster: which instances should exist (the last applied desired state) and which do (the live set, looked up
//! by id, owner and path), what removed ones left behind for a while (their stored catalogs, their installations'
//! holds), and the reconciler's turns and signals (readiness, each configuration applied).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::control::SnapshotDiff;
use crate::events::StopReason;
use crate::mcp::client::McpClient;
use crate::model::{Catalog, InstallationId, InstanceSpec, InstanceStatus, ProcessId, TeamId, Upstream, UserId};

use super::{live, Instance};

#[derive(Default)]
struct State {
    /// The last applied desired state, enabled and disabled entries alike.
    /// Shared with the live instances: one copy of each spec.
    desired: BTreeMap<ProcessId, Arc<InstanceSpec>>,
    /// Enabled instances.
    live: live::Live,
    /// Catalogs from the database, handed to instances as they are created.
    stored: HashMap<ProcessId, Arc<Catalog>>,
    /// Instances removed from the desired state, and when: their stored catalogs are deleted only after
    /// `REMOVAL_GRACE` (`purge_removed`), so a configuration cut short for a moment costs no catalog.
    /// With the spec it had (`None`: a catalog of a previous run the configuration did not name at start): a
    /// catalog is handed back only to the same spec.
    removed: HashMap<ProcessId, (Instant, Option<Arc<InstanceSpec>>)>,
    /// Installations with no instance left, and since when: their drift holds are released after `REMOVAL_GRACE`.
    uninstalled: HashMap<InstallationId, Instant>,
    applied_once: bool,
}

/// The instances wanted and running.
pub(super) struct Roster {
    state: RwLock<State>,
    /// Serialises reconciles.
    pub(super) reconcile: tokio::sync::Mutex<()>,
    /// Turns to start an instance a configuration added or changed: `reconcile_concurrency` at once across every
    /// apply, whose starts run on after it returns.
    pub(super) starting: tokio::sync::Semaphore,
    ready_tx: watch::Sender<bool>,
    /// Bumped by every configuration applied, once the live set is the new one (before its new instances have
    /// started): the long-lived client streams check their credential again then.
    applied: watch::Sender<u64>,
}

impl Roster {
    /// No instance yet; `stored`, the catalogs of a previous run, are handed to instances as they are created.
    pub(super) fn new(stored: HashMap<ProcessId, Arc<Catalog>>, starts_at_once: usize) -> Self {
        Self {
            state: RwLock::new(State { stored, ..State::default() }),
            reconcile: tokio::sync::Mutex::new(()),
            starting: tokio::sync::Semaphore::new(starts_at_once),
            ready_tx: watch::channel(false).0,
            applied: watch::Sender::new(0),
        }
    }

    pub(super) fn ready(&self) -> watch::Receiver<bool> {
        self.ready_tx.subscribe()
    }

    pub(super) fn set_ready(&self) {
        self.ready_tx.send_replace(true);
    }

    pub(super) fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// A configuration was applied: the live set is the new one.
    pub(super) fn bump_applied(&self) {
        self.applied.send_modify(|applied| *applied += 1);
    }

    pub(super) fn has_applied(&self) -> bool {
        self.state.read().applied_once
    }

    /// Note that a desired state was applied; true the first time.
    pub(super) fn mark_applied(&self) -> bool {
        !std::mem::replace(&mut self.state.write().applied_once, true)
    }

    pub(super) fn get(&self, process_id: &ProcessId) -> Option<Arc<Instance>> {
        self.state.read().live.get(process_id).cloned()
    }

    pub(super) fn of_owner(&self, user: &UserId, team: &TeamId) -> Vec<Arc<Instance>> {
        self.state.read().live.of_owner(user, team).to_vec()
    }

    pub(super) fn by_path(&self, path: &str) -> Option<Arc<Instance>> {
        self.state.read().live.by_path(path).cloned()
    }

    /// Every enabled instance, in no particular order.
    pub(super) fn all(&self) -> Vec<Arc<Instance>> {
        self.state.read().live.values().cloned().collect()
    }

    /// The applied specs, enabled or not.
    pub(super) fn desired(&self) -> BTreeMap<ProcessId, Arc<InstanceSpec>> {
        self.state.read().desired.clone()
    }

    /// The stdio instances of the live set (running or not).
    pub(super) fn running_stdio(&self) -> Vec<Arc<Instance>> {
        let state = self.state.read();
        state.live.values().filter(|i| matches!(i.spec().upstream, Upstream::Stdio { .. })).cloned().collect()
    }

    /// Online instances whose server asks for periodic discovery (`rediscover_every`) and whose catalog is older
    /// than that at `now`, with their connections.
    pub(super) fn due_for_rediscovery(
        &self,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Vec<(Arc<Instance>, Arc<McpClient>)> {
        self.state
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
            .collect()
    }

    /// Take every instance out.
    pub(super) fn drain(&self) -> Vec<Arc<Instance>> {
        self.state.write().live.drain()
    }

    /// Take the removed and the changed instances out of the live set, with why each goes.
    pub(super) fn take_retiring(&self, changes: &SnapshotDiff) -> Vec<(Arc<Instance>, StopReason)> {
        let mut state = self.state.write();
        let removed = changes.removed.iter().filter_map(|id| state.live.remove(id)).map(|i| (i, StopReason::Removed));
        let removed: Vec<_> = removed.collect();
        let replaced =
            changes.modified.iter().filter_map(|id| state.live.remove(id)).map(|i| (i, StopReason::Replaced));
        removed.into_iter().chain(replaced.collect::<Vec<_>>()).collect()
    }

    /// What removed instances leave (their catalogs, `kept`) is deleted only after `REMOVAL_GRACE`
    /// (`purge_removed`): back before then, they start with their tools, as after a restart.
    pub(super) fn keep_removed(
        &self,
        kept: Vec<(ProcessId, Arc<Catalog>)>,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
    ) {
        let now = Instant::now();
        let mut state = self.state.write();
        state.stored.extend(kept);
        for id in &changes.removed {
            state.removed.insert(id.clone(), (now, current.get(id).cloned()));
        }
    }

    /// Note the installations this apply uninstalled, and forget the removals and uninstalls it brought back.
    pub(super) fn note_uninstalled(
        &self,
        changes: &SnapshotDiff,
        current: &BTreeMap<ProcessId, Arc<InstanceSpec>>,
        desired: &BTreeMap<ProcessId, InstanceSpec>,
    ) {
        // Uninstalled: drift holds of the installation go with it (a reused id starts clean).
        let gone: BTreeSet<&InstallationId> = changes
            .removed
            .iter()
            .filter_map(|id| current.get(id))
            .map(|s| &s.installation_id)
            .filter(|installation| !desired.values().any(|d| &d.installation_id == *installation))
            .collect();
        let now = Instant::now();
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

    /// Put the added and the changed instances that are enabled in the live set (not started yet), each made by
    /// `make` from its spec and the catalog stored for it, and make `specs` the desired ones. Returns the instances
    /// to start.
    pub(super) fn admit(
        &self,
        changes: &SnapshotDiff,
        specs: BTreeMap<ProcessId, Arc<InstanceSpec>>,
        make: impl Fn(Arc<InstanceSpec>, Option<Arc<Catalog>>) -> Arc<Instance>,
    ) -> Vec<Arc<Instance>> {
        let mut state = self.state.write();
        let mut starting = Vec::new();
        for id in changes.added.iter().chain(&changes.modified) {
            let spec = &specs[id];
            if !spec.enabled {
                continue;
            }
            // A changed instance starts from scratch; an added one may have tools from a previous run.
            let stored = state.stored.remove(id).filter(|_| changes.added.contains(id));
            let instance = make(spec.clone(), stored);
            state.live.insert(instance.clone());
            starting.push(instance);
        }
        state.desired = specs;
        starting
    }

    /// After the first apply: catalogs of instances the configuration does not name, and holds (of the `held`
    /// installations) it does not name, would otherwise live forever: they go the way of removed ones, deleted
    /// after `REMOVAL_GRACE` (a configuration cut short at start costs nothing either). Catalogs of a previous run
    /// are no longer handed to instances that start later.
    pub(super) fn adopt_orphans(&self, desired: &BTreeMap<ProcessId, InstanceSpec>, held: BTreeSet<InstallationId>) {
        let now = Instant::now();
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

    /// Forget the instances and installations removed more than `grace` ago (and the catalogs kept for them):
    /// returned for what they left in the database to be deleted.
    pub(super) fn take_purgeable(&self, grace: Duration) -> (Vec<ProcessId>, Vec<InstallationId>) {
        let mut state = self.state.write();
        let due = |since: &Instant| since.elapsed() >= grace;
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
    }
}
