//! Ask one connected MCP server what it offers: tools (required), resources
//! and resource templates (optional), every listing paginated.

use futures::FutureExt as _;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tracing::{debug, warn};

use crate::mcp::client::McpClient;
use crate::mcp::payload::Payload;
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
    // of three.
    let mut fallbacks = Vec::new();
    // Each tool is made into its definition's text as it is read from its page, and the listing grows by it:
    // neither the whole listing's tree nor thousands of tools waiting for its end are ever held.
    let mut listing = ListingBuilder::default();
    let mut each_tool = |raw: Value| match PreparedTool::new(raw) {
        Ok(tool) => {
            if let Err(tool) = listing.push_new(tool) {
                warn!(tool = %tool.name(), "duplicate tool name in tools/list, later one skipped");
            }
        }
        Err(raw) => warn!(tool = %crate::mcp::transport::preview_value(&raw), "tool without a name skipped"),
    };
    let tools = list_all(client, "tools/list", "tools", request_timeout, deadline, &mut fallbacks, &mut each_tool);
    let resources = async {
        if !offers_resources {
            return (Vec::new(), Vec::new());
        }
        list_resources(client, request_timeout, deadline).await
    };
    // A failed tool listing fails the discovery at once: the optional listings are not waited for.
    let ((), (resources, templates)) = futures::future::try_join(tools, resources.map(Ok)).await?;
    Ok(Catalog {
        tools: listing.finish(),
        resources,
        templates,
        discovered_at: Utc::now(),
        tool_tokens: Vec::new(),
        fallbacks,
        header_tools: Default::default(),
        names: Default::default(),
    })
}

/// The resources and resource templates, listed together; optional listings: one that fails is empty, and whatever
/// they say of themselves is not a fallback of the tool catalog.
async fn list_resources(
    client: &McpClient,
    request_timeout: Duration,
    deadline: Instant,
) -> (Vec<ResourceDef>, Vec<TemplateDef>) {
    let (mut quiet, mut quiet_templates) = (Vec::new(), Vec::new());
    let (mut resources, mut templates) = (Vec::new(), Vec::new());
    let listed = list_all(client, "resources/list", "resources", request_timeout, deadline, &mut quiet, |raw| {
        resources.extend(ResourceDef::from_listing(&raw))
    });
    let templates_listed = list_all(
        client,
        "resources/templates/list",
        "resourceTemplates",
        request_timeout,
        deadline,
        &mut quiet_templates,
        |raw| templates.extend(TemplateDef::from_listing(&raw)),
    );
    let (listed, templates_listed) = tokio::join!(listed, templates_listed);
    (optional(listed, resources), optional(templates_listed, templates))
}

fn optional<T>(listed: Result<(), DiscoveryError>, items: Vec<T>) -> Vec<T> {
    match listed {
        Ok(()) => items,
        Err(err) => {
            debug!(error = %err, "optional listing unavailable");
            Vec::new()
        }
    }
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

/// One page of a listing as the server wrote it: the items' texts, borrowed from the page's text, and the
/// cursor of the next page. `None` unless the items are under `field` as the spec says.
fn standard_page<'a>(text: &'a str, field: &str) -> Option<(Vec<&'a RawValue>, Option<String>)> {
    // Of repeated members the last counts, as in a `Value`.
    let members: BTreeMap<String, &'a RawValue> = serde_json::from_str(text).ok()?;
    let items = serde_json::from_str(members.get(field)?.get()).ok()?;
    // A cursor that is not a string ends the listing; a string that cannot be read (a lone surrogate escape) is
    // left to the parsed page, which fails as a whole.
    let next = match members.get("nextCursor").map(|cursor| cursor.get()) {
        Some(cursor) if cursor.starts_with('"') => Some(serde_json::from_str::<String>(cursor).ok()?),
        _ => None,
    };
    Some((items, next))
}

