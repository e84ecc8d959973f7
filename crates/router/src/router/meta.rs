//! The four meta-tools `tools/list` returns on `/mcp` (SB §13.1): names,
//! input schemas and required lists are contractual.

use serde_json::{json, Value};

pub const DISCOVER: &str = "discover_mcp_tools";
pub const EXECUTE: &str = "execute_mcp_tool";
pub const LIST_RESOURCES: &str = "list_mcp_resources";
pub const READ_RESOURCE: &str = "read_mcp_resource";

/// The four definitions, built once: `tools/list` on `/mcp` answers them on every call.
pub fn definitions() -> &'static Value {
    static DEFINITIONS: std::sync::LazyLock<Value> = std::sync::LazyLock::new(build);
    &DEFINITIONS
}

/// The whole `tools/list` result (`{"tools": [...]}`) as JSON text, written once: the handshake endpoint sends
/// it as is instead of copying and writing the definitions on every listing.
pub fn listing_json() -> &'static str {
    static TEXT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| json!({"tools": definitions()}).to_string());
    &TEXT
}

fn build() -> Value {
    json!([discover(), execute(), list_resources(), read_resource()])
}

/// `discover_mcp_tools`: search the caller's tools.
fn discover() -> Value {
    json!({
        "name": DISCOVER,
        "description": "Find tools across all of your team's MCP servers. Prefer 1-3 short keywords to sentences \
            (e.g. \"markdown\", \"github create\", \"database query\"); a task of several steps may be sent whole and is \
            searched step by step; use \"*\" to list every tool (up to 20). Returns tool paths (serverName:toolName) to run \
            with execute_mcp_tool: the best matches with input schemas, then one-line entries, within budget_tokens. \
            Send tool paths as the query to get their input schemas.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "One to three keywords, e.g. \"github\" or \"database postgres\", or tool paths for their schemas. Use \"*\" to list every tool (up to 20)."},
                "limit": {"type": "number", "description": "Maximum results. Alone (without budget_tokens): that many results, each with its input schema (1-50; wildcard listing is capped at 20)"},
                "budget_tokens": {"type": "number", "description": "Most tokens the answer may take (default 1000, at least 400)"},
                "explain": {"type": "boolean", "description": "Say why each result matched"},
                "full_schemas": {"type": "boolean", "description": "Input schemas untrimmed (titles and stated defaults kept)"}
            },
            "required": ["query"]
        }
    })
}

/// `execute_mcp_tool`: run one found tool.
fn execute() -> Value {
    json!({
        "name": EXECUTE,
        "description": "Run a tool found with discover_mcp_tools. tool_path is serverName:toolName as returned by discovery \
            (e.g. \"github:create_issue\"); arguments follow the tool's input schema.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "tool_path": {"type": "string", "description": "Path returned by discover_mcp_tools, formatted serverName:toolName"},
                "arguments": {"type": "object", "description": "Arguments for the tool; shape depends on the tool"}
            },
            "required": ["tool_path", "arguments"]
        }
    })
}

/// `list_mcp_resources`: the caller's resources.
fn list_resources() -> Value {
    json!({
        "name": LIST_RESOURCES,
        "description": "List resources (files, UI components, configuration) from all of your connected MCP servers. \
            Read one with read_mcp_resource using its uri (serverSlug|originalUri).",
        "inputSchema": {"type": "object", "properties": {}, "required": []}
    })
}

/// `read_mcp_resource`: one resource's contents.
fn read_resource() -> Value {
    json!({
        "name": READ_RESOURCE,
        "description": "Read one resource by the uri list_mcp_resources returned, formatted serverSlug|originalUri \
            (e.g. excalidraw|ui://excalidraw/mcp-app.html).",
        "inputSchema": {
            "type": "object",
            "properties": {"uri": {"type": "string", "description": "URI from list_mcp_resources, formatted serverSlug|originalUri, e.g. excalidraw|ui://excalidraw/mcp-app.html"}},
            "required": ["uri"]
        }
    })
}

/// What the four meta-tools cost a client's context, counted once by the `cost` below and kept here so that
/// starting the satellite never builds the token encoder (~150 ms and most of an idle satellite's memory) just
/// for them. `the_kept_meta_cost_is_what_counting_gives` fails when the definitions change without this.
pub const COST: crate::analytics::MetaCost = crate::analytics::MetaCost { tools: 4, tokens: META_TOKENS };
const META_TOKENS: u64 = 737;

/// What the meta-tools cost a client's context, counted like any tool (SB §15) on the blocking pool.
pub async fn cost() -> Result<crate::analytics::MetaCost, crate::tokens::TokenError> {
    let tools = crate::model::ToolDef::listing(definitions().as_array().into_iter().flatten().cloned());
    let count = tools.len() as u64;
    let tokens = crate::tokens::count_tools(tools).await?;
    Ok(crate::analytics::MetaCost { tools: count, tokens: tokens.iter().map(|n| *n as u64).sum() })
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_kept_meta_cost_is_what_counting_gives() {
        let counted = super::cost().await.expect("the encoder counts");
        assert_eq!(counted, super::COST, "update META_TOKENS (and the tool count) in crates/router/src/router/meta.rs");
    }
}
