//! Ask one connected MCP server what it offers: tools (required), resources
//! and resource templates (optional), every listing paginated.

use futures::FutureExt as _;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{json, Value};
use tracing::{debug, warn};

use crate::mcp::client::McpClient;
use crate::mcp::transport::UpstreamError;
use crate::model::{Catalog, ListingBuilder, PreparedTool, ResourceDef, TemplateDef};

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

/// [`discover_until`] with no overall deadline (each request still waits at most `request_timeout`).
pub async fn discover(client: &McpClient, request_timeout: Duration) -> Result<Catalog, DiscoveryError> {
    discover_until(client, request_timeout, Instant::now() + Duration::from_secs(24 * 3600)).await
}

/// Discover everything; only a failed `tools/list` fails the discovery. Each request waits at most
/// `request_timeout` and never past `deadline`.
///
/// Read leniently (MCP Config Watcher's fallbacks): a listing cut off after its first page (a timeout, an
/// error, the deadline) keeps the tools that arrived; tools under `functions`, another key or in a bare array
/// are taken. Each such fallback is logged as a warning and listed in `Catalog::fallbacks`.
pub async fn discover_until(
    client: &McpClient,
    request_timeout: Duration,
    deadline: Instant,
) -> Result<Catalog, DiscoveryError> {
    let offers_resources = match client.capabilities() {
        Value::Object(caps) if !caps.is_empty() => caps.contains_key("resources"),
        _ => true,
    };
    // The three listings go out together: an instance comes online one round trip after its handshake instead
    // of three. Optional listings: whatever they say of themselves is not a fallback of the tool catalog.
    let mut fallbacks = Vec::new();
    let (mut quiet, mut quiet_templates) = (Vec::new(), Vec::new());
    let tools = list_all(client, "tools/list", "tools", request_timeout, deadline, &mut fallbacks);
    let resources = async {
        if !offers_resources {
            return (Vec::new(), Vec::new());
        }
        let resources = list_all(client, "resources/list", "resources", request_timeout, deadline, &mut quiet);
        let templates = list_all(
            client,
            "resources/templates/list",
            "resourceTemplates",
            request_timeout,
            deadline,
            &mut quiet_templates,
        );
        let (resources, templates) = tokio::join!(resources, templates);
        (optional(resources), optional(templates))
    };
    // A failed tool listing fails the discovery at once: the optional listings are not waited for.
    let (tools, (resources, templates)) = futures::future::try_join(tools, resources.map(Ok)).await?;
    let mut seen = HashSet::new();
    let mut listing = ListingBuilder::with_capacity(tools.len());
    // Each entry is handed over and freed once its definition's text is made: a large listing is never held
    // twice. The texts become one listing at the end (`ListingBuilder::finish`).
    for raw in tools {
        match PreparedTool::new(raw) {
            Ok(tool) if seen.insert(tool.name().to_owned()) => listing.push(tool),
            Ok(tool) => warn!(tool = %tool.name(), "duplicate tool name in tools/list, later one skipped"),
            Err(raw) => warn!(tool = %crate::mcp::transport::preview_value(&raw), "tool without a name skipped"),
        }
    }
    let tool_defs = listing.finish();
    let resources = resources.iter().filter_map(ResourceDef::from_listing).collect();
    let templates = templates.iter().filter_map(TemplateDef::from_listing).collect();
    Ok(Catalog {
        tools: tool_defs,
        resources,
        templates,
        discovered_at: Utc::now(),
        tool_tokens: Vec::new(),
        fallbacks,
    })
}

fn optional(listing: Result<Vec<Value>, DiscoveryError>) -> Vec<Value> {
    listing.unwrap_or_else(|err| {
        debug!(error = %err, "optional listing unavailable");
        Vec::new()
    })
}

/// The items of one page, taken out of it: under `field` as the spec says, else (with a note) a bare array,
/// `functions`, or the one key holding an array of named objects. Taken, not copied: a listing of thousands of
/// tools is a large tree, and every page of it made twice would leave its mark on the process's memory long after
/// (pages of the allocator that a few long-lived blocks keep).
fn page_items(result: &mut Value, field: &str) -> Option<(Vec<Value>, Option<String>)> {
    if let Some(items) = result.get_mut(field).and_then(Value::as_array_mut) {
        return Some((std::mem::take(items), None));
    }
    if let Some(items) = result.as_array_mut() {
        return Some((std::mem::take(items), Some(format!("the result is a bare array, not {{\"{field}\": [...]}}"))));
    }
    let object = result.as_object_mut()?;
    let named =
        |items: &Vec<Value>| !items.is_empty() && items.iter().all(|i| i.get("name").is_some_and(Value::is_string));
    let key = object.iter().find(|(_, value)| value.as_array().is_some_and(named)).map(|(key, _)| key.clone())?;
    let items = object.get_mut(&key).and_then(Value::as_array_mut).map(std::mem::take)?;
    Some((items, Some(format!("the items are under \"{key}\", not \"{field}\""))))
}

/// Follow `nextCursor` until it is absent, at most `MAX_PAGES` pages. A listing cut off after its first page
/// keeps what arrived, with a note in `fallbacks`.
async fn list_all(
    client: &McpClient,
    method: &'static str,
    field: &str,
    timeout: Duration,
    deadline: Instant,
    fallbacks: &mut Vec<String>,
) -> Result<Vec<Value>, DiscoveryError> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut cursors = HashSet::new();
    let mut shape_noted = false;
    for page in 0..MAX_PAGES {
        let params = cursor.as_ref().map(|c| json!({"cursor": c}));
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = if left.is_zero() {
            Err(UpstreamError::Timeout { method: method.to_owned(), after: Duration::ZERO })
        } else {
            client.request(method, params, timeout.min(left)).await
        };
        let mut result = match answer {
            Ok(result) => result,
            Err(source) if page > 0 => {
                let note = format!("{method} stopped after {} item(s) on page {}: {source}", items.len(), page + 1);
                warn!(method, kept = items.len(), error = %source, "listing cut off; the items that arrived are kept");
                fallbacks.push(note);
                return Ok(items);
            }
            Err(source) => return Err(DiscoveryError::Request { method, source }),
        };
        let (page_items, note) = page_items(&mut result, field)
            .ok_or_else(|| DiscoveryError::Malformed { method, detail: format!("missing {field} array") })?;
        if let (Some(note), false) = (note, shape_noted) {
            warn!(method, shape = %note, "non-standard listing accepted");
            fallbacks.push(format!("{method}: {note}"));
            shape_noted = true;
        }
        items.extend(page_items);
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
