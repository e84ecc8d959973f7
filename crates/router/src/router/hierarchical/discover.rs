//! `discover_mcp_tools` (SB §13.2, extended). Four answers, by what the request carries:
//!
//! - `*`: the first [`WILDCARD_LIMIT`] tools, as the reference lists them;
//! - `limit` without `budget_tokens`: the best `limit` tools, each a full entry (today's answer, unchanged); so
//!   too a request with neither when the operator chose the reference's answers (`pretty_results`), with 10;
//! - a query that is only tool paths the caller can use (`github:create_issue`, several space-separated): those
//!   tools as full entries, schemas included: how an agent gets the schema of a compact entry;
//! - otherwise an answer shaped by a token budget (`budget_tokens`, default [`budget::DEFAULT_BUDGET_TOKENS`]):
//!   see [`budget`].

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Value};

use super::super::results::text_result;
use super::super::{internal, RouteError};
use super::candidates::{search_failed, tool_entry, Candidates, Entry, Pick, Request, Shape, NO_MATCH_HINT};
use super::{budget, HierarchicalRouter};
use crate::auth::Principal;
use crate::instances::Instance;
use crate::mcp::protocol::{codes, RpcError};
use crate::model::Toolset;

/// Wildcard listings stop here (SB §13.2).
const WILDCARD_LIMIT: usize = 20;
const MAX_LIMIT: usize = 50;
/// The reference's number of results (with `pretty_results`, a request without `limit` or `budget_tokens`).
const DEFAULT_LIMIT: usize = 10;

impl HierarchicalRouter {
    /// The discover answer (its text) and the tool paths it lists.
    pub(super) async fn discover(
        &self,
        caller: &Principal,
        toolset: Option<&Arc<Toolset>>,
        args: &Value,
    ) -> Result<(Value, Vec<String>), RouteError> {
        let started = Instant::now();
        let request = Request::parse(args)?;
        let view = self.views.get(&self.manager, caller, toolset);
        if let (Some(toolset), Some(0)) = (toolset, view.toolset_tools) {
            return Err(empty_toolset(toolset, &view.instances));
        }
        let candidates = Candidates { instances: &view.instances, toolset };
        let mut answer = Answer { query: request.query, ..Answer::default() };
        let picks = if request.query == "*" {
            self.wildcard(&candidates, &mut answer)
        } else if let Some(limit) = self.limited(&request) {
            let hits = self.search.search(request.query, &view.scope, limit).await.map_err(search_failed)?;
            candidates.picks(&hits, None)
        } else if let Some(picks) = candidates.described(request.query) {
            picks
        } else {
            let (text, paths) = budget::answer(self, &request, &view.scope, &candidates, started).await?;
            self.manager.metrics().discover(started.elapsed(), !paths.is_empty());
            return Ok((text_result(text), paths));
        };
        if picks.is_empty() && request.query != "*" {
            answer.hint = Some(NO_MATCH_HINT);
        }
        let mut shape = self.shape(&request);
        answer.tools = picks.iter().map(|pick| tool_entry(pick, &mut shape)).collect();
        let paths = answer.tools.iter().map(|entry| entry.tool_path.clone()).collect();
        self.manager.metrics().discover(started.elapsed(), !answer.tools.is_empty());
        answer.total_found = answer.tools.len();
        answer.search_time_ms = started.elapsed().as_millis() as u64;
        let text = if self.pretty { serde_json::to_string_pretty(&answer) } else { serde_json::to_string(&answer) }
            .map_err(|err| internal(format!("could not write the discover answer: {err}")))?;
        Ok((text_result(text), paths))
    }

    /// The number of full results a request without a budget gets: its `limit`, or with `pretty_results` (the
    /// operator chose the reference's answers) the reference's 10; `None` for a budget answer.
    fn limited(&self, request: &Request<'_>) -> Option<usize> {
        if request.budget.is_some() {
            return None;
        }
        let limit = request.limit.or(self.pretty.then_some(DEFAULT_LIMIT))?;
        Some(limit.clamp(1, MAX_LIMIT))
    }

    /// How full entries of this request are written.
    pub(super) fn shape(&self, request: &Request<'_>) -> Shape<'_> {
        Shape {
            full_schemas: request.full_schemas,
            pretty: self.pretty,
            schemas: &self.schemas,
            explainer: request.explain.then(|| self.search.explainer(request.query)),
        }
    }

    /// `*`: the first [`WILDCARD_LIMIT`] tools in the order of the caller's instances and their catalogs.
    fn wildcard<'a>(&self, candidates: &Candidates<'a>, answer: &mut Answer<'_>) -> Vec<Pick<'a>> {
        let mut picks = candidates.all();
        let available = picks.len();
        if available > WILDCARD_LIMIT {
            picks.truncate(WILDCARD_LIMIT);
            answer.notice = Some(format!(
                "Showing {WILDCARD_LIMIT} of {available} available tools. Use specific keywords to find others."
            ));
            answer.total_available = Some(available);
        }
        picks
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

#[cfg(test)]
mod tests {
    use super::super::candidates::Schema;
    use super::*;

    /// The answer is written from borrowed parts; it must read exactly as the `json!` document it replaced,
    /// key order included (the token counter cuts answers at some of its keys).
    #[test]
    fn a_discover_answer_is_written_as_the_json_document_it_stands_for() -> Result<(), serde_json::Error> {
        let schema =
            serde_json::value::to_raw_value(&json!({"type": "object", "properties": {"q": {"type": "string"}}}))?;
        let matched = crate::search::Matched { exact_name: true, ..Default::default() };
        let entry = |meta: Option<Value>, matched: Option<crate::search::Matched>| Entry {
            tool_path: "web:search".into(),
            need: None,
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
