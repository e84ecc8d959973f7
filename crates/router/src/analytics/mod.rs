//! Token-savings analytics (docs/analytics.md): the facts the routers report as they answer (a listing shown, a
//! discover answered, a call made), recorded in batches by one writer task, and the figures computed from them
//! (`report`). Recording never waits on the database: a fact is queued and the request goes on; a full queue
//! drops the fact and counts it (`dropped`), because analytics must never slow or fail a client.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::model::{iso, InstanceSpec};
use crate::store::analytics::{CallRow, DiscoverRow, ListingRow, RowKey};
use crate::store::AnalyticsRows;

pub mod chart;
pub mod report;
mod writer;

use writer::writer;
#[cfg(test)]
use writer::{count_uncounted, drain, Ledger, Pending};

/// Facts waiting for the writer; beyond this they are dropped and counted.
const QUEUE: usize = 16_384;
/// Rows written per transaction at most.
const BATCH: usize = 512;
/// How long a fact waits for company before it is written.
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// Sessions whose state (last visible set, recent discovers) is kept; the oldest go first beyond this.
const SESSIONS_KEPT: usize = 50_000;
/// Recent discovers per session a call is matched against for the hit rate.
const DISCOVERS_KEPT: usize = 8;

/// Which router answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Router {
    Hierarchical,
    Instance,
}

impl Router {
    pub fn as_str(self) -> &'static str {
        match self {
            Router::Hierarchical => "hierarchical",
            Router::Instance => "instance",
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// A result with `isError: true`.
    ToolError,
    /// No result: the server failed, timed out or refused.
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::Error => "error",
        }
    }
}

/// Who asked, in which session. `session` is the MCP session id of a handshake-era client; a 2026-07-28
/// request has none, and a caller's stateless requests count as one session of theirs.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    pub team: &'a str,
    pub user: &'a str,
    pub session: Option<&'a str>,
}

/// One `tools/list` answer.
#[derive(Debug, Clone)]
pub struct Listing {
    pub router: Router,
    /// The instance, on the instance router.
    pub instance: Option<(String, String)>,
    pub tools_shown: u64,
    pub shown_tokens: u64,
    pub tools_visible: u64,
    pub visible_tokens: u64,
    /// Identifies the visible tool set: a plain proxy re-sends the list when it changes.
    pub fingerprint: u64,
    /// Visible tools whose tokens were not counted yet (a first discovery publishes before counting): the
    /// writer counts them and adds them to `visible_tokens`, and to `shown_tokens` on the instance router,
    /// which shows what is visible.
    pub uncounted: Vec<crate::model::ToolDef>,
}

#[derive(Debug)]
enum Fact {
    Listing(Box<ListingFact>),
    Discover { key: RowKey, text: String, tool_paths: Vec<String> },
    Call(Box<CallFact>),
}

/// Like listings of one session, one after another: one row that counts them (issue 19: a row per `tools/list` cost
/// a listing more than the rest of its answer). Like: the same router, instance and tools shown and visible, with
/// their tokens counted; a session's next listing joins only its last one, so a change of the visible tools and
/// back is still a listing a plain proxy re-sends.
#[derive(Debug)]
struct ListingFact {
    key: RowKey,
    stateless: bool,
    /// The caller's MCP session id as sent, to tell apart sessions whose hashes collide (not stored).
    session: Option<Box<str>>,
    listing: Listing,
    /// Listings this fact stands for.
    listings: u64,
}

impl ListingFact {
    /// Whether `listing` by `caller` goes in this fact's row.
    fn is_like(&self, caller: &Caller<'_>, listing: &Listing) -> bool {
        let (mine, theirs) = (&self.listing, listing);
        self.session.as_deref() == caller.session
            && self.key.team_id == caller.team
            && self.key.user_id == caller.user
            && mine.uncounted.is_empty()
            && theirs.uncounted.is_empty()
            && mine.router == theirs.router
            && mine.instance == theirs.instance
            && mine.fingerprint == theirs.fingerprint
            && (mine.tools_shown, mine.shown_tokens, mine.tools_visible, mine.visible_tokens)
                == (theirs.tools_shown, theirs.shown_tokens, theirs.tools_visible, theirs.visible_tokens)
    }
}