/// Hand each item of one answered page to `each`; the number of items handed and the next cursor. A page in the
/// spec's shape is read one item at a time from its text (a listing of thousands of tools is never one tree);
/// any other is parsed whole and read leniently ([`page_items`]), with a note of its shape.
fn read_page(answer: Payload, field: &str, each: &mut impl FnMut(Value)) -> Result<Page, ReadError> {
    if let Payload::Text { text, .. } = &answer {
        if let Some((items, next)) = standard_page(text.get(), field) {
            let (mut handed, mut skipped) = (0, 0);
            for item in items {
                match serde_json::from_str(item.get()) {
                    Ok(item) => {
                        each(item);
                        handed += 1;
                    }
                    Err(err) => {
                        warn!(error = %err, item = %crate::mcp::transport::preview(item.get(), 200), "a listing item that cannot be read skipped");
                        skipped += 1;
                    }
                }
            }
            return Ok(Page { items: handed, skipped, next, shape: None });
        }
    }
    let mut result = crate::mcp::transport::read_payload(answer).map_err(ReadError::Unreadable)?;
    let (items, note) = page_items(&mut result, field).ok_or(ReadError::NoItems)?;
    let count = items.len();
    items.into_iter().for_each(&mut *each);
    let next = result.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
    Ok(Page { items: count, skipped: 0, next, shape: note })
}

struct Page {
    /// Items handed on.
    items: usize,
    /// Items that could not be read (nested deeper than the parser follows, a number out of range).
    skipped: usize,
    next: Option<String>,
    /// How a page not in the spec's shape was read.
    shape: Option<String>,
}

enum ReadError {
    Unreadable(UpstreamError),
    NoItems,
}

/// Follow `nextCursor` until it is absent, at most `MAX_PAGES` pages, handing each item to `each` as its page
/// arrives. A listing cut off after its first page keeps what arrived, with a note in `fallbacks`.
async fn list_all(
    client: &McpClient,
    method: &'static str,
    field: &str,
    timeout: Duration,
    deadline: Instant,
    fallbacks: &mut Vec<String>,
    mut each: impl FnMut(Value),
) -> Result<(), DiscoveryError> {
    let mut kept = 0;
    let mut cursor: Option<String> = None;
    let mut cursors = HashSet::new();
    let mut shape_noted = false;
    for page in 0..MAX_PAGES {
        let answer = request_page(client, method, cursor.as_deref(), timeout, deadline).await;
        let read = answer.map_err(ReadError::Unreadable).and_then(|answer| read_page(answer, field, &mut each));
        let read = match read {
            Ok(read) => read,
            Err(ReadError::Unreadable(source)) if page > 0 => {
                fallbacks.push(cut_off(method, kept, page, &source));
                return Ok(());
            }
            Err(ReadError::Unreadable(source)) => return Err(DiscoveryError::Request { method, source }),
            Err(ReadError::NoItems) => {
                return Err(DiscoveryError::Malformed { method, detail: format!("missing {field} array") })
            }
        };
        kept += read.items;
        note_page(method, page, &read, &mut shape_noted, fallbacks);
        match read.next.filter(|c| !c.is_empty()) {
            None => return Ok(()),
            Some(next) => {
                if !cursors.insert(next.clone()) {
                    return Err(DiscoveryError::CursorLoop { method, cursor: next });
                }
                cursor = Some(next);
            }
        }
    }
    Err(DiscoveryError::TooManyPages { method })
}

/// One page of `method`, from `cursor`, waiting at most `timeout` and never past `deadline`.
async fn request_page(
    client: &McpClient,
    method: &'static str,
    cursor: Option<&str>,
    timeout: Duration,
    deadline: Instant,
) -> Result<Payload, UpstreamError> {
    let params = cursor.map(|c| json!({"cursor": c}));
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(UpstreamError::Timeout { method: method.to_owned(), after: Duration::ZERO })
    } else {
        client.request_relayed(method, params, timeout.min(left), None).await
    }
}

/// A listing cut off at page `page` (0-based) after `kept` items: logged, and the note for `Catalog::fallbacks`.
fn cut_off(method: &str, kept: usize, page: usize, source: &UpstreamError) -> String {
    warn!(method, kept, error = %source, "listing cut off; the items that arrived are kept");
    format!("{method} stopped after {kept} item(s) on page {}: {source}", page + 1)
}

