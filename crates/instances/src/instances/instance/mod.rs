//! One per-user instance: its spec, status, live connection, catalog, and
//! the supervisor's bookkeeping (activity, dormancy, crashes, call slots). What its clients asked the server to
//! remember is in `client_state`, what the server announces in `announce`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

mod announce;
mod client_state;

pub use announce::missed_announcements;
pub use client_state::{Release, MAX_SUBSCRIPTIONS};

use super::limits::ProcessSlot;
use super::policy::CrashWindow;
use crate::mcp::client::McpClient;
use crate::mcp::transport::{Announcement, Transport, UpstreamError};
use crate::model::{Catalog, InstallationId, InstanceSpec, InstanceStatus};

/// Per installation, tool name → disabled, as switched at run time (not persisted, OQ-7).
pub type ToolOverrides =
    Arc<parking_lot::RwLock<std::collections::HashMap<InstallationId, std::collections::BTreeMap<String, bool>>>>;

/// The current status with its message and when it was set.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusEntry {
    pub status: InstanceStatus,
    pub message: Option<String>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("instance {0} is not connected")]
    NotConnected(String),
    #[error("MCP server '{slug}' is busy: {limit} calls already running and none finished within {}ms; retry shortly", .waited.as_millis())]
    Busy { slug: String, limit: usize, waited: Duration },
    #[error("MCP server '{slug}' could not be woken from dormancy: {source}")]
    Respawn { slug: String, source: UpstreamError },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl InstanceError {
    /// The upstream failure behind this error, if one is.
    pub fn upstream(&self) -> Option<&UpstreamError> {
        match self {
            InstanceError::Upstream(err) | InstanceError::Respawn { source: err, .. } => Some(err),
            InstanceError::NotConnected(_) | InstanceError::Busy { .. } => None,
        }
    }
}

