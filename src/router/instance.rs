//! The instance router: one instance's real tools and resources under their
//! original names (SB §6.3), for a caller holding that instance's token.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    blocked_result, callable, disabled_result, forward, method_not_found, normalise_call_result, visible, RouteError,
};
use crate::instances::{Instance, InstanceManager};
use crate::mcp::protocol::{codes, RpcError};

#[derive(Clone)]
pub struct InstanceRouter {
    pub manager: InstanceManager,
    pub call_timeout: Duration,
    pub read_timeout: Duration,
}

impl InstanceRouter {
    pub async fn handle(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, RouteError> {
        let params = params.unwrap_or_else(|| json!({}));
        let catalog = instance.catalog().filter(|_| visible(instance));
        match method {
            "ping" => Ok(json!({})),
            "prompts/list" => Ok(json!({"prompts": []})),
            "tools/list" => {
                let tools: Vec<Value> = catalog
                    .iter()
                    .flat_map(|c| {
                        c.tools.iter().filter(|t| !instance.tool_disabled(&t.name)).map(|t| t.definition.clone())
                    })
                    .collect();
                Ok(json!({"tools": tools}))
            }
            "resources/list" => {
                let resources: Vec<Value> =
                    catalog.iter().flat_map(|c| c.resources.iter().map(|r| r.definition.clone())).collect();
                Ok(json!({"resources": resources}))
            }
            "resources/templates/list" => {
                let templates: Vec<Value> =
                    catalog.iter().flat_map(|c| c.templates.iter().map(|t| t.definition.clone())).collect();
                Ok(json!({"resourceTemplates": templates}))
            }
            "tools/call" => {
                let name = params.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
                    RouteError::Rpc(RpcError::new(
                        codes::INVALID_PARAMS,
                        "Invalid params: name must be a non-empty string",
                    ))
                })?;
                let known = instance.catalog().is_some_and(|c| c.tools.iter().any(|t| t.name == name));
                if !known {
                    return Err(RouteError::Rpc(RpcError::new(
                        codes::INVALID_PARAMS,
                        format!("Tool not found: {name}"),
                    )));
                }
                if !callable(instance.status().status) {
                    return Ok(blocked_result(name, instance));
                }
                if instance.tool_disabled(name) {
                    return Ok(disabled_result(name));
                }
                let arguments = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
                let result = forward(
                    &self.manager,
                    instance,
                    "tools/call",
                    json!({"name": name, "arguments": arguments}),
                    self.call_timeout,
                )
                .await?;
                Ok(normalise_call_result(result))
            }
            "resources/read" => {
                let uri = params.get("uri").and_then(Value::as_str).filter(|u| !u.is_empty()).ok_or_else(|| {
                    RouteError::Rpc(RpcError::new(
                        codes::INVALID_PARAMS,
                        "Invalid params: uri must be a non-empty string",
                    ))
                })?;
                if !callable(instance.status().status) {
                    let status = instance.status().status;
                    return Err(RouteError::Rpc(RpcError::new(
                        codes::INTERNAL_ERROR,
                        format!("MCP server is unavailable (status: {status})"),
                    )));
                }
                forward(&self.manager, instance, "resources/read", json!({"uri": uri}), self.read_timeout).await
            }
            other => Err(method_not_found(other)),
        }
    }
}
