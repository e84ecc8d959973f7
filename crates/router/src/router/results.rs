//! How meta-tool answers are written for an agent's context: compact JSON unless the operator chose the
//! reference's pretty form, and tool schemas trimmed of what a caller does not need to call the tool.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::model::ToolDef;

/// Schema keywords an agent does not need to build a call: documentation for humans and tooling.
const DROPPED_KEYWORDS: &[&str] = &["$schema", "$id", "$comment", "title"];

/// Keywords whose value is a map of name to schema.
const SCHEMA_MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];

/// Keywords whose value is one schema.
const SCHEMA_VALUES: &[&str] =
    &["items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems"];

/// Keywords whose value is a list of schemas.
const SCHEMA_LISTS: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems"];

/// JSON Schema nesting followed; deeper parts are kept as they are.
const MAX_DEPTH: usize = 32;

/// One text item holding `document` as JSON: compact, or 2-space indented when `pretty`.
pub(super) fn text_document(document: &Value, pretty: bool) -> Value {
    let text = if pretty {
        serde_json::to_string_pretty(document).unwrap_or_else(|_| document.to_string())
    } else {
        document.to_string()
    };
    text_result(text)
}

/// A tool result of one text item.
pub(super) fn text_result(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

/// Trimmed input schemas as compact JSON, remembered by the tool's content hash: a discover result then costs
/// a lookup instead of parsing, trimming and writing its schema again, and one tool installed for many users
/// is one entry. At most `MAX_TRIMMED` are kept; a full memo starts over.
#[derive(Clone, Default)]
pub struct TrimmedSchemas {
    memo: Arc<Mutex<HashMap<ContentHash, Arc<Box<RawValue>>>>>,
}

const MAX_TRIMMED: usize = 2048;

/// A tool's SHA-256 content hash ([`ToolDef::content_hash_bytes`]).
type ContentHash = [u8; 32];

impl TrimmedSchemas {
    /// `tool`'s input schema, trimmed (`trim_schema`), as compact JSON text.
    pub(super) fn get(&self, tool: &ToolDef) -> Arc<Box<RawValue>> {
        if let Some(known) = self.memo.lock().get(tool.content_hash_bytes()) {
            return known.clone();
        }
        // A `Value` always writes as JSON; `null` keeps this total all the same.
        let trimmed = Arc::new(serde_json::value::to_raw_value(&trim_schema(tool.input_schema())).unwrap_or_default());
        let mut memo = self.memo.lock();
        if memo.len() >= MAX_TRIMMED {
            memo.clear();
        }
        memo.insert(*tool.content_hash_bytes(), trimmed.clone());
        trimmed
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.memo.lock().len()
    }
}

/// `schema` without titles, `$schema`/`$id`/`$comment`, and `default`s its own description already states
/// (`"default": 10` next to "… (default 10)"). Property names are never touched, whatever they are called.
/// The schema is trimmed in place: it was parsed for this answer alone.
pub(super) fn trim_schema(schema: Value) -> Value {
    trim(schema, 0)
}

fn trim(schema: Value, depth: usize) -> Value {
    let Value::Object(mut map) = schema else {
        return schema;
    };
    if depth > MAX_DEPTH {
        return Value::Object(map);
    }
    // Read before the map changes; copied only when there is a default to compare it with.
    let description = match map.get("default") {
        Some(_) => map.get("description").and_then(Value::as_str).unwrap_or_default().to_owned(),
        None => String::new(),
    };
    map.retain(|key, value| {
        let key = key.as_str();
        let documentation = DROPPED_KEYWORDS.contains(&key) && !matches!(value, Value::Object(_) | Value::Array(_));
        let stated_default = key == "default" && default_is_stated(value, &description);
        !(documentation || stated_default)
    });
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if SCHEMA_MAPS.contains(&key) {
            if let Value::Object(members) = value {
                members.values_mut().for_each(|s| trim_slot(s, depth + 1));
            }
        } else if SCHEMA_VALUES.contains(&key) {
            match value {
                Value::Array(list) => list.iter_mut().for_each(|s| trim_slot(s, depth + 1)),
                other => trim_slot(other, depth + 1),
            }
        } else if SCHEMA_LISTS.contains(&key) {
            if let Value::Array(list) = value {
                list.iter_mut().for_each(|s| trim_slot(s, depth + 1));
            }
        }
    }
    Value::Object(map)
}

fn trim_slot(slot: &mut Value, depth: usize) {
    *slot = trim(std::mem::take(slot), depth);
}