/// A long-lived request counted on its instance ([`Instance::listening`]) until dropped.
#[derive(Debug)]
pub struct Listening<'a>(&'a AtomicUsize);

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A live instance. Replaced by a new one when its spec changes, so `spec` never changes.
#[derive(Debug)]
pub struct Instance {
    spec: Arc<InstanceSpec>,
    status: Mutex<StatusEntry>,
    connection: Mutex<Option<Connection>>,
    catalog: Mutex<Option<Arc<Catalog>>>,
    activity: Mutex<(Instant, DateTime<Utc>)>,
    dormant: Mutex<Option<(Instant, DateTime<Utc>)>>,
    pub(super) crashes: Mutex<CrashWindow>,
    /// Call slots: at most this many calls at once, the rest wait.
    pub(super) calls: Semaphore,
    pub(super) max_calls: usize,
    /// Set while a recovery (probe or re-discovery) runs, so there is one at a time.
    pub(super) recovering: AtomicBool,
    /// Respawns of this dormant instance tried so far, and how the last one failed (`None`: it did not). Callers
    /// that waited behind an attempt share its failure instead of each trying again in turn (`Inner::respawn`).
    pub(super) respawns: parking_lot::Mutex<(u64, Option<crate::mcp::transport::UpstreamError>)>,
    /// Long-lived requests open on it (`subscriptions/listen`): they take no call slot, yet keep it awake.
    listening: AtomicUsize,
    /// Stopped by a `kill` command: nothing brings it back on its own (BP §6.3) until it is started again.
    halted: AtomicBool,
    /// Bumped by every start attempt (under the lifecycle lock): a crash of an older attempt is stale.
    pub(super) generation: AtomicU64,
    /// Tool switches the backend sent at run time (BP §6.1.1), shared by every instance.
    overrides: ToolOverrides,
    /// Serialises start, stop, respawn, dormancy and rediscovery of this instance.
    pub(super) lifecycle: tokio::sync::Mutex<()>,
    /// Cancelled when the instance is removed or replaced.
    pub(super) retired: CancellationToken,
    /// What the server announces outside any request (resource updates, list changes), for the client
    /// sessions on its endpoint; lives as long as the instance, across reconnections. Made when the first session
    /// listens: its buffer is allocated whole (about 6 KiB), and most instances never have a listener.
    /// When listeners were last told announcements were missed ([`Instance::announce_missed`]).
    missed_at: parking_lot::Mutex<Option<std::time::Instant>>,
    announcements: std::sync::OnceLock<tokio::sync::broadcast::Sender<Announcement>>,
    /// Every tool definition of one published catalog, parsed, for clients that list this instance directly (the
    /// catalog keeps them as text). Made on the first listing of that catalog; the `Weak` tells which catalog
    /// it was made from, and a newer catalog makes it again.
    listing: Mutex<Option<ParsedListing>>,
    /// The secret values of the spec (`secrets::secret_values`), found once, on the first call that logs or
    /// masks: finding them reads every env or header name.
    secrets: std::sync::OnceLock<Box<[String]>>,
    /// The resources the server was asked to watch (`resources/subscribe` answered, no `resources/unsubscribe`
    /// answered since), asked again of a server that starts anew: a restarted process has forgotten them.
    subscriptions: Mutex<std::collections::BTreeSet<String>>,
    /// Bumped each time `subscriptions` changes: a 2026-07-28 server's listen is opened again with the new set.
    subscriptions_changed: tokio::sync::watch::Sender<u64>,
    /// Who among the instance's clients holds each subscription: a session (by id) or a listen the satellite
    /// serves. The server has one session for all of them, so a client's `resources/unsubscribe` goes to it only
    /// when no other holder is left (else another client would stop hearing of the resource).
    holders: Mutex<std::collections::HashMap<String, std::collections::HashSet<String>>>,
    /// Held while a subscription changes (the holders consulted and the server asked), so a client's subscribe and
    /// another's unsubscribe of the same resource, or a background undo, cannot cross on their way to the server.
    subscribing: tokio::sync::Mutex<()>,
    /// Held while the log level and subscriptions are asked of the server: by a client's call that changes them,
    /// and by a restore (`restore::restore_client_state`), so neither overwrites the other.
    pub(super) client_state: tokio::sync::Mutex<()>,
    /// The connection a waiting restore is for (at most one waits; a later one only updates this).
    pub(super) restore_for: Mutex<Option<Arc<McpClient>>>,
    /// Bumped each time the connection is set or taken: a watcher of an older one ends.
    connections: tokio::sync::watch::Sender<u64>,
    /// The level of the last `logging/setLevel` the server accepted, asked again of a server that starts anew.
    log_level: Mutex<Option<String>>,
    /// The key of the member the instance belongs to (`model::member_key`), made on its endpoint's first
    /// request: each request takes a place under it, which made it anew each time.
    member_key: std::sync::OnceLock<Arc<str>>,
    /// The activity record's client id of its endpoint (`instance:{path}`), made on its first request.
    client_id: std::sync::OnceLock<Box<str>>,
}

/// A catalog's tool definitions parsed, and the catalog they were parsed from.
type ParsedListing = (std::sync::Weak<Catalog>, Arc<[serde_json::Value]>);

/// A live connection to the instance's server.
#[derive(Debug)]
pub(super) struct Connection {
    pub client: Arc<McpClient>,
    pub since: Instant,
    /// The place of a stdio child in the process caps; freed with the connection.
    pub _slot: Option<ProcessSlot>,
}

