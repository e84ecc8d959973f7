//! Routing of MCP requests to the caller's own instances: the hierarchical
//! router (four meta-tools, `/mcp`) and the instance router (one instance's
//! real tools, `/i/{path}/mcp`). Every lookup goes through the caller's
//! (user, team); another member's instance is never used.

use serde_json::{json, Value};

use crate::auth::AuthError;
use crate::instances::Instance;
use crate::mcp::payload::{Payload, ResultType};
use crate::mcp::protocol::{codes, RpcError};
use crate::model::InstanceStatus;

pub mod cache_hints;
mod fit;
mod forward;
mod hierarchical;
mod instance;
pub mod limits;
pub mod meta;
mod prompts;
mod results;
mod summaries;
pub mod tasks;
mod views;

pub use hierarchical::{catalog, HierarchicalRouter};
pub use instance::InstanceRouter;
pub use results::TrimmedSchemas;
pub use summaries::Summaries;
pub use views::CallerViews;

use forward::forward;

/// A request the router refused: a JSON-RPC error, or a missing scope (HTTP 403).
#[derive(Debug, Clone, PartialEq)]
pub enum RouteError {
    Rpc(RpcError),
    Forbidden(AuthError),
}

impl From<RpcError> for RouteError {
    fn from(err: RpcError) -> Self {
        RouteError::Rpc(err)
    }
}

fn internal(message: impl Into<String>) -> RouteError {
    RouteError::Rpc(RpcError::new(codes::INTERNAL_ERROR, message))
}

/// The caller named something that is not there or asked wrongly (an unknown tool, server or resource, a
/// malformed argument): -32602 (MCP: unknown tools and resources are invalid params).
fn invalid(message: impl Into<String>) -> RouteError {
    RouteError::Rpc(RpcError::new(codes::INVALID_PARAMS, message))
}

fn method_not_found(method: &str) -> RouteError {
    RouteError::Rpc(RpcError::new(codes::METHOD_NOT_FOUND, format!("Method not found: {method}")))
}

/// A call of a tool the access rules that apply to the caller deny: refused before anything else is said of the
/// tool (its status, its arguments), as for a tool that is not there, with the reason (docs/governance.md).
fn denied(tool_path: &str) -> RouteError {
    invalid(format!("Tool '{tool_path}' is not available to you: the team's access rules do not allow it."))
}

/// Tools of an instance are visible only while it is online (SB §10.2).
fn visible(instance: &Instance) -> bool {
    instance.state().tools_visible()
}

/// Statuses in which a call may go through (`offline`/`error` act as a recovery probe, SB §10.1).
fn callable(status: InstanceStatus) -> bool {
    matches!(status, InstanceStatus::Online | InstanceStatus::Offline | InstanceStatus::Error)
}

/// The `isError` result of a call blocked by the instance's status (SB §10.5).
fn blocked_result(tool_path: &str, instance: &Instance) -> Value {
    let status = instance.status();
    let explanation = match status.status {
        InstanceStatus::Offline => "The server is currently unreachable.".to_owned(),
        InstanceStatus::Error => "The server hit an error and is not operational.".to_owned(),
        InstanceStatus::RequiresReauth => "The server needs re-authentication in the dashboard.".to_owned(),
        InstanceStatus::PermanentlyFailed => "The server crashed repeatedly and was disabled.".to_owned(),
        InstanceStatus::Connecting => "The server is still connecting; retry shortly.".to_owned(),
        InstanceStatus::DiscoveringTools => "The server is still discovering its tools; retry shortly.".to_owned(),
        other => format!("The server is in {other} state."),
    };
    let slug = &instance.spec().server_slug;
    let mut text = format!(
        "Tool '{tool_path}' cannot run: MCP server '{slug}' is unavailable.\n\nStatus: {}\n{explanation}\n",
        status.status
    );
    if let Some(message) = &status.message {
        text.push_str(&format!("Details: {message}\n"));
    }
    let step = if status.status == InstanceStatus::RequiresReauth {
        "re-authorize this server in the dashboard"
    } else {
        "wait until the server is back online and retry"
    };
    text.push_str(&format!(
        "\nWhat to do:\n1. Use discover_mcp_tools to look for an alternative tool on another server\n2. {step}\n\nUnavailable server: {slug}"
    ));
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// Why a server cannot take a call now, and what happens next: a server waiting out its restart backoff says
/// why it stopped and when it comes back, rather than only its status.
fn not_running(instance: &Instance) -> String {
    let status = instance.status();
    let reason = status.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
    let next = match status.status {
        InstanceStatus::Offline | InstanceStatus::Connecting | InstanceStatus::DiscoveringTools => {
            "It restarts on its own; retry in a few seconds."
        }
        InstanceStatus::PermanentlyFailed => "It was stopped after repeated crashes; an administrator must restart it.",
        InstanceStatus::RequiresReauth => "Re-authorize this server in the dashboard, then retry.",
        _ => "Retry later, or use discover_mcp_tools to find another tool.",
    };
    format!("MCP server not running: {} (status: {}{reason}). {next}", instance.spec().server_slug, status.status)
}

/// The `isError` result of a call to a tool the team administrator disabled (SB §10.5).
fn disabled_result(tool_path: &str) -> Value {
    let text = format!(
        "Tool '{tool_path}' was disabled by the team administrator and cannot be executed.\n\nWhat to do:\n\
         1. Use discover_mcp_tools to find another tool for the task\n2. Ask your team administrator to enable it\n\n\
         Disabled tool: {tool_path}"
    );
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// A `CallToolResult` forwarded unchanged; wrapped only when it has no `content` (SB §16.3). A 2026-07-28
/// `input_required` result and a `CreateTaskResult` (2025-11-25's nested `task`, or the Tasks extension's flat
/// `resultType: "task"`: the call became a task, whose outcome the client fetches) have no content by design and
/// pass through intact.
fn normalise_call_result(result: Payload) -> Payload {
    let shape = result.shape();
    let passes = matches!(shape.result_type, Some(ResultType::InputRequired | ResultType::Task));
    if passes || shape.content_is_array || shape.is_task {
        result
    } else {
        // The text as the satellite writes JSON (compact), whatever spacing the server used.
        let text = match result {
            Payload::Text { text, .. } => serde_json::from_str::<Value>(text.get())
                .map_or_else(|_| text.get().to_owned(), |value| value.to_string()),
            Payload::Value(value) => value.to_string(),
        };
        Payload::Value(json!({"content": [{"type": "text", "text": text}]}))
    }
}

/// A result too deeply nested to read, where the satellite must read it.
pub(crate) fn unreadable(err: serde_json::Error) -> RouteError {
    internal(format!("MCP server error: its result could not be read: {err}"))
}

/// How a forwarded call ended, for the analytics.
pub(crate) fn call_outcome(result: &Result<Payload, RouteError>) -> crate::analytics::Outcome {
    match result {
        Ok(payload) if payload.shape().is_error => crate::analytics::Outcome::ToolError,
        Ok(_) => crate::analytics::Outcome::Ok,
        Err(_) => crate::analytics::Outcome::Error,
    }
}
