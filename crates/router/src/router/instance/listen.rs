//! `subscriptions/listen` served by the satellite for a handshake-era server, from what the server announces on
//! the session the satellite keeps open.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::broadcast::{self, error::RecvError};

use super::{InstanceRouter, LISTEN_LIMIT};
use crate::instances::{Instance, InstanceManager, Release};
use crate::mcp::payload::Payload;
use crate::mcp::protocol;
use crate::mcp::transport::{Announcement, Relay};
use crate::router::RouteError;

/// Resource URIs one `subscriptions/listen` served by the satellite asks the server to watch, at most.
const MAX_LISTEN_RESOURCES: usize = 100;

impl InstanceRouter {
    /// `subscriptions/listen` for a handshake-era server, served from what it announces outside any request
    /// (`Instance::announcements`): acknowledged with the part of the filter the server can honour, then each
    /// announcement the filter asks for, until the client closes the stream or `LISTEN_LIMIT` passes. Resource
    /// subscriptions are asked of the server with `resources/subscribe` (kept, and asked again after a restart,
    /// by the instance), when it declares `resources.subscribe`.
    pub(super) async fn listen_here(
        &self,
        instance: &Arc<Instance>,
        params: &Value,
        relay: &Relay,
    ) -> Result<Payload, RouteError> {
        let wanted = params.get("notifications").cloned().unwrap_or_else(|| json!({}));
        let declared = instance.client().map(|client| client.capabilities().clone()).unwrap_or_default();
        let mut followed = Followed::lists(&wanted, &declared);
        let mut agreed = followed.agreed_lists();
        // What this listen asked of the server, undone when it ends however it ends (the client closing its
        // stream aborts this future).
        let mut held = Held {
            manager: &self.manager,
            instance,
            holder: format!("listen {:016x}", rand::random::<u64>()),
            uris: Vec::new(),
            timeout: self.call_timeout,
        };
        if declared.pointer("/resources/subscribe").and_then(Value::as_bool) == Some(true) {
            followed.watched = held.subscribe(&wanted).await;
            agreed.insert("resourceSubscriptions".into(), json!(followed.watched));
        }
        // Listening before the acknowledgement: nothing announced after it is missed.
        let announced = instance.announcements();
        relay.notify(
            "notifications/subscriptions/acknowledged",
            Some(json!({"_meta": listen_meta(), "notifications": agreed})),
        );
        relay_announcements(&followed, announced, relay).await;
        Ok(json!({"resultType": "complete", "_meta": listen_meta()}).into())
    }
}

/// What one listen follows: the list changes agreed, and the resources the server watches for it.
struct Followed {
    tools: bool,
    prompts: bool,
    resources: bool,
    watched: BTreeSet<String>,
}

impl Followed {
    /// The list changes the client asked for (`wanted`) that can be announced to it; no resources yet.
    fn lists(wanted: &Value, declared: &Value) -> Self {
        let asked = |flag: &str| wanted.get(flag).and_then(Value::as_bool).unwrap_or(false);
        let has = |capability: &str| declared.get(capability).is_some();
        Followed {
            // Tools are always listed by the satellite, which announces a changed catalog itself.
            tools: asked("toolsListChanged"),
            prompts: asked("promptsListChanged") && has("prompts"),
            resources: asked("resourcesListChanged") && has("resources"),
            watched: BTreeSet::new(),
        }
    }

    /// Each list's flag in the acknowledgement, its announcement, and whether this listen follows it.
    fn list_changes(&self) -> [(&'static str, &'static str, bool); 3] {
        [
            ("toolsListChanged", "notifications/tools/list_changed", self.tools),
            ("promptsListChanged", "notifications/prompts/list_changed", self.prompts),
            ("resourcesListChanged", "notifications/resources/list_changed", self.resources),
        ]
    }

    /// The acknowledgement's `notifications`, as far as the lists go.
    fn agreed_lists(&self) -> Map<String, Value> {
        let mut agreed = Map::new();
        for (flag, _, on) in self.list_changes() {
            if on {
                agreed.insert(flag.into(), json!(true));
            }
        }
        agreed
    }

