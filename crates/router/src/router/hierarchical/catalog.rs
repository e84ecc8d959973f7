//! Progressive tool disclosure on `/mcp`, ahead of the specification: the shape of the draft SEP-2636
//! (modelcontextprotocol PR #2636, "Progressive Tool Disclosure"), **experimental**, behind the satellite's own
//! extension [`EXTENSION`] so that a client that does not declare it never sees it.
//!
//! - A 2026-07-28 client declares the extension in its request's `_meta` client capabilities (`extensions`);
//!   `server/discover` then lists it among the server's extensions, and the client may call:
//! - `tools/catalog {cursor?, query?}`: the caller's tools as `{name, title?, summary, schemaHash}`, where `name`
//!   is the tool path (`server:tool`), `summary` the description's first sentence and `schemaHash` the lowercase
//!   hex SHA-256 of the RFC 8785 (JCS) form of the tool exactly as `tools/describe` returns it. Without a query,
//!   every tool the caller may use, [`PAGE`] a page (`nextCursor`); with one, the best [`QUERY_RESULTS`] from the
//!   same index and scope as `discover_mcp_tools`. `ttlMs: 0` and `cacheScope: "private"`: the list is the
//!   caller's own, and `/mcp` announces no list changes to 2026-07-28 clients.
//! - `tools/describe {names}`: the full tools, in the order asked; one unknown (or not the caller's) name fails
//!   the whole request with -32602 and `data.unknownNames` (the reworked SEP's code; -32002 is retired).
//! - `tools/call` with a tool path as its name runs that tool, as `execute_mcp_tool` would.
//!
//! What the caller may list, describe and call is one rule set ([`Candidates`]): the same instances, disabled
//! tools and toolset as discover and execute. The method names, fields and error code may change before the
//! proposal is accepted.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::super::{internal, invalid, RouteError};
use super::candidates::{search_failed, Candidates, Pick};
use super::HierarchicalRouter;
use crate::auth::Principal;
use crate::mcp::protocol::{codes, meta_keys, RpcError};
use crate::model::{namespace_ui_meta, Toolset};

/// The satellite's extension for the draft SEP-2636 methods.
pub const EXTENSION: &str = "io.deploystack.satellite/progressive-tool-disclosure";
/// Catalog entries per page without a query.
const PAGE: usize = 100;
/// Catalog entries for a query.
const QUERY_RESULTS: usize = 50;
/// Names one `tools/describe` may ask for.
const MAX_DESCRIBE: usize = 100;

/// Whether a request declares [`EXTENSION`] in its `_meta` client capabilities.
pub fn declared(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(meta_keys::CLIENT_CAPABILITIES))
        .and_then(|c| c.get("extensions"))
        .and_then(|e| e.get(EXTENSION))
        .is_some_and(Value::is_object)
}

/// Lists [`EXTENSION`] among the `extensions` of server `capabilities` (made when missing).
pub fn advertise(capabilities: &mut Value) {
    let Value::Object(capabilities) = capabilities else { return };
    let extensions = capabilities.entry("extensions").or_insert_with(|| json!({}));
    if let Value::Object(extensions) = extensions {
        extensions.insert(EXTENSION.into(), json!({"experimental": true, "draft": "SEP-2636"}));
    }
}

impl HierarchicalRouter {
    /// `tools/catalog`.
    pub(super) async fn tool_catalog(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        params: &Value,
    ) -> Result<Value, RouteError> {
        let view = self.views.get(&self.manager, caller, toolset);
        let candidates = Candidates { instances: &view.instances, toolset };
        let query = params.get("query").and_then(Value::as_str).map(str::trim).filter(|q| !q.is_empty());
        let (picks, next) = match query {
            Some(query) => {
                let hits = self.search.search(query, &view.scope, QUERY_RESULTS).await.map_err(search_failed)?;
                (candidates.picks(&hits, None), None)
            }
            None => {
                let from = match params.get("cursor") {
                    None | Some(Value::Null) => 0,
                    Some(cursor) => cursor
                        .as_str()
                        .and_then(|c| c.strip_prefix("at:"))
                        .and_then(|at| at.parse::<usize>().ok())
                        .ok_or_else(|| invalid("Invalid cursor: pass the nextCursor of the previous page"))?,
                };
                let all = candidates.all();
                let next = (all.len() > from + PAGE).then(|| format!("at:{}", from + PAGE));
                (all.into_iter().skip(from).take(PAGE).collect(), next)
            }
        };
        let mut entries = Vec::with_capacity(picks.len());
        for pick in &picks {
            entries.push(self.catalog_entry(pick)?);
        }
        let mut result = Map::from_iter([
            ("tools".to_owned(), Value::Array(entries)),
            ("ttlMs".to_owned(), json!(0)),
            ("cacheScope".to_owned(), json!("private")),
        ]);
        if let Some(next) = next {
            result.insert("nextCursor".into(), Value::String(next));
        }
        Ok(Value::Object(result))
    }

