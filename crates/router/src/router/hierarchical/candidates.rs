//! What the answers of `discover_mcp_tools` are made of, whatever their form: the request, the tools a caller may
//! be shown (one rule set for discover, the budget answer and the progressive-disclosure catalog), and the full
//! entry of one tool.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::super::results::{trim_schema, TrimmedSchemas};
use super::super::{internal, invalid, RouteError};
use crate::instances::Instance;
use crate::model::{namespace_ui_meta, parse_tool_path, tool_path, Catalog, ToolDef, Toolset};
use crate::search::{relevance_score, SearchHit};

/// Tool paths one query may name (`described`), as many as a `limit` answer may hold.
const MAX_NAMED: usize = 50;

/// What a discover request asks for.
pub(super) struct Request<'a> {
    pub(super) query: &'a str,
    /// Given: the most entries wanted (today's answer when no budget is given).
    pub(super) limit: Option<usize>,
    pub(super) budget: Option<usize>,
    pub(super) explain: bool,
    pub(super) full_schemas: bool,
}

impl<'a> Request<'a> {
    pub(super) fn parse(args: &'a Value) -> Result<Request<'a>, RouteError> {
        let query = args
            .get("query")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .ok_or_else(|| invalid("Invalid query parameter - must be a non-empty string"))?;
        let number = |name: &str| args.get(name).and_then(Value::as_f64).filter(|n| n.is_finite());
        let budget = match args.get("budget_tokens") {
            None | Some(Value::Null) => None,
            Some(_) => Some(
                number("budget_tokens")
                    .filter(|n| *n >= 1.0)
                    .ok_or_else(|| invalid("Invalid budget_tokens parameter - must be a positive number of tokens"))?
                    as usize,
            ),
        };
        Ok(Request {
            query,
            limit: number("limit").map(|l| l.max(1.0) as usize),
            budget,
            explain: args.get("explain").and_then(Value::as_bool).unwrap_or(false),
            full_schemas: args.get("full_schemas").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

/// One result: a tool of one of the caller's instances, by its place in the instance's catalog.
pub(super) struct Pick<'a> {
    pub(super) instance: &'a Arc<Instance>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) at: usize,
    /// Fuse-style, 0 best (the reference's `relevance_score`).
    pub(super) relevance: f64,
    /// The search's own score (0 where there was no search).
    pub(super) score: f32,
    /// Which of the request's needs it answers, when the request was split.
    pub(super) need: Option<usize>,
}

impl Pick<'_> {
    pub(super) fn tool(&self) -> &ToolDef {
        &self.catalog.tools[self.at]
    }

    pub(super) fn path(&self) -> String {
        tool_path(&self.instance.spec().server_slug, self.tool().name())
    }

    /// The key of its path in a [`Seen`] set.
    pub(super) fn key(&self) -> u64 {
        path_key(&self.instance.spec().server_slug, self.tool().name())
    }
}

/// The tools a caller may be shown: those of its visible instances, not disabled, in its toolset.
pub(super) struct Candidates<'a> {
    pub(super) instances: &'a [Arc<Instance>],
    pub(super) toolset: Option<&'a Arc<Toolset>>,
}

/// Tool paths (server slug, tool name) listed so far, by a hash of the two: several installations of one server
/// slug would list a path twice; the first is shown. Hashes, not copies: a budget answer reads a hundred hits.
pub(super) type Seen = HashSet<u64, std::hash::BuildHasherDefault<KeyHasher>>;

/// The hasher of [`Seen`]: its keys are hashes already, used as they are.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The key of a tool path in a [`Seen`] set.
pub(super) fn path_key(slug: &str, tool: &str) -> u64 {
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEYS.get_or_init(Default::default).hash_one((slug, tool))
}

impl<'a> Candidates<'a> {
    pub(super) fn usable(&self, instance: &Instance, tool: &ToolDef) -> bool {
        !instance.tool_disabled(tool.name())
            && self.toolset.is_none_or(|t| t.matches(&instance.spec().server_slug, tool.name()))
    }

    /// The hits the caller may use, in order, each path once, relevance taken against the first hit.
    pub(super) fn picks(&self, hits: &[SearchHit], need: Option<usize>) -> Vec<Pick<'a>> {
        let best = hits.first().map_or(0.0, |h| h.score);
        let mut seen = Seen::default();
        let mut picks = Vec::with_capacity(hits.len());
        for hit in hits {
            let found = self.instances.binary_search_by(|i| i.spec().process_id.0.as_str().cmp(&hit.process_id));
            let Some(instance) = found.ok().map(|at| &self.instances[at]) else { continue };
            let Some((catalog, at)) = instance.catalog().and_then(|c| {
                // Where it was when indexed, unless a catalog discovered since moved it.
                let indexed = Some(hit.position as usize)
                    .filter(|at| c.tools.get(*at).is_some_and(|t| t.name() == hit.tool_name));
                indexed.or_else(|| c.position(&hit.tool_name)).map(|at| (c, at))
            }) else {
                continue;
            };
            let tool = &catalog.tools[at];
            // The index can run ahead of the view for a moment (a re-discovery indexes before it publishes):
            // a hit is shown only if this session may use it now.
            if !self.usable(instance, tool) || !first_time(&mut seen, instance, tool) {
                continue;
            }
            let relevance = relevance_score(hit.score, best);
            picks.push(Pick { instance, catalog, at, relevance, score: hit.score, need });
        }
        picks
    }

    /// The tools a query of tool paths only names (`a:b`, or several separated by spaces or commas), when the
    /// caller may use every one of them.
    pub(super) fn described(&self, query: &str) -> Option<Vec<Pick<'a>>> {
        let names: Vec<&str> = query.split(|c: char| c.is_whitespace() || c == ',').filter(|n| !n.is_empty()).collect();
        if names.is_empty() || names.len() > MAX_NAMED {
            return None;
        }
        let mut seen = Seen::default();
        let mut picks = Vec::with_capacity(names.len());
        for name in names {
            let pick = self.named(name)?;
            if seen.insert(pick.key()) {
                picks.push(pick);
            }
        }
        Some(picks)
    }

