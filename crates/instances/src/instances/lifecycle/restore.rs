//! What a server started anew must be asked again: the log level and the resource subscriptions its clients asked
//! of the old process or connection, whose sessions outlive it.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn, Instrument};

use crate::instances::instance::Instance;
use crate::instances::Inner;
use crate::mcp::client::{Era, McpClient};
use crate::mcp::transport::UpstreamError;

impl Inner {
    /// Ask a server that started anew (after a crash, a restart or dormancy) for what its clients asked of the old
    /// one: to log at the level a client set (`logging/setLevel`), and to watch again the resources they subscribed
    /// to. Its new process or connection knows nothing of either, and the clients' sessions, which outlive it, would
    /// get its default log level and wait for updates in vain. Each resource watched again is announced as updated to
    /// the sessions that subscribed to it, since updates were lost while the server was down. In the background: a
    /// server slow to answer holds up neither its start nor its calls. A server that refuses a subscription (the
    /// resource is gone) no longer has it asked again; one that does not answer is asked again at its next start.
    pub(in crate::instances) fn restore_client_state(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        client: &Arc<McpClient>,
    ) {
        // A 2026-07-28 server is asked for both on every request and on the satellite's own listen; updates sent
        // while it was down were lost all the same.
        if matches!(client.era(), Era::Stateless { .. }) {
            for uri in instance.subscriptions() {
                announce_updated(instance, uri);
            }
            return;
        }
        // One restore waiting is enough (a load balancer that drops sessions renews them in bursts): it reads the
        // state and the connection when it runs, so it sends the latest of both.
        if instance.restore_for.lock().replace(client.clone()).is_some() {
            return;
        }
        let instance = instance.clone();
        let timeout = self.request_timeout(instance.spec());
        let span = tracing::info_span!("instance.restore", process_id = %instance.spec().process_id);
        let (retired, shutdown) = (instance.retired.clone(), self.shutdown.clone());
        let restore = restore(instance, timeout);
        // Not past the instance's removal nor the satellite's shutdown, which waits for its tasks.
        self.tasks.spawn(
            async move {
                tokio::select! {
                    _ = retired.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                    () = restore => {}
                }
            }
            .instrument(span),
        );
    }
}

/// The restore waiting for `instance` (`restore_for`), each request waiting at most `timeout`.
async fn restore(instance: Arc<Instance>, timeout: Duration) {
    // Serialised with the clients' own `logging/setLevel` and `resources/(un)subscribe` (`Inner::call`):
    // one sent while the restore runs is neither overwritten by it nor sent before it.
    let _state = instance.client_state.lock().await;
    let Some(client) = instance.restore_for.lock().take() else { return };
    // Read under the lock: a client's change that was on its way is in it.
    let (level, uris) = (instance.log_level(), instance.subscriptions());
    if level.is_none() && uris.is_empty() {
        return;
    }
    info!(resources = uris.len(), level = ?level, "asking the restarted server for its clients' log level and subscriptions again");
    if let Some(level) = level {
        let params = serde_json::json!({ "level": level });
        if let Err(err) = client.request("logging/setLevel", Some(params), timeout).await {
            let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
            warn!(error = %error, "the restarted server did not take its clients' log level again");
        }
    }
    subscribe_again(&instance, &client, uris, timeout).await;
}

/// Each of `uris` subscribed to again and announced as updated; one the server refuses is dropped, and a server
/// that does not answer is asked for the rest at its next start.
async fn subscribe_again(instance: &Instance, client: &McpClient, uris: Vec<String>, timeout: Duration) {
    for uri in uris {
        let params = serde_json::json!({ "uri": uri });
        match client.request("resources/subscribe", Some(params), timeout).await {
            Ok(_) => announce_updated(instance, uri),
            Err(UpstreamError::Rpc(err)) => {
                let error = crate::secrets::hide(&err.message, instance.secret_values());
                warn!(uri = %uri, error = %error, "the restarted server refused a subscription again; dropped");
                instance.note_subscription(&uri, false);
            }
            Err(err) => {
                let error = crate::secrets::hide(&err.to_string(), instance.secret_values());
                warn!(error = %error, "the restarted server did not take its subscriptions again; asked at its next start");
                return;
            }
        }
    }
}

/// Tell the sessions subscribed to `uri` that it was updated (updates were lost while the server was down).
fn announce_updated(instance: &Instance, uri: String) {
    let note = serde_json::json!({ "uri": uri });
    instance.announce(Arc::new(crate::mcp::protocol::notification("notifications/resources/updated", Some(note))));
}