    fn catalog_entry(&self, pick: &Pick<'_>) -> Result<Value, RouteError> {
        let tool = described(pick);
        let hash = schema_hash(&tool)?;
        let mut entry = Map::from_iter([("name".to_owned(), json!(pick.path()))]);
        if let Some(title) = tool.get("title").filter(|t| t.is_string()) {
            entry.insert("title".into(), title.clone());
        }
        entry.insert("summary".into(), json!(&*self.summaries.get(pick.tool()).sentence));
        entry.insert("schemaHash".into(), json!(hash));
        Ok(Value::Object(entry))
    }

    /// `tools/describe`: every named tool, or none.
    pub(super) fn describe_tools(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        params: &Value,
    ) -> Result<Value, RouteError> {
        let names: Vec<&str> = params
            .get("names")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .filter(|names: &Vec<&str>| !names.is_empty() && names.len() <= MAX_DESCRIBE)
            .ok_or_else(|| {
                invalid(format!("Invalid names parameter - must be a list of 1 to {MAX_DESCRIBE} tool names"))
            })?;
        let view = self.views.get(&self.manager, caller, toolset);
        let candidates = Candidates { instances: &view.instances, toolset };
        let mut tools = Vec::with_capacity(names.len());
        let mut unknown = Vec::new();
        for name in names {
            match candidates.named(name) {
                Some(pick) => tools.push(described(&pick)),
                None => unknown.push(name),
            }
        }
        if !unknown.is_empty() {
            return Err(RouteError::Rpc(
                RpcError::new(codes::INVALID_PARAMS, format!("Unknown tools: {}", unknown.join(", ")))
                    .with_data(json!({"unknownNames": unknown})),
            ));
        }
        Ok(json!({"tools": tools}))
    }
}

/// The tool as `tools/describe` returns it: the server's definition, named by its path, its `_meta` rewritten as
/// discover rewrites it.
fn described(pick: &Pick<'_>) -> Value {
    let tool = pick.tool();
    let mut definition = tool.definition_value();
    if let Value::Object(map) = &mut definition {
        map.insert("name".into(), json!(pick.path()));
        if let Some(meta) = tool.meta() {
            map.insert("_meta".into(), namespace_ui_meta(&meta, &pick.instance.spec().server_slug));
        }
    }
    definition
}

/// Lowercase hex SHA-256 of the RFC 8785 form of `tool`.
fn schema_hash(tool: &Value) -> Result<String, RouteError> {
    let canonical = serde_json_canonicalizer::to_vec(tool)
        .map_err(|err| internal(format!("could not write a tool in canonical form: {err}")))?;
    Ok(hex::encode(Sha256::digest(canonical)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_declared_extension_counts() {
        let declared_by = |extensions: Value| {
            declared(Some(&json!({"_meta": {meta_keys::CLIENT_CAPABILITIES: {"extensions": extensions}}})))
        };
        assert!(declared_by(json!({EXTENSION: {}})));
        assert!(!declared_by(json!({EXTENSION: true})), "an extension's settings are an object");
        assert!(!declared_by(json!({"io.modelcontextprotocol/tasks": {}})));
        assert!(!declared(Some(&json!({"query": "x"}))));
        assert!(!declared(None));
    }

    #[test]
    fn the_hash_is_of_the_canonical_form() -> Result<(), RouteError> {
        // Key order and spacing do not change the hash; a value does.
        let a =
            schema_hash(&json!({"name": "s:t", "inputSchema": {"type": "object", "properties": {"b": {}, "a": {}}}}))?;
        let b =
            schema_hash(&json!({"inputSchema": {"properties": {"a": {}, "b": {}}, "type": "object"}, "name": "s:t"}))?;
        let c = schema_hash(&json!({"name": "s:t", "inputSchema": {"type": "array"}}))?;
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // The RFC 8785 text of a small object, hashed here and by hand.
        let tool = json!({"name": "s:t", "b": 1.0, "a": "é"});
        let expected = hex::encode(Sha256::digest("{\"a\":\"é\",\"b\":1,\"name\":\"s:t\"}"));
        assert_eq!(schema_hash(&tool)?, expected);
        Ok(())
    }
}
