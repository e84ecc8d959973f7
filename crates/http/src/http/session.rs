//! Streamable HTTP sessions: transport bookkeeping bound to the identity that
//! created them, never credentials. Idle sessions expire; an unknown, expired,
//! terminated or foreign id is answered 404 so the client initializes again
//! (MCP 2025-11-25 transport; docs/decisions.md). Ids are checked for form
//! before anything is looked up or stored.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hashlink::{LinkedHashMap, LinkedHashSet};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::exchange::Exchange;

/// Idle time after which a session is forgotten.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// Upper bound on live sessions per table; the least recently used one is evicted past it.
pub const MAX_SESSIONS: usize = 10_000;
/// Upper bound on one owner's live sessions (a user in a team, or an instance): past it the owner's own least
/// recently used session goes, so one caller opening sessions without end never evicts another's.
pub const MAX_SESSIONS_PER_OWNER: usize = 1_000;
/// Largest `capabilities` object a client may declare at `initialize` (as compact JSON): it is kept for the
/// session's life. Clients declare well under 1 KiB.
pub const MAX_CAPABILITIES_BYTES: usize = 16 * 1024;
/// Longest session id accepted from a client (ours are 36 characters).
pub const MAX_SESSION_ID: usize = 128;

/// The owner of the sessions on an instance's own endpoint (`/i/{path}/mcp`): the instance, whoever connects.
pub fn instance_owner(process_id: &crate::model::ProcessId) -> String {
    format!("instance:{process_id}")
}

/// The instance whose endpoint's sessions `owner` names (`instance_owner`'s inverse).
pub fn owned_instance(owner: &str) -> Option<crate::model::ProcessId> {
    owner.strip_prefix("instance:").map(crate::model::ProcessId::from)
}

/// Whether a client-supplied session id has the form the transport allows: 1 to 128 visible ASCII characters
/// (0x21-0x7E, MCP 2025-11-25).
pub fn well_formed(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_SESSION_ID && id.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

#[derive(Debug)]
struct Session {
    owner: String,
    /// Whose count of sessions this one is in (`MAX_SESSIONS_PER_OWNER`): the owner, or for an instance's
    /// endpoint the member the instance belongs to, so that one member's many instances share one cap.
    quota: String,
    version: String,
    last_seen: Instant,
    /// Cancelled when the session ends; set while a GET stream is open.
    stream: Option<CancellationToken>,
    /// The capabilities the client declared at `initialize` (shared with each relayed request, not copied).
    capabilities: Arc<serde_json::Value>,
    /// Resource URIs the client subscribed to (`resources/subscribe` on an instance endpoint), whose update
    /// notifications its stream receives.
    subscriptions: HashSet<String>,
}

impl Session {
    /// Whether its GET stream is open.
    fn streaming(&self) -> bool {
        self.stream.as_ref().is_some_and(|t| !t.is_cancelled())
    }
}

/// What a request's session header resolved to.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Live and owned by the caller.
    Known,
    /// Absent, expired, or owned by someone else.
    Unknown,
}

#[derive(Debug, PartialEq, Eq)]
pub enum StreamError {
    NoSession,
    AlreadyOpen,
}

/// The sessions in two orders, least recently used first: all of them, and each owner's. A request moves its
/// session to the back of both, so eviction takes a front in O(1) (a scan for the oldest cost 30% of CPU under
/// `initialize` load with the table full).
#[derive(Debug, Default)]
struct Sessions {
    all: LinkedHashMap<String, Session>,
    by_owner: HashMap<String, LinkedHashSet<String>>,
    /// Each quota's sessions, least recently used first (the same as `by_owner` where the quota is the owner).
    by_quota: HashMap<String, LinkedHashSet<String>>,
}

impl Sessions {
    fn get(&self, id: &str) -> Option<&Session> {
        self.all.get(id)
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.all.get_mut(id)
    }

    fn len(&self) -> usize {
        self.all.len()
    }

