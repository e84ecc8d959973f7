//! The requests of ours a server is working on that have a client to relay to, on the transports whose server
//! messages carry no request id of ours (a stdio child's pipe, a legacy SSE stream). A message is matched this
//! way: what a 2026-07-28 server sends on a listen by the listen's id it is tagged with, progress by its token
//! (ours replaces the client's, so two clients using the same token never mix), log messages to every client with
//! a call running, and a request to the client to the newest call (with one call at a time, the one that caused
//! it).

use parking_lot::Mutex;
use serde_json::{Map, Value};

use crate::mcp::transport::Relay;
use crate::mcp::{progress, protocol};

#[derive(Debug, Default)]
pub(crate) struct Relays {
    active: Mutex<Vec<Active>>,
}

#[derive(Debug)]
struct Active {
    id: i64,
    relay: Relay,
    /// (the token the child sees, the client's own).
    token: Option<(Value, Value)>,
}

impl Relays {
    pub(crate) fn add(&self, id: i64, relay: Relay, token: Option<(Value, Value)>) {
        self.active.lock().push(Active { id, relay, token });
    }

    pub(crate) fn remove(&self, id: i64) {
        self.active.lock().retain(|a| a.id != id);
    }

    /// The relay whose request carries progress token `ours`, with the client's own token.
    pub(crate) fn for_progress(&self, ours: &Value) -> Option<(Relay, Value)> {
        let active = self.active.lock();
        active.iter().find_map(|a| match &a.token {
            Some((token, theirs)) if token == ours => Some((a.relay.clone(), theirs.clone())),
            _ => None,
        })
    }

    /// The relay of the `subscriptions/listen` of ours a 2026-07-28 server's notification names: it tags what it
    /// sends on a listen with the listen's id (`_meta` subscription id), the one thing that ties a message on a
    /// pipe to one request. Without this, a client's listen on a stdio server heard nothing, not even its
    /// acknowledgement, and was answered 504 when the request timed out.
    fn for_subscription(&self, params: Option<&Value>) -> Option<Relay> {
        let meta = params?.get("_meta")?;
        let id = meta.get(protocol::meta_keys::SUBSCRIPTION_ID)?.as_i64()?;
        let active = self.active.lock();
        active.iter().find(|a| a.id == id && !a.relay.is_closed()).map(|a| a.relay.clone())
    }

    /// The relay of the newest request still running, and whether it is the only one: only then is a server's
    /// request surely about that request (with several, it may be about another one).
    pub(crate) fn newest(&self) -> Option<(Relay, bool)> {
        let active = self.active.lock();
        let mut running = active.iter().rev().filter(|a| !a.relay.is_closed());
        let newest = running.next()?.relay.clone();
        Some((newest, running.next().is_none()))
    }

    /// Every relay with a request running (one per request).
    pub(crate) fn all(&self) -> Vec<Relay> {
        self.active.lock().iter().filter(|a| !a.relay.is_closed()).map(|a| a.relay.clone()).collect()
    }

    /// Hand a server's notification to the calls it is about: progress to the call whose token it carries (with
    /// the client's token put back), a log message to every call in flight. Returns it (its params) when no call
    /// takes it, for the server's announcements. A log line cannot say which call it is about; sent to both the
    /// calls and the announcements, a client would get it twice, where MCP sends each on one stream.
    pub(crate) fn deliver(&self, method: &str, params: Option<Value>) -> Result<(), Option<Value>> {
        if let Some(relay) = self.for_subscription(params.as_ref()) {
            relay.notify(method, params);
            return Ok(());
        }
        match method {
            "notifications/progress" => self.deliver_progress(method, params),
            "notifications/message" => {
                let relays = self.all();
                if relays.is_empty() {
                    return Err(params);
                }
                for relay in relays {
                    relay.notify(method, params.clone());
                }
                Ok(())
            }
            _ => Err(params),
        }
    }

    /// A server's progress under one of our tokens, to the call that holds it with the client's own token put
    /// back; under one no call holds any more, to nobody (our token would mean nothing to a client). Anything
    /// else is returned as it came.
    pub(crate) fn deliver_progress(&self, method: &str, params: Option<Value>) -> Result<(), Option<Value>> {
        let token = params.as_ref().and_then(|p| p.get("progressToken"));
        let Some(token) = token.filter(|token| method == "notifications/progress" && progress::is_ours(token)) else {
            return Err(params);
        };
        if let Some((relay, theirs)) = self.for_progress(token) {
            relay.notify(method, with_token(params, theirs));
        }
        Ok(())
    }
}

