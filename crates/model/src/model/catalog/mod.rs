//! What one instance offers: its tools, resources and resource templates,
//! and the two naming schemes that expose them through the hierarchical router.

mod diff;
mod listing;
mod naming;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use serde_json::Value;

pub use self::diff::{catalog_diff, ChangeKind, ToolChange};
pub use self::listing::{ListingBuilder, PreparedTool, ToolDef};
pub use self::naming::{
    namespace_ui_meta, namespaced_uri, parse_namespaced_uri, parse_shared_uri, parse_tool_path, shared_uri, tool_path,
    TOOL_PATH_SEPARATOR, URI_SEPARATOR,
};

/// One resource, under its original URI.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDef {
    pub uri: String,
    pub definition: Value,
}

/// One resource template, under its original URI template.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateDef {
    pub uri_template: String,
    pub definition: Value,
}

impl ResourceDef {
    pub fn from_listing(raw: &Value) -> Option<Self> {
        let uri = raw.get("uri")?.as_str()?.to_owned();
        raw.is_object().then(|| Self { uri, definition: raw.clone() })
    }
}

impl TemplateDef {
    pub fn from_listing(raw: &Value) -> Option<Self> {
        let uri_template = raw.get("uriTemplate")?.as_str()?.to_owned();
        raw.is_object().then(|| Self { uri_template, definition: raw.clone() })
    }
}

/// Everything one discovery found on one instance. Replaced whole, never patched.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    pub tools: Vec<ToolDef>,
    pub resources: Vec<ResourceDef>,
    pub templates: Vec<TemplateDef>,
    pub discovered_at: DateTime<Utc>,
    /// Each tool's o200k token count (SB §15), in the order of `tools`; empty until counted.
    pub tool_tokens: Vec<u32>,
    /// How this catalog departs from a compliant listing, one sentence each (a partial listing kept, tools
    /// found under another key, the tool list from the config): shown on the debug route. Not stored: the
    /// next discovery says it again.
    pub fallbacks: Vec<String>,
    /// The tools whose `inputSchema` names a header, found once: see [`Catalog::header_schema`].
    pub header_tools: HeaderTools,
    /// The tools by name, for a large catalog: see [`Catalog::position`].
    pub names: super::names::ToolNames,
}

/// The schema keyword naming a property's header (2026-07-28 "Custom Headers from Tool Parameters").
pub const X_MCP_HEADER: &str = "x-mcp-header";

/// The tools of a catalog whose `inputSchema` text mentions [`X_MCP_HEADER`], by name, as indexes into its
/// `tools`: built on the first `tools/call` that asks, from the tools (never patched, as the catalog is not), so
/// each later call finds its tool's annotations without walking the listing or reading every schema. Usually
/// empty. Being derived from `tools`, it takes no part in comparing catalogs.
#[derive(Default, Clone)]
pub struct HeaderTools(std::sync::OnceLock<HashMap<Box<str>, usize>>);

impl PartialEq for HeaderTools {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for HeaderTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            Some(found) => write!(f, "HeaderTools({} found)", found.len()),
            None => f.write_str("HeaderTools(not read yet)"),
        }
    }
}

impl Catalog {
    /// Nothing discovered yet, as of now.
    pub fn empty() -> Self {
        Catalog {
            tools: Vec::new(),
            resources: Vec::new(),
            templates: Vec::new(),
            discovered_at: Utc::now(),
            tool_tokens: Vec::new(),
            fallbacks: Vec::new(),
            header_tools: HeaderTools::default(),
            names: Default::default(),
        }
    }

    /// The `inputSchema` text of the tool `name`, when it mentions [`X_MCP_HEADER`] (a tool this catalog does not
    /// list has none): O(1) per call once the first call has found the few tools that do.
    pub fn header_schema(&self, name: &str) -> Option<&RawValue> {
        let found = self.header_tools.0.get_or_init(|| {
            // A name listed twice (a config's tool list, a stored catalog) is its first tool's, as a call finds it.
            let mut named = std::collections::HashSet::new();
            let mut found = HashMap::new();
            for (at, tool) in self.tools.iter().enumerate() {
                let first = named.insert(tool.name());
                if first && tool.input_schema_text().is_some_and(|schema| schema.get().contains(X_MCP_HEADER)) {
                    found.insert(Box::from(tool.name()), at);
                }
            }
            found
        });
        found.get(name).and_then(|&at| self.tools.get(at)).and_then(ToolDef::input_schema_text)
    }

    /// The place of the tool named `name` (the first, when a listing names one twice).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.names.position(&self.tools, ToolDef::name, name)
    }

    /// Tokens of every tool, once counted.
    pub fn tokens_total(&self) -> Option<u64> {
        self.is_counted().then(|| self.tool_tokens.iter().map(|n| u64::from(*n)).sum())
    }

    /// Every tool has its token count (a first discovery may publish before counting).
    pub fn is_counted(&self) -> bool {
        self.tool_tokens.len() == self.tools.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_tools_that_name_a_header_are_found_by_name_and_no_other() {
        let tool =
            |name: &str, schema: Value| ToolDef::from_listing(&json!({"name": name, "inputSchema": schema})).unwrap();
        let marked = json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}});
        let mut catalog = Catalog::empty();
        catalog.tools = vec![
            tool("plain", json!({"type": "object", "properties": {"q": {"type": "string"}}})),
            tool("regional", marked.clone()),
            tool("described", json!({"type": "object", "description": "no x-mcp-header here, only its name"})),
            // Listed again: the first of a name is the one called.
            tool("plain", marked.clone()),
            tool("regional", json!({"type": "object"})),
        ];
        let unread = catalog.clone();
        let schema = catalog.header_schema("regional").expect("the annotated tool");
        assert_eq!(serde_json::from_str::<Value>(schema.get()).unwrap(), marked);
        assert!(catalog.header_schema("plain").is_none(), "a schema naming no header is not kept");
        assert!(catalog.header_schema("missing").is_none(), "a tool the catalog does not list has none");
        // A schema that only mentions the word is found as well: the check reads it and finds no annotation.
        assert!(catalog.header_schema("described").is_some());
        // Found once, and only from the tools: a catalog that has been asked equals one that has not.
        assert_eq!(catalog, unread);
        assert_eq!(format!("{:?}", catalog.header_tools), "HeaderTools(2 found)");
    }
}
