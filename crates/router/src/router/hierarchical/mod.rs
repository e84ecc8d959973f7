//! The hierarchical router (SB §13): `tools/list` is the four meta-tools;
//! discovery searches the caller's visible tools, execution and resource reads
//! go to the caller's own instance of the named server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tracing::warn;

use super::results::{text_document, TrimmedSchemas};
use super::{
    blocked_result, call_outcome, callable, denied, disabled_result, fit, forward, internal, invalid, meta,
    method_not_found, normalise_call_result, unreadable, RouteError,
};
use crate::analytics::{self, Caller, Listing, Recorder, Router};
use crate::auth::{Principal, SCOPE_EXECUTE, SCOPE_READ};
use crate::instances::{Instance, InstanceManager};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, RpcError};
use crate::mcp::transport::Relay;
use crate::model::{
    namespace_ui_meta, namespaced_uri, parse_namespaced_uri, parse_shared_uri, parse_tool_path, shared_uri,
    ResourceDef, ToolDef, Toolset,
};
use crate::search::SearchIndex;

mod budget;
mod candidates;
pub mod catalog;
mod discover;
mod resources;
mod task_requests;
use resources::join_contents;

/// `_meta` key naming the server a resource listed on `/mcp` comes from.
pub const SERVER_META_KEY: &str = "io.deploystack.satellite/server";

#[derive(Clone)]
pub struct HierarchicalRouter {
    pub manager: InstanceManager,
    pub search: SearchIndex,
    pub call_timeout: Duration,
    pub read_timeout: Duration,
    /// Listings, discovers and calls, for the token-savings figures.
    pub analytics: Recorder,
    /// Each caller's visible instances and search scope, per visibility version.
    pub views: super::CallerViews,
    /// Discover results' trimmed schemas, remembered.
    pub schemas: TrimmedSchemas,
    /// Compact discover entries' sentences and required names, remembered.
    pub summaries: super::Summaries,
    /// Meta-tool answers as 2-space indented JSON (the reference's form) instead of compact JSON.
    pub pretty: bool,
    /// Rate limits and quotas on calls (`[[limits]]`), counted on the resolved server and tool.
    pub limits: super::limits::Limits,
}

