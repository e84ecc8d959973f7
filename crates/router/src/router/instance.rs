//! The instance router: one instance's real tools and resources under their
//! original names (SB §6.3), for a caller holding that instance's token.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    blocked_result, call_outcome, callable, denied, disabled_result, forward, invalid, normalise_call_result, tasks,
    visible, RouteError,
};
use crate::analytics::{self, Caller, Listing, Recorder, Router};
use crate::instances::{Instance, InstanceError, InstanceManager, Release};
use crate::mcp::client::Era;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, RpcError};
use crate::mcp::transport::{Relay, UpstreamError};
use crate::model::catalog::Catalog;

mod listen;

/// The longest a `subscriptions/listen` stream is kept open upstream; the client re-subscribes after it ends.
const LISTEN_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

#[derive(Clone)]
pub struct InstanceRouter {
    pub manager: InstanceManager,
    pub call_timeout: Duration,
    pub read_timeout: Duration,
    /// Listings and calls, for the token-savings figures.
    pub analytics: Recorder,
    /// Rate limits and quotas on calls (`[[limits]]`).
    pub limits: super::limits::Limits,
}

impl InstanceRouter {
    /// One request for the instance. The satellite answers what it keeps itself (the tool and resource
    /// listings of the catalog, with disabled tools left out) and gates what the instance's status or the
    /// administrator forbids; every other method, known or not, goes to the server unchanged, and what the
    /// server says on the way (progress, log messages, requests to the client) goes to `relay`.
    pub async fn handle(
        &self,
        instance: &Arc<Instance>,
        session: Option<&str>,
        method: &str,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let catalog = instance.catalog().filter(|_| visible(instance));
        let spec = instance.spec();
        let who = Caller { team: spec.team_id.as_str(), user: spec.user_id.as_str(), session };
        match method {
            "ping" => Ok(json!({}).into()),
            "tools/list" => Ok(self.list_tools(instance, catalog.as_ref(), &who)),
            "resources/list" => {
                let resources: Vec<Value> =
                    catalog.iter().flat_map(|c| c.resources.iter().map(|r| r.definition.clone())).collect();
                Ok(protocol::object([("resources", Value::Array(resources))]).into())
            }
            "resources/templates/list" => {
                let templates: Vec<Value> =
                    catalog.iter().flat_map(|c| c.templates.iter().map(|t| t.definition.clone())).collect();
                Ok(protocol::object([("resourceTemplates", Value::Array(templates))]).into())
            }
            "tools/call" => {
                let result = self.call_tool(instance, &who, params, relay).await;
                result.map(|result| tasks::seal_result(method, spec.process_id.as_str(), result))
            }
            "subscriptions/listen" => self.listen(instance, method, params, relay).await,
            task if tasks::names_task(task, params.as_ref()) => {
                let params = own_task(instance, params)?;
                let result = self.pass_on(instance, session, task, Some(params), relay).await;
                result.map(|result| tasks::seal_result(task, spec.process_id.as_str(), result))
            }
            other => {
                let result = self.pass_on(instance, session, other, params, relay).await;
                result.map(|result| tasks::seal_result(other, spec.process_id.as_str(), result))
            }
        }
    }