    /// Move session `id` of `owner` to the back of both orders.
    fn used(&mut self, id: &str, owner: &str) {
        self.all.to_back(id);
        if let Some(ids) = self.by_owner.get_mut(owner) {
            ids.to_back(id);
        }
        if let Some(ids) = self.all.get(id).and_then(|session| self.by_quota.get_mut(&session.quota)) {
            ids.to_back(id);
        }
    }

    fn remove(&mut self, id: &str) -> Option<Session> {
        let session = self.all.remove(id)?;
        if let Some(ids) = self.by_owner.get_mut(&session.owner) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_owner.remove(&session.owner);
            }
        }
        if let Some(ids) = self.by_quota.get_mut(&session.quota) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_quota.remove(&session.quota);
            }
        }
        Some(session)
    }

    /// Add a session, making room first: its quota's least recently used when the quota is at its cap, else the
    /// table's when the table is full. Returns the sessions it ended (replaced or evicted).
    fn insert(&mut self, id: String, session: Session) -> Vec<(String, Session)> {
        let mut ended = Vec::new();
        if let Some(old) = self.remove(&id) {
            ended.push((id.clone(), old));
        }
        let oldest_own = self.by_quota.get(&session.quota).filter(|ids| ids.len() >= MAX_SESSIONS_PER_OWNER);
        let evicted = match oldest_own.and_then(|ids| ids.front().cloned()) {
            Some(own) => Some(own),
            None if self.all.len() >= MAX_SESSIONS => self.all.front().map(|(oldest, _)| oldest.clone()),
            None => None,
        };
        if let Some(evicted) = evicted {
            if let Some(old) = self.remove(&evicted) {
                ended.push((evicted, old));
            }
        }
        self.by_owner.entry(session.owner.clone()).or_default().insert(id.clone());
        self.by_quota.entry(session.quota.clone()).or_default().insert(id.clone());
        self.all.insert(id, session);
        ended
    }
}

/// A session that ended holding resource subscriptions: its owner (an instance endpoint's), its id, and what it
/// held, so the instance can let go of them (`SessionTable::on_end`).
#[derive(Debug)]
pub struct EndedSession {
    pub owner: String,
    pub id: String,
    pub subscriptions: Vec<String>,
}

type OnEnd = Arc<dyn Fn(EndedSession) + Send + Sync>;

/// The hook `SessionTable::on_end` sets.
#[derive(Default)]
struct EndHook(std::sync::OnceLock<OnEnd>);

impl std::fmt::Debug for EndHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "EndHook(set)" } else { "EndHook(unset)" })
    }
}

#[derive(Debug, Default)]
pub struct SessionTable {
    sessions: Mutex<Sessions>,
    /// Server requests awaiting the client's answer and calls the client may cancel, per session.
    pub exchange: Arc<Exchange>,
    /// Cancelled at shutdown: every open GET stream ends (an open stream must not hold the drain).
    closing: CancellationToken,
    /// Told of each session that ends (removed, expired, evicted) holding subscriptions.
    on_end: EndHook,
}

impl SessionTable {
    /// Call `hook` for each session that ends holding resource subscriptions (once set, it stays).
    pub fn on_end(&self, hook: impl Fn(EndedSession) + Send + Sync + 'static) {
        let _ = self.on_end.0.set(Arc::new(hook));
    }

    /// End the sessions taken out of the table (outside its lock): their streams end, and the hook hears of
    /// those that held subscriptions.
    fn ended(&self, sessions: Vec<(String, Session)>) {
        for (id, session) in sessions {
            if let Some(stream) = &session.stream {
                stream.cancel();
            }
            if let (Some(hook), false) = (self.on_end.0.get(), session.subscriptions.is_empty()) {
                hook(EndedSession {
                    owner: session.owner,
                    id,
                    subscriptions: session.subscriptions.into_iter().collect(),
                });
            }
        }
    }

    /// A new session for `owner`; returns its id (UUID v4).
    pub fn create(&self, owner: &str, version: &str) -> String {
        self.create_with(owner, version, serde_json::Value::Null)
    }