impl HierarchicalRouter {
    /// Handle one request method for an authenticated caller.
    /// `relay` carries what an upstream server says during an execution or read back to the client.
    /// `session` is the client's MCP session id (handshake era), for the analytics. `toolset`, when the
    /// request uses one, limits what discover finds and execute runs.
    pub async fn handle(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        session: Option<&str>,
        method: &str,
        params: Option<Value>,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        caller.require(SCOPE_READ).map_err(RouteError::Forbidden)?;
        let params = params.unwrap_or_else(|| json!({}));
        let who = Caller { team: caller.team.as_str(), user: caller.user.as_str(), session };
        // What a server answers goes on as it came; what the satellite answers itself is a value.
        let answer = match method {
            "prompts/get" => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                return self.get_prompt(caller, params, relay).await;
            }
            "completion/complete" => {
                // It runs the server's code, as `prompts/get` does.
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                return self.complete(caller, params, relay).await;
            }
            "resources/read" => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                let uri = string_param(&params, "uri", "Invalid uri parameter - must be a non-empty string")?;
                return self.read(caller, uri, &params, relay).await;
            }
            "tools/call" => return self.call_meta_tool(caller, toolset, &who, &params, relay).await,
            task if crate::router::tasks::names_task(task, Some(&params)) => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                return self.task_request(caller, task, params, relay).await;
            }
            "tools/catalog" if catalog::declared(Some(&params)) => self.tool_catalog(caller, toolset, &params).await,
            "tools/describe" if catalog::declared(Some(&params)) => self.describe_tools(caller, toolset, &params),
            other => self.answer(caller, &who, other, params).await,
        };
        answer.map(Payload::from)
    }

    /// The requests of `/mcp` the satellite answers itself.
    async fn answer(
        &self,
        caller: &Principal,
        who: &Caller<'_>,
        method: &str,
        params: Value,
    ) -> Result<Value, RouteError> {
        match method {
            "ping" => Ok(json!({})),
            "tools/list" => {
                self.record_listing(caller, who);
                Ok(protocol::object([("tools", meta::definitions().clone())]))
            }
            "prompts/list" => self.list_prompts(caller).await,
            "logging/setLevel" => self.set_log_level(caller, params).await,
            "resources/list" => Ok(protocol::object([("resources", Value::Array(self.native_resources(caller)))])),
            "resources/templates/list" => {
                Ok(protocol::object([("resourceTemplates", Value::Array(self.native_templates(caller)))]))
            }
            other => Err(method_not_found(other)),
        }
    }

    /// `tools/list` as JSON text (`{"tools": [...]}`): the same four meta-tools for every caller, so it is
    /// written once, not built and serialized per request. Recorded for the analytics like `handle`'s.
    pub fn list_tools_json(&self, caller: &Principal, session: Option<&str>) -> Result<&'static str, RouteError> {
        caller.require(SCOPE_READ).map_err(RouteError::Forbidden)?;
        self.record_listing(caller, &Caller { team: caller.team.as_str(), user: caller.user.as_str(), session });
        Ok(meta::listing_json())
    }

    /// What this `tools/list` showed (the meta-tools) against every tool the caller can see now.
    fn record_listing(&self, caller: &Principal, who: &Caller<'_>) {
        let meta = self.analytics.meta();
        let catalogs: Vec<(Arc<Instance>, Arc<crate::model::Catalog>)> =
            self.visible_instances(caller).into_iter().filter_map(|i| i.catalog().map(|c| (i, c))).collect();
        let fingerprint = analytics::fingerprint(
            catalogs.iter().map(|(i, c)| (i.spec().process_id.as_str(), c.discovered_at.timestamp_millis())),
        );
        self.analytics.listing(
            who,
            Listing {
                router: Router::Hierarchical,
                instance: None,
                tools_shown: meta.tools,
                shown_tokens: meta.tokens,
                tools_visible: catalogs.iter().map(|(_, c)| c.tools.len() as u64).sum(),
                visible_tokens: catalogs.iter().filter_map(|(_, c)| c.tokens_total()).sum(),
                fingerprint,
                uncounted: catalogs
                    .iter()
                    .filter(|(_, c)| !c.is_counted())
                    .flat_map(|(_, c)| c.tools.iter().cloned())
                    .collect(),
            },
        );
    }

    async fn call_meta_tool(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        who: &Caller<'_>,
        params: &Value,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
        static NO_ARGUMENTS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| json!({}));
        let args = params.get("arguments").unwrap_or(&NO_ARGUMENTS);
        match name {
            meta::DISCOVER => {
                let (result, tool_paths) = self.discover(caller, toolset, args).await?;
                let text =
                    result.pointer("/content/0/text").and_then(Value::as_str).map(str::to_owned).unwrap_or_default();
                self.analytics.discover(who, text, tool_paths);
                Ok(result.into())
            }
            meta::EXECUTE => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                self.execute(caller, toolset, who, args, params, relay).await
            }
            meta::LIST_RESOURCES => Ok(self.list_resources(caller)),
            meta::READ_RESOURCE => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                let uri = string_param(args, "uri", "Invalid uri parameter - must be a non-empty string")?;
                let result = self.read(caller, uri, params, relay).await?.into_value().map_err(unreadable)?;
                Ok(Payload::from(json!({"content": [{"type": "text", "text": join_contents(&result)}]})))
            }
            // A client of the progressive-disclosure extension calls the tools it described by their paths.
            path if catalog::declared(Some(params)) && parse_tool_path(path).is_some() => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
                let args = json!({"tool_path": path, "arguments": arguments});
                self.execute(caller, toolset, who, &args, params, relay).await
            }
            other => Err(unknown_meta_tool(other)),
        }
    }

    /// `list_mcp_resources`: the caller's resources and templates, as one text document.
    fn list_resources(&self, caller: &Principal) -> Payload {
        let resources = self.resource_entries(caller);
        let templates = self.template_entries(caller);
        Payload::from(text_document(
            &json!({
                "total_resources": resources.len(),
                "total_templates": templates.len(),
                "resources": resources,
                "resource_templates": templates,
            }),
            self.pretty,
        ))
    }

    /// The caller's instances whose tools are visible now.
    pub(super) fn visible_instances(&self, caller: &Principal) -> Vec<Arc<Instance>> {
        self.views.get(&self.manager, caller, None).instances.clone()
    }

    /// The caller's instance of a server slug; several installations of one slug resolve to the last (OQ-23).
    pub(super) fn instance_for(&self, caller: &Principal, slug: &str) -> Result<Arc<Instance>, RouteError> {
        let mut matching: Vec<Arc<Instance>> = self
            .manager
            .instances_for(&caller.user, &caller.team)
            .into_iter()
            .filter(|i| i.spec().server_slug == slug)
            .collect();
        if matching.len() > 1 {
            warn!(user_id = %caller.user, server = slug, count = matching.len(), "several instances share a server slug; using the last");
        }
        matching.pop().ok_or_else(|| {
            invalid(format!(
                "You do not have access to server '{slug}'. Please check your team's MCP server installations."
            ))
        })
    }

    /// Run a tool on the caller's instance. What the outer call carries for the server goes with the inner call:
    /// its `_meta` (the progress token above all, so progress reaches the client that asked) and a 2026-07-28
    /// retry's `inputResponses` and `requestState` (the server asked through `input_required`; the client answers
    /// by calling `execute_mcp_tool` again with them).
    async fn execute(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        who: &Caller<'_>,
        args: &Value,
        outer: &Value,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        let (path, slug, tool_name) = tool_path(args, toolset)?;
        let instance = self.instance_for(caller, slug)?;
        if let Some(refused) = refusal(&instance, path, tool_name) {
            return refused;
        }
        let inner = inner_call(tool_name, args, outer)?;
        self.limits.admit(&self.manager, instance.spec(), tool_name).await?;
        let started = Instant::now();
        let result = forward(&self.manager, &instance, "tools/call", inner, self.call_timeout, relay).await;
        self.analytics.call(
            who,
            Router::Hierarchical,
            instance.spec(),
            tool_name,
            call_outcome(&result),
            started.elapsed(),
        );
        let pid = instance.spec().process_id.as_str();
        let result = result.map(|r| crate::router::tasks::seal_result("tools/call", pid, normalise_call_result(r)));
        explain_misfit(result, &instance, path, tool_name, args.get("arguments"))
    }
}