    /// `tools/list` from the catalog, disabled tools left out, reported to the analytics as a plain proxy's
    /// listing.
    fn list_tools(&self, instance: &Arc<Instance>, catalog: Option<&Arc<Catalog>>, who: &Caller<'_>) -> Payload {
        let spec = instance.spec();
        let mut tokens = 0u64;
        let mut uncounted = Vec::new();
        let tools: Vec<Value> = catalog
            .iter()
            .flat_map(|c| {
                let parsed = instance.tool_listing(c);
                c.tools
                    .iter()
                    .zip(parsed.iter())
                    .zip(c.tool_tokens.iter().map(Some).chain(std::iter::repeat(None)))
                    .filter(|((t, _), _)| !instance.tool_disabled(t.name()))
                    .map(|((t, definition), n)| {
                        match n {
                            Some(n) => tokens += u64::from(*n),
                            None => uncounted.push(t.clone()),
                        }
                        definition.clone()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        // The instance router is a plain proxy: what it shows is what one would send.
        self.analytics.listing(
            who,
            Listing {
                router: Router::Instance,
                instance: Some((spec.process_id.0.clone(), spec.installation_id.0.clone())),
                tools_shown: tools.len() as u64,
                shown_tokens: tokens,
                tools_visible: tools.len() as u64,
                visible_tokens: tokens,
                fingerprint: analytics::fingerprint(
                    catalog.iter().map(|c| (spec.process_id.as_str(), c.discovered_at.timestamp_millis())),
                ),
                uncounted,
            },
        );
        protocol::object([("tools", Value::Array(tools))]).into()
    }

    /// `tools/call`, gated by the instance's status and the installation's disabled tools, then sent on whole.
    async fn call_tool(
        &self,
        instance: &Arc<Instance>,
        who: &Caller<'_>,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let params = params.unwrap_or_else(|| json!({}));
        // Owned, so the request itself goes on to the server without a copy.
        let name: String = params
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                RouteError::Rpc(RpcError::new(codes::INVALID_PARAMS, "Invalid params: name must be a non-empty string"))
            })?;
        if instance.tool_denied(&name) {
            return Err(denied(&name));
        }
        if !callable(instance.state()) {
            return Ok(blocked_result(&name, instance).into());
        }
        if instance.tool_disabled(&name) {
            return Ok(disabled_result(&name).into());
        }
        self.limits.admit(&self.manager, instance.spec(), &name).await?;
        // A tool missing from the catalog goes on too: the server may have added it since it was listed, or serve
        // tools it does not list; it answers for its own tools, as it would without us. The whole request goes on:
        // arguments, `_meta` (progress token), and what a 2026-07-28 retry adds.
        let started = std::time::Instant::now();
        let result = forward(&self.manager, instance, "tools/call", params, self.call_timeout, relay).await;
        let spec = instance.spec();
        self.analytics.call(who, Router::Instance, spec, &name, call_outcome(&result), started.elapsed());
        Ok(normalise_call_result(result?))
    }

    /// `subscriptions/listen`: passed through to a 2026-07-28 server, served here for a handshake-era one.
    async fn listen(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let relay = relay.ok_or_else(|| {
            RouteError::Rpc(RpcError::new(codes::METHOD_NOT_FOUND, "subscriptions/listen needs a stream"))
        })?;
        let params = params.unwrap_or_else(|| json!({}));
        // Asleep, the server would announce nothing: an open listen keeps the instance awake, from before the wake
        // below, so the idle sweep cannot put it to sleep again in between.
        let _listening = instance.listening();
        // A handshake-era server has no `subscriptions/listen`; it announces on its session instead, which the
        // satellite keeps open: the stream is served here from what it announces.
        if self.manager.wake(instance).await.is_ok()
            && instance.client().is_some_and(|client| matches!(client.era(), Era::Handshake { .. }))
        {
            return Box::pin(self.listen_here(instance, &params, relay)).await;
        }
        // Boxed: a listen's future is several kilobytes, and held inline it would make every call's future as large
        // (a future is as large as its largest branch), copied whole each time the call's task moves it.
        // Task status is heard of this instance's own tasks only, with their ids sealed as the client knows them.
        let (mut params, pid) = (params, instance.spec().process_id.as_str());
        tasks::unseal_listen(&mut params, pid);
        let sealing = relay.sealing_tasks_of(pid);
        let relay = if super::forward::offers_tasks(instance) { &sealing } else { relay };
        match Box::pin(self.manager.listen(instance, method, Some(params), LISTEN_LIMIT, relay)).await {
            Ok(result) => Ok(result),
            Err(InstanceError::Upstream(UpstreamError::Rpc(err))) => Err(RouteError::Rpc(err)),
            Err(err) => Err(RouteError::Rpc(RpcError::new(
                codes::INTERNAL_ERROR,
                format!("MCP server error ({}): {err}", instance.spec().server_slug),
            ))),
        }
    }

    /// Any other method, known or not, goes to the server unchanged while the instance can take it; resource
    /// subscriptions are counted per client, since the server holds one set for all the instance's clients.
    async fn pass_on(
        &self,
        instance: &Arc<Instance>,
        session: Option<&str>,
        method: &str,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        if !callable(instance.state()) {
            let status = instance.state();
            return Err(RouteError::Rpc(RpcError::new(
                codes::INTERNAL_ERROR,
                format!("MCP server is unavailable (status: {status})"),
            )));
        }
        let timeout = if method == "resources/read" { self.read_timeout } else { self.call_timeout };
        let params = params.unwrap_or_else(|| json!({}));
        // The server holds one set of subscriptions for all the instance's clients: one client's unsubscribe must
        // not end another's updates.
        let subscription = SubscriptionChange::of(method, &params, session);
        // A hold is taken before the subscribe goes out, so an unsubscribe racing it cannot see the resource unheld
        // and end it; undone when the server refuses, as is a release the server refused. Decided and asked under
        // the instance's subscription lock, so a subscribe and another client's unsubscribe (or a background undo)
        // of the same resource cannot cross on their way to the server.
        let _changing = match &subscription {
            Some(_) => Some(instance.subscription_lock().await),
            None => None,
        };
        let mut was_held = false;
        if let Some(change) = &subscription {
            match change.before(method, instance)? {
                Some(Release::OthersHold) => return Ok(json!({}).into()),
                released => was_held = released == Some(Release::Last),
            }
        }
        let result = forward(&self.manager, instance, method, params, timeout, relay).await;
        if let Some(change) = &subscription {
            change.after(method, instance, &result, was_held);
        }
        result
    }
}

/// A task request's params with the server's own task id, when the client's id names a task of this instance;
/// refused as an unknown task otherwise (another instance's id is as unknown here as a made-up one).
fn own_task(instance: &Instance, params: Option<Value>) -> Result<Value, RouteError> {
    let mut params = params.unwrap_or_else(|| json!({}));
    // A server known to offer no tasks has none to keep from anyone: it answers as it does.
    if instance.client().is_some_and(|client| !crate::mcp::task_ids::offered(client.capabilities())) {
        return Ok(params);
    }
    if let Some(refused) = tasks::undeclared(&params) {
        return Err(refused);
    }
    let id = params.get("taskId").cloned().unwrap_or_default();
    match tasks::unseal_request(&mut params)? {
        owner if owner == instance.spec().process_id.as_str() => Ok(params),
        _ => Err(tasks::unknown(id.as_str().unwrap_or_default())),
    }
}

/// A client's `resources/subscribe` or `resources/unsubscribe`: the resource, and the client's session, which
/// holds the subscription.
struct SubscriptionChange<'a> {
    uri: String,
    holder: &'a str,
}

impl<'a> SubscriptionChange<'a> {
    /// The change a request asks for, when it is a subscribe or unsubscribe naming its resource.
    fn of(method: &str, params: &Value, session: Option<&'a str>) -> Option<Self> {
        match method {
            "resources/subscribe" | "resources/unsubscribe" => {
                let uri = params.get("uri").and_then(Value::as_str)?;
                Some(SubscriptionChange { uri: uri.to_owned(), holder: session.unwrap_or_default() })
            }
            _ => None,
        }
    }

