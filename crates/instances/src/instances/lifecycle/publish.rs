//! What an instance offers and how it is: discovery into the catalog, the store, the search index and the
//! discovery events; every status change through the transition function.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::{debug, error, warn};

use crate::discovery;
use crate::events::Event;
use crate::instances::instance::Instance;
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::mcp::client::McpClient;
use crate::model::{Catalog, InstanceSpec, InstanceStatus, ProcessId, ToolDef, Upstream};
use crate::search::ToolDoc;
use crate::store::CatalogOwner;

impl Inner {
    /// Run discovery on a connected instance and publish the result; true when it went online.
    /// With `announce` the instance passes through `discovering_tools`; a rediscovery of an online
    /// instance (tool list changed) keeps serving its current tools until the new ones are in.
    pub(in crate::instances) async fn discover_into(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        client: &Arc<McpClient>,
        announce: bool,
    ) -> bool {
        let online = instance.state() == InstanceStatus::Online;
        if announce || !online {
            self.set_status(
                instance,
                InstanceStatus::DiscoveringTools,
                Some("Discovering available tools from MCP server".into()),
            )
            .await;
        }
        let request_timeout = self.request_timeout(instance.spec());
        let budget = self.deps.settings.discovery_timeout;
        // The deadline inside keeps the pages that arrived before it; the outer timeout is only a backstop.
        let deadline = std::time::Instant::now() + budget;
        let discovered = tokio::select! {
            _ = instance.retired.cancelled() => return false,
            found = tokio::time::timeout(
                budget + Duration::from_secs(1),
                discovery::discover_until(client, request_timeout, deadline),
            ) => found,
        };
        // A server that cannot list its tools, or lists none, gets the tools its config declares (marked so).
        let discovered = match discovered {
            Ok(Ok(catalog)) if catalog.tools.is_empty() => {
                Ok(Ok(
                    declared_catalog(instance.spec(), "the server listed no tools", catalog.clone()).unwrap_or(catalog)
                ))
            }
            Ok(Err(err)) => match declared_catalog(instance.spec(), &format!("{err}"), Catalog::empty()) {
                Some(catalog) => Ok(Ok(catalog)),
                None => Ok(Err(err)),
            },
            other => other,
        };
        match discovered {
            Ok(Ok(mut catalog)) => {
                // Building the token encoder takes ~130 ms, once per process (and again after it was released
                // when idle): a first instance does not wait for it to serve its tools. Its counts, the saved
                // catalog and `mcp.tools.discovered` follow as soon as they are counted.
                let count_later = !crate::tokens::is_built() && !catalog.is_counted();
                if !count_later {
                    count_into(&mut catalog).await;
                }
                let catalog = Arc::new(catalog);
                debug!(process_id = %instance.spec().process_id, tools = catalog.tools.len(), resources = catalog.resources.len(), count_later, "tools discovered");
                if !count_later {
                    self.save_and_report(instance, &catalog).await;
                }
                if let Some(previous) = instance.catalog() {
                    self.report_change(instance.spec(), &previous, &catalog).await;
                }
                self.index(instance, &catalog).await;
                let previous = instance.catalog();
                instance.set_catalog(catalog.clone());
                self.bump_visibility();
                if instance.state() != InstanceStatus::Online {
                    self.set_status(instance, InstanceStatus::Online, Some("MCP server is online and ready".into()))
                        .await;
                }
                // After the status: a client that lists at once is answered from the new catalog. An instance that
                // comes back (restarted, reconnected) announces its lists even unchanged: while it was not online its
                // endpoint listed nothing, and a client that listed then would otherwise keep that empty list. So
                // does a new one's first catalog: a client that connected while it started (or whose stream followed
                // it from the instance it replaced, edited in place) listed nothing too.
                let previous = previous.unwrap_or_else(|| Arc::new(crate::model::Catalog::empty()));
                self.announce_list_changes(instance, &previous, &catalog, !online);
                if count_later {
                    let (inner, instance) = (self.clone(), instance.clone());
                    self.tasks.spawn(async move { inner.count_and_report(&instance, catalog).await });
                }
                true
            }
            Ok(Err(err)) => {
                let (status, message) = status_for(&instance.spec().upstream, &Failure::Discovery(&err));
                self.set_status(instance, status, Some(message)).await;
                false
            }
            Err(_) => {
                let message = format!("Process error: discovery timed out after {}s", budget.as_secs());
                self.set_status(instance, InstanceStatus::Offline, Some(message)).await;
                false
            }
        }
    }