/// `execute_mcp_tool`'s `tool_path`, and its server slug and tool name, when it is well formed and in the
/// session's toolset.
fn tool_path<'a>(args: &'a Value, toolset: Option<&Arc<Toolset>>) -> Result<(&'a str, &'a str, &'a str), RouteError> {
    let path = string_param(
        args,
        "tool_path",
        "Invalid tool_path parameter - must be a non-empty string in format \"serverName:toolName\"",
    )?;
    let (slug, tool_name) = parse_tool_path(path).ok_or_else(|| {
        invalid(format!(
            "Invalid tool_path format: {path}. Expected format: \"serverSlug:toolName\" (e.g., \"github:create_issue\")"
        ))
    })?;
    if let Some(toolset) = toolset.filter(|t| !t.matches(slug, tool_name)) {
        return Err(invalid(format!(
            "Tool {path} is not in the toolset '{}' this session uses. Use discover_mcp_tools to find tools in it, or connect with ?toolset=all to reach every tool.",
            toolset.name
        )));
    }
    Ok((path, slug, tool_name))
}

/// Why the tool cannot run on `instance` now, when it cannot: the answer to give instead of calling it.
fn refusal(instance: &Instance, path: &str, tool_name: &str) -> Option<Result<Payload, RouteError>> {
    if instance.tool_denied(tool_name) {
        return Some(Err(denied(path)));
    }
    if instance.catalog().is_none() {
        // Never started (or never listed its tools): say why, not "Tool not found".
        return Some(Ok(blocked_result(path, instance).into()));
    }
    let known = instance.catalog().is_some_and(|c| c.position(tool_name).is_some());
    if !known {
        return Some(Err(invalid(format!("Tool not found: {path}. Use discover_mcp_tools to find available tools."))));
    }
    if !callable(instance.state()) {
        return Some(Ok(blocked_result(path, instance).into()));
    }
    if instance.tool_disabled(tool_name) {
        return Some(Ok(disabled_result(path).into()));
    }
    None
}

