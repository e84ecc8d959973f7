//! One request to one of the caller's instances, whatever the eras on either side: the server's errors keep their
//! code and data, and a 2026-07-28 server's `input_required` is answered through a handshake-era client's session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{internal, not_running, RouteError};
use crate::instances::{Instance, InstanceError, InstanceManager};
use crate::mcp::client::Era;
use crate::mcp::payload::{Payload, ResultType};
use crate::mcp::protocol::{codes, RpcError};
use crate::mcp::transport::{Relay, UpstreamError};

/// Rounds of `input_required` the satellite answers for a handshake-era client before passing the result on.
const MAX_INPUT_ROUNDS: usize = 10;

/// Send a request to an instance, mapping failures to JSON-RPC errors: the server's own errors keep their
/// code and data, transport failures become -32603 with the reason. `timeout` is the whole request's budget,
/// however many rounds of questions a 2026-07-28 server asks a handshake-era client in it.
pub(super) async fn forward(
    manager: &InstanceManager,
    instance: &Arc<Instance>,
    method: &str,
    params: Value,
    timeout: Duration,
    relay: Option<&Relay>,
) -> Result<Payload, RouteError> {
    let uri = (method == "resources/read").then(|| params.get("uri").cloned()).flatten();
    // The task status notifications of a server that offers tasks reach the client with their ids sealed.
    let sealing;
    let relay = match relay {
        Some(relay) if offers_tasks(instance) => {
            sealing = relay.sealing_tasks_of(instance.spec().process_id.as_str());
            Some(&sealing)
        }
        other => other,
    };
    let result = answering(manager, instance, method, params, timeout, relay).await;
    match (result, uri) {
        (Err(RouteError::Rpc(err)), Some(uri)) => Err(RouteError::Rpc(name_missing_resource(err, uri))),
        (result, _) => result,
    }
}

/// Whether the instance's server offers tasks (`mcp::task_ids::offered`), as far as its connection says.
pub(super) fn offers_tasks(instance: &Instance) -> bool {
    instance.client().is_some_and(|client| crate::mcp::task_ids::offered(client.capabilities()))
}

/// [`forward`], asking a handshake-era client the questions of a 2026-07-28 server's `input_required` result (as
/// requests on its session) and retrying with the answers, until the server answers or the budget is spent.
async fn answering(
    manager: &InstanceManager,
    instance: &Arc<Instance>,
    method: &str,
    params: Value,
    timeout: Duration,
    relay: Option<&Relay>,
) -> Result<Payload, RouteError> {
    let mut params = params;
    let stateless_server = instance.client().is_some_and(|c| matches!(c.era(), Era::Stateless { .. }));
    if let Some(capabilities) = relay.and_then(Relay::client_capabilities).filter(|_| stateless_server) {
        declare_client_capabilities(&mut params, capabilities);
    }
    // Only when the client must be asked is the request needed again: every other call sends it on without a copy.
    let answers_for = relay.filter(|r| stateless_server && r.takes_requests());
    let deadline = Instant::now() + timeout;
    let mut rounds = 0;
    loop {
        let retry_left = answers_for.is_some() && rounds < MAX_INPUT_ROUNDS;
        let sent = if retry_left { params.clone() } else { std::mem::take(&mut params) };
        let result = forward_once(manager, instance, method, sent, left(deadline, timeout, instance)?, relay).await?;
        let asks = result.shape().result_type == Some(ResultType::InputRequired);
        let Some(relay) = answers_for.filter(|_| asks && retry_left) else {
            return Ok(result);
        };
        let result = result.into_value().map_err(super::unreadable)?;
        rounds += 1;
        let mut responses = serde_json::Map::new();
        if let Some(requests) = result.get("inputRequests").and_then(Value::as_object) {
            for (key, request) in requests {
                let method = request.get("method").and_then(Value::as_str).unwrap_or_default();
                let wait = left(deadline, timeout, instance)?;
                let answer = relay.ask(method, request.get("params").cloned(), wait).await.map_err(RouteError::Rpc)?;
                responses.insert(key.clone(), answer);
            }
        }
        retry_with_answers(&mut params, responses, &result);
    }
}

