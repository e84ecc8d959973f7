//! Calls to an instance with their limits, remote retries and request logging; recovery of remote
//! servers that failed (a background probe, or re-discovery after a call succeeds again).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;
use tracing::{info, warn, Instrument};

use crate::events::{CallOutcome, Event, LimitExceeded, LimitedResource, ToolExecution};
use crate::instances::instance::{Instance, InstanceError};
use crate::instances::policy::{self, Blame};
use crate::instances::status::{status_for, Failure};
use crate::instances::Inner;
use crate::logcapture::{omitted, RequestRecord, MAX_LOGGED_TEXT_BYTES};
use crate::mcp::client::{Era, McpClient};
use crate::mcp::payload::Payload;
use crate::mcp::protocol::{codes, RpcError};
use crate::mcp::transport::{Relay, UpstreamError};
use crate::model::{InstanceSpec, InstanceStatus, Upstream};

/// What a request asks the server to remember for the connection, which a server started anew must be asked again.
enum Remembered {
    /// The resource a `resources/subscribe` (true) or `resources/unsubscribe` (false) names.
    Subscription(String, bool),
    /// The level of a `logging/setLevel`.
    LogLevel(String),
}

fn remembered(method: &str, params: Option<&Value>) -> Option<Remembered> {
    let text = |key: &str| params?.get(key)?.as_str().map(str::to_owned);
    match method {
        "resources/subscribe" => Some(Remembered::Subscription(text("uri")?, true)),
        "resources/unsubscribe" => Some(Remembered::Subscription(text("uri")?, false)),
        "logging/setLevel" => Some(Remembered::LogLevel(text("level")?)),
        _ => None,
    }
}

/// Put the log level a client set (`logging/setLevel`) in a 2026-07-28 request's `_meta`, unless it names one.
fn ask_log_level(params: &mut Option<Value>, level: String) {
    let params = params.get_or_insert_with(|| Value::Object(serde_json::Map::new()));
    let Some(params) = params.as_object_mut() else { return };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(meta) = meta.as_object_mut() {
        meta.entry(crate::mcp::protocol::meta_keys::LOG_LEVEL).or_insert(Value::String(level));
    }
}

/// A 2026-07-28 server has no session to keep a log level or subscriptions in (the revision removed both methods):
/// the satellite keeps them, answers here, asks for the level on each request's `_meta`, and watches the subscribed
/// resources on its own listen (`supervise::listen_upstream`). `Some` is the answer given here, a refusal too (what
/// `remember` held is then taken); `None`, the request goes to the server.
fn answer_stateless(
    instance: &Instance,
    method: &str,
    client: &McpClient,
    remember: &mut Option<Remembered>,
    params: &mut Option<Value>,
) -> Option<Result<Payload, InstanceError>> {
    if !matches!(client.era(), Era::Stateless { .. }) {
        return None;
    }
    // Subscriptions only where the server declares them (else the client gets -32601, as from the server).
    // A log level is kept whatever the server declares: the official Python SDK's servers log on request
    // without declaring `logging`.
    let declared = client.capabilities();
    let refused = |what: &str| {
        let message = format!("Method not found: the server does not declare {what}");
        InstanceError::Upstream(UpstreamError::Rpc(RpcError::new(codes::METHOD_NOT_FOUND, message)))
    };
    match remember.take() {
        Some(Remembered::Subscription(..))
            if declared.pointer("/resources/subscribe").and_then(Value::as_bool) != Some(true) =>
        {
            return Some(Err(refused("resources.subscribe")));
        }
        Some(Remembered::Subscription(uri, subscribed)) => {
            instance.note_subscription(&uri, subscribed);
            return Some(Ok(Payload::from(serde_json::json!({}))));
        }
        // Answered here, so checked here: a level no server knows, kept, went into the `_meta` of every
        // later request to this server, which refused them all.
        Some(Remembered::LogLevel(level)) => {
            let level = match crate::mcp::protocol::check_log_level(Some(&Value::String(level))) {
                Ok(level) => level,
                Err(err) => return Some(Err(InstanceError::Upstream(UpstreamError::Rpc(err)))),
            };
            instance.note_log_level(level.to_owned());
            return Some(Ok(Payload::from(serde_json::json!({}))));
        }
        // No level, or not a string: refused alike (the same check cannot pass without a string).
        None if method == "logging/setLevel" => {
            let level = params.as_ref().and_then(|p| p.get("level"));
            if let Err(err) = crate::mcp::protocol::check_log_level(level) {
                return Some(Err(InstanceError::Upstream(UpstreamError::Rpc(err))));
            }
        }
        None => {}
    }
    if let Some(level) = instance.log_level() {
        ask_log_level(params, level);
    }
    None
}

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

