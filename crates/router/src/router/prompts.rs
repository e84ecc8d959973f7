//! What `/mcp` serves beyond the meta-tools: the caller's prompts from all their instances, namespaced like tools
//! (`slug:prompt`), their completions, and the logging level passed to the caller's servers.

use std::collections::HashSet;
use std::sync::Arc;

use futures::future::join_all;
use serde_json::{json, Value};
use tracing::debug;

use super::hierarchical::HierarchicalRouter;
use super::{callable, forward, invalid, RouteError};
use crate::auth::Principal;
use crate::instances::Instance;
use crate::mcp::payload::Payload;
use crate::mcp::transport::Relay;
use crate::model::{parse_tool_path, tool_path};

/// Whether an instance's server declared a capability at connect time.
fn declares(instance: &Instance, capability: &str) -> bool {
    instance.client().is_some_and(|c| c.capabilities().get(capability).is_some())
}

impl HierarchicalRouter {
    /// `prompts/list`: every prompt of the caller's live instances, named `slug:prompt`, each server's listing
    /// followed through its `nextCursor` pages, so the answer is whole and has no cursor of its own. A server that
    /// does not answer in time is left out of this listing rather than failing it.
    pub(super) async fn list_prompts(&self, caller: &Principal) -> Result<Value, RouteError> {
        let instances: Vec<Arc<Instance>> = self
            .visible_instances(caller)
            .into_iter()
            .filter(|i| callable(i.state()) && declares(i, "prompts"))
            .collect();
        let listings = join_all(instances.iter().map(|instance| async move {
            let listed = self.prompts_of(instance).await;
            (instance, listed)
        }))
        .await;
        let mut prompts = Vec::new();
        for (instance, listed) in listings {
            let slug = &instance.spec().server_slug;
            match listed {
                Ok(listed) => {
                    for mut prompt in listed {
                        let Some(name) = prompt.get("name").and_then(Value::as_str) else { continue };
                        prompt["name"] = json!(tool_path(slug, name));
                        prompts.push(prompt);
                    }
                }
                Err(err) => debug!(server = %slug, error = ?err, "prompts/list failed; left out of the listing"),
            }
        }
        Ok(json!({"prompts": prompts}))
    }

    /// Every prompt of one instance: at most `discovery::MAX_PAGES` pages, ending early at a cursor seen before;
    /// a page that fails after the first keeps the prompts already listed.
    async fn prompts_of(&self, instance: &Arc<Instance>) -> Result<Vec<Value>, RouteError> {
        let mut prompts = Vec::new();
        let mut cursors = HashSet::new();
        let mut params = json!({});
        for page in 0..crate::discovery::MAX_PAGES {
            let mut listing =
                match forward(&self.manager, instance, "prompts/list", params, self.read_timeout, None).await {
                    Ok(listing) => listing.into_value_or_null(),
                    Err(err) if page > 0 => {
                        let slug = &instance.spec().server_slug;
                        debug!(server = %slug, page, error = ?err, "prompts/list stopped; the prompts listed are kept");
                        break;
                    }
                    Err(err) => return Err(err),
                };
            if let Some(listed) = listing.get_mut("prompts").and_then(Value::as_array_mut) {
                prompts.append(listed);
            }
            match listing.get("nextCursor").and_then(Value::as_str).filter(|c| !c.is_empty()) {
                Some(next) if cursors.insert(next.to_owned()) => params = json!({"cursor": next}),
                _ => break,
            }
        }
        Ok(prompts)
    }

    /// `prompts/get` for `slug:prompt`, on the caller's instance of that server.
    pub(super) async fn get_prompt(
        &self,
        caller: &Principal,
        mut params: Value,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let (slug, prompt) = parse_tool_path(&name).ok_or_else(|| {
            invalid(format!("Invalid prompt name: {name}. Expected \"serverSlug:promptName\" from prompts/list"))
        })?;
        let instance = self.instance_for(caller, slug)?;
        params["name"] = json!(prompt);
        forward(&self.manager, &instance, "prompts/get", params, self.read_timeout, relay).await
    }

    /// `completion/complete` for a namespaced prompt (`slug:prompt`) or resource (`slug|uri`).
    pub(super) async fn complete(
        &self,
        caller: &Principal,
        mut params: Value,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let reference = params.get("ref").cloned().unwrap_or(Value::Null);
        let (instance, rewritten) = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => {
                let name = reference.get("name").and_then(Value::as_str).unwrap_or_default();
                let (slug, prompt) = parse_tool_path(name).ok_or_else(|| {
                    invalid(format!("Invalid prompt name: {name}. Expected \"serverSlug:promptName\""))
                })?;
                (self.instance_for(caller, slug)?, json!({"type": "ref/prompt", "name": prompt}))
            }
            Some("ref/resource") => {
                let uri = reference.get("uri").and_then(Value::as_str).unwrap_or_default();
                let (instance, original) = self.resolve_resource(caller, uri)?;
                (instance, json!({"type": "ref/resource", "uri": original}))
            }
            _ => return Err(invalid("ref must be a ref/prompt or ref/resource")),
        };
        params["ref"] = rewritten;
        forward(&self.manager, &instance, "completion/complete", params, self.read_timeout, relay).await
    }

    /// `logging/setLevel`: passed to each of the caller's live servers that log; their messages then reach the
    /// caller with the calls that cause them.
    pub(super) async fn set_log_level(&self, caller: &Principal, params: Value) -> Result<Value, RouteError> {
        // A level no server knows is refused here, once, as a server would refuse it (-32602); passed on, each
        // server's refusal was swallowed and the client told `{}`.
        crate::mcp::protocol::check_log_level(params.get("level")).map_err(RouteError::Rpc)?;
        let instances: Vec<Arc<Instance>> = self
            .visible_instances(caller)
            .into_iter()
            .filter(|i| callable(i.state()) && declares(i, "logging"))
            .collect();
        join_all(instances.iter().map(|instance| {
            let params = params.clone();
            async move {
                if let Err(err) =
                    forward(&self.manager, instance, "logging/setLevel", params, self.read_timeout, None).await
                {
                    debug!(server = %instance.spec().server_slug, error = ?err, "logging/setLevel failed");
                }
            }
        }))
        .await;
        Ok(json!({}))
    }
}
