//! Watching a connection: a stdio child's exit (a crash, `crash`), its stderr over the rate limit, and what a
//! server announces outside any request, passed on to the instance's clients or followed by a rediscovery when its
//! lists changed; a remote server's renewed session, whose clients' state is asked again (`restore`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tracing::{info, Instrument};

use crate::events::{CrashReport, Event};
use crate::instances::instance::Instance;
use crate::instances::Inner;
use crate::mcp::client::McpClient;
use crate::mcp::transport::{Announcement, ExitInfo, StdioTransport, Transport};

use super::listen::listen_upstream;

/// Notifications a server sends outside any request that its client sessions hear about as it sends them. Tool
/// and resource list changes are not among them: the catalog is discovered again first, and only a change it
/// really finds is announced (`announce_list_changes`), so a client that lists at once sees the new list.
const ANNOUNCED: [&str; 4] = [
    "notifications/resources/updated",
    "notifications/prompts/list_changed",
    "notifications/message",
    "notifications/tasks/status",
];

/// A task's status announced with its id as the instance's clients know it (`mcp::task_ids`: sealed to the
/// instance); any other announcement as it came.
fn seal_task_ids(instance: &Instance, method: &str, note: Announcement) -> Announcement {
    if method != "notifications/tasks/status" {
        return note;
    }
    let mut sealed = (*note).clone();
    if let Some(params) = sealed.get_mut("params") {
        crate::mcp::task_ids::seal_notification(method, params, instance.spec().process_id.as_str());
    }
    Announcement::new(sealed)
}

/// Notifications that change what the catalog holds, so the satellite discovers the instance again.
const CHANGES_CATALOG: [&str; 2] = ["notifications/tools/list_changed", "notifications/resources/list_changed"];

/// A burst of list changes (a server announcing once per tool it adds) is collected this long, then one
/// rediscovery covers it.
pub(in crate::instances) const LIST_CHANGE_DEBOUNCE: Duration = Duration::from_millis(250);

