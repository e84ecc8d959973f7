//! Who an endpoint says it is: the name, capabilities and instructions a client receives at `initialize` or
//! `server/discover`. `/mcp` is the satellite itself, and declares exactly what it serves; an instance endpoint
//! is the upstream server, whose own identity the client sees (the satellite adds, never removes).

use std::time::Duration;

use serde_json::{json, Value};

use super::dispatch::Target;
use crate::instances::InstanceManager;
use crate::model::Toolset;

/// How long `initialize` on an instance endpoint waits for a dormant or starting server to connect.
const WAKE_WAIT: Duration = Duration::from_secs(30);

pub const HIERARCHICAL_INSTRUCTIONS: &str =
    "Find tools with discover_mcp_tools (1-3 keywords), then run them with execute_mcp_tool.";

#[derive(Debug, Clone)]
pub struct Identity {
    pub server_info: Value,
    pub capabilities: Value,
    pub instructions: Option<String>,
}

impl Identity {
    /// No capability promises `listChanged`: for a transport on which the satellite carries no list changes (a
    /// legacy SSE stream; a 2026-07-28 client of `/mcp`, which serves no `subscriptions/listen`).
    pub fn promise_no_list_changes(&mut self) {
        for capability in self.capabilities.as_object_mut().into_iter().flat_map(|all| all.values_mut()) {
            if let Some(capability) = capability.as_object_mut() {
                capability.remove("listChanged");
            }
        }
    }

    /// The satellite's own identity, as `/mcp` and the legacy SSE endpoint present it.
    pub fn hierarchical() -> Self {
        static OWN: std::sync::LazyLock<Identity> = std::sync::LazyLock::new(Identity::build_hierarchical);
        OWN.clone()
    }

    fn build_hierarchical() -> Self {
        Identity {
            server_info: satellite_info(),
            capabilities: json!({
                "tools": {},
                // Sent on the session's GET stream when an instance of the caller's comes or goes, or its
                // resources or prompts change.
                "resources": {"listChanged": true},
                "prompts": {"listChanged": true},
                "completions": {},
                "logging": {},
            }),
            instructions: Some(HIERARCHICAL_INSTRUCTIONS.to_owned()),
        }
    }

    /// `/mcp` through a toolset: the instructions name it, so the agent knows its search is narrowed.
    pub fn hierarchical_with(toolset: Option<&Toolset>) -> Self {
        let mut identity = Self::hierarchical();
        if let Some(toolset) = toolset {
            let about = toolset.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
            identity.instructions = Some(format!(
                "{HIERARCHICAL_INSTRUCTIONS} This session uses the toolset '{}'{about}: discover_mcp_tools finds and execute_mcp_tool runs only its tools.",
                toolset.name
            ));
        }
        identity
    }

    /// The identity of the endpoint a target names; for an instance, its server's (waking it if dormant).
    pub async fn of(manager: &InstanceManager, target: &Target) -> Self {
        let Target::Instance(instance) = target else {
            return Self::hierarchical_with(target.toolset().map(|t| t.as_ref()));
        };
        if instance.client().is_none() {
            // Boxed: waking a dormant instance is a ~6 KB future, and held inline it made every POST's future
            // (boxed per request) 8.7 KB for a branch only an `initialize` takes.
            let _ = tokio::time::timeout(WAKE_WAIT, Box::pin(manager.wake(instance))).await;
        }
        match instance.client() {
            Some(client) => {
                let mut capabilities = client.capabilities().clone();
                if !capabilities.is_object() {
                    capabilities = json!({});
                }
                // The endpoint always answers tools/list (from the catalog), whatever the server declared, and
                // announces a changed catalog once it has discovered it again (on the server's word, or on the
                // server's `rediscover_seconds`).
                if !capabilities.get("tools").is_some_and(Value::is_object) {
                    capabilities["tools"] = json!({});
                }
                capabilities["tools"]["listChanged"] = json!(true);
                Identity {
                    server_info: client.server_info().clone(),
                    capabilities,
                    instructions: client.instructions().map(str::to_owned),
                }
            }
            // Not reachable now: the endpoint still serves its catalog; calls say why they cannot run.
            None => Identity { server_info: satellite_info(), capabilities: json!({"tools": {}}), instructions: None },
        }
    }
}

pub fn satellite_info() -> Value {
    json!({"name": "deploystack-satellite", "version": env!("CARGO_PKG_VERSION")})
}
