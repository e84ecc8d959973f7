//! Arguments that do not fit a tool's input schema. When a call through `execute_mcp_tool` fails (a JSON-RPC
//! -32602 from the server, or an `isError` result), the arguments are checked against the tool's input schema
//! (the `jsonschema` crate; its default features are off, so a `$ref` to another document is never fetched);
//! when they do not fit, the failure also carries what does not fit and the tool's schema, trimmed, so an agent
//! that called from a one-line discover entry corrects its call in one more turn.
//!
//! Checked only after a failure: a call that succeeds pays nothing, and a server that accepts what its schema
//! refuses is answered as it answered (a gateway is invisible).

use serde_json::{json, Value};

use super::results::trim_schema;
use crate::mcp::payload::Payload;
use crate::mcp::protocol::RpcError;
use crate::model::ToolDef;

/// At most this many problems are named.
const MAX_PROBLEMS: usize = 5;

/// What does not fit, when `arguments` do not fit `tool`'s input schema (`None` when they fit, or when the
/// schema itself cannot be compiled: then nothing can be said of the arguments).
pub(super) fn problems(tool: &ToolDef, arguments: &Value) -> Option<Vec<String>> {
    let schema = tool.input_schema();
    let validator = jsonschema::validator_for(&schema).ok()?;
    let problems: Vec<String> = validator
        .iter_errors(arguments)
        .take(MAX_PROBLEMS)
        .map(|error| {
            let at = error.instance_path().to_string();
            if at.is_empty() {
                error.to_string()
            } else {
                format!("{at}: {error}")
            }
        })
        .collect();
    (!problems.is_empty()).then_some(problems)
}

/// The sentence that tells the agent what to fix, and the schema to fix it by.
fn advice(tool_path: &str, tool: &ToolDef, problems: &[String]) -> (String, Value) {
    let schema = trim_schema(tool.input_schema());
    let text = format!(
        "The arguments do not fit the input schema of {tool_path}: {}. Call it again with arguments that follow this input schema: {schema}",
        problems.join("; ")
    );
    (text, schema)
}

/// A server's -32602 with what does not fit and the schema: in its message (what agents are shown) and its data.
pub(super) fn explain_error(err: RpcError, tool_path: &str, tool: &ToolDef, problems: &[String]) -> RpcError {
    let (text, schema) = advice(tool_path, tool, problems);
    let mut data = match err.data.clone() {
        Some(Value::Object(map)) => map,
        Some(other) => serde_json::Map::from_iter([("server_data".to_owned(), other)]),
        None => serde_json::Map::new(),
    };
    data.insert("input_schema".into(), schema);
    data.insert("problems".into(), json!(problems));
    RpcError::new(err.code, format!("{}\n\n{text}", err.message)).with_data(Value::Object(data))
}

/// An `isError` result with one more text item: what does not fit and the schema. The server's own items stay
/// first, as it wrote them.
pub(super) fn explain_result(result: Payload, tool_path: &str, tool: &ToolDef, problems: &[String]) -> Payload {
    let Ok(mut value) = result.into_value() else {
        // Unreadable here means too deeply nested to parse; it was readable enough to be an error result.
        return Payload::Value(json!({"content": [], "isError": true}));
    };
    let (text, _) = advice(tool_path, tool, problems);
    if let Some(content) = value.get_mut("content").and_then(Value::as_array_mut) {
        content.push(json!({"type": "text", "text": text}));
    }
    Payload::Value(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::protocol::codes;

    fn tool() -> ToolDef {
        let listing = ToolDef::listing([json!({"name": "get", "description": "Get a page.", "inputSchema": {
            "type": "object", "title": "GetArgs",
            "properties": {"url": {"type": "string"}, "depth": {"type": "integer"}},
            "required": ["url"]}})]);
        listing.into_iter().next().expect("one tool")
    }

    #[test]
    fn what_does_not_fit_is_named_and_what_fits_is_not() {
        assert_eq!(problems(&tool(), &json!({"url": "https://example.com", "depth": 2})), None);
        let found = problems(&tool(), &json!({"depth": "deep"})).expect("two problems");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|p| p.contains("url")), "{found:?}");
        assert!(found.iter().any(|p| p.starts_with("/depth")), "{found:?}");
        // A schema that cannot be compiled says nothing of the arguments.
        let odd = ToolDef::listing([json!({"name": "o", "inputSchema": {"type": "no such type"}})]);
        assert_eq!(problems(&odd[0], &json!({})), None);
    }

    #[test]
    fn an_error_and_an_error_result_carry_the_trimmed_schema() {
        let tool = tool();
        let found = problems(&tool, &json!({})).expect("url is missing");
        let err = RpcError::new(codes::INVALID_PARAMS, "Invalid params").with_data(json!({"field": "url"}));
        let explained = explain_error(err, "web:get", &tool, &found);
        assert_eq!(explained.code, codes::INVALID_PARAMS);
        assert!(explained.message.starts_with("Invalid params\n\n") && explained.message.contains("\"url\""));
        let data = explained.data.expect("data");
        assert_eq!(data["field"], "url", "the server's data is kept");
        assert_eq!(data["input_schema"]["required"], json!(["url"]));
        assert!(data["input_schema"].get("title").is_none(), "trimmed");

        let result = Payload::Value(json!({"content": [{"type": "text", "text": "bad input"}], "isError": true}));
        let explained = explain_result(result, "web:get", &tool, &found).into_value().expect("a value");
        assert_eq!(explained["content"][0]["text"], "bad input");
        assert!(explained["content"][1]["text"]
            .as_str()
            .is_some_and(|t| t.contains("web:get") && t.contains("required")));
        assert_eq!(explained["isError"], true);
    }
}