/// What a request the server answered asked it to remember, noted for a server started anew to be asked again.
fn note_remembered(instance: &Instance, remember: Remembered) {
    match remember {
        Remembered::Subscription(uri, subscribed) => instance.note_subscription(&uri, subscribed),
        Remembered::LogLevel(level) => instance.note_log_level(level),
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
            self.record_call(instance, sent, result.as_ref().map_err(ToString::to_string), began).await;
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
        let queue = self.deps.settings.lifecycle.call_queue_timeout;
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
                    let busy = crate::metrics::CallOutcome::Busy;
                    self.deps.metrics.tool_call(&spec.server_slug, busy, queue);
                }
                self.limit_exceeded(spec, LimitedResource::CallSlots, limit, limit, err.to_string()).await;
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
            self.record_call(instance, sent, Err(err.to_string()), began).await;
        }
        Err(err)
    }

    /// A call failed in a way that says something of the server (not of the call): mark the instance and probe it.
    async fn call_failed(self: &Arc<Self>, instance: &Arc<Instance>, err: &UpstreamError) {
        let spec = instance.spec();
        let (status, message) = self.oauth_aware(spec, err, status_for(&spec.upstream, &Failure::Call(err)));
        let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
        warn!(process_id = %instance.spec().process_id, error = %error, status = %status, "call failed, marking instance");
        self.set_status(instance, status, Some(message)).await;
        self.maybe_probe(instance);
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
        let (outcome, error) = match &result {
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
        };
        let counted = match outcome {
            CallOutcome::Success => crate::metrics::CallOutcome::Ok,
            CallOutcome::ToolError => crate::metrics::CallOutcome::ToolError,
            CallOutcome::Failed => crate::metrics::CallOutcome::Failed,
        };
        self.deps.metrics.tool_call(&spec.server_slug, counted, began.elapsed());
        let execution = ToolExecution {
            tool_path,
            duration_ms: began.elapsed().as_millis() as u64,
            outcome,
            error_message: error.as_deref().map(|e| crate::secrets::hide(e, instance.secret_values())),
            request_bytes: sent.request_bytes,
            response_bytes,
        };
        // Batched with the request logs: no database write on the call's path.
        self.deps.logs.event(Event::tool_executed(spec, &execution));
        // Nothing is logged for this installation: the arguments were not copied either.
        let Some(arguments) = sent.arguments else { return };
        // A server may echo its own secret in an answer: the request log keeps nothing the config holds secret.
        let secrets = instance.secret_values();
        let response = match (&result, outcome) {
            // Not copied: see `MAX_LOGGED_TEXT_BYTES`.
            (Ok(_), CallOutcome::Success) if response_bytes > MAX_LOGGED_TEXT_BYTES => Some(omitted(response_bytes)),
            (Ok(Payload::Text { text, .. }), CallOutcome::Success) => crate::secrets::hide_json_text(text, secrets),
            (Ok(Payload::Value(value)), CallOutcome::Success) => {
                Some(crate::secrets::hide_json_written(value, secrets))
            }
            _ => None,
        };
        let kept = arguments.get().len() + response.as_ref().map_or(0, |r| r.get().len());
        let record = RequestRecord {
            tool_path: execution.tool_path,
            params: arguments,
            response,
            error,
            duration: began.elapsed(),
            bytes: kept,
        };
        self.deps.logs.request(spec, record);
    }

    /// A cap refused work: `resource.limit.exceeded`, at most one a minute per (team, resource, instance).
    pub(in crate::instances) async fn limit_exceeded(
        &self,
        spec: &InstanceSpec,
        resource: LimitedResource,
        current: u64,
        limit: u64,
        message: String,
    ) {
        let key = format!("{}|{resource:?}|{}", spec.team_id, spec.process_id);
        let Some(suppressed) = self.limit_events.allow(&key, std::time::Instant::now()) else { return };
        warn!(process_id = %spec.process_id, resource = resource.as_str(), current, limit, "{message}");
        let exceeded = LimitExceeded {
            team_id: spec.team_id.0.clone(),
            resource_type: resource,
            current_value: current,
            limit_value: limit,
            user_id: Some(spec.user_id.0.clone()),
            installation_id: Some(spec.installation_id.0.clone()),
            message,
            suppressed_count: suppressed,
        };
        self.emit(Event::limit_exceeded(&exceeded)).await;
    }

    /// A call succeeded while the instance was offline or in error: rediscover in the background (SB §11.2).
    pub(in crate::instances) fn recovered(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>) {
        if !instance.try_begin_recovery() {
            return;
        }
        let inner = self.clone();
        let span = tracing::info_span!("instance.recovered", process_id = %instance.spec().process_id);
        self.spawn_recovery(instance.clone(), span, async move {
            let _lifecycle = instance.lifecycle.lock().await;
            // Not for a killed instance, nor on a connection closed meanwhile: a remote one still answers after its
            // close, and would have brought a killed instance back `online` with no connection.
            if !instance.retired.is_cancelled() && recoverable(&instance) && instance.is_connection(&client) {
                let message = "Server recovered, re-discovering tools".to_owned();
                inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                if !inner.discover_into(&instance, &client, true).await {
                    info!("re-discovery after recovery failed");
                }
            }
        });
    }

    /// Instances that are offline or in error get a background probe with backoff (one per instance at a time): a
    /// remote one reconnects until the server answers again (SB §11.2); a stdio one whose process runs (it
    /// answered its handshake, not its tool listing: still loading, or its listing failed) is asked for its
    /// tools again, quietly, until it lists them. Before, such a stdio instance stayed hidden until a restart or a
    /// config edit: a dead process is the crash policy's, but a live one had nothing to ask it again.
    pub(in crate::instances) fn maybe_probe(self: &Arc<Self>, instance: &Arc<Instance>) {
        let stdio = matches!(instance.spec().upstream, Upstream::Stdio { .. });
        if (stdio && instance.client().is_none()) || !recoverable(instance) || !instance.try_begin_recovery() {
            return;
        }
        if stdio {
            self.relist(instance.clone());
        } else {
            self.reconnect(instance.clone());
        }
    }

    /// The remote half of [`Inner::maybe_probe`]: reconnect with the probe's backoff until the server answers, then
    /// discover again. The caller has begun the recovery.
    fn reconnect(self: &Arc<Self>, instance: Arc<Instance>) {
        let inner = self.clone();
        let span = tracing::info_span!("instance.probe", process_id = %instance.spec().process_id);
        self.spawn_recovery(instance.clone(), span, async move {
            let mut attempt = 0;
            while inner.probe_pause(&instance, &mut attempt).await {
                // A `kill` meanwhile stops the probe: nothing restarts a killed instance (BP §6.3).
                if !recoverable(&instance) {
                    break;
                }
                let connected = tokio::select! {
                    _ = instance.retired.cancelled() => break,
                    connected = inner.connect(instance.spec()) => connected,
                };
                let Ok((client, slot)) = connected else { continue };
                let _lifecycle = instance.lifecycle.lock().await;
                // Brought back meanwhile (a restart, a recovery command): its connection is left alone.
                if instance.retired.is_cancelled() || !recoverable(&instance) {
                    client.close().await;
                    break;
                }
                info!(attempt, "server answers again, re-discovering tools");
                let client = Arc::new(client);
                if let Some(old) = instance.take_client() {
                    old.close().await;
                }
                instance.set_connection(client.clone(), slot);
                inner.watch_remote(instance.clone(), client.clone());
                let message = "Server recovered, re-discovering tools".to_owned();
                inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                if inner.discover_into(&instance, &client, true).await {
                    break;
                }
            }
        });
    }

    /// Run one recovery of `instance` (a probe, a relist) in the background, in `span`; it ends the recovery, however
    /// it ends.
    fn spawn_recovery(
        &self,
        instance: Arc<Instance>,
        span: tracing::Span,
        recovery: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.spawn(
            async move {
                recovery.await;
                instance.end_recovery();
            }
            .instrument(span),
        );
    }

    /// A probe's pause before its next attempt (`policy::probe_wait` of the attempts so far, counted here): false
    /// once the instance is retired or the satellite stops meanwhile.
    async fn probe_pause(&self, instance: &Instance, attempt: &mut u32) -> bool {
        tokio::select! {
            _ = instance.retired.cancelled() => return false,
            _ = self.shutdown.cancelled() => return false,
            _ = tokio::time::sleep(policy::probe_wait(*attempt)) => {}
        }
        *attempt += 1;
        true
    }

    /// The stdio half of [`Inner::maybe_probe`]: the running server's tool listing asked again with the probe's
    /// backoff, with no status change while it still fails; once it lists, the instance is published as after a
    /// start. It ends when the instance comes back otherwise, is stopped, killed or retired, or its process goes
    /// (a restart brings its own discovery). The caller has begun the recovery.
    fn relist(self: &Arc<Self>, instance: Arc<Instance>) {
        let inner = self.clone();
        let span = tracing::info_span!("instance.relist", process_id = %instance.spec().process_id);
        self.spawn_recovery(instance.clone(), span, async move {
            let mut attempt = 0;
            while inner.probe_pause(&instance, &mut attempt).await {
                let Some(client) = instance.client().filter(|_| recoverable(&instance)) else { break };
                let timeout = inner.request_timeout(instance.spec());
                let deadline = Instant::now() + inner.deps.settings.discovery_timeout;
                if crate::discovery::discover_until(&client, timeout, deadline).await.is_err() {
                    continue;
                }
                let _lifecycle = instance.lifecycle.lock().await;
                if instance.retired.is_cancelled() || !recoverable(&instance) || !instance.is_connection(&client) {
                    break;
                }
                info!(attempt, "the server lists its tools now, publishing them");
                let message = "Server lists its tools now, re-discovering tools".to_owned();
                inner.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
                if inner.discover_into(&instance, &client, true).await {
                    inner.restore_client_state(&instance, &client);
                    break;
                }
            }
        });
    }
}

/// Whether a recovery may bring `instance` back: it is `offline` or in `error`, and no `kill` stopped it (BP §6.3:
/// nothing restarts a killed instance on its own).
fn recoverable(instance: &Instance) -> bool {
    matches!(instance.state(), InstanceStatus::Offline | InstanceStatus::Error) && !instance.is_halted()
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
    fn of(instance: &Instance, params: Option<&Value>) -> SentCall {
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