    /// Before the request goes out: a subscribe past the instance's bound is refused; an unsubscribe releases the
    /// client's hold, and says what that left (`OthersHold`: nothing to ask of the server).
    fn before(&self, method: &str, instance: &Instance) -> Result<Option<Release>, RouteError> {
        if method == "resources/subscribe" {
            if !instance.can_hold_subscription(&self.uri) {
                return Err(invalid(format!(
                    "too many resource subscriptions on this server (at most {}): unsubscribe from one first",
                    crate::instances::MAX_SUBSCRIPTIONS
                )));
            }
            return Ok(None);
        }
        Ok(Some(instance.release_subscription(&self.uri, self.holder)))
    }

    /// After the server answered: a subscribe it took is held for the client, as is one it refused to end.
    fn after(&self, method: &str, instance: &Instance, result: &Result<Payload, RouteError>, was_held: bool) {
        match (method, result) {
            ("resources/subscribe", Ok(_)) => instance.hold_subscription(&self.uri, self.holder),
            // The server refused to stop: the client still holds it.
            ("resources/unsubscribe", Err(_)) if was_held => instance.hold_subscription(&self.uri, self.holder),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every proxied call's task holds this future, and a task's future is copied whole when it is spawned: a rare
    /// branch held inline (a `subscriptions/listen`, ~6 KB) and the upstream call held unboxed (its callers' futures
    /// grew by twice its ~7 KB) made every `tools/call` pay for their size. Boxed, this future is ~1.4 KB in a debug
    /// build (7.9 KB before); the bound leaves room for growth, not for another large branch.
    #[test]
    fn the_instance_routers_future_stays_small() {
        let size = future_size!(InstanceRouter::handle, <'a> (&'a InstanceRouter, &'a Arc<Instance>, Option<&'a str>, &'a str, Option<Value>, Option<&'a Relay>));
        assert!(size <= 3 * 1024, "InstanceRouter::handle's future is {size} bytes: box the large branch");
    }
}