impl Instance {
    pub(super) fn new(
        spec: Arc<InstanceSpec>,
        catalog: Option<Arc<Catalog>>,
        max_calls: usize,
        overrides: ToolOverrides,
    ) -> Self {
        Self {
            spec,
            status: Mutex::new(StatusEntry {
                status: InstanceStatus::Provisioning,
                message: None,
                updated_at: Utc::now(),
            }),
            connection: Mutex::new(None),
            catalog: Mutex::new(catalog),
            activity: Mutex::new((Instant::now(), Utc::now())),
            dormant: Mutex::new(None),
            crashes: Mutex::new(CrashWindow::default()),
            calls: Semaphore::new(max_calls),
            max_calls,
            recovering: AtomicBool::new(false),
            respawns: parking_lot::Mutex::new((0, None)),
            listening: AtomicUsize::new(0),
            halted: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            overrides,
            lifecycle: tokio::sync::Mutex::new(()),
            retired: CancellationToken::new(),
            announcements: std::sync::OnceLock::new(),
            missed_at: parking_lot::Mutex::new(None),
            listing: Mutex::new(None),
            secrets: std::sync::OnceLock::new(),
            subscriptions: Mutex::new(std::collections::BTreeSet::new()),
            subscriptions_changed: tokio::sync::watch::Sender::new(0),
            holders: Mutex::default(),
            subscribing: tokio::sync::Mutex::new(()),
            connections: tokio::sync::watch::Sender::new(0),
            client_state: tokio::sync::Mutex::new(()),
            restore_for: Mutex::new(None),
            log_level: Mutex::new(None),
            member_key: std::sync::OnceLock::new(),
            client_id: std::sync::OnceLock::new(),
        }
    }

    /// The key of the member this instance belongs to (`model::member_key`), shared.
    pub fn member_key(&self) -> Arc<str> {
        let spec = &self.spec;
        self.member_key
            .get_or_init(|| crate::model::member_key(spec.user_id.as_str(), spec.team_id.as_str()).into())
            .clone()
    }

    /// The client id its endpoint's requests are counted under in the activity records: `instance:{path}`.
    pub fn client_id(&self) -> &str {
        let path = self.spec.instance_path.as_deref().unwrap_or_default();
        self.client_id.get_or_init(|| format!("instance:{path}").into())
    }

