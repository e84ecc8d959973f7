//! What the manager tells others of its instances: every status change, through the transition function and with
//! its `mcp.server.status_changed` event; the lifecycle and resource-limit events; and who must look again (the
//! visibility version that callers' cached views follow, members' list changes for their `/mcp` sessions).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::{debug, error, warn};

use crate::events::{Emitter, Event, LimitExceeded, LimitedResource, Throttle};
use crate::instances::instance::Instance;
use crate::model::{Catalog, InstanceSpec, InstanceStatus, TeamId, UserId};

/// At most one `resource.limit.exceeded` per (team, resource, instance) in this window.
const LIMIT_EVENT_WINDOW: Duration = Duration::from_secs(60);

/// List changes kept for a session stream that is behind; one that falls further behind is told everything changed.
const VIEW_CHANGES_BUFFER: usize = 1024;

/// A member's lists (as `/mcp` shows them) changed: an instance of theirs came or went, or a re-discovery
/// changed its resources, or its server announced new prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewChange {
    pub team: TeamId,
    pub user: UserId,
    pub resources: bool,
    pub prompts: bool,
}

impl ViewChange {
    /// The notifications a session of this member is sent.
    pub fn notifications(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.resources {
            out.push(crate::mcp::protocol::notification("notifications/resources/list_changed", None));
        }
        if self.prompts {
            out.push(crate::mcp::protocol::notification("notifications/prompts/list_changed", None));
        }
        out
    }
}

/// Status changes, events and the signals that tell callers to look again.
pub(in crate::instances) struct Reporter {
    /// Where lifecycle events go (the SQLite outbox).
    events: Emitter,
    /// One `resource.limit.exceeded` a minute per (team, resource, instance).
    limit_events: Throttle,
    /// Bumped whenever what some caller can see may have changed: the live set, a status, a catalog.
    visibility: AtomicU64,
    /// Which member's lists changed, for the hierarchical router's open sessions.
    view_changes: tokio::sync::broadcast::Sender<ViewChange>,
}

impl Reporter {
    pub(in crate::instances) fn new(events: Emitter) -> Self {
        Self {
            events,
            limit_events: Throttle::new(LIMIT_EVENT_WINDOW, 10_000),
            visibility: AtomicU64::new(0),
            view_changes: tokio::sync::broadcast::channel(VIEW_CHANGES_BUFFER).0,
        }
    }

    /// Tell the owner's open `/mcp` sessions that their lists changed; nobody listening is fine.
    pub(in crate::instances) fn view_changed(&self, spec: &InstanceSpec, resources: bool, prompts: bool) {
        if resources || prompts {
            let change = ViewChange { team: spec.team_id.clone(), user: spec.user_id.clone(), resources, prompts };
            let _ = self.view_changes.send(change);
        }
    }

    /// Members' list changes from now on.
    pub(in crate::instances) fn view_changes(&self) -> tokio::sync::broadcast::Receiver<ViewChange> {
        self.view_changes.subscribe()
    }

    /// Invalidate every caller's cached view of their visible instances.
    pub(in crate::instances) fn bump_visibility(&self) {
        self.visibility.fetch_add(1, Ordering::AcqRel);
    }

    /// The version `bump_visibility` moves.
    pub(in crate::instances) fn visibility(&self) -> u64 {
        self.visibility.load(Ordering::Acquire)
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
        log_status(spec, status, entry.message.as_deref());
        if let Err(err) = self.events.status_changed(spec, status, entry.message.as_deref(), entry.updated_at).await {
            error!(process_id = %spec.process_id, status = %status, error = %err, "recording status change failed");
        }
    }

    pub(in crate::instances) async fn emit(&self, event: Event) {
        self.events.emit(event).await;
    }

    /// A cap refused work: `resource.limit.exceeded`, at most one a minute per (team, resource, instance).
    pub(in crate::instances) async fn limit_exceeded(
        &self,
        spec: &InstanceSpec,
        resource: LimitedResource,
        current: u64,
        limit: u64,
        message: String,
    ) {
        let key = format!("{}|{resource:?}|{}", spec.team_id, spec.process_id);
        let Some(suppressed) = self.limit_events.allow(&key, std::time::Instant::now()) else { return };
        warn!(process_id = %spec.process_id, resource = resource.as_str(), current, limit, "{message}");
        let exceeded = LimitExceeded {
            team_id: spec.team_id.0.clone(),
            resource_type: resource,
            current_value: current,
            limit_value: limit,
            user_id: Some(spec.user_id.0.clone()),
            installation_id: Some(spec.installation_id.0.clone()),
            message,
            suppressed_count: suppressed,
        };
        self.emit(Event::limit_exceeded(&exceeded)).await;
    }

    /// After a re-discovery, the lists that really changed are announced (all of them when the instance `came_back`
    /// online): `notifications/tools/list_changed` and
    /// `…/resources/list_changed` to the instance endpoint's sessions (sent now, not when the server announced, so
    /// a client that lists again gets the new catalog), and a resource change to the owner's `/mcp` sessions.
    pub(in crate::instances) fn announce_list_changes(
        &self,
        instance: &Instance,
        previous: &Catalog,
        current: &Catalog,
        came_back: bool,
    ) {
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
}

/// A status that hides the instance's tools is a warning with its reason; any other change is for debugging.
fn log_status(spec: &InstanceSpec, status: InstanceStatus, message: Option<&str>) {
    match status {
        InstanceStatus::Error
        | InstanceStatus::Offline
        | InstanceStatus::RequiresReauth
        | InstanceStatus::PermanentlyFailed => {
            warn!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, reason = message.unwrap_or("none given"), "instance is not serving; its tools are hidden until it recovers (details: GET /api/status/debug)")
        }
        _ => {
            debug!(process_id = %spec.process_id, user_id = %spec.user_id, status = %status, "instance status changed")
        }
    }
}