/// The `tools/call` request for the server: the tool's name and arguments, with what of the outer call is meant
/// for the server.
fn inner_call(tool_name: &str, args: &Value, outer: &Value) -> Result<Value, RouteError> {
    let arguments = match args.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(value @ Value::Object(_)) => value.clone(),
        Some(_) => return Err(RouteError::Rpc(RpcError::new(codes::INVALID_PARAMS, "arguments must be an object"))),
    };
    let mut inner = protocol::object([("name", Value::from(tool_name)), ("arguments", arguments)]);
    for key in ["_meta", "inputResponses", "requestState"] {
        if let Some(value) = outer.get(key).filter(|v| !v.is_null()) {
            inner[key] = value.clone();
        }
    }
    Ok(inner)
}

/// A failure whose arguments do not fit the tool's schema says so, with the schema.
fn explain_misfit(
    result: Result<Payload, RouteError>,
    instance: &Instance,
    path: &str,
    tool_name: &str,
    arguments: Option<&Value>,
) -> Result<Payload, RouteError> {
    match result {
        Err(RouteError::Rpc(err)) if err.code == codes::INVALID_PARAMS => {
            match misfit(instance, tool_name, arguments) {
                Some((tool, problems)) => Err(RouteError::Rpc(fit::explain_error(err, path, &tool, &problems))),
                None => Err(RouteError::Rpc(err)),
            }
        }
        Ok(result) if result.shape().is_error => match misfit(instance, tool_name, arguments) {
            Some((tool, problems)) => Ok(fit::explain_result(result, path, &tool, &problems)),
            None => Ok(result),
        },
        other => other,
    }
}

/// The tool `tool_name` of `instance` and what of `arguments` does not fit its input schema, when something does
/// not (missing arguments are `{}`, as the call sent them).
fn misfit(instance: &Instance, tool_name: &str, arguments: Option<&Value>) -> Option<(ToolDef, Vec<String>)> {
    let catalog = instance.catalog()?;
    let tool = catalog.tools.get(catalog.position(tool_name)?)?.clone();
    let none = Value::Object(Default::default());
    let problems = fit::problems(&tool, arguments.filter(|a| !a.is_null()).unwrap_or(&none))?;
    Some((tool, problems))
}

/// The error for a `tools/call` of a name that is none of the meta-tools.
fn unknown_meta_tool(name: &str) -> RouteError {
    invalid(format!(
        "Unknown meta-tool: {name}. Available tools: {}, {}, {}, {}",
        meta::DISCOVER,
        meta::EXECUTE,
        meta::LIST_RESOURCES,
        meta::READ_RESOURCE
    ))
}

fn string_param<'a>(params: &'a Value, name: &str, message: &str) -> Result<&'a str, RouteError> {
    params.get(name).and_then(Value::as_str).filter(|s| !s.trim().is_empty()).ok_or_else(|| invalid(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `execute_mcp_tool`'s task holds this future, copied whole when the task is spawned (as the instance
    /// router's test says): ~1.6 KB in a debug build, 8.1 KB before the upstream call was boxed; a large branch
    /// held inline would make every call carry it.
    #[test]
    fn the_hierarchical_routers_future_stays_small() {
        let size = future_size!(
            HierarchicalRouter::handle,
            <'a> (
                &'a HierarchicalRouter,
                &'a Principal,
                Option<&'a Arc<Toolset>>,
                Option<&'a str>,
                &'a str,
                Option<Value>,
                Option<&'a Relay>,
            )
        );
        assert!(size <= 4 * 1024, "HierarchicalRouter::handle's future is {size} bytes: box the large branch");
    }
}
