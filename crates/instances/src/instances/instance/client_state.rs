//! What an instance's clients asked its server to remember, kept across reconnections and asked again of a server
//! started anew: the resources it watches (and which client holds each) and the log level.

use super::Instance;

/// What letting go of a subscription left (`Instance::release_subscription`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The holder was the last: the server may stop watching.
    Last,
    /// Other clients still hold it: the server goes on watching.
    OthersHold,
    /// No holder was known for it.
    NotHeld,
}

/// Resources watched per instance at most, as per client session (`http::session`): past it a subscribe is
/// refused (`can_hold_subscription`), since a subscription no hold records could be undone for its client by
/// another's unsubscribe or a listen's end.
pub const MAX_SUBSCRIPTIONS: usize = 1_000;

impl Instance {
    /// Note that the server accepted a `resources/subscribe` (true) or `resources/unsubscribe` (false) of `uri`.
    pub(in crate::instances) fn note_subscription(&self, uri: &str, subscribed: bool) {
        let mut subscriptions = self.subscriptions.lock();
        let changed = if !subscribed {
            subscriptions.remove(uri)
        } else {
            subscriptions.len() < MAX_SUBSCRIPTIONS && subscriptions.insert(uri.to_owned())
        };
        drop(subscriptions);
        if changed {
            self.subscriptions_changed.send_modify(|n| *n += 1);
        }
    }

    /// Whether a hold of `uri` fits: one more resource while under the bound, or one held already. Asked, and the
    /// hold then taken, under `subscription_lock`, so no other hold comes between.
    pub fn can_hold_subscription(&self, uri: &str) -> bool {
        let holders = self.holders.lock();
        holders.len() < MAX_SUBSCRIPTIONS || holders.contains_key(uri)
    }

    /// `holder` (a client session's id, or a listen's) subscribed to `uri`.
    pub fn hold_subscription(&self, uri: &str, holder: &str) {
        let mut holders = self.holders.lock();
        if holders.len() < MAX_SUBSCRIPTIONS || holders.contains_key(uri) {
            holders.entry(uri.to_owned()).or_default().insert(holder.to_owned());
        }
    }

    /// `holder` no longer wants `uri`: whether it was the last holder, others still hold it, or it held nothing
    /// (a subscription from before, or past the bound: undone as asked).
    pub fn release_subscription(&self, uri: &str, holder: &str) -> Release {
        let mut holders = self.holders.lock();
        let Some(held) = holders.get_mut(uri) else { return Release::NotHeld };
        if !held.remove(holder) {
            return if held.is_empty() { Release::NotHeld } else { Release::OthersHold };
        }
        if held.is_empty() {
            holders.remove(uri);
            return Release::Last;
        }
        Release::OthersHold
    }

    /// Whether any client holds a subscription to `uri`.
    pub fn subscription_held(&self, uri: &str) -> bool {
        self.holders.lock().contains_key(uri)
    }

    /// Taken while a subscription changes (see `subscribing`); before any call to the server.
    pub async fn subscription_lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.subscribing.lock().await
    }

    /// Changes each time the resources the server is asked to watch change.
    pub(in crate::instances) fn subscription_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.subscriptions_changed.subscribe()
    }

    /// What the clients of `predecessor`, the instance this one replaces under the same process id (its entry
    /// edited in place), asked of its server: the log level, the resources watched and who holds each. Their
    /// sessions outlive the edit, so the new server is asked for the same once it has started
    /// (`restore_client_state`), as a restarted one is. A server that refuses a resource no longer has it asked.
    pub(in crate::instances) fn carry_client_state(&self, predecessor: &Instance) {
        *self.holders.lock() = predecessor.holders.lock().clone();
        *self.subscriptions.lock() = predecessor.subscriptions.lock().clone();
        *self.log_level.lock() = predecessor.log_level.lock().clone();
    }

    /// Note that the server accepted a `logging/setLevel` to `level`.
    pub(in crate::instances) fn note_log_level(&self, level: String) {
        *self.log_level.lock() = Some(level);
    }

    /// The level the server was last asked to log at, if a client asked.
    pub(in crate::instances) fn log_level(&self) -> Option<String> {
        self.log_level.lock().clone()
    }

    /// The resources the server was asked to watch, in order.
    pub(in crate::instances) fn subscriptions(&self) -> Vec<String> {
        self.subscriptions.lock().iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instances::ToolOverrides;
    use std::sync::Arc;

    /// What the server was asked to watch follows its answers, within the bound.
    #[test]
    fn subscriptions_follow_what_the_server_accepted() {
        let instance = Instance::new(Arc::new(crate::model::sample_spec()), None, 1, ToolOverrides::default());
        instance.note_subscription("file:///b", true);
        instance.note_subscription("file:///a", true);
        instance.note_subscription("file:///a", true);
        assert_eq!(instance.subscriptions(), ["file:///a", "file:///b"]);
        instance.note_subscription("file:///a", false);
        instance.note_subscription("file:///never", false);
        assert_eq!(instance.subscriptions(), ["file:///b"]);
        for n in 0..MAX_SUBSCRIPTIONS + 5 {
            instance.note_subscription(&format!("file:///{n}"), true);
        }
        assert_eq!(instance.subscriptions().len(), MAX_SUBSCRIPTIONS);
    }

    /// A subscription is undone upstream only when its last holder lets go; one nobody was known to hold is undone
    /// as asked.
    #[test]
    fn a_subscription_ends_with_its_last_holder() {
        let instance = Instance::new(Arc::new(crate::model::sample_spec()), None, 1, ToolOverrides::default());
        instance.hold_subscription("file:///a", "session-1");
        instance.hold_subscription("file:///a", "listen 7");
        instance.hold_subscription("file:///a", "session-1");
        assert_eq!(instance.release_subscription("file:///a", "session-1"), Release::OthersHold, "the listen holds it");
        assert_eq!(instance.release_subscription("file:///a", "session-1"), Release::OthersHold, "released twice");
        assert!(instance.subscription_held("file:///a"));
        assert_eq!(instance.release_subscription("file:///a", "listen 7"), Release::Last, "the last holder");
        assert!(!instance.subscription_held("file:///a"));
        assert_eq!(instance.release_subscription("file:///never", "session-1"), Release::NotHeld);
        for n in 0..MAX_SUBSCRIPTIONS + 5 {
            instance.hold_subscription(&format!("file:///{n}"), "s");
        }
        assert_eq!(instance.holders.lock().len(), MAX_SUBSCRIPTIONS, "bounded like the subscriptions");
        assert!(instance.can_hold_subscription("file:///7"), "one held already is taken");
        assert!(!instance.can_hold_subscription("file:///new"), "one more is not");
    }
}
