//! The satellite's own `subscriptions/listen` on a 2026-07-28 server, which has no session to announce on: held
//! open for as long as the connection is watched, what comes on it announced to the instance's clients as a
//! handshake-era server's announcements are (so the watch follows list changes the same way).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::instances::instance::Instance;
use crate::mcp::client::{Era, McpClient};
use crate::mcp::payload::Payload;
use crate::mcp::transport::{Inbound, Relay, UpstreamError};

/// How long the satellite's own `subscriptions/listen` on a 2026-07-28 server stays open before it is opened anew.
const UPSTREAM_LISTEN_LIMIT: Duration = Duration::from_secs(60 * 60);
/// The first wait before opening again a listen the server ended or refused; doubled after each failure, to
/// `UPSTREAM_LISTEN_RETRY_MAX`.
const UPSTREAM_LISTEN_RETRY: Duration = Duration::from_secs(5);
const UPSTREAM_LISTEN_RETRY_MAX: Duration = Duration::from_secs(5 * 60);
/// A listen open this long before it ended is opened again at once.
const UPSTREAM_LISTEN_LASTED: Duration = Duration::from_secs(60);

/// The filter the satellite listens to a 2026-07-28 server with: the list changes it declares, which the catalog
/// and the instance's clients follow. `None` for a handshake-era server, which announces them on its session, or
/// one that declares none.
fn upstream_listen_filter(client: &McpClient, instance: &Instance) -> Option<Value> {
    let declared = client.capabilities();
    let mut filter = serde_json::Map::new();
    for (capability, flag) in
        [("tools", "toolsListChanged"), ("prompts", "promptsListChanged"), ("resources", "resourcesListChanged")]
    {
        if declared.get(capability).and_then(|c| c.get("listChanged")).and_then(Value::as_bool) == Some(true) {
            filter.insert(flag.into(), Value::Bool(true));
        }
    }
    // The resources the instance's clients subscribed to (`resources/subscribe`, kept by the satellite).
    let watched = instance.subscriptions();
    if declared.pointer("/resources/subscribe").and_then(Value::as_bool) == Some(true) && !watched.is_empty() {
        filter.insert("resourceSubscriptions".into(), serde_json::json!(watched));
    }
    (!filter.is_empty()).then_some(Value::Object(filter))
}

/// Hold the satellite's own `subscriptions/listen` open on a 2026-07-28 server for as long as the connection is
/// watched, and announce what comes on it as a handshake-era server's announcements are (the watch then follows
/// list changes the same way). It is opened again after the server ends it, after a growing wait when it failed.
/// Never completes; pending for ever when the server needs no listen.
pub(super) async fn listen_upstream(client: Arc<McpClient>, instance: Arc<Instance>) {
    let (client, instance) = (&*client, &*instance);
    if !matches!(client.era(), Era::Stateless { .. }) {
        return futures::future::pending().await;
    }
    let mut changes = instance.subscription_changes();
    let mut wait = UPSTREAM_LISTEN_RETRY;
    loop {
        changes.mark_unchanged();
        let Some(filter) = upstream_listen_filter(client, instance) else {
            // Nothing to listen to until a client subscribes to a resource.
            if changes.changed().await.is_err() {
                return futures::future::pending().await;
            }
            continue;
        };
        let opened = Instant::now();
        // Subscriptions changed: opened again at once with them.
        let Some(ended) = listen_once(client, filter, &mut changes).await else { continue };
        if let Err(err) = &ended {
            tracing::debug!(error = %err, "the server's subscriptions/listen ended");
        }
        // A listen that lasted (to the server's end or the satellite's own limit) is opened again at once; one
        // ended or refused soon after it opened waits first, longer each time, or until the subscriptions change.
        if opened.elapsed() >= UPSTREAM_LISTEN_LASTED {
            wait = UPSTREAM_LISTEN_RETRY;
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            Ok(()) = changes.changed() => {}
        }
        wait = (wait * 2).min(UPSTREAM_LISTEN_RETRY_MAX);
    }
}

/// One listen with `filter`, what comes on it announced: how it ended, or `None` when the subscriptions changed
/// first (it is then dropped, cancelled, to be opened again with them).
async fn listen_once(
    client: &McpClient,
    filter: Value,
    changes: &mut tokio::sync::watch::Receiver<u64>,
) -> Option<Result<Payload, UpstreamError>> {
    let (relay, mut heard) = Relay::channel(false);
    let params = Some(serde_json::json!({"notifications": filter}));
    let listen = client.request_relayed("subscriptions/listen", params, UPSTREAM_LISTEN_LIMIT, Some(&relay));
    tokio::pin!(listen);
    loop {
        tokio::select! {
            ended = &mut listen => return Some(ended),
            Ok(()) = changes.changed() => return None,
            Some(inbound) = heard.recv() => announce_heard(client, inbound),
        }
    }
}

/// A notification that came on the listen, announced to the instance's clients (not the listen's own
/// acknowledgement).
fn announce_heard(client: &McpClient, inbound: Inbound) {
    let Inbound::Notification { method, mut params, .. } = inbound else { return };
    if method == "notifications/subscriptions/acknowledged" {
        return;
    }
    // The subscription's id is ours; the instance's clients get the notification without it.
    if let Some(meta) = params.as_mut().and_then(|p| p.get_mut("_meta")).and_then(Value::as_object_mut) {
        meta.remove(crate::mcp::protocol::meta_keys::SUBSCRIPTION_ID);
    }
    client.transport().announce(Arc::new(crate::mcp::protocol::notification(&method, params)));
}