    /// Changes each time the connection is set or taken.
    pub(super) fn connection_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.connections.subscribe()
    }

    pub fn spec(&self) -> &InstanceSpec {
        &self.spec
    }

    /// What is masked in this instance's logs: its spec's secret values, longest first.
    pub(super) fn secret_values(&self) -> &[String] {
        self.secrets.get_or_init(|| crate::secrets::secret_values(&self.spec).into_boxed_slice())
    }

    /// Whether the team administrator disabled this tool: a run-time switch of the installation
    /// (`update_tool_status`) wins over the configured `disabled_tools`.
    pub fn tool_disabled(&self, name: &str) -> bool {
        // The access rules first: no administrator's switch turns on a tool the user may not use.
        if self.tool_denied(name) {
            return true;
        }
        match self.overrides.read().get(&self.spec.installation_id).and_then(|m| m.get(name)) {
            Some(disabled) => *disabled,
            None => self.spec.disabled_tools.contains(name),
        }
    }

    /// Whether the access rules that apply to this instance's user deny the tool `name` (`model::ToolAccess`):
    /// part of [`Instance::tool_disabled`], which every listing and call consults; asked alone to tell a call why.
    pub fn tool_denied(&self, name: &str) -> bool {
        !self.spec.access.allows(&self.spec.server_slug, name)
    }

    pub fn status(&self) -> StatusEntry {
        self.status.lock().clone()
    }

    /// The status alone, without copying its message: what every call and listing asks.
    pub fn state(&self) -> InstanceStatus {
        self.status.lock().status
    }

    /// Move to `status` if the transition function allows it; the refused move is returned as an error.
    pub(super) fn set_status(
        &self,
        status: InstanceStatus,
        message: Option<String>,
    ) -> Result<StatusEntry, (InstanceStatus, InstanceStatus)> {
        let mut current = self.status.lock();
        if !current.status.can_move_to(status) {
            return Err((current.status, status));
        }
        *current = StatusEntry { status, message, updated_at: Utc::now() };
        Ok(current.clone())
    }

    /// `catalog`'s tool definitions parsed, in its order: parsed once per catalog, not once per listing.
    pub fn tool_listing(&self, catalog: &Arc<Catalog>) -> Arc<[serde_json::Value]> {
        let mut listing = self.listing.lock();
        if let Some((made_from, tools)) = listing.as_ref() {
            // The `Weak` keeps the catalog's allocation, so a catalog made later never has the same address.
            if std::ptr::eq(made_from.as_ptr(), Arc::as_ptr(catalog)) {
                return tools.clone();
            }
        }
        let tools: Arc<[serde_json::Value]> = catalog.tools.iter().map(|t| t.definition_value()).collect();
        *listing = Some((Arc::downgrade(catalog), tools.clone()));
        tools
    }

    /// The tools, resources and templates of the last successful discovery.
    pub fn catalog(&self) -> Option<Arc<Catalog>> {
        self.catalog.lock().clone()
    }

    pub(super) fn set_catalog(&self, catalog: Arc<Catalog>) {
        *self.catalog.lock() = Some(catalog);
    }

    /// Put `catalog` in place of `expected` only while `expected` is still the instance's catalog (a newer
    /// discovery may have replaced it meanwhile); true when it did.
    pub(super) fn replace_catalog(&self, expected: &Arc<Catalog>, catalog: Arc<Catalog>) -> bool {
        let mut slot = self.catalog.lock();
        if slot.as_ref().is_some_and(|current| Arc::ptr_eq(current, expected)) {
            *slot = Some(catalog);
            return true;
        }
        false
    }

    pub fn client(&self) -> Option<Arc<McpClient>> {
        self.connection.lock().as_ref().map(|c| c.client.clone())
    }

    /// Whether `client` is still this instance's connection: not closed since by a restart, dormancy or a kill.
    pub(super) fn is_connection(&self, client: &Arc<McpClient>) -> bool {
        self.connection.lock().as_ref().is_some_and(|c| Arc::ptr_eq(&c.client, client))
    }

    pub(super) fn set_connection(&self, client: Arc<McpClient>, slot: Option<ProcessSlot>) {
        *self.connection.lock() = Some(Connection { client, since: Instant::now(), _slot: slot });
        self.connections.send_modify(|n| *n += 1);
    }

    /// Remove the connection (freeing its process slot); the caller closes the client.
    pub(super) fn take_client(&self) -> Option<Arc<McpClient>> {
        let taken = self.connection.lock().take().map(|c| c.client);
        self.connections.send_modify(|n| *n += 1);
        taken
    }

    /// How long the current connection has been up.
    pub fn uptime(&self) -> Option<Duration> {
        self.connection.lock().as_ref().map(|c| c.since.elapsed())
    }

    /// The child's pid, for stdio instances with a live process.
    pub fn pid(&self) -> Option<u32> {
        match self.client()?.transport() {
            Transport::Stdio(stdio) if stdio.is_alive() => stdio.pid(),
            _ => None,
        }
    }

    /// The child's last stderr lines (stdio only).
    pub fn stderr_tail(&self) -> Vec<String> {
        match self.client().as_deref().map(McpClient::transport) {
            Some(Transport::Stdio(stdio)) => stdio.stderr_tail(),
            _ => Vec::new(),
        }
    }

    /// Note a request to or answer from the server.
    pub(super) fn touch(&self) {
        *self.activity.lock() = (Instant::now(), Utc::now());
    }

    /// Time since the last request or answer, and when that was.
    pub fn idle(&self) -> (Duration, DateTime<Utc>) {
        let (at, wall) = *self.activity.lock();
        (at.elapsed(), wall)
    }

    /// Calls running now.
    pub fn in_flight(&self) -> usize {
        self.max_calls.saturating_sub(self.calls.available_permits())
    }

    /// Count a long-lived request (`subscriptions/listen`) open on this instance until the guard is dropped: the
    /// idle sweep leaves the instance awake meanwhile, since asleep its server could announce nothing and a
    /// listen passed through to it would fail. It takes no call slot, so listens never starve calls.
    pub fn listening(&self) -> Listening<'_> {
        self.listening.fetch_add(1, Ordering::Relaxed);
        Listening(&self.listening)
    }

    /// Long-lived requests open on this instance.
    pub fn listens(&self) -> usize {
        self.listening.load(Ordering::Relaxed)
    }

    /// True while the process was stopped for idleness and not yet respawned; its tools stay cached.
    pub fn is_dormant(&self) -> bool {
        self.dormant.lock().is_some()
    }

    pub(super) fn set_dormant(&self) {
        *self.dormant.lock() = Some((Instant::now(), Utc::now()));
    }

    /// Leave dormancy; returns how long it lasted.
    pub(super) fn clear_dormant(&self) -> Option<Duration> {
        self.dormant.lock().take().map(|(since, _)| since.elapsed())
    }

    /// Crashes within the current window.
    pub fn recent_crashes(&self) -> usize {
        self.crashes.lock().len()
    }

    /// Start a new attempt; returns its generation. Call with the lifecycle lock held.
    pub(super) fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Mark the instance stopped by a `kill` (true) or started again (false).
    pub(super) fn set_halted(&self, halted: bool) {
        self.halted.store(halted, Ordering::Release);
    }

    pub fn is_halted(&self) -> bool {
        self.halted.load(Ordering::Acquire)
    }

    /// Whether a recovery (the probe of an unreachable server, or a re-discovery) is running now.
    pub fn recovering(&self) -> bool {
        self.recovering.load(Ordering::Acquire)
    }

    pub(super) fn try_begin_recovery(&self) -> bool {
        !self.recovering.swap(true, Ordering::AcqRel)
    }

    pub(super) fn end_recovery(&self) {
        self.recovering.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count that finishes after a newer discovery replaced the catalog it counted must not put the old tools
    /// back: only the catalog it started from is replaced.
    #[test]
    fn a_late_count_replaces_only_the_catalog_it_counted() {
        let published = Arc::new(Catalog::empty());
        let instance =
            Instance::new(Arc::new(crate::model::sample_spec()), Some(published.clone()), 1, ToolOverrides::default());
        let counted = Arc::new(Catalog::empty());
        assert!(instance.replace_catalog(&published, counted.clone()));
        assert!(instance.catalog().is_some_and(|c| Arc::ptr_eq(&c, &counted)));

        let newer = Arc::new(Catalog::empty());
        instance.set_catalog(newer.clone());
        assert!(!instance.replace_catalog(&counted, Arc::new(Catalog::empty())), "a newer catalog stays");
        assert!(instance.catalog().is_some_and(|c| Arc::ptr_eq(&c, &newer)));
    }

    /// The parsed listing is made once per catalog, and a new catalog is never served the old one's tools.
    #[test]
    fn a_listing_follows_the_catalog_it_was_parsed_from() {
        let with = |names: &[&str]| {
            let mut catalog = Catalog::empty();
            catalog.tools = names
                .iter()
                .filter_map(|n| crate::model::ToolDef::from_listing(&serde_json::json!({"name": n, "annotations": {}})))
                .collect();
            Arc::new(catalog)
        };
        let names = |tools: &[serde_json::Value]| -> Vec<String> {
            tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect()
        };
        let instance = Instance::new(Arc::new(crate::model::sample_spec()), None, 1, ToolOverrides::default());
        let first = with(&["a", "b"]);
        let listed = instance.tool_listing(&first);
        assert_eq!(names(&listed), ["a", "b"]);
        assert_eq!(
            listed[0],
            serde_json::json!({"name": "a", "annotations": {}, "description": "", "inputSchema": {}})
        );
        assert!(Arc::ptr_eq(&listed, &instance.tool_listing(&first)), "parsed once per catalog");
        let second = with(&["c"]);
        assert_eq!(names(&instance.tool_listing(&second)), ["c"]);
        // The first catalog let go and a third made: whatever its address, it gets its own tools.
        drop(first);
        let third = with(&["d", "e"]);
        assert_eq!(names(&instance.tool_listing(&third)), ["d", "e"]);
    }
}