    /// A new session for `owner` whose client declared `capabilities` at `initialize`.
    pub fn create_with(&self, owner: &str, version: &str, capabilities: serde_json::Value) -> String {
        self.create_in(owner, owner, version, capabilities)
    }

    /// `create_with`, counted against `quota`'s cap instead of the owner's.
    pub fn create_in(&self, owner: &str, quota: &str, version: &str, capabilities: serde_json::Value) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.insert(id.clone(), owner, quota, version, capabilities);
        id
    }

    /// What the client of session `id` declared it can do (null when unknown).
    pub fn capabilities(&self, id: &str) -> Arc<serde_json::Value> {
        self.sessions.lock().get(id).map(|s| s.capabilities.clone()).unwrap_or_default()
    }

    fn insert(&self, id: String, owner: &str, quota: &str, version: &str, capabilities: serde_json::Value) {
        let session = Session {
            owner: owner.to_owned(),
            quota: quota.to_owned(),
            version: version.to_owned(),
            last_seen: Instant::now(),
            stream: None,
            capabilities: Arc::new(capabilities),
            subscriptions: HashSet::new(),
        };
        let ended = self.sessions.lock().insert(id, session);
        self.ended(ended);
    }

    /// Look a session up for `owner`, refreshing it when known.
    pub fn touch(&self, id: &str, owner: &str) -> Lookup {
        let mut sessions = self.sessions.lock();
        match sessions.get_mut(id) {
            // An open GET stream keeps a session alive, as it does in `sweep`.
            Some(session)
                if session.owner == owner && (session.last_seen.elapsed() < SESSION_IDLE || session.streaming()) =>
            {
                session.last_seen = Instant::now();
                sessions.used(id, owner);
                Lookup::Known
            }
            _ => Lookup::Unknown,
        }
    }

    pub fn version(&self, id: &str) -> Option<String> {
        self.sessions.lock().get(id).map(|s| s.version.clone())
    }

    /// End a session the caller owns; false when there is none.
    pub fn remove(&self, id: &str, owner: &str) -> bool {
        let mut sessions = self.sessions.lock();
        if sessions.get(id).is_none_or(|s| s.owner != owner) {
            return false;
        }
        let removed = sessions.remove(id);
        drop(sessions);
        self.ended(removed.map(|session| (id.to_owned(), session)).into_iter().collect());
        true
    }

    /// Register the session's one standalone SSE stream; the token ends it with the session.
    pub fn open_stream(&self, id: &str, owner: &str) -> Result<CancellationToken, StreamError> {
        let mut sessions = self.sessions.lock();
        let session = sessions.get_mut(id).filter(|s| s.owner == owner).ok_or(StreamError::NoSession)?;
        if session.stream.as_ref().is_some_and(|s| !s.is_cancelled()) {
            return Err(StreamError::AlreadyOpen);
        }
        let token = self.closing.child_token();
        session.stream = Some(token.clone());
        session.last_seen = Instant::now();
        sessions.used(id, owner);
        Ok(token)
    }

    /// Record a resource subscription the server accepted for session `id` (or its end, `subscribed: false`);
    /// false when the session is gone (it ended while the request ran).
    pub fn set_subscription(&self, id: &str, uri: &str, subscribed: bool) -> bool {
        // Bounded like everything a client can make the satellite keep.
        const MAX_SUBSCRIPTIONS: usize = 1_000;
        let mut sessions = self.sessions.lock();
        let Some(session) = sessions.get_mut(id) else { return false };
        if !subscribed {
            session.subscriptions.remove(uri);
        } else if session.subscriptions.len() < MAX_SUBSCRIPTIONS {
            session.subscriptions.insert(uri.to_owned());
        }
        true
    }

    /// Whether any live session of `owner` holds a resource subscription (the server must stay up to send its
    /// updates: such an instance is not put to sleep).
    pub fn has_subscriptions(&self, owner: &str) -> bool {
        let sessions = self.sessions.lock();
        let Some(ids) = sessions.by_owner.get(owner) else { return false };
        ids.iter().any(|id| sessions.get(id).is_some_and(|s| !s.subscriptions.is_empty()))
    }

    /// The resources session `id` subscribed to.
    pub fn subscriptions(&self, id: &str) -> Vec<String> {
        self.sessions.lock().get(id).map(|s| s.subscriptions.iter().cloned().collect()).unwrap_or_default()
    }

    /// Whether session `id` subscribed to `uri`.
    pub fn subscribed(&self, id: &str, uri: &str) -> bool {
        self.sessions.lock().get(id).is_some_and(|s| s.subscriptions.contains(uri))
    }

    /// Shutdown: end every open GET stream and long-lived relayed stream now; requests in flight go on.
    pub fn close_streams(&self) {
        self.closing.cancel();
        self.exchange.close_long_lived();
    }

    /// Drop sessions idle longer than `idle`; returns how many.
    pub fn sweep(&self, idle: Duration) -> usize {
        let mut sessions = self.sessions.lock();
        let idle: Vec<String> = sessions
            .all
            .iter()
            // An open stream keeps a session alive.
            .filter(|(_, s)| !s.streaming() && s.last_seen.elapsed() >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        let ended: Vec<(String, Session)> =
            idle.into_iter().filter_map(|id| sessions.remove(&id).map(|session| (id, session))).collect();
        drop(sessions);
        let swept = ended.len();
        self.ended(ended);
        swept
    }

    pub fn len(&self) -> usize {
        self.sessions.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_belong_to_their_creator() {
        let table = SessionTable::default();
        let id = table.create("alice", "2025-06-18");
        assert_eq!(table.touch(&id, "alice"), Lookup::Known);
        assert_eq!(table.touch(&id, "bob"), Lookup::Unknown);
        assert!(!table.remove(&id, "bob"));
        assert_eq!(table.open_stream(&id, "bob"), Err(StreamError::NoSession));
        let stream = table.open_stream(&id, "alice").unwrap();
        assert_eq!(table.open_stream(&id, "alice"), Err(StreamError::AlreadyOpen));
        assert!(table.remove(&id, "alice"));
        assert!(stream.is_cancelled());
        assert_eq!(table.touch(&id, "alice"), Lookup::Unknown);
    }

    #[test]
    fn session_ids_are_visible_ascii_of_bounded_length() {
        assert!(well_formed(&SessionTable::default().create("a", "v")));
        assert!(well_formed("abc-DEF_123.~!"));
        for bad in ["", "has space", "tab\there", "é", &"x".repeat(MAX_SESSION_ID + 1)] {
            assert!(!well_formed(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_used_session() {
        let table = SessionTable::default();
        // Many owners, each under its own cap: the table's cap is what evicts.
        let owner = |n: usize| format!("owner-{}", n % 20);
        let ids: Vec<String> = (0..MAX_SESSIONS).map(|n| table.create(&owner(n), "v")).collect();
        let stream = table.open_stream(&ids[1], &owner(1)).map_err(|e| format!("{e:?}"));
        assert_eq!(table.touch(&ids[0], &owner(0)), Lookup::Known, "used again: now the most recent");
        table.create("newcomer", "v");
        assert_eq!(table.len(), MAX_SESSIONS);
        assert_eq!(table.touch(&ids[0], &owner(0)), Lookup::Known);
        assert_eq!(table.touch(&ids[1], &owner(1)), Lookup::Known, "its stream opened after ids[2] was made");
        assert_eq!(table.touch(&ids[2], &owner(2)), Lookup::Unknown, "the least recently used went");
        table.create("newcomer", "v");
        assert_eq!(table.touch(&ids[3], &owner(3)), Lookup::Unknown);
        assert_eq!(stream.map(|s| s.is_cancelled()), Ok(false));
    }

    /// A member's instance endpoints share one cap: with ten instances, opening sessions without end on each
    /// evicts only that member's own sessions, never another member's. (Each instance was an owner with a cap of
    /// its own, so ten of them filled the table and pushed out everyone else's.)
    #[test]
    fn one_members_many_instances_share_one_cap() {
        let table = SessionTable::default();
        let bob = table.create_in("instance:bob-demo", "bob", "v", serde_json::Value::Null);
        for n in 0..10 {
            for _ in 0..MAX_SESSIONS_PER_OWNER {
                table.create_in(&format!("instance:mallory-{n}"), "mallory", "v", serde_json::Value::Null);
            }
        }
        assert_eq!(table.touch(&bob, "instance:bob-demo"), Lookup::Known, "another member's session stays");
        assert_eq!(table.len(), MAX_SESSIONS_PER_OWNER + 1);
    }

    #[test]
    fn one_owner_opening_sessions_without_end_evicts_only_its_own() {
        let table = SessionTable::default();
        let alice = table.create("alice", "v");
        let carol = table.create("carol", "v");
        let stream = table.open_stream(&carol, "carol").map_err(|e| format!("{e:?}"));
        let mallory: Vec<String> = (0..MAX_SESSIONS + 10).map(|_| table.create("mallory", "v")).collect();
        assert_eq!(table.touch(&alice, "alice"), Lookup::Known, "the least recently used, yet not evicted");
        assert_eq!(table.touch(&carol, "carol"), Lookup::Known);
        assert_eq!(stream.map(|s| s.is_cancelled()), Ok(false));
        assert_eq!(table.len(), MAX_SESSIONS_PER_OWNER + 2);
        assert_eq!(table.touch(&mallory[0], "mallory"), Lookup::Unknown, "its own oldest went");
        assert_eq!(table.touch(mallory.last().map_or("", String::as_str), "mallory"), Lookup::Known);
        // Used again, an owner's session moves to the back of its own order too.
        let kept = &mallory[mallory.len() - MAX_SESSIONS_PER_OWNER];
        assert_eq!(table.touch(kept, "mallory"), Lookup::Known);
        table.create("mallory", "v");
        assert_eq!(table.touch(kept, "mallory"), Lookup::Known);
        assert_eq!(table.touch(&mallory[mallory.len() - MAX_SESSIONS_PER_OWNER + 1], "mallory"), Lookup::Unknown);
    }

    #[test]
    fn a_session_whose_stream_is_open_is_not_idle() {
        let table = SessionTable::default();
        let quiet = table.create("a", "v");
        let listening = table.create("a", "v");
        let stream = table.open_stream(&listening, "a").map_err(|e| format!("{e:?}"));
        let long_ago = Instant::now().checked_sub(SESSION_IDLE + Duration::from_secs(60));
        for id in [&quiet, &listening] {
            if let (Some(session), Some(at)) = (table.sessions.lock().get_mut(id), long_ago) {
                session.last_seen = at;
            }
        }
        assert_eq!(table.touch(&quiet, "a"), Lookup::Unknown, "idle past SESSION_IDLE");
        assert_eq!(table.touch(&listening, "a"), Lookup::Known, "its GET stream has been open all along");
        assert_eq!(stream.map(|s| s.is_cancelled()), Ok(false));
    }

    #[test]
    fn idle_sessions_are_swept() {
        let table = SessionTable::default();
        table.create("a", "v");
        let streaming = table.create("a", "v");
        let _stream = table.open_stream(&streaming, "a");
        assert_eq!(table.sweep(Duration::from_secs(60)), 0);
        assert_eq!(table.sweep(Duration::ZERO), 1, "an open stream keeps its session");
        assert_eq!(table.len(), 1);
        assert!(table.remove(&streaming, "a"));
        assert!(table.is_empty() && table.sessions.lock().by_owner.is_empty(), "no owner left behind");
        assert!(table.sessions.lock().by_quota.is_empty(), "no quota left behind");
    }
}