    /// The catalog with its token counts into the store, and `mcp.tools.discovered`.
    async fn save_and_report(&self, instance: &Instance, catalog: &Catalog) {
        if let Err(err) = self.deps.store.save_catalog(&CatalogOwner::from(instance.spec()), catalog).await {
            warn!(process_id = %instance.spec().process_id, error = %err, "saving catalog failed");
        }
        self.report_discovery(instance.spec(), catalog).await;
    }

    /// Count the tokens of a catalog published without them, put the counted catalog in its place (unless a
    /// newer discovery replaced it meanwhile, which reports its own), then save and report it.
    async fn count_and_report(&self, instance: &Instance, published: Arc<Catalog>) {
        let mut counted = (*published).clone();
        count_into(&mut counted).await;
        let counted = Arc::new(counted);
        if instance.replace_catalog(&published, counted.clone()) {
            self.save_and_report(instance, &counted).await;
        }
    }

    /// After a re-discovery, the lists that really changed are announced (all of them when the instance `came_back`
    /// online): `notifications/tools/list_changed` and
    /// `…/resources/list_changed` to the instance endpoint's sessions (sent now, not when the server announced, so
    /// a client that lists again gets the new catalog), and a resource change to the owner's `/mcp` sessions.
    fn announce_list_changes(&self, instance: &Instance, previous: &Catalog, current: &Catalog, came_back: bool) {
        let tools = came_back || !crate::model::catalog_diff(&previous.tools, &current.tools).is_empty();
        let has_resources = !current.resources.is_empty() || !current.templates.is_empty();
        let resources = (came_back && has_resources)
            || previous.resources != current.resources
            || previous.templates != current.templates;
        for (changed, method) in
            [(tools, "notifications/tools/list_changed"), (resources, "notifications/resources/list_changed")]
        {
            if changed {
                instance.announce(Arc::new(crate::mcp::protocol::notification(method, None)));
            }
        }
        self.view_changed(instance.spec(), resources, false);
    }

    /// `mcp.tools.discovered` with each tool's token count (SB §15), counted by [`count_into`].
    pub(in crate::instances) async fn report_discovery(&self, spec: &InstanceSpec, catalog: &Catalog) {
        if !catalog.is_counted() {
            warn!(process_id = %spec.process_id, "tool tokens were not counted; no discovery event");
            return;
        }
        self.emit(Event::tools_discovered(spec, &catalog.tools, &catalog.tool_tokens)).await;
    }

