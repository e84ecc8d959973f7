//! The record of each `tools/call`: its `mcp.tool.executed` event, its request log entry (arguments and answer,
//! with the instance's secrets hidden) and the tool-call metrics.

use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;

use crate::events::{CallOutcome, Event, ToolExecution};
use crate::instances::instance::Instance;
use crate::logcapture::{omitted, LogCapture, RequestRecord, MAX_LOGGED_TEXT_BYTES};
use crate::mcp::payload::Payload;

/// Where calls are recorded.
pub(in crate::instances) struct CallLog {
    /// Server and request log capture (BP §9); the per-call events are batched with the request logs.
    logs: LogCapture,
    /// Tool calls by server and outcome, for `/metrics`.
    metrics: crate::metrics::Metrics,
}

impl CallLog {
    pub(in crate::instances) fn new(logs: LogCapture, metrics: crate::metrics::Metrics) -> Self {
        Self { logs, metrics }
    }

    /// The satellite's metrics (the routers count discovers here too).
    pub(in crate::instances) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// A `tools/call` refused as busy after waiting `waited` for a call slot.
    pub(in crate::instances) fn busy(&self, server_slug: &str, waited: Duration) {
        self.metrics.tool_call(server_slug, crate::metrics::CallOutcome::Busy, waited);
    }

    /// One `tools/call`: an `mcp.tool.executed` event, and the request log (arguments and result) unless the
    /// installation turned it off. A result with `isError` counts as a failure.
    pub(in crate::instances) async fn record_call(
        &self,
        instance: &Instance,
        sent: SentCall,
        result: Result<&Payload, String>,
        began: Instant,
    ) {
        let spec = instance.spec();
        let tool_path = crate::model::tool_path(&spec.server_slug, &sent.name);
        let response_bytes = result.as_ref().map_or(0, |p| p.json_len());
        let (outcome, error) = outcome_of(&result, response_bytes);
        self.metrics.tool_call(&spec.server_slug, counted(outcome), began.elapsed());
        let execution = ToolExecution {
            tool_path,
            duration_ms: began.elapsed().as_millis() as u64,
            outcome,
            error_message: error.as_deref().map(|e| crate::secrets::hide(e, instance.secret_values())),
            request_bytes: sent.request_bytes,
            response_bytes,
        };
        // Batched with the request logs: no database write on the call's path.
        self.logs.event(Event::tool_executed(spec, &execution));
        // Nothing is logged for this installation: the arguments were not copied either.
        let Some(arguments) = sent.arguments else { return };
        // A server may echo its own secret in an answer: the request log keeps nothing the config holds secret.
        let response = logged_response(&result, outcome, response_bytes, instance.secret_values());
        let kept = arguments.get().len() + response.as_ref().map_or(0, |r| r.get().len());
        let record = RequestRecord {
            tool_path: execution.tool_path,
            params: arguments,
            response,
            error,
            duration: began.elapsed(),
            bytes: kept,
        };
        self.logs.request(spec, record);
    }
}

/// How a call ended, and its error message if it failed.
fn outcome_of(result: &Result<&Payload, String>, response_bytes: usize) -> (CallOutcome, Option<String>) {
    match result {
        Ok(payload) if payload.shape().is_error && response_bytes > MAX_LOGGED_TEXT_BYTES => {
            (CallOutcome::ToolError, Some("tool returned an error".to_owned()))
        }
        Ok(payload) if payload.shape().is_error => {
            // Rare enough to read the result for its message.
            let value = payload.to_value().unwrap_or_default();
            let text = value.pointer("/content/0/text").and_then(Value::as_str).unwrap_or("tool returned an error");
            (CallOutcome::ToolError, Some(text.to_owned()))
        }
        Ok(_) => (CallOutcome::Success, None),
        Err(message) => (CallOutcome::Failed, Some(message.clone())),
    }
}

/// The metric a call's outcome is counted under.
fn counted(outcome: CallOutcome) -> crate::metrics::CallOutcome {
    match outcome {
        CallOutcome::Success => crate::metrics::CallOutcome::Ok,
        CallOutcome::ToolError => crate::metrics::CallOutcome::ToolError,
        CallOutcome::Failed => crate::metrics::CallOutcome::Failed,
    }
}

/// The answer as the request log keeps it: a successful one only, with `secrets` hidden, or a note of its size.
fn logged_response(
    result: &Result<&Payload, String>,
    outcome: CallOutcome,
    response_bytes: usize,
    secrets: &[String],
) -> Option<Box<RawValue>> {
    match (result, outcome) {
        // Not copied: see `MAX_LOGGED_TEXT_BYTES`.
        (Ok(_), CallOutcome::Success) if response_bytes > MAX_LOGGED_TEXT_BYTES => Some(omitted(response_bytes)),
        (Ok(Payload::Text { text, .. }), CallOutcome::Success) => crate::secrets::hide_json_text(text, secrets),
        (Ok(Payload::Value(value)), CallOutcome::Success) => Some(crate::secrets::hide_json_written(value, secrets)),
        _ => None,
    }
}

/// What a `tools/call`'s log and event need of its request, taken before the request goes to the server.
pub(in crate::instances) struct SentCall {
    name: String,
    request_bytes: usize,
    /// `Some` when the installation logs requests: the arguments as JSON text with the instance's secrets
    /// hidden (`null` when there were none).
    arguments: Option<Box<RawValue>>,
}

impl SentCall {
    pub(in crate::instances) fn of(instance: &Instance, params: Option<&Value>) -> SentCall {
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default().to_owned();
        let request_bytes = params.map_or(0, crate::mcp::payload::json_len);
        let arguments = instance.spec().request_logging_enabled.then(|| {
            let arguments = params.and_then(|p| p.get("arguments")).unwrap_or(&Value::Null);
            // Only a request that large can have arguments too large to keep.
            let bytes =
                if request_bytes > MAX_LOGGED_TEXT_BYTES { crate::mcp::payload::json_len(arguments) } else { 0 };
            if bytes > MAX_LOGGED_TEXT_BYTES {
                return omitted(bytes);
            }
            crate::secrets::hide_json_written(arguments, instance.secret_values())
        });
        SentCall { name, request_bytes, arguments }
    }
}
