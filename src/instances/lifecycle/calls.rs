//! Calls to an instance with their limits, remote retries and request logging; recovery of remote
//! servers that failed (a background probe, or re-discovery after a call succeeds again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::{info, warn, Instrument};

use crate::instances::instance::{Instance, InstanceError};
use crate::instances::policy::{self, Blame};
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::logcapture::RequestRecord;
use crate::mcp::client::McpClient;
use crate::mcp::transport::UpstreamError;
use crate::model::{InstanceStatus, Upstream};

impl Inner {
    pub(in crate::instances) async fn call(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, InstanceError> {
        let queue = self.deps.settings.lifecycle.call_queue_timeout;
        let _permit = match tokio::time::timeout(queue, instance.calls.acquire()).await {
            Ok(Ok(permit)) => permit,
            _ => {
                return Err(InstanceError::Busy {
                    slug: instance.spec().server_slug.clone(),
                    limit: instance.max_calls,
                    waited: queue,
                })
            }
        };
        instance.touch();
        let began = Instant::now();
        let logged = method == "tools/call";
        let client = match self.ensure_connected(instance).await {
            Ok(client) => client,
            Err(err) => {
                if logged {
                    self.log_request(instance, params.as_ref(), Err(err.to_string()), began);
                }
                return Err(err);
            }
        };
        let before = instance.status().status;
        let remote = !matches!(instance.spec().upstream, Upstream::Stdio { .. });
        let mut attempt = 0;
        let result = loop {
            let result = client.request(method, params.clone(), timeout).await;
            match &result {
                Err(err)
                    if remote
                        && policy::blame(err) == Blame::Unreachable
                        && attempt < policy::REMOTE_RETRY_WAITS.len() =>
                {
                    tokio::time::sleep(policy::REMOTE_RETRY_WAITS[attempt]).await;
                    attempt += 1;
                }
                _ => break result,
            }
        };
        instance.touch();
        if logged {
            self.log_request(instance, params.as_ref(), result.as_ref().map_err(ToString::to_string), began);
        }
        match &result {
            Ok(_) if matches!(before, InstanceStatus::Offline | InstanceStatus::Error) => {
                self.recovered(instance.clone(), client);
            }
            // A dead stdio child is the watcher's to report (crash policy); a connection that was replaced
            // meanwhile says nothing about the current one.
            Err(UpstreamError::Exited { .. } | UpstreamError::Closed(_)) if !remote => {}
            Err(err)
                if policy::blame(err) != Blame::Call && instance.client().is_some_and(|c| Arc::ptr_eq(&c, &client)) =>
            {
                let spec = instance.spec();
                let (status, message) = self.oauth_aware(spec, err, status_for(&spec.upstream, &Failure::Call(err)));
                warn!(process_id = %instance.spec().process_id, error = %err, status = %status, "call failed, marking instance");
                self.set_status(instance, status, Some(message)).await;
                self.maybe_probe(instance);
            }
            _ => {}
        }
        Ok(result?)
    }

    /// One `tools/call` for the request log: the external tool path, the arguments, and the result or error.
    /// A result with `isError` counts as a failure.
    pub(in crate::instances) fn log_request(
        &self,
        instance: &Instance,
        params: Option<&Value>,
        result: Result<&Value, String>,
        began: Instant,
    ) {
        let spec = instance.spec();
        if !spec.request_logging_enabled {
            // Nothing is logged for this installation: skip copying arguments and results.
            return;
        }
        let name = params.and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
        let arguments = params.and_then(|p| p.get("arguments")).cloned().unwrap_or(Value::Null);
        let (response, error) = match result {
            Ok(value) if value.get("isError").and_then(Value::as_bool) == Some(true) => {
                let text = value.pointer("/content/0/text").and_then(Value::as_str).unwrap_or("tool returned an error");
                (None, Some(text.to_owned()))
            }
            Ok(value) => (Some(value.clone()), None),
            Err(message) => (None, Some(message)),
        };
        self.deps.logs.request(
            spec,
            RequestRecord {
                tool_path: crate::model::tool_path(&spec.server_slug, name),
                params: arguments,
                response,
                error,
                duration: began.elapsed(),
            },
        );
    }

    /// A call succeeded while the instance was offline or in error: rediscover in the background (SB §11.2).
    pub(in crate::instances) fn recovered(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>) {
        if !instance.try_begin_recovery() {
            return;
        }
        let inner = self.clone();
        self.tasks.spawn(async move {
            {
                let _lifecycle = instance.lifecycle.lock().await;
                if !instance.retired.is_cancelled()
                    && matches!(instance.status().status, InstanceStatus::Offline | InstanceStatus::Error)
                {
                    let message = "Server recovered, re-discovering tools".to_owned();
                    inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                    if !inner.discover_into(&instance, &client, true).await {
                        info!(process_id = %instance.spec().process_id, "re-discovery after recovery failed");
                    }
                }
            }
            instance.end_recovery();
        });
    }

    /// Remote instances that are offline or in error get a background probe that reconnects with backoff
    /// until the server answers again (SB §11.2). One probe per instance at a time.
    pub(in crate::instances) fn maybe_probe(self: &Arc<Self>, instance: &Arc<Instance>) {
        let remote = !matches!(instance.spec().upstream, Upstream::Stdio { .. });
        let probing = matches!(instance.status().status, InstanceStatus::Offline | InstanceStatus::Error);
        if !remote || !probing || !instance.try_begin_recovery() {
            return;
        }
        let inner = self.clone();
        let instance = instance.clone();
        let span = tracing::info_span!("instance.probe", process_id = %instance.spec().process_id);
        self.tasks.spawn(
            async move {
                let mut attempt = 0;
                loop {
                    tokio::select! {
                        _ = instance.retired.cancelled() => break,
                        _ = inner.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(policy::probe_wait(attempt)) => {}
                    }
                    attempt += 1;
                    if !matches!(instance.status().status, InstanceStatus::Offline | InstanceStatus::Error) {
                        break;
                    }
                    let connected = tokio::select! {
                        _ = instance.retired.cancelled() => break,
                        connected = inner.connect(instance.spec()) => connected,
                    };
                    let Ok((client, slot)) = connected else { continue };
                    let _lifecycle = instance.lifecycle.lock().await;
                    if instance.retired.is_cancelled() {
                        break;
                    }
                    info!(attempt, "server answers again, re-discovering tools");
                    let client = Arc::new(client);
                    if let Some(old) = instance.take_client() {
                        old.close().await;
                    }
                    instance.set_connection(client.clone(), slot);
                    let message = "Server recovered, re-discovering tools".to_owned();
                    inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                    if inner.discover_into(&instance, &client, true).await {
                        break;
                    }
                }
                instance.end_recovery();
            }
            .instrument(span),
        );
    }
}
