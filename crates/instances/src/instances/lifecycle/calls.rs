//! Calls to an instance: a call slot within its limit, a dormant instance woken for it, a remote server's
//! request retried while it cannot be reached, the call recorded, and the instance marked (and probed) when the
//! failure says something of the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::warn;

use crate::events::LimitedResource;
use crate::instances::instance::{Instance, InstanceError};
use crate::instances::policy::{self, Blame};
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::mcp::client::McpClient;
use crate::mcp::payload::Payload;
use crate::mcp::transport::{Relay, UpstreamError};
use crate::model::{InstanceStatus, Upstream};

use super::call_log::SentCall;
use super::stateless::{answer_stateless, note_remembered, remembered};

/// The request, tried again after each of `policy::REMOTE_RETRY_WAITS` while a remote server cannot be reached.
async fn request_with_retries(
    client: &McpClient,
    method: &str,
    mut params: Option<Value>,
    timeout: Duration,
    relay: Option<&Relay>,
    remote: bool,
) -> Result<Payload, UpstreamError> {
    let mut attempt = 0;
    loop {
        // A copy only while a retry may still need the request again.
        let retry_left = remote && attempt < policy::REMOTE_RETRY_WAITS.len();
        let request = if retry_left { params.clone() } else { params.take() };
        let result = client.request_relayed(method, request, timeout, relay).await;
        match &result {
            // The same condition that kept a copy of the request above.
            Err(err) if retry_left && policy::blame(err) == Blame::Unreachable => {
                tokio::time::sleep(policy::REMOTE_RETRY_WAITS[attempt]).await;
                attempt += 1;
            }
            _ => return result,
        }
    }
}

impl Inner {
    pub(in crate::instances) async fn call(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
        relay: Option<&Relay>,
    ) -> Result<Payload, InstanceError> {
        let _permit = self.call_slot(instance, method).await?;
        instance.touch();
        let began = Instant::now();
        // What the call's log needs of its request, taken now: the request itself goes to the server.
        let mut sent = (method == "tools/call").then(|| SentCall::of(instance, params.as_ref()));
        let mut remember = remembered(method, params.as_ref());
        let client = self.connection_for_call(instance, &mut sent, began).await?;
        let mut params = params;
        if let Some(answer) = answer_stateless(instance, method, &client, &mut remember, &mut params) {
            return answer;
        }
        // A change of the state a restore asks again waits for a restore running now, and holds one back.
        let _state = match remember {
            Some(_) => Some(instance.client_state.lock().await),
            None => None,
        };
        let before = instance.state();
        let remote = !matches!(instance.spec().upstream, Upstream::Stdio { .. });
        let result = request_with_retries(&client, method, params, timeout, relay, remote).await;
        instance.touch();
        if let Some(sent) = sent {
            self.call_log.record_call(instance, sent, result.as_ref().map_err(ToString::to_string), began).await;
        }
        if let (Ok(_), Some(remember)) = (&result, remember) {
            note_remembered(instance, remember);
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
                self.call_failed(instance, err).await;
            }
            _ => {}
        }
        Ok(result?)
    }

    /// A slot among `instance`'s concurrent calls, waited for up to `call_queue_timeout`: none by then refuses the
    /// call as busy (counted for a `tools/call`, and a `resource.limit.exceeded`).
    async fn call_slot<'a>(
        &self,
        instance: &'a Instance,
        method: &str,
    ) -> Result<tokio::sync::SemaphorePermit<'a>, InstanceError> {
        let queue = self.settings.lifecycle.call_queue_timeout;
        match tokio::time::timeout(queue, instance.calls.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                let err = InstanceError::Busy {
                    slug: instance.spec().server_slug.clone(),
                    limit: instance.max_calls,
                    waited: queue,
                };
                let spec = instance.spec();
                let limit = instance.max_calls as u64;
                if method == "tools/call" {
                    self.call_log.busy(&spec.server_slug, queue);
                }
                self.reporter.limit_exceeded(spec, LimitedResource::CallSlots, limit, limit, err.to_string()).await;
                Err(err)
            }
        }
    }

    /// The instance's connection for a call, a dormant instance woken for it: a `tools/call` that gets none is
    /// recorded as failed (its `sent` taken).
    async fn connection_for_call(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        sent: &mut Option<SentCall>,
        began: Instant,
    ) -> Result<Arc<McpClient>, InstanceError> {
        let err = match self.ensure_connected(instance).await {
            Ok(client) => return Ok(client),
            Err(err) => err,
        };
        if let Some(sent) = sent.take() {
            self.call_log.record_call(instance, sent, Err(err.to_string()), began).await;
        }
        Err(err)
    }

    /// A call failed in a way that says something of the server (not of the call): mark the instance and probe it.
    async fn call_failed(self: &Arc<Self>, instance: &Arc<Instance>, err: &UpstreamError) {
        let spec = instance.spec();
        let (status, message) = self.connector.oauth_aware(spec, err, status_for(&spec.upstream, &Failure::Call(err)));
        let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
        warn!(process_id = %instance.spec().process_id, error = %error, status = %status, "call failed, marking instance");
        self.reporter.set_status(instance, status, Some(message)).await;
        self.maybe_probe(instance);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's future is boxed once per proxied call (`InstanceManager::call_relayed`), so copied whole: respawning
    /// a dormant instance (~6 KB) and the HTTP transports' requests (~3 KB) held inline made a stdio call's 6.9 KB
    /// in a release build. Boxed where they are taken, it is 3.0 KB.
    #[test]
    fn a_calls_future_stays_small() {
        let size = future_size!(Inner::call, <'a> (&'a Arc<Inner>, &'a Arc<Instance>, &'a str, Option<Value>, Duration, Option<&'a Relay>));
        assert!(size <= 4 * 1024, "a call's future is {size} bytes: box the large branch");
    }
}
