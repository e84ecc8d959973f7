//! The demo server's tools: what it offers, and what calling each does.

use std::time::Duration;

use serde_json::{json, Value};

use super::{DemoServer, Offer, UI_RESOURCE_URI};
use crate::mcp::protocol::{self, codes, RpcError};

impl DemoServer {
    pub(super) async fn call_tool(&self, params: &Value) -> Result<Value, RpcError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "missing tool name"))?;
        let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
        if let Some(slug) = &self.offer.corpus_slug {
            return self.call_corpus_tool(slug, name, &args);
        }
        match name {
            "echo" => {
                let text = arg_str(&args, "text")?;
                Ok(text_result(text.to_owned()))
            }
            "add" => {
                let (a, b) = (arg_f64(&args, "a")?, arg_f64(&args, "b")?);
                let sum = a + b;
                let mut result = text_result(format!("{sum}"));
                result["structuredContent"] = json!({"sum": sum});
                Ok(result)
            }
            "slow" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(100).min(60_000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(text_result(format!("slept {ms} ms")))
            }
            "fail" => {
                let message = args.get("message").and_then(Value::as_str).unwrap_or("this tool always fails");
                let mut result = text_result(message.to_owned());
                result["isError"] = json!(true);
                Ok(result)
            }
            "exit_process" => {
                let code = args.get("code").and_then(Value::as_i64).unwrap_or(3) as i32;
                eprintln!("demo server exiting with code {code} as asked");
                std::process::exit(code);
            }
            "with_meta" => Ok(self.with_meta()),
            "show_ui" => Ok(text_result("open ui://demo/app.html to see the demo app".into())),
            "toggle_tool" if self.quirks.mutable => self.toggle_tool(&args).await,
            other => Err(RpcError::new(codes::INVALID_PARAMS, format!("Unknown tool: {other}"))),
        }
    }

    /// A corpus server's tool answers with a short text naming the call.
    fn call_corpus_tool(&self, slug: &str, name: &str, args: &Value) -> Result<Value, RpcError> {
        if !self.offer.tools.iter().any(|t| t["name"] == name) {
            return Err(RpcError::new(codes::INVALID_PARAMS, format!("Unknown tool: {name}")));
        }
        Ok(text_result(format!("{slug}:{name} called with {args}")))
    }

    /// `with_meta`: a result carrying `_meta`, with this server's label when it has one.
    fn with_meta(&self) -> Value {
        let mut result = text_result("this result carries _meta".into());
        result["_meta"] = json!({"demo/trace": {"id": "trace-1", "sampled": true}});
        if let Some(label) = &self.offer.label {
            result["_meta"]["demo/instance"] = json!(label);
        }
        result
    }

    /// `toggle_tool`: hide or show a tool, or describe it anew, then announce the change as often as asked.
    async fn toggle_tool(&self, args: &Value) -> Result<Value, RpcError> {
        let tool = arg_str(args, "name")?.to_owned();
        let now = match args.get("description").and_then(Value::as_str) {
            Some(description) => {
                self.live.descriptions.lock().insert(tool.clone(), description.to_owned());
                "described anew"
            }
            None => self.toggle_hidden(&tool),
        };
        let announce = args.get("announce").and_then(Value::as_u64).unwrap_or(1).min(100);
        self.announce_tools_changed(announce).await;
        Ok(text_result(format!("{tool} is now {now}")))
    }

    /// Hide the tool if it is shown, show it if hidden; what it is now.
    fn toggle_hidden(&self, tool: &str) -> &'static str {
        let mut hidden = self.live.hidden.lock();
        if !hidden.remove(tool) {
            hidden.insert(tool.to_owned());
        }
        if hidden.contains(tool) {
            "hidden"
        } else {
            "shown"
        }
    }

    /// `notifications/tools/list_changed`, `times` times, when a writer takes notifications (stdio).
    async fn announce_tools_changed(&self, times: u64) {
        let notify = self.live.notify.lock().clone();
        if let Some(notify) = notify {
            let note = protocol::notification_line("notifications/tools/list_changed", None);
            for _ in 0..times {
                let _ = notify.send(note.clone()).await;
            }
        }
    }
}

fn text_result(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

fn arg_str<'a>(args: &'a Value, name: &str) -> Result<&'a str, RpcError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, format!("argument {name:?} must be a string")))
}

fn arg_f64(args: &Value, name: &str) -> Result<f64, RpcError> {
    args.get(name)
        .and_then(Value::as_f64)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, format!("argument {name:?} must be a number")))
}

/// The demo tools, and the resources that go with them.
pub(super) fn demo_offer() -> Offer {
    let tools = vec![
        json!({"name": "echo", "description": "Echo the given text back.",
               "inputSchema": {"type": "object", "properties": {"text": {"type": "string", "description": "Text to echo"}}, "required": ["text"]}}),
        json!({"name": "add", "description": "Add two numbers and return the sum.",
               "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
               "outputSchema": {"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]}}),
        // Titled like the schemas pydantic-based servers publish, with a default its description states.
        json!({"name": "slow", "description": "Sleep for the given number of milliseconds, then answer.",
               "inputSchema": {"type": "object", "title": "slowArguments", "properties": {"ms": {"type": "integer", "title": "Ms",
                   "description": "Milliseconds to sleep (default 100)", "default": 100, "minimum": 0, "maximum": 60000}}}}),
        json!({"name": "fail", "description": "Always return a tool error (isError: true).",
               "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}),
        json!({"name": "exit_process", "description": "Exit the server process at once with the given code (default 3).",
               "inputSchema": {"type": "object", "properties": {"code": {"type": "integer"}}}}),
        json!({"name": "with_meta", "description": "Return a result that carries _meta.",
               "inputSchema": {"type": "object", "properties": {}},
               "_meta": {"demo/category": "diagnostics"}}),
        json!({"name": "show_ui", "description": "Show the demo app, an MCP App UI resource.",
               "inputSchema": {"type": "object", "properties": {}},
               "_meta": {"ui": {"resourceUri": UI_RESOURCE_URI}}}),
    ];
    Offer { name: "satellite-demo".into(), tools, with_resources: true, corpus_slug: None, label: None }
}

/// A tool whose input schema nests 200 objects deep: serde_json, like most parsers, stops at 128.
pub(super) fn too_deep_tool() -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 0..200 {
        schema = json!({"type": "object", "properties": {"inner": schema}});
    }
    json!({"name": "too_deep", "description": "Nested deeper than a parser follows", "inputSchema": schema})
}
