//! Tool switches at run time: an administrator's `update_tool_status`, and drift holds, tools held out of discover
//! and calls after they changed following a call, until an admin accepts them. Holds are written to the database
//! before memory, so replicas on one database hold and release the same tools (`sync_holds`).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use parking_lot::RwLock;
use tracing::{info, warn};

use crate::model::{InstallationId, InstanceSpec};
use crate::store::{Catalogs, StoreError};

use super::{Instance, InstanceManager, ToolOverrides};

/// The run-time switches and the drift holds among them.
pub(in crate::instances) struct DriftHolds {
    /// Where holds are kept across restarts and shared by replicas (`tool_holds`).
    store: Catalogs,
    /// Per installation, tool name → disabled; shared with every instance.
    overrides: ToolOverrides,
    /// The drift holds among `overrides` (as stored in `tool_holds`): what `sync_holds` compares with the
    /// database when replicas share one.
    held: RwLock<HashSet<(InstallationId, String)>>,
}

impl DriftHolds {
    /// The holds stored by a previous run: drifted tools an admin has not accepted yet stay held across restarts.
    pub(in crate::instances) async fn load(store: Catalogs) -> Result<Self, StoreError> {
        let overrides = ToolOverrides::default();
        let mut holds = HashSet::new();
        for held in store.held_tools().await? {
            let installation = InstallationId(held.installation_id);
            overrides.write().entry(installation.clone()).or_default().insert(held.tool_name.clone(), true);
            holds.insert((installation, held.tool_name));
        }
        Ok(Self { store, overrides, held: RwLock::new(holds) })
    }

    /// The switches, for a new instance to consult.
    pub(in crate::instances) fn overrides(&self) -> ToolOverrides {
        self.overrides.clone()
    }

    /// Switch `tool` of `installation` on or off for every member.
    fn switch(&self, installation: &InstallationId, tool: &str, disabled: bool) {
        self.overrides.write().entry(installation.clone()).or_default().insert(tool.to_owned(), disabled);
    }

    /// A tool enabled by an admin (accepted, or the backend's update_tool_status): a drift hold on it ends too, in
    /// the database first, so a replica's `sync_holds` never sees it released here but held there.
    async fn release(&self, installation: &InstallationId, tool: &str) {
        if let Err(err) = self.store.release_hold(installation.as_str(), tool).await {
            warn!(installation_id = %installation, tool, error = %err, "releasing a stored tool hold failed; it returns at the next start");
        }
        self.held.write().remove(&(installation.clone(), tool.to_owned()));
    }

    /// Hold `drifted` tools of `spec`'s installation (the change is the server's) until an admin accepts them; the
    /// index built right after leaves held tools out. Stored first, so a restart does not release a tool nobody
    /// reviewed and replicas on the same database (`sync_holds`) hold it too.
    pub(in crate::instances) async fn hold(&self, spec: &InstanceSpec, drifted: &HashSet<String>) {
        let tools: Vec<&str> = drifted.iter().map(String::as_str).collect();
        if let Err(err) = self.store.hold_tools(&spec.installation_id.0, &spec.process_id.0, &tools).await {
            warn!(process_id = %spec.process_id, error = %err, "storing the hold of drifted tools failed; it lasts until a restart");
        }
        {
            let mut overrides = self.overrides.write();
            let held = overrides.entry(spec.installation_id.clone()).or_default();
            let mut holds = self.held.write();
            for tool in drifted {
                held.insert(tool.clone(), true);
                holds.insert((spec.installation_id.clone(), tool.clone()));
            }
        }
        warn!(process_id = %spec.process_id, tools = %drifted.iter().cloned().collect::<Vec<_>>().join(", "), "drifted tools held out of discover and calls until an admin accepts them: POST /api/tools/accept");
    }

    /// The installations that hold tools now.
    pub(in crate::instances) fn installations(&self) -> BTreeSet<InstallationId> {
        self.held.read().iter().map(|(installation, _)| installation.clone()).collect()
    }

    /// An installation uninstalled for good: its holds go, in the database first, then in memory (the order
    /// `sync_holds` relies on), and the held tools' switches too.
    pub(in crate::instances) async fn release_installation(&self, installation: &InstallationId) {
        if let Err(err) = self.store.release_holds_of(installation.as_str()).await {
            warn!(installation_id = %installation, error = %err, "releasing the holds of an uninstalled installation failed");
            return;
        }
        let released: Vec<String> = {
            let mut holds = self.held.write();
            let released =
                holds.iter().filter(|(held, _)| held == installation).map(|(_, tool)| tool.clone()).collect();
            holds.retain(|(held, _)| held != installation);
            released
        };
        if let Some(switches) = self.overrides.write().get_mut(installation) {
            for tool in &released {
                switches.remove(tool);
            }
        }
    }
}

impl InstanceManager {
    /// BP §6.1.1 `update_tool_status`: switch one tool of an installation for every member; the search index
    /// follows at once. Returns the instances affected.
    pub async fn set_tool_status(&self, installation: &InstallationId, tool: &str, disabled: bool) -> usize {
        if !disabled {
            self.inner.holds.release(installation, tool).await;
        }
        self.inner.holds.switch(installation, tool, disabled);
        let affected: Vec<Arc<Instance>> =
            self.instances().into_iter().filter(|i| &i.spec().installation_id == installation).collect();
        for instance in &affected {
            if let Some(catalog) = instance.catalog() {
                self.inner.publisher.index(instance, &catalog).await;
            }
        }
        // Views narrowed to a toolset leave disabled tools out: they are rebuilt with the tool back (or gone).
        self.inner.reporter.bump_visibility();
        affected.len()
    }

    /// Replicas on one database: make this replica's drift holds what the database says, so a tool another
    /// replica held is held here too, and one accepted on another replica (`POST /api/tools/accept`) is served
    /// here again. Returns how many holds changed.
    pub async fn sync_holds(&self) -> Result<usize, StoreError> {
        let holds = &self.inner.holds;
        // This replica's holds first, then the database's: holds and releases are written to the database before
        // memory, so what this replica holds and the database no longer does was released, never just made.
        let here = holds.held.read().clone();
        let stored: HashSet<(InstallationId, String)> = holds
            .store
            .held_tools()
            .await?
            .into_iter()
            .map(|h| (InstallationId(h.installation_id), h.tool_name))
            .collect();
        let mut changed = 0;
        for (installation, tool) in here.difference(&stored) {
            info!(installation_id = %installation, tool, "a held tool was accepted on another replica; served again");
            self.set_tool_status(installation, tool, false).await;
            changed += 1;
        }
        for (installation, tool) in stored.difference(&here) {
            info!(installation_id = %installation, tool, "a tool another replica held is held here too");
            holds.held.write().insert((installation.clone(), tool.clone()));
            self.set_tool_status(installation, tool, true).await;
            changed += 1;
        }
        Ok(changed)
    }
}
