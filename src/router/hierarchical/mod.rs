//! The hierarchical router (SB §13): `tools/list` is the four meta-tools;
//! discovery searches the caller's visible tools, execution and resource reads
//! go to the caller's own instance of the named server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tracing::warn;

use super::results::{text_document, text_result, trim_schema, TrimmedSchemas};
use super::{
    blocked_result, call_outcome, callable, disabled_result, forward, internal, invalid, meta, method_not_found,
    normalise_call_result, unreadable, RouteError,
};
use crate::analytics::{self, Caller, Listing, Recorder, Router};
use crate::auth::{Principal, SCOPE_EXECUTE, SCOPE_READ};
use crate::instances::{Instance, InstanceManager};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{self, codes, RpcError};
use crate::mcp::transport::Relay;
use crate::model::{
    namespace_ui_meta, namespaced_uri, parse_namespaced_uri, parse_shared_uri, parse_tool_path, shared_uri, tool_path,
    Catalog, ResourceDef, ToolDef, Toolset,
};
use crate::search::{relevance_score, SearchIndex};

mod resources;
use resources::join_contents;

/// `_meta` key naming the server a resource listed on `/mcp` comes from.
pub const SERVER_META_KEY: &str = "io.deploystack.satellite/server";

/// Wildcard listings stop here (SB §13.2).
const WILDCARD_LIMIT: usize = 20;
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 50;

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
    /// Meta-tool answers as 2-space indented JSON (the reference's form) instead of compact JSON.
    pub pretty: bool,
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
            meta::LIST_RESOURCES => {
                let resources = self.resource_entries(caller);
                let templates = self.template_entries(caller);
                Ok(Payload::from(text_document(
                    &json!({
                        "total_resources": resources.len(),
                        "total_templates": templates.len(),
                        "resources": resources,
                        "resource_templates": templates,
                    }),
                    self.pretty,
                )))
            }
            meta::READ_RESOURCE => {
                caller.require(SCOPE_EXECUTE).map_err(RouteError::Forbidden)?;
                let uri = string_param(args, "uri", "Invalid uri parameter - must be a non-empty string")?;
                let result = self.read(caller, uri, params, relay).await?.into_value().map_err(unreadable)?;
                Ok(Payload::from(json!({"content": [{"type": "text", "text": join_contents(&result)}]})))
            }
            other => Err(invalid(format!(
                "Unknown meta-tool: {other}. Available tools: {}, {}, {}, {}",
                meta::DISCOVER,
                meta::EXECUTE,
                meta::LIST_RESOURCES,
                meta::READ_RESOURCE
            ))),
        }
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

    /// The discover answer and the tool paths it lists.
    async fn discover(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        args: &Value,
    ) -> Result<(Value, Vec<String>), RouteError> {
        let started = Instant::now();
        let query = args
            .get("query")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .ok_or_else(|| invalid("Invalid query parameter - must be a non-empty string"))?;
        let limit =
            args.get("limit").and_then(Value::as_f64).map(|l| l as usize).unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
        let explain = args.get("explain").and_then(Value::as_bool).unwrap_or(false);
        let mut shape = Shape {
            full_schemas: args.get("full_schemas").and_then(Value::as_bool).unwrap_or(false),
            pretty: self.pretty,
            schemas: &self.schemas,
            explainer: explain.then(|| self.search.explainer(query)),
        };
        let view = self.views.get(&self.manager, caller, toolset);
        if let (Some(toolset), Some(0)) = (toolset, view.toolset_tools) {
            return Err(empty_toolset(toolset, &view.instances));
        }
        let instances = &view.instances;
        let in_toolset = |instance: &Instance, tool: &ToolDef| {
            toolset.is_none_or(|t| t.matches(&instance.spec().server_slug, tool.name()))
        };
        // The results, as (instance, its catalog, the tool's position there, relevance): the answer borrows the
        // tools from the catalogs instead of copying them.
        let mut picked: Vec<(&Arc<Instance>, Arc<Catalog>, usize, f64)> = Vec::new();
        // Several installations of one server slug would list one tool path twice: the first is shown. At most
        // MAX_LIMIT results, so a scan costs less than a set of allocated paths.
        let is_new = |picked: &[(&Arc<Instance>, Arc<Catalog>, usize, f64)], instance: &Instance, tool: &ToolDef| {
            !picked.iter().any(|(i, c, at, _)| {
                c.tools[*at].name() == tool.name() && i.spec().server_slug == instance.spec().server_slug
            })
        };
        let mut answer = Answer { query, ..Answer::default() };
        if query == "*" {
            let mut available = 0;
            for (instance, catalog) in instances.iter().filter_map(|i| i.catalog().map(|c| (i, c))) {
                for (at, tool) in catalog.tools.iter().enumerate() {
                    if instance.tool_disabled(tool.name()) || !in_toolset(instance, tool) {
                        continue;
                    }
                    available += 1;
                    if picked.len() < WILDCARD_LIMIT && is_new(&picked, instance, tool) {
                        picked.push((instance, catalog.clone(), at, 0.0));
                    }
                }
            }
            if available > WILDCARD_LIMIT {
                answer.notice = Some(format!(
                    "Showing {WILDCARD_LIMIT} of {available} available tools. Use specific keywords to find others."
                ));
                answer.total_available = Some(available);
            }
        } else {
            let hits = self
                .search
                .search(query, &view.scope, limit)
                .await
                .map_err(|err| internal(format!("search failed: {err}")))?;
            let best = hits.first().map(|h| h.score).unwrap_or(0.0);
            for hit in hits {
                let found = instances.binary_search_by(|i| i.spec().process_id.0.as_str().cmp(&hit.process_id));
                let Some(instance) = found.ok().map(|at| &instances[at]) else {
                    continue;
                };
                let Some((catalog, at)) = instance
                    .catalog()
                    .and_then(|c| c.tools.iter().position(|t| t.name() == hit.tool_name).map(|at| (c, at)))
                else {
                    continue;
                };
                let tool = &catalog.tools[at];
                // The index can run ahead of the view for a moment (a re-discovery indexes before it publishes):
                // a hit is shown only if this session may use it now.
                if instance.tool_disabled(tool.name()) || !in_toolset(instance, tool) {
                    continue;
                }
                if is_new(&picked, instance, tool) {
                    picked.push((instance, catalog.clone(), at, relevance_score(hit.score, best)));
                }
            }
            if picked.is_empty() {
                answer.hint = Some(NO_MATCH_HINT);
            }
        }
        answer.tools =
            picked.iter().map(|(i, c, at, relevance)| tool_entry(i, &c.tools[*at], *relevance, &mut shape)).collect();
        let paths = answer.tools.iter().map(|entry| entry.tool_path.clone()).collect();
        self.manager.metrics().discover(started.elapsed(), !answer.tools.is_empty());
        answer.total_found = answer.tools.len();
        answer.search_time_ms = started.elapsed().as_millis() as u64;
        let text = if self.pretty { serde_json::to_string_pretty(&answer) } else { serde_json::to_string(&answer) }
            .map_err(|err| internal(format!("could not write the discover answer: {err}")))?;
        Ok((text_result(text), paths))
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
        let instance = self.instance_for(caller, slug)?;
        if instance.catalog().is_none() {
            // Never started (or never listed its tools): say why, not "Tool not found".
            return Ok(blocked_result(path, &instance).into());
        }
        let known = instance.catalog().is_some_and(|c| c.tools.iter().any(|t| t.name() == tool_name));
        if !known {
            return Err(invalid(format!("Tool not found: {path}. Use discover_mcp_tools to find available tools.")));
        }
        if !callable(instance.state()) {
            return Ok(blocked_result(path, &instance).into());
        }
        if instance.tool_disabled(tool_name) {
            return Ok(disabled_result(path).into());
        }
        let arguments = match args.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(value @ Value::Object(_)) => value.clone(),
            Some(_) => {
                return Err(RouteError::Rpc(RpcError::new(codes::INVALID_PARAMS, "arguments must be an object")))
            }
        };
        let mut inner = protocol::object([("name", Value::from(tool_name)), ("arguments", arguments)]);
        for key in ["_meta", "inputResponses", "requestState"] {
            if let Some(value) = outer.get(key).filter(|v| !v.is_null()) {
                inner[key] = value.clone();
            }
        }
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
        Ok(normalise_call_result(result?))
    }
}