    /// The tool a tool path names, when the caller may use it (several installations of one slug: the last, as
    /// `execute_mcp_tool` finds it).
    pub(super) fn named(&self, path: &str) -> Option<Pick<'a>> {
        let (slug, tool_name) = parse_tool_path(path)?;
        let (instance, catalog, at) = self.instances.iter().rev().find_map(|instance| {
            let catalog = instance.catalog().filter(|_| instance.spec().server_slug == slug)?;
            let at = catalog.position(tool_name)?;
            Some((instance, catalog, at))
        })?;
        self.usable(instance, &catalog.tools[at]).then_some(Pick {
            instance,
            catalog,
            at,
            relevance: 0.0,
            score: 0.0,
            need: None,
        })
    }

    /// Every tool the caller may use, in the order of its instances and their catalogs, each path once.
    pub(super) fn all(&self) -> Vec<Pick<'a>> {
        let mut seen = Seen::default();
        let mut picks = Vec::new();
        for (instance, catalog) in self.instances.iter().filter_map(|i| i.catalog().map(|c| (i, c))) {
            for (at, tool) in catalog.tools.iter().enumerate() {
                if self.usable(instance, tool) && first_time(&mut seen, instance, tool) {
                    let catalog = catalog.clone();
                    picks.push(Pick { instance, catalog, at, relevance: 0.0, score: 0.0, need: None });
                }
            }
        }
        picks
    }
}

/// Whether the path of `tool` on `instance` is new to `seen` (and remember it).
fn first_time(seen: &mut Seen, instance: &Instance, tool: &ToolDef) -> bool {
    seen.insert(path_key(&instance.spec().server_slug, tool.name()))
}

pub(super) fn search_failed(err: crate::search::SearchError) -> RouteError {
    internal(format!("search failed: {err}"))
}

/// How discover results are written: trimmed schemas unless `full_schemas`; with an explainer, why each matched.
pub(super) struct Shape<'a> {
    pub(super) full_schemas: bool,
    /// The reference's indented form: schemas are parsed so that they are indented too.
    pub(super) pretty: bool,
    pub(super) schemas: &'a TrimmedSchemas,
    pub(super) explainer: Option<crate::search::Explainer>,
}

impl Shape<'_> {
    /// Entries written compactly, whatever the operator chose for whole answers (a budget answer's entries).
    pub(super) fn compact(mut self) -> Self {
        self.pretty = false;
        self
    }
}

pub(super) const NO_MATCH_HINT: &str = "No tool matched. Try one or two different keywords (a product name, a verb like \"create\" or \"search\"), or \"*\" to list tools.";

/// One full discover result. The key order is part of the answer: the token counter cuts answers right after
/// `"tool_path":`, `"relevance_score":` and `"input_schema":` (`tokens::Counter::count_answer`).
#[derive(Serialize)]
pub(super) struct Entry<'a> {
    pub(super) tool_path: String,
    /// Which need of a split request the tool answers (budget answers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) need: Option<usize>,
    pub(super) description: &'a str,
    pub(super) server_name: &'a str,
    pub(super) transport: &'static str,
    pub(super) relevance_score: f64,
    pub(super) input_schema: Schema<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) matched: Option<crate::search::Matched>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub(super) meta: Option<Value>,
}

/// A result's input schema: as the server wrote it, trimmed and remembered, or parsed (the pretty form).
pub(super) enum Schema<'a> {
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

/// The full entry of one pick.
pub(super) fn tool_entry<'a>(pick: &'a Pick<'_>, shape: &mut Shape<'_>) -> Entry<'a> {
    let (instance, tool) = (pick.instance, pick.tool());
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
        need: pick.need,
        description: tool.description(),
        server_name: &spec.server_slug,
        transport,
        // Three decimals tell results apart; more digits only cost the agent tokens.
        relevance_score: (pick.relevance * 1000.0).round() / 1000.0,
        input_schema,
        matched: shape.explainer.as_mut().map(|explainer| explainer.explain(&spec.server_slug, tool)),
        meta: tool.meta().map(|meta| namespace_ui_meta(&meta, &spec.server_slug)),
    }
}