/// What is left of a request's budget; spent, the request fails as one the server did not answer in time would.
fn left(deadline: Instant, timeout: Duration, instance: &Instance) -> Result<Duration, RouteError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        let slug = &instance.spec().server_slug;
        return Err(internal(format!(
            "MCP server error ({slug}): no answer within {}s, the client's answers to its questions included",
            timeout.as_secs()
        )));
    }
    Ok(left)
}

/// A 2026-07-28 server asks only for what the client declared: declare a handshake-era client's own
/// capabilities on its behalf (a 2026-07-28 client's envelope already carries its own).
fn declare_client_capabilities(params: &mut Value, capabilities: &Value) {
    if let Some(object) = params.as_object_mut() {
        let meta = object.entry("_meta").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.entry(crate::mcp::protocol::meta_keys::CLIENT_CAPABILITIES).or_insert_with(|| capabilities.clone());
        }
    }
}

/// The request again, with the client's answers and the state the server asked to get back.
fn retry_with_answers(params: &mut Value, responses: serde_json::Map<String, Value>, result: &Value) {
    if let Some(object) = params.as_object_mut() {
        object.insert("inputResponses".into(), Value::Object(responses));
        match result.get("requestState") {
            Some(state) => object.insert("requestState".into(), state.clone()),
            None => object.remove("requestState"),
        };
    }
}

/// A `resources/read` of a resource the server does not have names it in `data.uri`, as both eras' examples do
/// (SEP-2164 makes it a SHOULD): a server that left it out gets it added, whichever of the two codes eras used for
/// "not found" it answered with. Other errors, and data the server gave, are left as they are.
fn name_missing_resource(mut err: RpcError, uri: Value) -> RpcError {
    const RESOURCE_NOT_FOUND: i64 = -32002;
    if err.data.is_none() && matches!(err.code, codes::INVALID_PARAMS | RESOURCE_NOT_FOUND) {
        err.data = Some(json!({ "uri": uri }));
    }
    err
}

async fn forward_once(
    manager: &InstanceManager,
    instance: &Arc<Instance>,
    method: &str,
    params: Value,
    timeout: Duration,
    relay: Option<&Relay>,
) -> Result<Payload, RouteError> {
    match manager.call_relayed(instance, method, Some(params), timeout, relay).await {
        Ok(result) => Ok(result),
        Err(InstanceError::Upstream(UpstreamError::Rpc(err))) => Err(RouteError::Rpc(err)),
        Err(InstanceError::NotConnected(_)) => Err(internal(not_running(instance))),
        Err(err @ (InstanceError::Busy { .. } | InstanceError::Respawn { .. })) => Err(internal(err.to_string())),
        Err(InstanceError::Upstream(err)) => {
            Err(internal(format!("MCP server error ({}): {err}", instance.spec().server_slug)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_resource_is_named_in_the_error_unless_the_server_said_more() {
        let uri = json!("test://gone");
        let plain = name_missing_resource(RpcError::new(codes::INVALID_PARAMS, "Resource not found"), uri.clone());
        assert_eq!(plain.data, Some(json!({"uri": "test://gone"})));
        let old = name_missing_resource(RpcError::new(-32002, "Resource not found"), uri.clone());
        assert_eq!((old.code, old.data), (-32002, Some(json!({"uri": "test://gone"}))), "the code is the server's");
        let said = RpcError::new(codes::INVALID_PARAMS, "x").with_data(json!({"reason": "r"}));
        assert_eq!(name_missing_resource(said, uri.clone()).data, Some(json!({"reason": "r"})));
        let other = name_missing_resource(RpcError::new(codes::INTERNAL_ERROR, "boom"), uri);
        assert_eq!(other.data, None, "only a not-found names the resource");
    }
}
