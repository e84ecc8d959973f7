//! Requests to an instance on a caller's behalf: calls (each in its `mcp.upstream` span), long-lived listens,
//! notifications passed on, waking a dormant instance, and undoing the subscriptions no client holds any more.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::{debug, warn, Instrument};

use crate::model::ProcessId;

use super::{Instance, InstanceError, InstanceManager, Release};

impl InstanceManager {
    /// Send a request to an instance: wait for a call slot, wake it from dormancy, forward (retrying
    /// unreachable remote servers), and turn failures and recoveries into status changes (SB §11).
    pub async fn call(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, InstanceError> {
        let result = self.inner.call(instance, method, params, timeout, None);
        let payload = result.instrument(upstream_span(instance, method)).await?;
        crate::mcp::transport::read_payload(payload).map_err(InstanceError::Upstream)
    }

    /// A call whose progress, log messages and requests to the client (sampling, elicitation, roots) go to
    /// `relay`, the client that made it.
    pub async fn call_relayed(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&crate::mcp::transport::Relay>,
    ) -> Result<crate::mcp::payload::Payload, InstanceError> {
        // Boxed: this future is ~7 KB, and the router's futures around it grew by twice that (`forward_once`'s was
        // 14 KB): every proxied call's task, copied whole when spawned, carried it (see the routers' future tests).
        Box::pin(self.inner.call(instance, method, params, timeout, relay))
            .instrument(upstream_span(instance, method))
            .await
    }

    /// A long-lived request (2026-07-28 `subscriptions/listen`): sent to the instance with everything it says
    /// going to `relay`, for as long as `limit` or until the caller drops it (the client closed its stream). It
    /// takes no call slot, so open subscriptions never starve calls, and its failure changes no status; it keeps
    /// the instance awake.
    pub async fn listen(
        &self,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        limit: Duration,
        relay: &crate::mcp::transport::Relay,
    ) -> Result<crate::mcp::payload::Payload, InstanceError> {
        let _listening = instance.listening();
        let client = self.inner.ensure_connected(instance).await?;
        instance.touch();
        let result = client.request_relayed(method, params, limit, Some(relay)).await;
        instance.touch();
        result.map_err(InstanceError::Upstream)
    }

    /// Pass a client's notification on to the instance (nothing when it has no live connection).
    pub async fn notify(&self, instance: &Arc<Instance>, method: &str, params: Option<Value>) {
        if let Some(client) = instance.client() {
            if let Err(err) = client.notify(method, params).await {
                let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
                warn!(process_id = %instance.spec().process_id, method, error = %error, "forwarding a notification failed");
            }
        }
    }

    /// Make sure the instance has a live connection, respawning it from dormancy (single-flight).
    pub async fn wake(&self, instance: &Arc<Instance>) -> Result<(), InstanceError> {
        self.inner.ensure_connected(instance).await.map(|_| ())
    }

    /// Undo, in the background, the resource subscriptions `uris` their holders let go of (`resources/unsubscribe`).
    /// Each is decided when its turn comes, under the instance's subscription lock: one a client holds again by
    /// then stays; with no connection (dormant, failed) only what a restart would ask again is forgotten, so no
    /// server is started to be told. A task of the manager's, awaited at shutdown.
    pub fn unsubscribe_later(&self, instance: Arc<Instance>, uris: Vec<String>, timeout: Duration) {
        if uris.is_empty() {
            return;
        }
        let manager = self.clone();
        self.inner.tasks.spawn(async move {
            for uri in uris {
                let _changing = instance.subscription_lock().await;
                if instance.subscription_held(&uri) {
                    continue;
                }
                if instance.client().is_none() {
                    instance.note_subscription(&uri, false);
                    continue;
                }
                let params = serde_json::json!({ "uri": uri });
                if let Err(err) = manager.call(&instance, "resources/unsubscribe", Some(params), timeout).await {
                    debug!(process_id = %instance.spec().process_id, uri, error = %err, "undoing a subscription no client holds failed");
                }
            }
        });
    }

    /// A rate limit or quota (`[[limits]]`) refused a call on `spec`'s instance: `resource.limit.exceeded`
    /// (`tool_calls`), at most one a minute per team and instance, with the refusals in between counted.
    pub async fn report_limit(&self, spec: &crate::model::InstanceSpec, current: u64, limit: u64, message: String) {
        let resource = crate::events::LimitedResource::ToolCalls;
        self.inner.reporter.limit_exceeded(spec, resource, current, limit, message).await;
    }

    /// A client of `process_id`'s endpoint ended (its session expired, was deleted or evicted) still subscribed to
    /// `uris`: its holds go, and what no other client holds is undone upstream (`unsubscribe_later`).
    pub fn release_subscriptions(
        &self,
        process_id: &ProcessId,
        holder: &str,
        mut uris: Vec<String>,
        timeout: Duration,
    ) {
        let Some(instance) = self.get(process_id) else { return };
        uris.retain(|uri| instance.release_subscription(uri, holder) != Release::OthersHold);
        self.unsubscribe_later(instance, uris, timeout);
    }
}

/// One request to an upstream server, as a span (a child of the client's request span; exported as a trace
/// span when OpenTelemetry is on). Never the arguments: only which server and which method. At `debug`: the
/// satellite's info and warn lines about an instance name it already, and a span built on every call for log
/// lines alone cost about 3% of a call's CPU (docs/performance-history.md, 2026-11-27 10:50).
fn upstream_span(instance: &Instance, method: &str) -> tracing::Span {
    let spec = instance.spec();
    tracing::debug_span!(
        "mcp.upstream",
        server = %spec.server_slug,
        method = %method,
        transport = spec.upstream.transport_name(),
        process_id = %spec.process_id,
    )
}