/// Successful calls of one session to one tool, made one after another with no discover between them: one row
/// with their count and total duration (issue 19: a row per call cost more than the rest of the call's records).
#[derive(Debug)]
struct CallFact {
    key: RowKey,
    /// The caller's MCP session id as sent, to tell apart calls whose hashes collide (not stored).
    session: Option<Box<str>>,
    router: Router,
    process_id: String,
    installation_id: String,
    server_slug: String,
    tool_name: String,
    outcome: Outcome,
    /// Calls this fact stands for (1 unless like successful calls were merged into it).
    calls: u64,
    /// Their durations added up.
    duration_ms: u64,
}

impl CallFact {
    /// Whether a call by `caller` to `tool` of `spec` through `router` goes in this fact's row.
    fn is_like(&self, caller: &Caller<'_>, router: Router, spec: &InstanceSpec, tool: &str) -> bool {
        self.outcome == Outcome::Ok
            && self.router == router
            && self.session.as_deref() == caller.session
            && self.key.team_id == caller.team
            && self.key.user_id == caller.user
            && self.process_id == spec.process_id.0
            && self.tool_name == tool
    }
}

/// Facts the writer has not taken yet.
#[derive(Default)]
struct Queue {
    facts: Vec<Fact>,
    /// Successful call facts that like calls still join, by [`call_hash`]: their place in `facts`. Emptied by every
    /// discover (a call after it may be a hit of it, a call before may not) and when the writer takes the facts.
    open_calls: HashMap<u64, usize>,
    /// Each session's last listing fact, by [`session_hash`]: its place in `facts`. Emptied when the writer takes
    /// the facts.
    open_listings: HashMap<u64, usize>,
}

/// Under which index a queued fact stays open to like facts after it.
enum Open {
    Not,
    Call(u64),
    Listing(u64),
}

/// What a listing is merged by first: the caller (team, user, session).
fn session_hash(caller: &Caller<'_>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (caller.team, caller.user, caller.session).hash(&mut hasher);
    hasher.finish()
}

/// What a successful call is merged by: the caller (team, user, session), the router, the instance and the tool.
fn call_hash(caller: &Caller<'_>, router: Router, spec: &InstanceSpec, tool: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (caller.team, caller.user, caller.session, router as u8, spec.process_id.as_str(), tool).hash(&mut hasher);
    hasher.finish()
}

/// What the four meta-tools cost, counted like any tool (SB §15) when the satellite starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaCost {
    pub tools: u64,
    pub tokens: u64,
}

/// The routers' handle: cheap to clone, never blocks.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

struct RecorderInner {
    /// Facts the writer has not taken yet (at most [`QUEUE`]).
    queue: parking_lot::Mutex<Queue>,
    /// Rung when the queue holds a whole batch; otherwise the writer comes every [`FLUSH_EVERY`]. A wake-up per
    /// fact (a channel's receive) cost a task switch per call.
    full: Notify,
    writer_started: AtomicBool,
    dropped: AtomicU64,
    /// Rows dropped because the database refused them for so long that the rows kept for it filled up.
    rows_dropped: AtomicU64,
    meta: MetaCost,
}

impl Recorder {
    /// A recorder whose facts wait until [`Recorder::spawn_writer`] starts writing them.
    pub fn new(meta: MetaCost) -> Self {
        Self {
            inner: Arc::new(RecorderInner {
                queue: parking_lot::Mutex::new(Queue::default()),
                full: Notify::new(),
                writer_started: AtomicBool::new(false),
                dropped: AtomicU64::new(0),
                rows_dropped: AtomicU64::new(0),
                meta,
            }),
        }
    }

    /// What the meta-tools cost.
    pub fn meta(&self) -> MetaCost {
        self.inner.meta
    }

    /// Facts dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Rows dropped because the database refused them past what is kept for it ([`writer::PENDING_MAX`]).
    pub fn rows_dropped(&self) -> u64 {
        self.inner.rows_dropped.load(Ordering::Relaxed)
    }

    /// Start the one writer (a second call does nothing), writing to `store`. It writes until `shutdown`, then
    /// drains the queue.
    pub fn spawn_writer(&self, store: AnalyticsRows, tasks: &TaskTracker, shutdown: CancellationToken) {
        if self.inner.writer_started.swap(true, Ordering::Relaxed) {
            return;
        }
        tasks.spawn(writer(self.inner.clone(), store, shutdown));
    }