    /// Whether the announcement `note`, a `method`, is one this listen follows.
    fn wants(&self, method: &str, note: &Value) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            "notifications/resources/updated" => {
                note.pointer("/params/uri").and_then(Value::as_str).is_some_and(|uri| self.watched.contains(uri))
            }
            _ => false,
        }
    }
}

/// The `_meta` of what a listen served here sends.
fn listen_meta() -> Value {
    json!({protocol::meta_keys::SUBSCRIPTION_ID: null})
}

/// Relay what the listen follows of the instance's announcements, until the client closes the stream,
/// `LISTEN_LIMIT` passes or the announcements end.
async fn relay_announcements(followed: &Followed, mut announced: broadcast::Receiver<Announcement>, relay: &Relay) {
    let deadline = tokio::time::sleep(LISTEN_LIMIT);
    tokio::pin!(deadline);
    loop {
        let note = tokio::select! {
            _ = relay.closed() => break,
            _ = &mut deadline => break,
            note = announced.recv() => note,
        };
        match note {
            Ok(note) if !crate::instances::missed_announcements(&note) => relay_announcement(followed, &note, relay),
            // Missed announcements may have been list changes or updates: the lists this listen follows, and
            // the resources it watches, may have changed.
            Ok(_) | Err(RecvError::Lagged(_)) => relay_missed(followed, relay),
            Err(RecvError::Closed) => break,
        }
    }
}

/// One announcement, passed on when the listen follows it, with the listen's `_meta` key added.
fn relay_announcement(followed: &Followed, note: &Value, relay: &Relay) {
    let method = note.get("method").and_then(Value::as_str).unwrap_or_default();
    if !followed.wants(method, note) {
        return;
    }
    let mut params = note.get("params").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
    match params.get_mut("_meta").and_then(Value::as_object_mut) {
        Some(meta) => {
            meta.insert(protocol::meta_keys::SUBSCRIPTION_ID.into(), Value::Null);
        }
        None => params["_meta"] = listen_meta(),
    }
    relay.notify(method, Some(params));
}

/// Announcements were missed: each list the listen follows, and each resource it watches, is said to have changed.
fn relay_missed(followed: &Followed, relay: &Relay) {
    for (_, method, on) in followed.list_changes() {
        if on {
            relay.notify(method, Some(json!({"_meta": listen_meta()})));
        }
    }
    for uri in &followed.watched {
        relay.notify("notifications/resources/updated", Some(json!({"uri": uri, "_meta": listen_meta()})));
    }
}

/// The subscriptions a listen served by the satellite holds, released when it ends; those no other client holds
/// are undone upstream (`unsubscribe_later`).
struct Held<'a> {
    manager: &'a InstanceManager,
    instance: &'a Arc<Instance>,
    /// The listen's name among the subscriptions' holders.
    holder: String,
    uris: Vec<String>,
    timeout: Duration,
}

impl Held<'_> {
    /// Ask the server to watch the resources the listen names (the first `MAX_LISTEN_RESOURCES`), each held in
    /// the listen's name; the ones it watches.
    async fn subscribe(&mut self, wanted: &Value) -> BTreeSet<String> {
        let mut watched = BTreeSet::new();
        let uris = wanted.get("resourceSubscriptions").and_then(Value::as_array).cloned().unwrap_or_default();
        for uri in uris.iter().filter_map(Value::as_str).take(MAX_LISTEN_RESOURCES) {
            let subscribe = json!({"uri": uri});
            let _changing = self.instance.subscription_lock().await;
            // Past the instance's bound, not agreed (the acknowledgement leaves it out), as when refused.
            if !self.instance.can_hold_subscription(uri) {
                continue;
            }
            match self.manager.call(self.instance, "resources/subscribe", Some(subscribe), self.timeout).await {
                Ok(_) => {
                    watched.insert(uri.to_owned());
                    self.instance.hold_subscription(uri, &self.holder);
                    self.uris.push(uri.to_owned());
                }
                Err(err) => {
                    tracing::debug!(process_id = %self.instance.spec().process_id, uri, error = %err, "a listen's resource subscription was refused")
                }
            }
        }
        watched
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut uris = std::mem::take(&mut self.uris);
        uris.retain(|uri| self.instance.release_subscription(uri, &self.holder) != Release::OthersHold);
        self.manager.unsubscribe_later(self.instance.clone(), uris, self.timeout);
    }
}