/// The error of a discover through a toolset that takes none of the caller's tools now: which patterns, and
/// which servers are online, so the user can tell a wrong pattern from a server that is down.
fn empty_toolset(toolset: &Toolset, online: &[Arc<Instance>]) -> RouteError {
    let mut servers: Vec<&str> = online.iter().map(|i| i.spec().server_slug.as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    let listed = if servers.is_empty() { "none".to_owned() } else { servers.join(", ") };
    RouteError::Rpc(
        RpcError::new(
            codes::INVALID_PARAMS,
            format!(
                "Toolset '{}' has no tools available to you now: its patterns ({}) match none of the tools of your online servers ({listed}). Fix the toolset, wait for its servers to come online, or connect with ?toolset=all.",
                toolset.name,
                toolset.patterns.join(", ")
            ),
        )
        .with_data(json!({"toolset": toolset.name, "patterns": toolset.patterns, "online_servers": servers})),
    )
}

/// How discover results are written: trimmed schemas unless `full_schemas`; with an explainer, why each matched.
struct Shape<'a> {
    full_schemas: bool,
    /// The reference's indented form: schemas are parsed so that they are indented too.
    pretty: bool,
    schemas: &'a TrimmedSchemas,
    explainer: Option<crate::search::Explainer>,
}

const NO_MATCH_HINT: &str = "No tool matched. Try one or two different keywords (a product name, a verb like \"create\" or \"search\"), or \"*\" to list tools.";

/// The discover answer, in the order an agent reads it.
#[derive(Default, Serialize)]
struct Answer<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    notice: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    total_available: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<&'static str>,
    total_found: usize,
    tools: Vec<Entry<'a>>,
    search_time_ms: u64,
    query: &'a str,
}