/// Replace the client's `_meta.progressToken` by one unique to request `id`; returns (ours, theirs).
pub(crate) fn take_progress_token(params: &mut Option<Value>, id: i64) -> Option<(Value, Value)> {
    let meta = params.as_mut()?.as_object_mut()?.get_mut("_meta")?.as_object_mut()?;
    let theirs = meta.get("progressToken")?.clone();
    let ours = progress::ours(id);
    meta.insert("progressToken".into(), ours.clone());
    Some((ours, theirs))
}

/// A progress notification's params with the client's token put back.
pub(crate) fn with_token(params: Option<Value>, theirs: Value) -> Option<Value> {
    let mut params = params.unwrap_or_else(|| Value::Object(Map::new()));
    if let Some(map) = params.as_object_mut() {
        map.insert("progressToken".into(), theirs);
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::mcp::transport::Inbound;

    #[test]
    fn tokens_are_replaced_and_put_back() {
        let mut params = Some(json!({"name": "t", "_meta": {"progressToken": 7, "other": 1}}));
        let (ours, theirs) = take_progress_token(&mut params, 42).unwrap();
        assert_eq!(ours, json!("satellite-42"));
        assert_eq!(theirs, json!(7));
        assert_eq!(params.unwrap()["_meta"], json!({"progressToken": "satellite-42", "other": 1}));
        assert_eq!(take_progress_token(&mut Some(json!({"name": "t"})), 1), None);
        let relays = Relays::default();
        let (relay, _rx) = Relay::channel(true);
        relays.add(42, relay, Some((ours.clone(), theirs)));
        let (_, back) = relays.for_progress(&ours).unwrap();
        assert_eq!(with_token(Some(json!({"progressToken": ours, "progress": 1})), back).unwrap()["progressToken"], 7);
        relays.remove(42);
        assert!(relays.newest().is_none());
    }

    /// Progress under a token of ours that no call holds any more (the server spoke of a request after it ended)
    /// reaches nobody: announced, it would show a client our token instead of its own. Progress under any other
    /// token is the server's own business, announced as before.
    #[test]
    fn progress_under_a_token_of_ours_that_ended_goes_to_nobody() {
        let relays = Relays::default();
        let (relay, mut rx) = Relay::channel(true);
        let mut params = Some(json!({"_meta": {"progressToken": 1.5}}));
        let (ours, theirs) = take_progress_token(&mut params, 3).unwrap();
        relays.add(3, relay, Some((ours.clone(), theirs)));
        let progress = |token: &Value| Some(json!({"progressToken": token, "progress": 1}));
        assert_eq!(relays.deliver_progress("notifications/progress", progress(&ours)), Ok(()));
        let Ok(Inbound::Notification { params, .. }) = rx.try_recv() else { panic!("the call's progress") };
        assert_eq!(params.unwrap()["progressToken"], json!(1.5));
        relays.remove(3);
        assert_eq!(relays.deliver("notifications/progress", progress(&ours)), Ok(()));
        assert!(rx.try_recv().is_err());
        let foreign = progress(&json!("theirs"));
        assert_eq!(relays.deliver("notifications/progress", foreign.clone()), Err(foreign.clone()));
        assert_eq!(relays.deliver_progress("notifications/message", progress(&ours)), Err(progress(&ours)));
    }

    /// What a 2026-07-28 server sends on one of our listens goes to that listen's client, whatever the method;
    /// tagged with an id none of our requests has, it is the server's announcement.
    #[test]
    fn what_comes_on_a_listen_goes_to_its_client() {
        let relays = Relays::default();
        let (relay, mut rx) = Relay::channel(true);
        relays.add(5, relay, None);
        let tagged = |id: i64| Some(json!({"_meta": {protocol::meta_keys::SUBSCRIPTION_ID: id}, "uri": "x://y"}));
        assert_eq!(relays.deliver("notifications/resources/updated", tagged(5)), Ok(()));
        let Ok(Inbound::Notification { method, .. }) = rx.try_recv() else { panic!("the listen's notification") };
        assert_eq!(method, "notifications/resources/updated");
        assert_eq!(relays.deliver("notifications/resources/updated", tagged(6)), Err(tagged(6)));
        relays.remove(5);
        assert_eq!(relays.deliver("notifications/tools/list_changed", tagged(5)), Err(tagged(5)));
    }
}