/// The next renewal of a Streamable HTTP session; never for a transport without them, or once it is gone.
async fn renewed(renewals: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(receiver) = renewals {
        if receiver.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// When a rediscovery is due, if one is.
async fn due(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A stdio child's exit as a crash (with its last stderr line in the detail), or `None` when the satellite asked it
/// to stop.
fn crash_of(
    stdio: &StdioTransport,
    exit: &ExitInfo,
    pid: Option<u32>,
    since: Instant,
) -> Option<(CrashReport, String)> {
    let ExitInfo::Exited { code, signal } = exit else { return None };
    let report = CrashReport {
        pid,
        exit_code: *code,
        signal: *signal,
        uptime_seconds: since.elapsed().as_secs(),
        crash_count: 0,
        will_restart: false,
    };
    let mut detail = exit.describe();
    if let Some(last) = stdio.stderr_tail().last() {
        detail.push_str(&format!("; last stderr line: {last}"));
    }
    Some((report, detail))
}

/// What a remote connection's watch follows besides the instance.
struct RemoteFeeds {
    notifications: tokio::sync::broadcast::Receiver<Announcement>,
    renewals: Option<tokio::sync::watch::Receiver<u64>>,
    connections: tokio::sync::watch::Receiver<u64>,
}

impl Inner {
    /// Follow a stdio child: a crash when it dies unasked, rediscovery when its tool list changes,
    /// an event when its stderr goes over the rate limit.
    pub(in crate::instances) fn watch(
        self: &Arc<Self>,
        instance: Arc<Instance>,
        client: Arc<McpClient>,
        generation: u64,
    ) {
        let Transport::Stdio(stdio) = client.transport() else {
            self.watch_remote(instance, client);
            return;
        };
        let notifications = stdio.subscribe();
        let span = tracing::info_span!("instance.watch", process_id = %instance.spec().process_id);
        self.tasks.spawn(self.clone().follow_stdio(instance, client, generation, notifications).instrument(span));
    }

    /// The watch of a stdio child, until it exits (its crash handled), is retired or the satellite stops.
    async fn follow_stdio(
        self: Arc<Self>,
        instance: Arc<Instance>,
        client: Arc<McpClient>,
        generation: u64,
        mut notifications: tokio::sync::broadcast::Receiver<Announcement>,
    ) {
        let Transport::Stdio(stdio) = client.transport() else { return };
        let since = Instant::now();
        let pid = stdio.pid();
        let mut rediscover: Option<tokio::time::Instant> = None;
        let mut listening = Box::pin(listen_upstream(client.clone(), instance.clone()));
        loop {
            tokio::select! {
                biased;
                _ = instance.retired.cancelled() => return,
                _ = self.shutdown.cancelled() => return,
                () = &mut listening => {}
                exit = stdio.exited() => {
                    let Some((report, detail)) = crash_of(stdio, &exit, pid, since) else { return };
                    if instance.retired.is_cancelled() {
                        return;
                    }
                    Box::pin(self.on_crash(instance, report, detail, generation)).await;
                    return;
                }
                dropped = stdio.stderr_dropped() => Box::pin(self.log_rate_limited(&instance, dropped)).await,
                note = notifications.recv() => {
                    if !self.heard(&instance, note, &mut rediscover) {
                        // The owner task is gone; the exit branch reports it.
                        stdio.exited().await;
                    }
                }
                _ = due(rediscover) => {
                    rediscover = None;
                    if !Box::pin(self.rediscover_after_change(&instance, &client)).await {
                        return;
                    }
                }
            }
        }
    }

    /// Follow a remote server's announcements for as long as this connection lives.
    pub(in crate::instances) fn watch_remote(self: &Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>) {
        let feeds = RemoteFeeds {
            notifications: client.transport().announcements(),
            renewals: client.transport().session_renewals(),
            connections: instance.connection_changes(),
        };
        let span = tracing::info_span!("instance.watch", process_id = %instance.spec().process_id);
        self.tasks.spawn(self.clone().follow_remote(instance, client, feeds).instrument(span));
    }

    /// The watch of a remote connection, until it is no longer the instance's, the instance is retired or the
    /// satellite stops.
    async fn follow_remote(self: Arc<Self>, instance: Arc<Instance>, client: Arc<McpClient>, mut feeds: RemoteFeeds) {
        let mut rediscover: Option<tokio::time::Instant> = None;
        let mut listening = Box::pin(listen_upstream(client.clone(), instance.clone()));
        loop {
            let note = tokio::select! {
                biased;
                _ = instance.retired.cancelled() => return,
                _ = self.shutdown.cancelled() => return,
                // Restarted, stopped or recovered on a new connection: this one is no longer the instance's.
                _ = feeds.connections.changed() => {
                    if instance.client().is_some_and(|current| Arc::ptr_eq(&current, &client)) {
                        continue;
                    }
                    return;
                }
                () = &mut listening => continue,
                note = feeds.notifications.recv() => note,
                // The server forgot the session (restarted): it forgot its subscriptions and log level with it.
                () = renewed(&mut feeds.renewals) => {
                    self.restore_client_state(&instance, &client);
                    continue;
                }
                _ = due(rediscover) => {
                    rediscover = None;
                    if !Box::pin(self.rediscover_after_change(&instance, &client)).await {
                        return;
                    }
                    continue;
                }
            };
            if !self.heard(&instance, note, &mut rediscover) {
                return;
            }
        }
    }

    /// What the watch heard on the connection's announcements: a rediscovery falls due (after the debounce) when it
    /// changes the catalog or some were missed. False once the channel is closed.
    fn heard(
        &self,
        instance: &Instance,
        note: Result<Announcement, RecvError>,
        rediscover: &mut Option<tokio::time::Instant>,
    ) -> bool {
        match note {
            Ok(note) => {
                if self.on_announcement(instance, note) {
                    rediscover.get_or_insert(tokio::time::Instant::now() + LIST_CHANGE_DEBOUNCE);
                }
            }
            // Missed notifications may have been list changes (and the client sessions missed them too).
            Err(RecvError::Lagged(_)) => {
                rediscover.get_or_insert(tokio::time::Instant::now() + LIST_CHANGE_DEBOUNCE);
                instance.announce_missed();
            }
            Err(RecvError::Closed) => return false,
        }
        true
    }

    /// A child's stderr went over the rate limit: `dropped` lines were dropped.
    async fn log_rate_limited(&self, instance: &Instance, dropped: u64) {
        let lifecycle = &self.settings.lifecycle;
        let window = lifecycle.log_rate_warning_interval.as_secs().max(1);
        let event = Event::log_rate_limited(instance.spec(), dropped, window, lifecycle.log_rate_limit);
        self.reporter.emit(event).await;
    }

    /// A notification the server sent outside any request: the instance's client sessions hear of list changes
    /// and resource updates. True when it changes the catalog (a rediscovery is then due).
    fn on_announcement(&self, instance: &Instance, note: Announcement) -> bool {
        let method = note.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
        if method == "notifications/prompts/list_changed" {
            self.reporter.view_changed(instance.spec(), false, true);
        }
        if ANNOUNCED.contains(&method.as_str()) {
            instance.announce(seal_task_ids(instance, &method, note));
        }
        CHANGES_CATALOG.contains(&method.as_str())
    }

    /// Discover a running instance again after its lists changed; it keeps serving its current tools meanwhile.
    /// False once the instance is retired.
    async fn rediscover_after_change(self: &Arc<Self>, instance: &Arc<Instance>, client: &Arc<McpClient>) -> bool {
        info!("the server's lists changed, discovering it again");
        self.refresh_catalog(instance, client).await.is_some()
    }

    /// Discover a connected instance again, serving its current tools meanwhile: whether it is online after
    /// it, or `None` once the instance is retired or `client` is no longer its connection. A discovery waits for
    /// the lifecycle lock, and meanwhile a restart, dormancy or a kill may have closed the connection it was
    /// given: discovered on that, it failed and made a healthy (or sleeping) instance `offline`.
    pub(in crate::instances) async fn refresh_catalog(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
        client: &Arc<McpClient>,
    ) -> Option<bool> {
        let _lifecycle = instance.lifecycle.lock().await;
        if instance.retired.is_cancelled() || !instance.is_connection(client) {
            return None;
        }
        Some(self.discover_into(instance, client, false).await)
    }
}
