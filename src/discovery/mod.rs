//! Ask one connected MCP server what it offers: tools (required), resources
//! and resource templates (optional), every listing paginated.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use tracing::{debug, warn};

use crate::mcp::client::McpClient;
use crate::mcp::transport::UpstreamError;
use crate::model::{Catalog, ResourceDef, TemplateDef, ToolDef};

/// Pages followed per listing before giving up (OQ-56).
pub const MAX_PAGES: usize = 10;

#[derive(Debug, Clone, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{method} failed: {source}")]
    Request { method: &'static str, source: UpstreamError },
    #[error("{method} returned a malformed result: {detail}")]
    Malformed { method: &'static str, detail: String },
    #[error("{method} did not finish within {MAX_PAGES} pages")]
    TooManyPages { method: &'static str },
    #[error("{method} repeated cursor {cursor:?}")]
    CursorLoop { method: &'static str, cursor: String },
}

impl DiscoveryError {
    pub fn upstream(&self) -> Option<&UpstreamError> {
        match self {
            DiscoveryError::Request { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Discover everything; only a failed `tools/list` fails the discovery.
pub async fn discover(client: &McpClient, request_timeout: Duration) -> Result<Catalog, DiscoveryError> {
    let tools = list_all(client, "tools/list", "tools", request_timeout).await?;
    let mut seen = HashSet::new();
    let mut tool_defs = Vec::with_capacity(tools.len());
    for raw in &tools {
        match ToolDef::from_listing(raw) {
            Some(tool) if seen.insert(tool.name.clone()) => tool_defs.push(tool),
            Some(tool) => warn!(tool = %tool.name, "duplicate tool name in tools/list, later one skipped"),
            None => warn!(tool = %crate::mcp::transport::preview_value(raw), "tool without a name skipped"),
        }
    }

    let offers_resources = match client.capabilities() {
        Value::Object(caps) if !caps.is_empty() => caps.contains_key("resources"),
        _ => true,
    };
    let (resources, templates) = if offers_resources {
        let resources = optional(list_all(client, "resources/list", "resources", request_timeout).await);
        let templates =
            optional(list_all(client, "resources/templates/list", "resourceTemplates", request_timeout).await);
        (
            resources.iter().filter_map(ResourceDef::from_listing).collect(),
            templates.iter().filter_map(TemplateDef::from_listing).collect(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(Catalog { tools: tool_defs, resources, templates, discovered_at: Utc::now(), tool_tokens: Vec::new() })
}

fn optional(listing: Result<Vec<Value>, DiscoveryError>) -> Vec<Value> {
    listing.unwrap_or_else(|err| {
        debug!(error = %err, "optional listing unavailable");
        Vec::new()
    })
}

/// Follow `nextCursor` until it is absent, at most `MAX_PAGES` pages.
async fn list_all(
    client: &McpClient,
    method: &'static str,
    field: &str,
    timeout: Duration,
) -> Result<Vec<Value>, DiscoveryError> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut cursors = HashSet::new();
    for _ in 0..MAX_PAGES {
        let params = cursor.as_ref().map(|c| json!({"cursor": c}));
        let result = client
            .request(method, params, timeout)
            .await
            .map_err(|source| DiscoveryError::Request { method, source })?;
        let page = result
            .get(field)
            .and_then(Value::as_array)
            .ok_or_else(|| DiscoveryError::Malformed { method, detail: format!("missing {field} array") })?;
        items.extend(page.iter().cloned());
        match result.get("nextCursor").and_then(Value::as_str).filter(|c| !c.is_empty()) {
            None => return Ok(items),
            Some(next) => {
                if !cursors.insert(next.to_owned()) {
                    return Err(DiscoveryError::CursorLoop { method, cursor: next.to_owned() });
                }
                cursor = Some(next.to_owned());
            }
        }
    }
    Err(DiscoveryError::TooManyPages { method })
}