/// What a page read leniently says in `fallbacks`: the first page not in the spec's shape, and items skipped.
fn note_page(method: &str, page: usize, read: &Page, shape_noted: &mut bool, fallbacks: &mut Vec<String>) {
    if let (Some(note), false) = (&read.shape, *shape_noted) {
        warn!(method, shape = %note, "non-standard listing accepted");
        fallbacks.push(format!("{method}: {note}"));
        *shape_noted = true;
    }
    if read.skipped > 0 {
        fallbacks.push(format!("{method}: {} unreadable item(s) skipped on page {}", read.skipped, page + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(page: &str) -> Payload {
        Payload::text(RawValue::from_string(page.to_owned()).expect("valid JSON"))
    }

    fn names(answer: Payload, field: &str) -> Result<(Vec<String>, Page), ReadError> {
        let mut names = Vec::new();
        let page = read_page(answer, field, &mut |item: Value| {
            names.push(item.get("name").and_then(Value::as_str).unwrap_or("?").to_owned())
        })?;
        Ok((names, page))
    }

    /// One tool nested deeper than a parser will follow (a hostile or broken server) costs that tool, not the
    /// listing: the page is read one item at a time.
    #[test]
    fn a_tool_too_deep_to_read_is_skipped_and_the_rest_kept() {
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        let page = format!(
            r#"{{"tools":[{{"name":"first"}},{{"name":"deep","inputSchema":{{"default":{deep}}}}},{{"name":"last"}}],"nextCursor":"2"}}"#
        );
        let Ok((names, page)) = names(text(&page), "tools") else { panic!("the page is read") };
        assert_eq!(names, ["first", "last"]);
        assert_eq!((page.items, page.skipped, page.next.as_deref(), page.shape), (2, 1, Some("2"), None));
    }

    /// The spec's shape read from the text gives what reading the parsed page gives: repeated members count
    /// last, a cursor that is not a string ends the listing, and items of any kind are handed on as they are.
    #[test]
    fn a_page_read_from_its_text_reads_as_its_parsed_value() {
        let pages = [
            r#"{"tools":[{"name":"gone"}],"tools":[{"name":"a"},{"name":"b"}],"nextCursor":"c1"}"#,
            r#"{"tools":[{"name":"a"}, 7, "x", {"noname":true}],"nextCursor":5,"_meta":{"k":[1,2]}}"#,
            r#"{"tools":[],"nextCursor":"\u0063"}"#,
        ];
        for page in pages {
            assert!(standard_page(page, "tools").is_some(), "read from its text: {page}");
            let Ok((from_text, read)) = names(text(page), "tools") else { panic!("{page}") };
            let value: Value = serde_json::from_str(page).expect("valid");
            let Ok((from_value, parsed)) = names(Payload::Value(value), "tools") else { panic!("{page}") };
            assert_eq!(from_text, from_value, "{page}");
            assert_eq!((read.items, read.next), (parsed.items, parsed.next), "{page}");
        }
    }

    /// Another shape falls back to the parsed page, with a note; no items at all is an error.
    #[test]
    fn other_shapes_are_read_from_the_parsed_page() {
        let Ok((names_of, page)) = names(text(r#"[{"name":"a"}]"#), "tools") else { panic!("a bare array") };
        assert_eq!(names_of, ["a"]);
        assert!(page.shape.is_some_and(|note| note.contains("bare array")));
        let Ok((names_of, _)) = names(text(r#"{"tools":"none","functions":[{"name":"f"}]}"#), "tools") else {
            panic!("items under another key")
        };
        assert_eq!(names_of, ["f"]);
        assert!(matches!(names(text(r#"{"tools":{}}"#), "tools"), Err(ReadError::NoItems)));
        // A cursor that cannot be read does not end the listing as if it were complete: the page fails.
        let lone_surrogate = text(r#"{"tools":[{"name":"a"}],"nextCursor":"\ud800"}"#);
        assert!(matches!(names(lone_surrogate, "tools"), Err(ReadError::Unreadable(_))));
    }
}
