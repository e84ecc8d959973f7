//! Each caller's visible instances and search scope, computed once per visibility version rather than on
//! every request: a discover over hundreds of instances otherwise spends most of its time rebuilding them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::visible;
use crate::auth::Principal;
use crate::instances::{Instance, InstanceManager};
use crate::model::{TeamId, UserId};
use crate::search::Scope;

/// Views kept at most; past this the cache starts over (a view is cheap to rebuild once).
const MAX_VIEWS: usize = 10_000;

/// What one caller can see at one [`InstanceManager::visibility_version`].
pub(crate) struct CallerView {
    version: u64,
    /// The caller's instances whose tools are visible, ordered by process id.
    pub(crate) instances: Vec<Arc<Instance>>,
    /// Their process ids, with the search filter cached for them.
    pub(crate) scope: Arc<Scope>,
}

/// The caller a view belongs to.
type CallerKey = (UserId, TeamId);

/// The cache of [`CallerView`]s, shared by clones of the router.
#[derive(Clone, Default)]
pub struct CallerViews {
    views: Arc<Mutex<HashMap<CallerKey, Arc<CallerView>>>>,
}

impl CallerViews {
    /// The caller's current view: cached while the manager's visibility version has not moved.
    pub(crate) fn get(&self, manager: &InstanceManager, caller: &Principal) -> Arc<CallerView> {
        // Read the version first: a change racing with the computation below makes the view stale at once.
        let version = manager.visibility_version();
        let key = (caller.user.clone(), caller.team.clone());
        if let Some(view) = self.views.lock().get(&key).filter(|v| v.version == version) {
            return view.clone();
        }
        let instances: Vec<Arc<Instance>> =
            manager.instances_for(&caller.user, &caller.team).into_iter().filter(|i| visible(i)).collect();
        let ids = instances.iter().map(|i| i.spec().process_id.0.clone()).collect();
        let view = Arc::new(CallerView { version, instances, scope: Arc::new(Scope::new(ids)) });
        let mut views = self.views.lock();
        if views.len() >= MAX_VIEWS {
            views.clear();
        }
        views.insert(key, view.clone());
        view
    }
}