    /// A re-discovery changed the instance's tools: `mcp.tools.updated` (BP §8.5-5) with what was added,
    /// removed and updated (and which parts), the change kept in the tool history, and a drift warning for each
    /// tool whose description or schema changed after a call within the drift window (how tool poisoning arrives).
    pub(in crate::instances) async fn report_change(&self, spec: &InstanceSpec, previous: &Catalog, current: &Catalog) {
        let changes = crate::model::catalog_diff(&previous.tools, &current.tools);
        if changes.is_empty() {
            return;
        }
        let meaning: Vec<&str> = changes.iter().filter(|c| c.changes_meaning()).map(|c| c.name.as_str()).collect();
        let window = chrono::Duration::from_std(self.deps.settings.drift_window).unwrap_or(chrono::Duration::days(30));
        let since = crate::model::iso(chrono::Utc::now() - window);
        let drifted = match self.deps.store.called_since(&spec.process_id.0, &meaning, &since).await {
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
        // The history first: from the moment a tool is held out of discover, the admin's history says why.
        let owner = CatalogOwner::from(spec);
        if let Err(err) = self.deps.store.record_tool_changes(&owner, &changes, &drifted).await {
            warn!(process_id = %spec.process_id, error = %err, "recording the tool history failed");
        }
        if self.deps.settings.hold_drifted_tools && !drifted.is_empty() {
            // Held for the whole installation (the change is the server's) until an admin accepts it; the index
            // built right after this leaves held tools out. Stored first, so a restart does not release a tool
            // nobody reviewed and replicas on the same database (`sync_holds`) hold it too.
            let tools: Vec<&str> = drifted.iter().map(String::as_str).collect();
            if let Err(err) = self.deps.store.hold_tools(&spec.installation_id.0, &spec.process_id.0, &tools).await {
                warn!(process_id = %spec.process_id, error = %err, "storing the hold of drifted tools failed; it lasts until a restart");
            }
            {
                let mut overrides = self.overrides.write();
                let held = overrides.entry(spec.installation_id.clone()).or_default();
                let mut holds = self.holds.write();
                for tool in &drifted {
                    held.insert(tool.clone(), true);
                    holds.insert((spec.installation_id.clone(), tool.clone()));
                }
            }
            warn!(process_id = %spec.process_id, tools = %drifted.iter().cloned().collect::<Vec<_>>().join(", "), "drifted tools held out of discover and calls until an admin accepts them: POST /api/tools/accept");
        }
        let mut drifted: Vec<&str> = drifted.iter().map(String::as_str).collect();
        drifted.sort_unstable();
        self.emit(Event::tools_updated(spec, &changes, &drifted, current.tools.len())).await;
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
        if let Err(err) = self.deps.search.replace_instance(&spec.process_id.0, docs).await {
            warn!(process_id = %spec.process_id, error = %err, "indexing tools failed");
        }
    }

    pub(in crate::instances) async fn unindex(&self, id: &ProcessId) {
        if let Err(err) = self.deps.search.remove_instance(&id.0).await {
            warn!(process_id = %id, error = %err, "removing tools from the index failed");
        }
    }

    pub(in crate::instances) fn request_timeout(&self, spec: &InstanceSpec) -> Duration {
        match &spec.upstream {
            Upstream::Stdio { .. } => self.deps.settings.call_timeout,
            Upstream::StreamableHttp { timeout, .. } | Upstream::Sse { timeout, .. } => *timeout,
        }
    }

    /// Move an instance to `status` through the transition function, recording the change and its event
    /// in one transaction. An impossible move is refused and logged.
    pub(in crate::instances) async fn set_status(
        &self,
        instance: &Instance,
        status: InstanceStatus,
        message: Option<String>,
    ) {
        let spec = instance.spec();
        let was_visible = instance.state().tools_visible();
        // A message is often an upstream's own error text, which may echo a key the config holds secret; it is
        // kept, shown on the debug route and sent in `mcp.server.status_changed` (SB §22).
        let message = message.map(|text| crate::secrets::hide(&text, instance.secret_values()));
        let entry = match instance.set_status(status, message) {
            Ok(entry) => {
                self.bump_visibility();
                if was_visible != status.tools_visible() {
                    // An instance coming or going changes the owner's resources and prompts on `/mcp`.
                    self.view_changed(spec, true, true);
                }
                entry
            }
            Err((from, to)) => {
                error!(process_id = %spec.process_id, from = %from, to = %to, "refused impossible status transition");
                return;
            }
        };
        match status {
            InstanceStatus::Error
            | InstanceStatus::Offline
            | InstanceStatus::RequiresReauth
            | InstanceStatus::PermanentlyFailed => {
                warn!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, reason = entry.message.as_deref().unwrap_or("none given"), "instance is not serving; its tools are hidden until it recovers (details: GET /api/status/debug)")
            }
            _ => {
                debug!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, "instance status changed")
            }
        }
        if let Err(err) =
            self.deps.events.status_changed(spec, status, entry.message.as_deref(), entry.updated_at).await
        {
            error!(process_id = %spec.process_id, status = %status, error = %err, "recording status change failed");
        }
    }

    pub(in crate::instances) async fn emit(&self, event: Event) {
        self.deps.events.emit(event).await;
    }
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

/// `base` with the tools the config declares for this server, and a fallback note saying why; `None` when
/// the config declares none.
fn declared_catalog(spec: &InstanceSpec, why: &str, mut base: Catalog) -> Option<Catalog> {
    let declared: Vec<Value> = serde_json::from_str(spec.declared_tools.as_deref()?).ok()?;
    base.tools = crate::model::ToolDef::listing(declared);
    let note = format!("tools from the config ({} declared): {why}", base.tools.len());
    warn!(process_id = %spec.process_id, reason = %why, tools = base.tools.len(), "using the tool list declared in the config");
    base.fallbacks.push(note);
    Some(base)
}
