//! Recovery of instances that failed: a call that succeeds again rediscovers in the background; an offline or failed
//! instance gets a probe with backoff (a remote one reconnects, a stdio one whose process runs is asked for its
//! tools again) until it comes back.

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, Instrument};

use crate::instances::instance::Instance;
use crate::instances::policy;
use crate::instances::Inner;
use crate::mcp::client::McpClient;
use crate::model::{InstanceStatus, Upstream};

impl Inner {
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
                inner.reporter.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
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
                inner.reporter.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
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
                let deadline = Instant::now() + inner.settings.discovery_timeout;
                if crate::discovery::discover_until(&client, timeout, deadline).await.is_err() {
                    continue;
                }
                let _lifecycle = instance.lifecycle.lock().await;
                if instance.retired.is_cancelled() || !recoverable(&instance) || !instance.is_connection(&client) {
                    break;
                }
                info!(attempt, "the server lists its tools now, publishing them");
                let message = "Server lists its tools now, re-discovering tools".to_owned();
                inner.reporter.set_status(&instance, InstanceStatus::Connecting, Some(message)).await;
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