/// Whether `description` already says what the default is: "default 10", "default: 10", "defaults to 10",
/// "(default: \"asc\")", compared case-insensitively.
fn default_is_stated(default: &Value, description: &str) -> bool {
    let shown = match default {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return false,
    };
    let description = description.to_lowercase();
    let shown = shown.to_lowercase();
    let Some(at) = description.find("default") else {
        return false;
    };
    let after = &description[at..];
    let window: String = after.chars().take(shown.chars().count() + 24).collect();
    window.contains(&shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_drops_documentation_keywords_but_never_property_names() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "SearchArgs",
            "type": "object",
            "properties": {
                "title": {"type": "string", "title": "Title", "description": "The page title"},
                "limit": {"type": "number", "description": "Max results (default 10)", "default": 10},
                "order": {"type": "string", "default": "asc"},
                "filter": {"anyOf": [{"title": "ByName", "type": "object", "properties": {"name": {"title": "N"}}}]},
                "tags": {"type": "array", "items": {"type": "string", "title": "Tag"}}
            },
            "$defs": {"Thing": {"title": "Thing", "type": "object"}},
            "required": ["title"]
        });
        let trimmed = trim_schema(schema.clone());
        assert_eq!(
            trimmed,
            json!({
                "type": "object",
                "properties": {
                    "title": {"type": "string", "description": "The page title"},
                    "limit": {"type": "number", "description": "Max results (default 10)"},
                    "order": {"type": "string", "default": "asc"},
                    "filter": {"anyOf": [{"type": "object", "properties": {"name": {}}}]},
                    "tags": {"type": "array", "items": {"type": "string"}}
                },
                "$defs": {"Thing": {"type": "object"}},
                "required": ["title"]
            })
        );
    }

    #[test]
    fn schemas_of_odd_shapes_are_kept_as_they_are() {
        // What real servers publish besides well-formed schemas: boolean schemas, keywords with the wrong type,
        // no description, and nesting deeper than the walk follows.
        let odd = json!({
            "type": "object",
            "properties": ["not", "a", "map"],
            "items": true,
            "anyOf": {"not": "a list"},
            "additionalProperties": false,
            "title": {"an": "object, not a title"},
            "default": 3
        });
        assert_eq!(trim_schema(odd.clone()), odd);
        assert_eq!(trim_schema(json!(true)), json!(true));
        assert_eq!(trim_schema(json!(null)), json!(null));
        let mut deep = json!({"type": "string", "title": "leaf"});
        for _ in 0..200 {
            deep = json!({"type": "object", "properties": {"p": deep}});
        }
        let trimmed = trim_schema(deep.clone());
        assert_eq!(trimmed.to_string().matches("\"title\"").count(), 1, "the leaf past the depth limit stays as it is");
    }

    #[test]
    fn a_default_is_kept_unless_the_description_states_it() {
        assert!(default_is_stated(&json!(10), "Maximum results (default: 10)"));
        assert!(default_is_stated(&json!("asc"), "Sort order. Defaults to \"asc\"."));
        assert!(default_is_stated(&json!(false), "Include archived (default false)"));
        assert!(!default_is_stated(&json!(10), "Maximum results; the default is the server's page size"));
        assert!(!default_is_stated(&json!(5), "Number of results, 1-50"));
        assert!(!default_is_stated(&json!(null), "default null"));
        assert!(!default_is_stated(&json!(""), "default empty"));
    }

    #[test]
    fn compact_is_the_same_document_in_fewer_characters() {
        let document = json!({"tools": [{"tool_path": "a:b", "input_schema": {"type": "object"}}], "total_found": 1});
        let compact = text_document(&document, false);
        let pretty = text_document(&document, true);
        let text = |v: &Value| v["content"][0]["text"].as_str().unwrap_or_default().to_owned();
        assert!(text(&compact).len() < text(&pretty).len());
        let parsed: Value = serde_json::from_str(&text(&compact)).unwrap_or_default();
        assert_eq!(parsed, document);
        assert!(text(&pretty).contains("\n  \"tools\""), "pretty is the reference's 2-space form");
    }

    #[test]
    fn a_remembered_schema_is_the_trimmed_one_written_once_per_content() -> Result<(), serde_json::Error> {
        let listing = |name: &str, title: &str| {
            json!({"name": name, "description": "d", "inputSchema": {"type": "object", "title": title,
                "properties": {"n": {"type": "integer", "description": "Count (default 3)", "default": 3}}}})
        };
        let tool =
            |name: &str, title: &str| ToolDef::from_listing(&listing(name, title)).unwrap_or_else(|| panic!("{name}"));
        let schemas = TrimmedSchemas::default();
        let first = tool("a", "A");
        let remembered = schemas.get(&first);
        assert_eq!(remembered.get(), trim_schema(first.input_schema()).to_string());
        assert_eq!(
            serde_json::from_str::<Value>(remembered.get())?,
            json!({"type": "object", "properties": {"n": {"type": "integer", "description": "Count (default 3)"}}})
        );
        assert!(Arc::ptr_eq(&remembered, &schemas.get(&first)), "asked again, it is not written again");
        // Another tool with another definition has its own entry, and the first one's is kept.
        let other = tool("b", "B");
        assert!(!Arc::ptr_eq(&remembered, &schemas.get(&other)));
        assert_eq!(schemas.len(), 2);
        // Bounded: past MAX_TRIMMED it starts over, and what it answers stays right.
        for n in 0..MAX_TRIMMED + 10 {
            let many = tool(&format!("t{n}"), "T");
            assert_eq!(schemas.get(&many).get(), trim_schema(many.input_schema()).to_string());
            assert!(schemas.len() <= MAX_TRIMMED);
        }
        assert!(schemas.len() < MAX_TRIMMED, "it started over");
        Ok(())
    }
}