    /// A listing answered. Like the session's last listing, it joins its row (a client or an agent loop that lists
    /// again and again is one row per writer cycle), even when the queue is full, since it needs no room.
    pub fn listing(&self, caller: &Caller<'_>, listing: Listing) {
        let hash = session_hash(caller);
        {
            let mut queue = self.inner.queue.lock();
            let Queue { facts, open_listings, .. } = &mut *queue;
            if let Some(Fact::Listing(fact)) = open_listings.get(&hash).and_then(|at| facts.get_mut(*at)) {
                if fact.is_like(caller, &listing) {
                    fact.listings += 1;
                    return;
                }
            }
        }
        let fact = ListingFact {
            key: row_key(caller),
            stateless: caller.session.is_none(),
            session: caller.session.map(Box::from),
            listing,
            listings: 1,
        };
        self.push(Fact::Listing(Box::new(fact)), Open::Listing(hash));
    }

    /// A discover answered with `text`, listing `tool_paths` (`slug:tool`).
    pub fn discover(&self, caller: &Caller<'_>, text: String, tool_paths: Vec<String>) {
        self.send(Fact::Discover { key: row_key(caller), text, tool_paths });
    }

    /// A call forwarded to `spec`'s instance. A successful one joins the row of the like calls before it, if no
    /// discover came between (the figures count calls, not rows): under load one session calls one tool many times
    /// per writer cycle.
    pub fn call(
        &self,
        caller: &Caller<'_>,
        router: Router,
        spec: &InstanceSpec,
        tool: &str,
        outcome: Outcome,
        took: Duration,
    ) {
        let duration_ms = took.as_millis() as u64;
        let hash = (outcome == Outcome::Ok).then(|| call_hash(caller, router, spec, tool));
        if let Some(hash) = hash {
            let mut queue = self.inner.queue.lock();
            let Queue { facts, open_calls, .. } = &mut *queue;
            if let Some(Fact::Call(fact)) = open_calls.get(&hash).and_then(|at| facts.get_mut(*at)) {
                if fact.is_like(caller, router, spec, tool) {
                    fact.calls += 1;
                    fact.duration_ms += duration_ms;
                    return;
                }
            }
        }
        let fact = Fact::Call(Box::new(CallFact {
            key: row_key(caller),
            session: caller.session.map(Box::from),
            router,
            process_id: spec.process_id.0.clone(),
            installation_id: spec.installation_id.0.clone(),
            server_slug: spec.server_slug.clone(),
            tool_name: tool.to_owned(),
            outcome,
            calls: 1,
            duration_ms,
        }));
        self.push(fact, hash.map_or(Open::Not, Open::Call));
    }

    fn send(&self, fact: Fact) {
        self.push(fact, Open::Not);
    }

    /// Queue `fact`; `open`: the hash under which like facts join it.
    fn push(&self, fact: Fact, open: Open) {
        let queued = {
            let mut queue = self.inner.queue.lock();
            if queue.facts.len() < QUEUE {
                if matches!(fact, Fact::Discover { .. }) {
                    queue.open_calls.clear();
                }
                let at = queue.facts.len();
                match open {
                    Open::Not => {}
                    Open::Call(hash) => {
                        queue.open_calls.insert(hash, at);
                    }
                    Open::Listing(hash) => {
                        queue.open_listings.insert(hash, at);
                    }
                }
                queue.facts.push(fact);
                Some(queue.facts.len())
            } else {
                None
            }
        };
        match queued {
            Some(BATCH) => self.inner.full.notify_one(),
            Some(_) => {}
            None => {
                let dropped = self.inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped.is_power_of_two() {
                    warn!(dropped, "analytics facts dropped: the writer is behind or stopped; figures will undercount");
                }
            }
        }
    }
}

