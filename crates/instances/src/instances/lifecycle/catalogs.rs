//! The catalog publisher: a discovered catalog into the store (with its token counts) and the search index, and
//! the events of what an instance offers (`mcp.tools.discovered`) and of how its tools changed (`mcp.tools.updated`,
//! the tool history, the drift warnings).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use crate::events::{Emitter, Event};
use crate::instances::instance::Instance;
use crate::model::{Catalog, InstanceSpec, ProcessId, ToolChange, ToolDef};
use crate::search::{SearchIndex, ToolDoc};
use crate::store::{CatalogOwner, Catalogs};

/// Where discovered catalogs go.
pub(in crate::instances) struct CatalogPublisher {
    /// The tool index; kept in step with every catalog the manager holds.
    search: SearchIndex,
    /// The saved catalogs and the tool history.
    store: Catalogs,
    /// Where the discovery events go (the SQLite outbox).
    events: Emitter,
    /// A tool whose description or schema changes within this time of a call has drifted.
    drift_window: Duration,
}

impl CatalogPublisher {
    pub(in crate::instances) fn new(
        search: SearchIndex,
        store: Catalogs,
        events: Emitter,
        drift_window: Duration,
    ) -> Self {
        Self { search, store, events, drift_window }
    }

    pub(in crate::instances) async fn index(&self, instance: &Instance, catalog: &Catalog) {
        let spec = instance.spec();
        // Handles on the catalog's tools; the index's writer makes each into a document as it adds it.
        let tools: Vec<(usize, ToolDef)> = catalog
            .tools
            .iter()
            .enumerate()
            .filter(|(_, tool)| !instance.tool_disabled(tool.name()))
            .map(|(at, tool)| (at, tool.clone()))
            .collect();
        let (process_id, server_slug) = (spec.process_id.0.clone(), spec.server_slug.clone());
        let docs = tools.into_iter().map(move |(at, tool)| ToolDoc::of(&process_id, &server_slug, &tool, at));
        if let Err(err) = self.search.replace_instance(&spec.process_id.0, docs).await {
            warn!(process_id = %spec.process_id, error = %err, "indexing tools failed");
        }
    }

    pub(in crate::instances) async fn unindex(&self, id: &ProcessId) {
        if let Err(err) = self.search.remove_instance(&id.0).await {
            warn!(process_id = %id, error = %err, "removing tools from the index failed");
        }
    }

    /// The catalog with its token counts into the store, and `mcp.tools.discovered`.
    pub(in crate::instances) async fn save_and_report(&self, instance: &Instance, catalog: &Catalog) {
        if let Err(err) = self.store.save_catalog(&CatalogOwner::from(instance.spec()), catalog).await {
            warn!(process_id = %instance.spec().process_id, error = %err, "saving catalog failed");
        }
        self.report_discovery(instance.spec(), catalog).await;
    }

    /// Count the tokens of a catalog published without them, put the counted catalog in its place (unless a
    /// newer discovery replaced it meanwhile, which reports its own), then save and report it.
    pub(in crate::instances) async fn count_and_report(&self, instance: &Instance, published: Arc<Catalog>) {
        let mut counted = (*published).clone();
        count_into(&mut counted).await;
        let counted = Arc::new(counted);
        if instance.replace_catalog(&published, counted.clone()) {
            self.save_and_report(instance, &counted).await;
        }
    }

    /// `mcp.tools.discovered` with each tool's token count (SB §15), counted by [`count_into`].
    async fn report_discovery(&self, spec: &InstanceSpec, catalog: &Catalog) {
        if !catalog.is_counted() {
            warn!(process_id = %spec.process_id, "tool tokens were not counted; no discovery event");
            return;
        }
        self.events.emit(Event::tools_discovered(spec, &catalog.tools, &catalog.tool_tokens)).await;
    }

    /// The tools among `changes` whose description or schema changed after a call within the drift window (how
    /// tool poisoning arrives), each warned of.
    pub(in crate::instances) async fn drifted(&self, spec: &InstanceSpec, changes: &[ToolChange]) -> HashSet<String> {
        let meaning: Vec<&str> = changes.iter().filter(|c| c.changes_meaning()).map(|c| c.name.as_str()).collect();
        let window = chrono::Duration::from_std(self.drift_window).unwrap_or(chrono::Duration::days(30));
        let since = crate::model::iso(chrono::Utc::now() - window);
        let drifted = match self.store.called_since(&spec.process_id.0, &meaning, &since).await {
            Ok(called) => called,
            Err(err) => {
                warn!(process_id = %spec.process_id, error = %err, "cannot tell which changed tools were called; drift not checked");
                Default::default()
            }
        };
        for change in changes.iter().filter(|c| drifted.contains(&c.name)) {
            warn!(
                tool = %crate::model::tool_path(&spec.server_slug, &change.name),
                process_id = %spec.process_id,
                changed = %change.parts.join(", "),
                "a tool called recently changed its description or schema; review the change before trusting it (tool poisoning arrives this way)"
            );
        }
        drifted
    }

    /// The change kept in the tool history, with the tools that drifted.
    pub(in crate::instances) async fn record_history(
        &self,
        spec: &InstanceSpec,
        changes: &[ToolChange],
        drifted: &HashSet<String>,
    ) {
        let owner = CatalogOwner::from(spec);
        if let Err(err) = self.store.record_tool_changes(&owner, changes, drifted).await {
            warn!(process_id = %spec.process_id, error = %err, "recording the tool history failed");
        }
    }

    /// `mcp.tools.updated` (BP §8.5-5): what was added, removed and updated (and which parts), and what drifted.
    pub(in crate::instances) async fn report_update(
        &self,
        spec: &InstanceSpec,
        changes: &[ToolChange],
        drifted: &HashSet<String>,
        tools: usize,
    ) {
        let mut drifted: Vec<&str> = drifted.iter().map(String::as_str).collect();
        drifted.sort_unstable();
        self.events.emit(Event::tools_updated(spec, changes, &drifted, tools)).await;
    }

    /// Forget the stored catalog of an instance removed for good.
    pub(in crate::instances) async fn delete_catalog(&self, id: &ProcessId) {
        if let Err(err) = self.store.delete_catalog(id).await {
            warn!(process_id = %id, error = %err, "deleting the stored catalog of a removed instance failed");
        }
    }
}

/// The catalogs stored by a previous run, counted.
pub(in crate::instances) async fn load_stored(
    store: &Catalogs,
) -> Result<HashMap<ProcessId, Arc<Catalog>>, crate::store::StoreError> {
    let mut stored = store.load_catalogs().await?;
    for catalog in stored.values_mut() {
        count_into(catalog).await;
    }
    Ok(stored.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
}

/// Count each tool's tokens (SB §15) on the blocking pool into `catalog.tool_tokens`; left empty (and logged)
/// when the encoder fails, so nothing reports a wrong count.
pub(in crate::instances) async fn count_into(catalog: &mut Catalog) {
    if catalog.is_counted() {
        return;
    }
    match crate::tokens::count_tools(catalog.tools.clone()).await {
        Ok(counts) => {
            catalog.tool_tokens = counts.into_iter().map(|n| u32::try_from(n).unwrap_or(u32::MAX)).collect();
        }
        Err(err) => warn!(tools = catalog.tools.len(), error = %err, "counting tool tokens failed"),
    }
}
