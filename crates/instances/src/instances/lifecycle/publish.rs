//! Publishing what an instance offers: discovery on its connection, the catalog (or the tools its config declares)
//! made the instance's and published (`catalogs`), the instance's status following, and a change of its tools
//! reported, with drifted tools held.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::{debug, warn};

use crate::discovery::{self, DiscoveryError};
use crate::instances::instance::Instance;
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::mcp::client::McpClient;
use crate::model::{Catalog, InstanceSpec, InstanceStatus, Upstream};

use super::catalogs::count_into;

/// A discovery as it ended: a catalog, the server's failure, or the backstop timeout.
type Discovered = Result<Result<Catalog, DiscoveryError>, tokio::time::error::Elapsed>;

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
            let message = Some("Discovering available tools from MCP server".into());
            self.reporter.set_status(instance, InstanceStatus::DiscoveringTools, message).await;
        }
        let budget = self.settings.discovery_timeout;
        let Some(discovered) = self.discover_catalog(instance, client, budget).await else { return false };
        match discovered {
            Ok(Ok(catalog)) => {
                self.publish(instance, catalog, online).await;
                true
            }
            Ok(Err(err)) => {
                let (status, message) = status_for(&instance.spec().upstream, &Failure::Discovery(&err));
                self.reporter.set_status(instance, status, Some(message)).await;
                false
            }
            Err(_) => {
                let message = format!("Process error: discovery timed out after {}s", budget.as_secs());
                self.reporter.set_status(instance, InstanceStatus::Offline, Some(message)).await;
                false
            }
        }
    }

    /// What the server lists within `budget`, or the tools its config declares when it lists none; `None` once the
    /// instance is retired.
    async fn discover_catalog(&self, instance: &Instance, client: &McpClient, budget: Duration) -> Option<Discovered> {
        let request_timeout = self.request_timeout(instance.spec());
        // The deadline inside keeps the pages that arrived before it; the outer timeout is only a backstop.
        let deadline = std::time::Instant::now() + budget;
        let discovered = tokio::select! {
            _ = instance.retired.cancelled() => return None,
            found = tokio::time::timeout(
                budget + Duration::from_secs(1),
                discovery::discover_until(client, request_timeout, deadline),
            ) => found,
        };
        Some(or_declared(instance.spec(), discovered))
    }

    /// Make a discovered catalog the instance's: counted (now, or in the background while the token encoder is not
    /// built yet), saved and reported, its changes reported, indexed, the instance online, and the lists that
    /// changed announced (all of them unless it `was_online`).
    async fn publish(self: &Arc<Self>, instance: &Arc<Instance>, mut catalog: Catalog, was_online: bool) {
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
            self.publisher.save_and_report(instance, &catalog).await;
        }
        if let Some(previous) = instance.catalog() {
            self.report_change(instance.spec(), &previous, &catalog).await;
        }
        self.publisher.index(instance, &catalog).await;
        let previous = instance.catalog();
        instance.set_catalog(catalog.clone());
        self.reporter.bump_visibility();
        if instance.state() != InstanceStatus::Online {
            let message = Some("MCP server is online and ready".into());
            self.reporter.set_status(instance, InstanceStatus::Online, message).await;
        }
        // After the status: a client that lists at once is answered from the new catalog. An instance that
        // comes back (restarted, reconnected) announces its lists even unchanged: while it was not online its
        // endpoint listed nothing, and a client that listed then would otherwise keep that empty list. So
        // does a new one's first catalog: a client that connected while it started (or whose stream followed
        // it from the instance it replaced, edited in place) listed nothing too.
        let previous = previous.unwrap_or_else(|| Arc::new(crate::model::Catalog::empty()));
        self.reporter.announce_list_changes(instance, &previous, &catalog, !was_online);
        if count_later {
            let (inner, instance) = (self.clone(), instance.clone());
            self.tasks.spawn(async move { inner.publisher.count_and_report(&instance, catalog).await });
        }
    }

    /// A re-discovery changed the instance's tools: `mcp.tools.updated` (BP §8.5-5) with what was added,
    /// removed and updated (and which parts), the change kept in the tool history, and a drift warning for each
    /// tool whose description or schema changed after a call within the drift window (how tool poisoning arrives).
    pub(in crate::instances) async fn report_change(&self, spec: &InstanceSpec, previous: &Catalog, current: &Catalog) {
        let changes = crate::model::catalog_diff(&previous.tools, &current.tools);
        if changes.is_empty() {
            return;
        }
        let drifted = self.publisher.drifted(spec, &changes).await;
        // The history first: from the moment a tool is held out of discover, the admin's history says why.
        self.publisher.record_history(spec, &changes, &drifted).await;
        if self.settings.hold_drifted_tools && !drifted.is_empty() {
            self.holds.hold(spec, &drifted).await;
        }
        self.publisher.report_update(spec, &changes, &drifted, current.tools.len()).await;
    }

    pub(in crate::instances) fn request_timeout(&self, spec: &InstanceSpec) -> Duration {
        match &spec.upstream {
            Upstream::Stdio { .. } => self.settings.call_timeout,
            Upstream::StreamableHttp { timeout, .. } | Upstream::Sse { timeout, .. } => *timeout,
        }
    }
}

/// A server that cannot list its tools, or lists none, gets the tools its config declares (marked so).
fn or_declared(spec: &InstanceSpec, discovered: Discovered) -> Discovered {
    match discovered {
        Ok(Ok(catalog)) if catalog.tools.is_empty() => {
            Ok(Ok(declared_catalog(spec, "the server listed no tools", catalog.clone()).unwrap_or(catalog)))
        }
        Ok(Err(err)) => match declared_catalog(spec, &format!("{err}"), Catalog::empty()) {
            Some(catalog) => Ok(Ok(catalog)),
            None => Ok(Err(err)),
        },
        other => other,
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