/// A fingerprint of a visible tool set from each instance's id and discovery time.
pub fn fingerprint<'a>(parts: impl Iterator<Item = (&'a str, i64)>) -> u64 {
    let mut parts: Vec<(&str, i64)> = parts.collect();
    parts.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// The session as stored: a hash of the MCP session id (ids are bookkeeping, but there is no reason to keep
/// them), or the caller's stateless pseudo-session.
fn row_key(caller: &Caller<'_>) -> RowKey {
    let session = match caller.session {
        Some(id) => short_digest("s:", id.as_bytes()),
        None => short_digest("stateless:", format!("{}\u{1f}{}", caller.team, caller.user).as_bytes()),
    };
    RowKey { at: iso(chrono::Utc::now()), team_id: caller.team.to_owned(), user_id: caller.user.to_owned(), session }
}

/// `prefix` and the first 16 hex digits of the SHA-256 of `bytes`: only the 8 bytes shown are hex-encoded, into a
/// buffer (this runs for every listing, discover and call; `hex::encode` of the whole digest cost more than the hash).
fn short_digest(prefix: &str, bytes: &[u8]) -> String {
    let mut digits = [0u8; 16];
    let _ = hex::encode_to_slice(&Sha256::digest(bytes)[..8], &mut digits); // 8 bytes always fill 16 digits
    let mut out = String::with_capacity(prefix.len() + digits.len());
    out.push_str(prefix);
    out.push_str(std::str::from_utf8(&digits).unwrap_or_default());
    out
}

/// What the writer remembers of a session.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::analytics::AnalyticsRow;
    use crate::store::Store;

    /// A session's key is what earlier versions stored (the first 16 hex digits of the digest): rows written
    /// before and after an upgrade stay one session.
    #[test]
    fn session_keys_are_the_digest_prefix_earlier_versions_stored() {
        let earlier = |prefix: &str, text: &str| format!("{prefix}{}", &hex::encode(Sha256::digest(text))[..16]);
        let caller = Caller { team: "acme", user: "alice", session: Some("a5f0-session") };
        assert_eq!(row_key(&caller).session, earlier("s:", "a5f0-session"));
        let stateless = Caller { session: None, ..caller };
        assert_eq!(row_key(&stateless).session, earlier("stateless:", "acme\u{1f}alice"));
    }

    fn key(session: &str) -> RowKey {
        RowKey {
            at: "2026-01-01T00:00:00.000Z".into(),
            team_id: "t".into(),
            user_id: "u".into(),
            session: session.into(),
        }
    }

    /// One listing's fact, as the recorder queues it.
    fn listed(key: RowKey, stateless: bool, listing: Listing) -> Fact {
        let session = (!stateless).then(|| Box::from(key.session.as_str()));
        Fact::Listing(Box::new(ListingFact { key, stateless, session, listing, listings: 1 }))
    }

    /// Under load a client lists again and again: like listings of one session are one row that counts them, its
    /// tokens their totals, and a plain proxy's cost once for a session (each time for a stateless one). A listing
    /// that differs joins nothing, and a session's next listing joins only its last one, so a change and back is
    /// still re-sent. Before, each listing was a row of its own: a SQLite insert per `tools/list`.
    #[tokio::test]
    async fn like_listings_of_a_session_are_one_row() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path()).await?;
        let recorder = Recorder::new(MetaCost::default());
        let a = Caller { team: "t", user: "u", session: Some("s1") };
        let stateless = Caller { session: None, ..a.clone() };
        for _ in 0..5 {
            recorder.listing(&a, listing(1));
            recorder.listing(&stateless, listing(1));
        }
        // The visible tools change, and back: three rows, each re-sent by a plain proxy.
        recorder.listing(&a, listing(2));
        recorder.listing(&a, listing(1));
        recorder.listing(&a, listing(1));
        assert_eq!(recorder.inner.queue.lock().facts.len(), 4, "two rows of five, then a change and back");
        let mut ledger = Ledger { sessions: HashMap::new() };
        drain(&recorder.inner, &mut ledger, &store.analytics_rows(), &mut Pending::default()).await;
        let filter = crate::store::analytics::RowFilter::default();
        let (rows, _) =
            store.analytics_sums().activity(&filter, crate::store::analytics::Grouping::Session, 10, 0).await?;
        let mut figures: Vec<(u64, u64, u64, u64)> =
            rows.iter().map(|r| (r.listings, r.shown_tokens, r.visible_tokens, r.proxy_tokens)).collect();
        figures.sort_unstable();
        // The session: 8 listings, re-sent three times (first, change, back); the stateless caller: 5, each re-sent.
        assert_eq!(figures, vec![(5, 2000, 5000, 5000), (8, 3200, 8000, 3000)]);
        Ok(())
    }

    fn listing(fingerprint: u64) -> Listing {
        Listing {
            router: Router::Hierarchical,
            instance: None,
            tools_shown: 4,
            shown_tokens: 400,
            tools_visible: 10,
            visible_tokens: 1000,
            fingerprint,
            uncounted: Vec::new(),
        }
    }

    /// A listing made before its tools were counted gets their tokens in the writer: visible on both routers,
    /// shown too on the instance router, which shows the tools themselves.
    #[tokio::test]
    async fn tools_listed_before_they_were_counted_are_counted_by_the_writer() {
        let tool = crate::model::ToolDef::from_listing(&serde_json::json!({"name": "echo", "description": "Echo it"}))
            .expect("a tool");
        let tokens = crate::tokens::count_tools(vec![tool.clone()]).await.expect("counted")[0] as u64;
        assert!(tokens > 0);
        let fact =
            |router: Router| listed(key("a"), true, Listing { router, uncounted: vec![tool.clone()], ..listing(1) });
        let mut facts = vec![fact(Router::Hierarchical), fact(Router::Instance)];
        count_uncounted(&mut facts).await;
        let figures: Vec<(u64, u64, usize)> = facts
            .iter()
            .map(|f| match f {
                Fact::Listing(fact) => {
                    (fact.listing.shown_tokens, fact.listing.visible_tokens, fact.listing.uncounted.len())
                }
                _ => (0, 0, 0),
            })
            .collect();
        assert_eq!(figures, vec![(400, 1000 + tokens, 0), (400 + tokens, 1000 + tokens, 0)]);
    }

    fn proxy(row: &AnalyticsRow) -> u64 {
        match row {
            AnalyticsRow::Listing(l) => l.proxy_tokens,
            other => panic!("not a listing: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_making_the_request_wait() {
        let recorder = Recorder::new(MetaCost::default());
        let caller = Caller { team: "t", user: "u", session: Some("s") };
        // No writer is running: nothing drains the queue, as when the database stalls.
        for _ in 0..QUEUE + 3 {
            recorder.discover(&caller, String::new(), Vec::new());
        }
        assert_eq!(recorder.dropped(), 3);
    }

    /// A stalled writer (the database busy) lets the queue fill: a successful call like the open row before it
    /// still counts there, since it needs no room; any other call is dropped and counted.
    #[tokio::test]
    async fn with_the_queue_full_like_calls_still_count_in_their_open_row_and_others_are_dropped() {
        let recorder = Recorder::new(MetaCost::default());
        let spec = crate::model::sample_spec();
        let a = Caller { team: "t", user: "u", session: Some("s1") };
        let other = Caller { session: Some("s2"), ..a.clone() };
        let ms = Duration::from_millis(1);
        recorder.call(&a, Router::Hierarchical, &spec, "echo", Outcome::Ok, ms);
        // Listings that differ (like ones would join one row and fill nothing).
        for n in 1..QUEUE {
            recorder.listing(&other, listing(n as u64));
        }
        for _ in 0..5 {
            recorder.call(&a, Router::Hierarchical, &spec, "echo", Outcome::Ok, ms);
        }
        recorder.call(&a, Router::Hierarchical, &spec, "add", Outcome::Ok, ms);
        recorder.call(&a, Router::Hierarchical, &spec, "echo", Outcome::Error, ms);
        assert_eq!(recorder.dropped(), 2, "the other tool's call and the failure found no room");
        let queue = recorder.inner.queue.lock();
        let Some(Fact::Call(open)) = queue.facts.first() else { panic!("the first fact is not the call") };
        assert_eq!((open.calls, open.duration_ms), (6, 6));
    }

    /// The writer takes the queue with its open rows: the index of open rows is emptied with it (it would otherwise
    /// grow with every session that ever called, and point into a queue that no longer holds those rows), and a
    /// like call after that starts a row of its own. What reaches the database still counts every call.
    #[tokio::test]
    async fn the_writer_takes_the_open_rows_and_a_like_call_after_it_starts_its_own(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path()).await?;
        let recorder = Recorder::new(MetaCost::default());
        let spec = crate::model::sample_spec();
        let ms = Duration::from_millis(2);
        let sessions: Vec<String> = (0..50).map(|n| format!("s{n}")).collect();
        for session in &sessions {
            let caller = Caller { team: "t", user: "u", session: Some(session) };
            recorder.call(&caller, Router::Instance, &spec, "echo", Outcome::Ok, ms);
            recorder.call(&caller, Router::Instance, &spec, "echo", Outcome::Ok, ms);
        }
        assert_eq!(recorder.inner.queue.lock().open_calls.len(), 50);
        let mut ledger = Ledger { sessions: HashMap::new() };
        drain(&recorder.inner, &mut ledger, &store.analytics_rows(), &mut Pending::default()).await;
        assert!(recorder.inner.queue.lock().open_calls.is_empty(), "the index outlived the rows it pointed to");
        let first = Caller { team: "t", user: "u", session: Some(&sessions[0]) };
        recorder.call(&first, Router::Instance, &spec, "echo", Outcome::Ok, ms);
        {
            let queue = recorder.inner.queue.lock();
            let Some(Fact::Call(row)) = queue.facts.first() else { panic!("the call after the drain has no row") };
            assert_eq!((queue.facts.len(), row.calls), (1, 1));
        }
        drain(&recorder.inner, &mut ledger, &store.analytics_rows(), &mut Pending::default()).await;
        let filter = crate::store::analytics::RowFilter::default();
        let (total, _) =
            store.analytics_sums().activity(&filter, crate::store::analytics::Grouping::Total, 1, 0).await?;
        assert_eq!(total[0].calls, 101);
        let (tools, _) = store.analytics_sums().tool_calls(&filter, 10, 0).await?;
        assert_eq!((tools[0].calls, tools[0].avg_duration_ms), (101, 2.0));
        Ok(())
    }

    /// Calls whose hashes collide are still told apart: a row takes only calls equal in every part of its key.
    #[test]
    fn a_call_joins_a_row_only_if_every_part_of_its_key_is_equal() {
        let spec = crate::model::sample_spec();
        let a = Caller { team: "t", user: "u", session: Some("s1") };
        let fact = CallFact {
            key: row_key(&a),
            session: Some("s1".into()),
            router: Router::Hierarchical,
            process_id: spec.process_id.0.clone(),
            installation_id: spec.installation_id.0.clone(),
            server_slug: spec.server_slug.clone(),
            tool_name: "echo".into(),
            outcome: Outcome::Ok,
            calls: 1,
            duration_ms: 1,
        };
        let other_instance = InstanceSpec { process_id: crate::model::ProcessId::from("another"), ..spec.clone() };
        assert!(fact.is_like(&a, Router::Hierarchical, &spec, "echo"));
        for (caller, router, spec, tool) in [
            (Caller { session: Some("s2"), ..a.clone() }, Router::Hierarchical, &spec, "echo"),
            (Caller { session: None, ..a.clone() }, Router::Hierarchical, &spec, "echo"),
            (Caller { team: "t2", ..a.clone() }, Router::Hierarchical, &spec, "echo"),
            (Caller { user: "u2", ..a.clone() }, Router::Hierarchical, &spec, "echo"),
            (a.clone(), Router::Instance, &spec, "echo"),
            (a.clone(), Router::Hierarchical, &other_instance, "echo"),
            (a.clone(), Router::Hierarchical, &spec, "add"),
        ] {
            assert!(!fact.is_like(&caller, router, spec, tool), "{caller:?} {router:?} {tool} joined the row");
        }
        let failed = CallFact { outcome: Outcome::Error, ..fact };
        assert!(!failed.is_like(&a, Router::Hierarchical, &spec, "echo"), "a failure's row takes no other call");
    }

    #[test]
    fn a_plain_proxy_resends_the_list_only_when_it_changed_or_the_client_is_stateless() {
        let mut ledger = Ledger { sessions: HashMap::new() };
        let facts = vec![
            listed(key("a"), false, listing(1)),
            listed(key("a"), false, listing(1)),
            listed(key("a"), false, listing(2)),
            listed(key("b"), false, listing(2)),
            listed(key("c"), true, listing(2)),
            listed(key("c"), true, listing(2)),
        ];
        let rows = ledger.rows(facts, &[]);
        let proxied: Vec<u64> = rows.iter().map(proxy).collect();
        assert_eq!(proxied, vec![1000, 0, 1000, 1000, 1000, 1000]);
    }

    /// Under load one session calls one tool many times between two writer cycles: those calls are one row that
    /// counts them, unless a discover came between (a call after it may be a hit of it) or the call failed (each
    /// failure is listed on its own).
    #[test]
    fn like_successful_calls_are_one_row_until_a_discover_and_failures_stay_one_row_each() {
        let recorder = Recorder::new(MetaCost::default());
        let spec = crate::model::sample_spec();
        let a = Caller { team: "t", user: "u", session: Some("s1") };
        let b = Caller { session: Some("s2"), ..a.clone() };
        let call = |caller: &Caller<'_>, router, tool, outcome, ms| {
            recorder.call(caller, router, &spec, tool, outcome, Duration::from_millis(ms));
        };
        for ms in [1, 2, 3] {
            call(&a, Router::Hierarchical, "echo", Outcome::Ok, ms);
        }
        call(&a, Router::Hierarchical, "add", Outcome::Ok, 1);
        call(&b, Router::Hierarchical, "echo", Outcome::Ok, 1);
        call(&a, Router::Instance, "echo", Outcome::Ok, 1);
        call(&a, Router::Hierarchical, "echo", Outcome::Error, 5);
        call(&a, Router::Hierarchical, "echo", Outcome::Error, 5);
        recorder.discover(&a, "x".into(), vec![crate::model::tool_path(&spec.server_slug, "echo")]);
        for ms in [4, 6] {
            call(&a, Router::Hierarchical, "echo", Outcome::Ok, ms);
        }
        let facts = std::mem::take(&mut recorder.inner.queue.lock().facts);
        let rows = Ledger { sessions: HashMap::new() }.rows(facts, &[7]);
        let AnalyticsRow::Discover(discover) = &rows[6] else { panic!("not a discover: {:?}", rows[6]) };
        let sessions: Vec<&str> = rows
            .iter()
            .map(|r| match r {
                AnalyticsRow::Listing(l) => l.key.session.as_str(),
                AnalyticsRow::Discover(d) => d.key.session.as_str(),
                AnalyticsRow::Call(c) => c.key.session.as_str(),
            })
            .collect();
        let calls: Vec<_> = rows
            .iter()
            .filter_map(|r| match r {
                AnalyticsRow::Call(c) => Some((
                    c.tool_name.as_str(),
                    c.router,
                    c.outcome,
                    c.calls,
                    c.duration_ms,
                    c.discover_key.as_deref() == Some(discover.discover_key.as_str()),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            calls,
            vec![
                ("echo", "hierarchical", "ok", 3, 6, false),
                ("add", "hierarchical", "ok", 1, 1, false),
                ("echo", "hierarchical", "ok", 1, 1, false),
                ("echo", "instance", "ok", 1, 1, false),
                ("echo", "hierarchical", "error", 1, 5, false),
                ("echo", "hierarchical", "error", 1, 5, false),
                ("echo", "hierarchical", "ok", 2, 10, true),
            ]
        );
        assert_ne!(sessions[0], sessions[2], "the third row is the other session's");
        assert_eq!(rows.len(), 8);
    }

    #[test]
    fn a_call_of_a_tool_the_sessions_recent_discover_listed_is_a_hit_and_another_sessions_is_not() {
        let mut ledger = Ledger { sessions: HashMap::new() };
        let spec_call = |session: &str, tool: &str| {
            Fact::Call(Box::new(CallFact {
                key: key(session),
                session: Some(session.into()),
                router: Router::Hierarchical,
                process_id: "p".into(),
                installation_id: "i".into(),
                server_slug: "demo".into(),
                tool_name: tool.into(),
                outcome: Outcome::Ok,
                calls: 1,
                duration_ms: 1,
            }))
        };
        let facts = vec![
            Fact::Discover { key: key("a"), text: "x".into(), tool_paths: vec!["demo:echo".into(), "demo:add".into()] },
            spec_call("a", "add"),
            spec_call("a", "other"),
            spec_call("b", "add"),
        ];
        let rows = ledger.rows(facts, &[7]);
        let AnalyticsRow::Discover(d) = &rows[0] else { panic!("not a discover") };
        assert_eq!((d.results, d.result_tokens), (2, 7));
        let keys: Vec<Option<String>> = rows[1..]
            .iter()
            .map(|r| match r {
                AnalyticsRow::Call(c) => c.discover_key.clone(),
                other => panic!("not a call: {other:?}"),
            })
            .collect();
        assert_eq!(keys, vec![Some(d.discover_key.clone()), None, None]);
    }
}