/// One discover result. The key order is part of the answer: the token counter cuts answers right after
/// `"tool_path":`, `"relevance_score":` and `"input_schema":` (`tokens::Counter::count_answer`).
#[derive(Serialize)]
struct Entry<'a> {
    tool_path: String,
    description: &'a str,
    server_name: &'a str,
    transport: &'static str,
    relevance_score: f64,
    input_schema: Schema<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    matched: Option<crate::search::Matched>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<Value>,
}

/// A result's input schema: as the server wrote it, trimmed and remembered, or parsed (the pretty form).
enum Schema<'a> {
    Text(&'a RawValue),
    Trimmed(Arc<Box<RawValue>>),
    Parsed(Value),
}

impl Serialize for Schema<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Schema::Text(text) => text.serialize(serializer),
            Schema::Trimmed(text) => text.serialize(serializer),
            Schema::Parsed(value) => value.serialize(serializer),
        }
    }
}

fn tool_entry<'a>(instance: &'a Instance, tool: &'a ToolDef, relevance: f64, shape: &mut Shape<'_>) -> Entry<'a> {
    let spec = instance.spec();
    let transport = match spec.upstream.transport_name() {
        "stdio" => "stdio",
        _ => "http",
    };
    let input_schema = match (shape.full_schemas, shape.pretty) {
        (true, false) => tool.input_schema_text().map_or_else(|| Schema::Parsed(tool.input_schema()), Schema::Text),
        (true, true) => Schema::Parsed(tool.input_schema()),
        (false, false) => Schema::Trimmed(shape.schemas.get(tool)),
        (false, true) => Schema::Parsed(trim_schema(tool.input_schema())),
    };
    Entry {
        tool_path: tool_path(&spec.server_slug, tool.name()),
        description: tool.description(),
        server_name: &spec.server_slug,
        transport,
        // Three decimals tell results apart; more digits only cost the agent tokens.
        relevance_score: (relevance * 1000.0).round() / 1000.0,
        input_schema,
        matched: shape.explainer.as_mut().map(|explainer| explainer.explain(&spec.server_slug, tool)),
        meta: tool.meta().map(|meta| namespace_ui_meta(&meta, &spec.server_slug)),
    }
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

    /// The answer is written from borrowed parts; it must read exactly as the `json!` document it replaced,
    /// key order included (the token counter cuts answers at some of its keys).
    #[test]
    fn a_discover_answer_is_written_as_the_json_document_it_stands_for() -> Result<(), serde_json::Error> {
        let schema =
            serde_json::value::to_raw_value(&json!({"type": "object", "properties": {"q": {"type": "string"}}}))?;
        let matched = crate::search::Matched { exact_name: true, ..Default::default() };
        let entry = |meta: Option<Value>, matched: Option<crate::search::Matched>| Entry {
            tool_path: "web:search".into(),
            description: "Search the \"web\"",
            server_name: "web",
            transport: "http",
            relevance_score: 0.25,
            input_schema: Schema::Text(&schema),
            matched,
            meta,
        };
        let answer = Answer {
            hint: None,
            total_found: 2,
            tools: vec![
                entry(None, None),
                entry(Some(json!({"ui": {"resourceUri": "web|ui://x"}})), Some(matched.clone())),
            ],
            search_time_ms: 3,
            query: "find \"this\"",
            ..Answer::default()
        };
        let plain = json!({
            "tool_path": "web:search", "description": "Search the \"web\"", "server_name": "web", "transport": "http",
            "relevance_score": 0.25, "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        });
        let mut full = plain.clone();
        full["matched"] = json!(matched);
        full["_meta"] = json!({"ui": {"resourceUri": "web|ui://x"}});
        let document = json!({"total_found": 2, "tools": [plain, full], "search_time_ms": 3, "query": "find \"this\""});
        assert_eq!(serde_json::to_string(&answer)?, document.to_string());
        // The pretty form parses schemas, so that they are indented like the rest.
        let mut pretty = answer;
        for entry in &mut pretty.tools {
            entry.input_schema = Schema::Parsed(serde_json::from_str(schema.get())?);
        }
        assert_eq!(serde_json::to_string_pretty(&pretty)?, serde_json::to_string_pretty(&document)?);

        let wildcard = Answer {
            notice: Some("Showing 20 of 31 available tools.".into()),
            total_available: Some(31),
            query: "*",
            ..Answer::default()
        };
        let document = json!({"notice": "Showing 20 of 31 available tools.", "total_available": 31,
            "total_found": 0, "tools": [], "search_time_ms": 0, "query": "*"});
        assert_eq!(serde_json::to_string(&wildcard)?, document.to_string());
        let empty = Answer { hint: Some(NO_MATCH_HINT), query: "zzz", ..Answer::default() };
        let document =
            json!({"hint": NO_MATCH_HINT, "total_found": 0, "tools": [], "search_time_ms": 0, "query": "zzz"});
        assert_eq!(serde_json::to_string(&empty)?, document.to_string());
        Ok(())
    }
}
