//! The enabled instances, with the lookups requests make kept as maps.
//!
//! Every `execute_mcp_tool` looks up its caller's instances and every instance-router request looks up an
//! instance path. Both were scans of every instance of every user: cost grew with the whole satellite, not with
//! the caller. Here each is one hash lookup; the maps change only when the reconciler adds or removes an instance.

use std::collections::HashMap;
use std::sync::Arc;

use super::Instance;
use crate::model::{ProcessId, TeamId, UserId};

#[derive(Default)]
pub(super) struct Live {
    by_id: HashMap<ProcessId, Arc<Instance>>,
    /// Team, then user: looked up with borrowed ids, no key built per request. Each list is ordered by process id.
    by_owner: HashMap<TeamId, HashMap<UserId, Vec<Arc<Instance>>>>,
    by_path: HashMap<String, Arc<Instance>>,
}

impl Live {
    /// Add an instance, replacing (and returning) the one with the same process id.
    pub(super) fn insert(&mut self, instance: Arc<Instance>) -> Option<Arc<Instance>> {
        let spec = instance.spec();
        let old = self.remove(&spec.process_id);
        let owned = self.by_owner.entry(spec.team_id.clone()).or_default().entry(spec.user_id.clone()).or_default();
        let at = owned.partition_point(|i| i.spec().process_id < spec.process_id);
        owned.insert(at, instance.clone());
        if let Some(path) = &spec.instance_path {
            self.by_path.insert(path.clone(), instance.clone());
        }
        self.by_id.insert(spec.process_id.clone(), instance);
        old
    }

    pub(super) fn remove(&mut self, id: &ProcessId) -> Option<Arc<Instance>> {
        let instance = self.by_id.remove(id)?;
        let spec = instance.spec();
        if let Some(users) = self.by_owner.get_mut(&spec.team_id) {
            if let Some(owned) = users.get_mut(&spec.user_id) {
                owned.retain(|i| !Arc::ptr_eq(i, &instance));
                if owned.is_empty() {
                    users.remove(&spec.user_id);
                }
            }
            if users.is_empty() {
                self.by_owner.remove(&spec.team_id);
            }
        }
        // Only this instance's own entry: another may have been given the same path since.
        if let Some(path) = &spec.instance_path {
            if self.by_path.get(path).is_some_and(|i| Arc::ptr_eq(i, &instance)) {
                self.by_path.remove(path);
            }
        }
        Some(instance)
    }

    pub(super) fn get(&self, id: &ProcessId) -> Option<&Arc<Instance>> {
        self.by_id.get(id)
    }

    /// One user's instances in one team, ordered by process id.
    pub(super) fn of_owner(&self, user: &UserId, team: &TeamId) -> &[Arc<Instance>] {
        self.by_owner.get(team).and_then(|users| users.get(user)).map_or(&[], Vec::as_slice)
    }

    pub(super) fn by_path(&self, path: &str) -> Option<&Arc<Instance>> {
        self.by_path.get(path)
    }

    /// Every instance, in no particular order.
    pub(super) fn values(&self) -> impl Iterator<Item = &Arc<Instance>> {
        self.by_id.values()
    }

    /// Take every instance out.
    pub(super) fn drain(&mut self) -> Vec<Arc<Instance>> {
        self.by_owner.clear();
        self.by_path.clear();
        self.by_id.drain().map(|(_, instance)| instance).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::ToolOverrides;
    use crate::model::sample_spec;

    fn instance(id: &str, user: &str, team: &str, path: Option<&str>) -> Arc<Instance> {
        let mut spec = sample_spec();
        spec.process_id = ProcessId(id.into());
        spec.user_id = UserId::from(user);
        spec.team_id = TeamId::from(team);
        spec.instance_path = path.map(str::to_owned);
        Arc::new(Instance::new(Arc::new(spec), None, 1, ToolOverrides::default()))
    }

    fn ids(list: &[Arc<Instance>]) -> Vec<&str> {
        list.iter().map(|i| i.spec().process_id.0.as_str()).collect()
    }

    #[test]
    fn lookups_follow_inserts_replacements_and_removals() {
        let mut live = Live::default();
        live.insert(instance("c", "u1", "t1", Some("pc")));
        live.insert(instance("a", "u1", "t1", Some("pa")));
        live.insert(instance("b", "u2", "t1", None));
        live.insert(instance("d", "u1", "t2", None));
        // Ordered by process id whatever the insertion order; each team and user apart.
        assert_eq!(ids(live.of_owner(&UserId::from("u1"), &TeamId::from("t1"))), ["a", "c"]);
        assert_eq!(ids(live.of_owner(&UserId::from("u2"), &TeamId::from("t1"))), ["b"]);
        assert_eq!(ids(live.of_owner(&UserId::from("u1"), &TeamId::from("t2"))), ["d"]);
        assert!(live.of_owner(&UserId::from("u2"), &TeamId::from("t2")).is_empty());
        assert_eq!(live.by_path("pa").map(|i| i.spec().process_id.0.as_str()), Some("a"));

        // A modified instance replaces the old one everywhere, its path moved with it.
        let old = live.insert(instance("a", "u1", "t1", Some("pa2")));
        assert_eq!(old.and_then(|o| o.spec().instance_path.clone()).as_deref(), Some("pa"));
        assert!(live.by_path("pa").is_none());
        assert_eq!(live.by_path("pa2").map(|i| i.spec().process_id.0.as_str()), Some("a"));
        assert_eq!(ids(live.of_owner(&UserId::from("u1"), &TeamId::from("t1"))), ["a", "c"]);
        assert_eq!(live.values().count(), 4);

        assert!(live.remove(&ProcessId("c".into())).is_some());
        assert!(live.remove(&ProcessId("c".into())).is_none());
        assert!(live.by_path("pc").is_none());
        assert_eq!(ids(live.of_owner(&UserId::from("u1"), &TeamId::from("t1"))), ["a"]);
        assert!(live.get(&ProcessId("c".into())).is_none());
        assert_eq!(live.drain().len(), 3);
        assert!(live.of_owner(&UserId::from("u1"), &TeamId::from("t1")).is_empty());
        assert!(live.by_path("pa2").is_none());
    }

    #[test]
    fn a_path_taken_over_stays_with_its_new_instance_when_the_old_one_goes() {
        let mut live = Live::default();
        live.insert(instance("a", "u1", "t1", Some("shared")));
        live.insert(instance("b", "u2", "t1", Some("shared")));
        live.remove(&ProcessId("a".into()));
        assert_eq!(live.by_path("shared").map(|i| i.spec().process_id.0.as_str()), Some("b"));
    }
}
