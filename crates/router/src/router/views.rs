//! Each caller's visible instances and search scope, computed once per visibility version rather than on
//! every request: a discover over hundreds of instances otherwise spends most of its time rebuilding them.
//! A view is per (caller, toolset): a toolset narrows the search scope to its tools.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::visible;
use crate::auth::Principal;
use crate::instances::{Instance, InstanceManager};
use crate::model::{TeamId, Toolset, UserId};
use crate::search::{tool_key, Scope};

/// Views kept at most; past this the cache starts over (a view is cheap to rebuild once).
const MAX_VIEWS: usize = 10_000;

/// What one caller can see at one [`InstanceManager::visibility_version`] through one toolset.
pub(crate) struct CallerView {
    version: u64,
    toolset: Option<Arc<Toolset>>,
    /// The caller's instances whose tools are visible, ordered by process id (all of them, whatever the
    /// toolset: it limits tools, not resources).
    pub(crate) instances: Vec<Arc<Instance>>,
    /// What searches may find: the visible instances, or with a toolset, the tools it takes from them.
    pub(crate) scope: Arc<Scope>,
    /// With a toolset, how many of the visible tools it takes.
    pub(crate) toolset_tools: Option<usize>,
}

/// The caller a view belongs to, and the toolset's name.
type CallerKey = (UserId, TeamId, Option<String>);

/// The cache of [`CallerView`]s, shared by clones of the router.
#[derive(Clone, Default)]
pub struct CallerViews {
    views: Arc<Mutex<HashMap<CallerKey, Arc<CallerView>>>>,
}

impl CallerViews {
    /// The caller's current view through `toolset`: cached while the manager's visibility version has not
    /// moved and the toolset is the same definition (a changed toolset is a new `Arc`).
    pub(crate) fn get(
        &self,
        manager: &InstanceManager,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
    ) -> Arc<CallerView> {
        // Read the version first: a change racing with the computation below makes the view stale at once.
        let version = manager.visibility_version();
        let key = (caller.user.clone(), caller.team.clone(), toolset.map(|t| t.name.clone()));
        let same_toolset = |view: &CallerView| match (&view.toolset, toolset) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if let Some(view) = self.views.lock().get(&key).filter(|v| v.version == version && same_toolset(v)) {
            return view.clone();
        }
        let instances: Vec<Arc<Instance>> =
            manager.instances_for(&caller.user, &caller.team).into_iter().filter(|i| visible(i)).collect();
        let (scope, toolset_tools) = match toolset {
            None => (Scope::new(instances.iter().map(|i| i.spec().process_id.0.clone()).collect()), None),
            Some(toolset) => narrowed(&instances, toolset),
        };
        let view = Arc::new(CallerView {
            version,
            toolset: toolset.cloned(),
            instances,
            scope: Arc::new(scope),
            toolset_tools,
        });
        let mut views = self.views.lock();
        if views.len() >= MAX_VIEWS {
            views.clear();
        }
        views.insert(key, view.clone());
        view
    }
}

/// The scope of the tools `toolset` takes from `instances`: whole instances where it takes every tool (the
/// cheap filter), single tools elsewhere; and how many tools that is.
fn narrowed(instances: &[Arc<Instance>], toolset: &Toolset) -> (Scope, Option<usize>) {
    let (mut whole, mut single, mut count) = (Vec::new(), Vec::new(), 0);
    for instance in instances {
        let Some(catalog) = instance.catalog() else { continue };
        let spec = instance.spec();
        let taken: Vec<&str> = catalog
            .tools
            .iter()
            .filter(|t| toolset.matches(&spec.server_slug, t.name()) && !instance.tool_disabled(t.name()))
            .map(|t| t.name())
            .collect();
        count += taken.len();
        if !taken.is_empty() && taken.len() == catalog.tools.len() {
            whole.push(spec.process_id.0.clone());
        } else {
            single.extend(taken.into_iter().map(|name| tool_key(spec.process_id.as_str(), name)));
        }
    }
    (Scope::with_tools(whole, single), Some(count))
}
