//! Log capture (BP §9): MCP servers' stderr and lifecycle lines become
//! `mcp.server.logs` events, tool calls become `mcp.request.logs` events.
//! Two buffers, turned into events of at most 20 entries each (BP §9), written
//! to the outbox 3 s after the first buffered entry, as soon as ten events'
//! worth (200 entries) or [`WRITE_BYTES`] of entries wait, and on shutdown. Server logs are grouped by
//! (installation, user), request logs by (installation, team). Secret values of the
//! instance (its secret env, header and query values, and any env value
//! whose name looks secret) are masked in every captured line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{Emitter, Event, RequestLogEntry, ServerLogEntry};
use crate::model::{iso, InstanceSpec};
use crate::secrets;

/// Entries per event, at most (BP §9's flush size).
pub const FLUSH_AT: usize = 20;
/// Entries in one buffer that are written at once, as events of [`FLUSH_AT`]: at thousands of calls a second
/// one outbox write per 200 calls instead of one per 20 (each write is a transaction and a hop to SQLite's
/// thread). Below that rate nothing changes: a buffer goes 3 s after its first entry, as BP §9 has it.
pub const WRITE_AT: usize = 10 * FLUSH_AT;
/// Longest an entry waits in a buffer.
pub const FLUSH_AFTER: Duration = Duration::from_secs(3);
/// Bytes of buffered entries (arguments, results, lines, event payloads; counted as their JSON text) that are
/// written at once, however few the entries: calls with large results are not held in memory by the megabyte
/// for 3 s, nor written as one huge transaction.
pub const WRITE_BYTES: usize = 512 * 1024;
/// What an entry costs beyond its variable text (ids, level, timestamp, keys), counted toward [`WRITE_BYTES`].
const ENTRY_OVERHEAD_BYTES: usize = 160;
/// Per-call events (`mcp.tool.executed`) that trigger an immediate flush: at thousands of calls a second, one
/// write of a few hundred rows instead of one write per call.
pub const EVENTS_FLUSH_AT: usize = 256;

#[derive(Debug, Clone)]
struct ServerLine {
    installation_id: String,
    team_id: String,
    user_id: String,
    entry: ServerLogEntry,
}

#[derive(Debug, Clone)]
struct RequestLine {
    installation_id: String,
    team_id: String,
    entry: RequestLogEntry,
}

#[derive(Debug, Default)]
struct Buffers {
    server: Vec<ServerLine>,
    requests: Vec<RequestLine>,
    /// Whole events written with the next flush (one per tool call).
    events: Vec<Event>,
    /// When the oldest buffered entry (of any kind) arrived.
    first_at: Option<Instant>,
    /// The buffered entries' size, as counted for [`WRITE_BYTES`].
    bytes: usize,
}

impl Buffers {
    /// Whether the buffers are to be written now rather than when their 3 s are up.
    fn full(&self) -> bool {
        self.server.len() >= WRITE_AT
            || self.requests.len() >= WRITE_AT
            || self.events.len() >= EVENTS_FLUSH_AT
            || self.bytes >= WRITE_BYTES
    }
}

/// The capture; cheap to clone.
#[derive(Debug, Clone)]
pub struct LogCapture {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    emitter: Emitter,
    buffers: Mutex<Buffers>,
    wake: Notify,
    /// Events written so far.
    emitted: std::sync::atomic::AtomicU64,
    /// Entries dropped because the buffers were full, not yet reported.
    dropped: std::sync::atomic::AtomicU64,
}

/// Bytes the buffers hold at most while a flush is stuck; past it new entries are dropped (and counted).
pub const MAX_BUFFERED_BYTES: usize = 64 * WRITE_BYTES;

/// The longest arguments or answer (as JSON text) a request log entry keeps; a longer one is logged as
/// [`omitted`]. An entry of more is no use: one event of it is more than the backend takes (its body limit is
/// 1 MiB, an upload batch stops at 512 KiB), so it would be held in the outbox for ever; and keeping it cost a copy
/// of the whole answer, then its event's text, then the database's, while the client's copy was being written.
pub const MAX_LOGGED_TEXT_BYTES: usize = 256 * 1024;

/// What a request log entry keeps instead of arguments or an answer of `bytes` bytes, over
/// [`MAX_LOGGED_TEXT_BYTES`]: `{"omitted": "…", "bytes": N}`.
pub fn omitted(bytes: usize) -> Box<RawValue> {
    let why = format!("larger than the {MAX_LOGGED_TEXT_BYTES} bytes a request log keeps");
    serde_json::value::to_raw_value(&serde_json::json!({"omitted": why, "bytes": bytes}))
        .unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// What one captured tool call was: its arguments and answer as JSON text, with the instance's secrets masked.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub tool_path: String,
    pub params: Box<RawValue>,
    pub response: Option<Box<RawValue>>,
    pub error: Option<String>,
    pub duration: Duration,
    /// The size of `params` and `response` as JSON text, as the caller measured them (for the byte bound).
    pub bytes: usize,
}

impl LogCapture {
    pub fn new(emitter: Emitter) -> Self {
        Self {
            inner: Arc::new(Inner {
                emitter,
                buffers: Mutex::new(Buffers::default()),
                wake: Notify::new(),
                emitted: Default::default(),
                dropped: Default::default(),
            }),
        }
    }

    /// A line for the instance's server log (stderr, lifecycle), masked.
    pub fn server_line(&self, spec: &InstanceSpec, level: &str, message: &str) {
        let masked = mask_secrets(spec, message);
        let line = ServerLine {
            installation_id: spec.installation_id.0.clone(),
            team_id: spec.team_id.0.clone(),
            user_id: spec.user_id.0.clone(),
            entry: ServerLogEntry { level: level.to_owned(), message: masked, timestamp: iso(Utc::now()) },
        };
        let bytes = ENTRY_OVERHEAD_BYTES + line.entry.message.len();
        self.push(bytes, |b| b.server.push(line));
    }

    /// A tool call that reached an instance; nothing when the installation turned request logging off.
    pub fn request(&self, spec: &InstanceSpec, record: RequestRecord) {
        if !spec.request_logging_enabled {
            return;
        }
        let bytes = ENTRY_OVERHEAD_BYTES + record.bytes + record.error.as_ref().map_or(0, String::len);
        let entry = RequestLogEntry {
            user_id: spec.user_id.0.clone(),
            tool_name: record.tool_path,
            tool_params: Some(record.params).filter(|params| params.get().starts_with('{') && reads_back(params.get())),
            response_time_ms: record.duration.as_millis() as u64,
            success: record.error.is_none(),
            timestamp: iso(Utc::now()),
            tool_response: record.response.filter(|response| reads_back(response.get())),
            error_message: record.error.map(|error| mask_secrets(spec, &error)),
        };
        let line =
            RequestLine { installation_id: spec.installation_id.0.clone(), team_id: spec.team_id.0.clone(), entry };
        self.push(bytes, |b| b.requests.push(line));
    }

    /// An event that happens on every call (`mcp.tool.executed`): written with the next flush, in one
    /// transaction with the others, instead of one database write on the call's own path.
    pub fn event(&self, event: Event) {
        let bytes = ENTRY_OVERHEAD_BYTES + event.data.as_ref().map_or_else(String::len, String::len);
        self.push(bytes, |b| b.events.push(event));
    }

    fn push(&self, bytes: usize, add: impl FnOnce(&mut Buffers)) {
        let wake = {
            let mut buffers = self.inner.buffers.lock();
            // A flush that cannot finish (the store stalled) must not let the buffers take all memory: past the
            // bound, entries are counted and dropped, and the next flush says how many.
            if buffers.bytes >= MAX_BUFFERED_BYTES {
                self.inner.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return;
            }
            let was_full = buffers.full();
            add(&mut buffers);
            buffers.bytes = buffers.bytes.saturating_add(bytes);
            let first = buffers.first_at.is_none();
            buffers.first_at.get_or_insert_with(Instant::now);
            first || (!was_full && buffers.full())
        };
        // The runner re-reads the buffers only when that changes what it waits for: the first entry starts the
        // 3 s clock, a buffer that just filled goes at once. Waking it on every call cost a task switch per call.
        if wake {
            self.inner.wake.notify_one();
        }
    }

    /// Turn everything buffered into events now.
    pub async fn flush(&self) -> usize {
        let taken = std::mem::take(&mut *self.inner.buffers.lock());
        let dropped = self.inner.dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 {
            tracing::error!(
                dropped,
                bytes = MAX_BUFFERED_BYTES,
                "log entries and call events dropped: the buffers were full while the event store stalled"
            );
        }
        let mut events = taken.events;
        let mut server: BTreeMap<(String, String), (String, Vec<ServerLogEntry>)> = BTreeMap::new();
        for line in taken.server {
            server
                .entry((line.installation_id, line.user_id))
                .or_insert_with(|| (line.team_id, Vec::new()))
                .1
                .push(line.entry);
        }
        for ((installation_id, user_id), (team_id, logs)) in server {
            for logs in in_events(logs, |line| ENTRY_OVERHEAD_BYTES + line.message.len()) {
                events.push(Event::server_logs(&installation_id, &team_id, &user_id, logs));
            }
        }
        let mut requests: BTreeMap<(String, String), Vec<RequestLogEntry>> = BTreeMap::new();
        for line in taken.requests {
            requests.entry((line.installation_id, line.team_id)).or_default().push(line.entry);
        }
        for ((installation_id, team_id), entries) in requests {
            for entries in in_events(entries, request_bytes) {
                events.push(Event::request_logs(&installation_id, &team_id, entries));
            }
        }
        let n = events.len();
        if n > 0 {
            self.inner.emitter.emit_all(events).await;
            self.inner.emitted.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        n
    }

    /// Entries waiting in the buffers.
    pub fn buffered(&self) -> usize {
        let buffers = self.inner.buffers.lock();
        buffers.server.len() + buffers.requests.len() + buffers.events.len()
    }

    /// Events this capture has written since it started.
    pub fn emitted(&self) -> u64 {
        self.inner.emitted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Flush at 200 log entries, 256 events, [`WRITE_BYTES`] or 3 s after the first, until cancelled; then flush
    /// what is left.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            let (due, full) = {
                let buffers = self.inner.buffers.lock();
                (buffers.first_at.map(|t| t + FLUSH_AFTER), buffers.full())
            };
            if full {
                self.flush().await;
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.inner.wake.notified() => continue,
                _ = sleep_until(due) => { self.flush().await; }
            }
        }
        self.flush().await;
    }
}

/// Bytes of entries (as [`entry_bytes`] counts them) one log event carries at most, unless one entry alone is more.
/// An event the backend refuses as too large is held in the outbox with every entry in it: a call with a result
/// of megabytes must go alone, not take the small calls logged beside it along.
pub const EVENT_BYTES: usize = 256 * 1024;

/// One group's entries, in order, as the entries of events of at most [`FLUSH_AT`] entries and [`EVENT_BYTES`].
fn in_events<T>(entries: Vec<T>, bytes: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut events: Vec<Vec<T>> = Vec::new();
    let mut size = 0;
    for entry in entries {
        let entry_size = bytes(&entry);
        match events.last_mut() {
            Some(event) if event.len() < FLUSH_AT && size + entry_size <= EVENT_BYTES => {
                size += entry_size;
                event.push(entry);
            }
            _ => {
                size = entry_size;
                events.push(vec![entry]);
            }
        }
    }
    events
}

/// What one request log entry weighs in its event: its arguments, answer and error, and the rest.
fn request_bytes(entry: &RequestLogEntry) -> usize {
    let text = |raw: &Option<Box<serde_json::value::RawValue>>| raw.as_ref().map_or(0, |r| r.get().len());
    ENTRY_OVERHEAD_BYTES
        + text(&entry.tool_params)
        + text(&entry.tool_response)
        + entry.error_message.as_ref().map_or(0, String::len)
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Replace the instance's secret values in `text` by their masked form.
/// How deep arguments or an answer may be nested and still be read back inside a request log event: the outbox
/// reads every event as a value, whose parser stops at 128 levels, and the event puts three around each entry's
/// (its data, the `requests` array, the entry); a few more are kept spare.
const MAX_LOGGED_DEPTH: usize = 120;

/// Whether JSON `text` reads back as a value inside a request log event: nested at most [`MAX_LOGGED_DEPTH`]
/// deep, and no number out of `f64`'s range (`1e400`, hundreds of digits), which the value parser refuses. A
/// server's answer is logged as the text it wrote, read without building a value and so without either check;
/// one the outbox could not read would hold back the whole event, every other call of it included.
fn reads_back(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            // To the closing quote, past escaped characters: most of an answer's bytes are in strings.
            b'"' => loop {
                match memchr::memchr2(b'"', b'\\', bytes.get(i + 1..).unwrap_or_default()) {
                    Some(at) if bytes[i + 1 + at] == b'\\' => i += at + 2,
                    Some(at) => {
                        i += at + 1;
                        break;
                    }
                    None => {
                        i = bytes.len();
                        break;
                    }
                }
            },
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_LOGGED_DEPTH {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' => {
                let start = i;
                while bytes.get(i + 1).is_some_and(|b| matches!(b, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')) {
                    i += 1;
                }
                let number = &text[start..=i];
                // Only an exponent or a run of over 300 digits can leave f64's range.
                let may_overflow = number.len() > 300 || number.contains(['e', 'E']);
                if may_overflow && !number.parse::<f64>().is_ok_and(f64::is_finite) {
                    return false;
                }
            }
            _ => {}
        }
        i += 1;
    }
    true
}

pub fn mask_secrets(spec: &InstanceSpec, text: &str) -> String {
    secrets::hide(text, &secrets::secret_values(spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn text(value: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&value).unwrap()
    }
    use crate::model::Upstream;
    use crate::model::{InstallationId, ProcessId, SecretNames, TeamId, UserId};
    use crate::store::{Outbox, Store};

    /// Events carry at most 20 entries and 256 KiB of them; an entry bigger than that goes alone, so the small
    /// entries logged beside it are not held back with it when the backend refuses it as too large (before, entries
    /// were grouped by count only).
    #[test]
    fn a_large_entry_goes_alone_and_the_small_ones_around_it_go_together() {
        let sizes = [10, 10, super::EVENT_BYTES + 1, 10, 10];
        let events = super::in_events(sizes.to_vec(), |size| *size);
        assert_eq!(events, [vec![10, 10], vec![super::EVENT_BYTES + 1], vec![10, 10]]);
        let many = super::in_events(vec![1; 45], |size| *size);
        assert_eq!(many.iter().map(Vec::len).collect::<Vec<_>>(), [20, 20, 5]);
        let heavy = super::in_events(vec![super::EVENT_BYTES / 2; 5], |size| *size);
        assert_eq!(heavy.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1], "by bytes before count");
        assert!(super::in_events(Vec::<usize>::new(), |size| *size).is_empty());
    }

    fn spec(user: &str, logging: bool) -> InstanceSpec {
        InstanceSpec {
            process_id: ProcessId(format!("gh-acme-{user}-i1")),
            instance_id: None,
            installation_id: InstallationId::from("i1"),
            installation_name: "GitHub".into(),
            team_id: TeamId::from("t1"),
            team_slug: "acme".into(),
            user_id: UserId::from(user),
            server_name: "github".into(),
            server_slug: "github".into(),
            upstream: Upstream::Stdio {
                command: "npx".into(),
                args: vec![],
                env: [("GITHUB_TOKEN".to_owned(), "ghp_supersecret123".to_owned()), ("MODE".into(), "fast".into())]
                    .into_iter()
                    .collect(),
            },
            enabled: true,
            instance_path: None,
            instance_token_hash: None,
            requires_oauth: false,
            request_logging_enabled: logging,
            secrets: SecretNames::default(),
            disabled_tools: Default::default(),
            access: crate::model::ToolAccess::open(),
            deployment: None,
            declared_tools: None,
            rediscover_every: None,
        }
    }

    async fn capture() -> (tempfile::TempDir, Outbox, LogCapture) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let capture = LogCapture::new(Emitter::new(store.outbox(), store.statuses()));
        (dir, store.outbox(), capture)
    }

    #[tokio::test]
    async fn server_lines_group_by_installation_and_user_with_secrets_masked() {
        let (_dir, store, capture) = capture().await;
        capture.server_line(&spec("alice", true), "error", "auth failed for token ghp_supersecret123 in fast mode");
        capture.server_line(&spec("bob", true), "info", "MCP Server started successfully");
        capture.server_line(&spec("alice", true), "info", "retrying");
        assert_eq!(capture.flush().await, 2);
        let events = store.events(Some("mcp.server.logs"), 0, 10).await.unwrap();
        let alice = events.iter().find(|e| e.data["user_id"] == "alice").unwrap();
        assert_eq!(alice.data["installation_id"], "i1");
        assert_eq!(alice.data["team_id"], "t1");
        let logs = alice.data["logs"].as_array().unwrap();
        assert_eq!(logs.len(), 2);
        assert_eq!(logs[0]["message"], "auth failed for token ghp***** in fast mode");
        assert_eq!(logs[0]["level"], "error");
        assert!(!events.iter().any(|e| e.data.to_string().contains("supersecret")));
    }

    #[tokio::test]
    async fn request_logs_group_by_installation_and_team_and_respect_the_switch() {
        let (_dir, store, capture) = capture().await;
        let ok = RequestRecord {
            tool_path: "github:list_repos".into(),
            params: text(json!({"owner": "x"})),
            response: Some(text(json!({"content": []}))),
            error: None,
            duration: Duration::from_millis(12),
            bytes: 40,
        };
        capture.request(&spec("alice", true), ok.clone());
        capture.request(
            &spec("bob", true),
            RequestRecord { response: None, error: Some("Channel not found".into()), ..ok.clone() },
        );
        capture.request(&spec("carol", false), ok);
        capture.flush().await;
        let events = store.events(Some("mcp.request.logs"), 0, 10).await.unwrap();
        assert_eq!(events.len(), 1, "one event per (installation, team)");
        let requests = events[0].data["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 2, "carol's installation settings turn logging off");
        assert_eq!(requests[0]["tool_name"], "github:list_repos");
        assert_eq!(requests[0]["success"], true);
        assert_eq!(requests[0]["response_time_ms"], 12);
        assert_eq!(requests[1]["success"], false);
        assert_eq!(requests[1]["error_message"], "Channel not found");
        assert!(requests[1].get("tool_response").is_none());
    }

    /// The capture's runner on paused time: the clock moves only when every task waits, so the 3 s are virtual
    /// and exact.
    fn paused_runner(capture: &LogCapture) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        tokio::time::pause();
        let cancel = CancellationToken::new();
        (cancel.clone(), tokio::spawn(capture.clone().run(cancel)))
    }

    /// Wait until `n` events were written. It spins (`yield_now`) so that the paused clock stands still while a
    /// flush writes to SQLite; a real deadline ends the wait if nothing comes.
    async fn wait_emitted(capture: &LogCapture, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while capture.emitted() < n && std::time::Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert!(capture.emitted() >= n, "{} events written, {n} expected", capture.emitted());
    }

    #[tokio::test]
    async fn a_buffer_goes_as_events_of_twenty_at_two_hundred_entries_or_three_seconds_after_the_first() {
        let (_dir, store, capture) = capture().await;
        let (cancel, runner) = paused_runner(&capture);
        let alice = spec("alice", true);
        let started = Instant::now();
        capture.server_line(&alice, "info", "one");
        tokio::time::sleep(FLUSH_AFTER - Duration::from_millis(10)).await;
        assert_eq!(capture.buffered(), 1, "a lone entry waits its 3 s");
        while capture.buffered() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(started.elapsed() >= FLUSH_AFTER, "flushed {:?} after the first entry", started.elapsed());
        wait_emitted(&capture, 1).await;

        // 25 entries of one group: two events (20 and 5), 3 s after the first.
        let started = Instant::now();
        for i in 0..FLUSH_AT + 5 {
            capture.server_line(&alice, "info", &format!("line {i}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(capture.buffered(), FLUSH_AT + 5, "fewer than 200 entries wait for the 3 s");
        while capture.buffered() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(started.elapsed() >= FLUSH_AFTER);
        wait_emitted(&capture, 3).await;

        // 200 entries go at once, as ten events of twenty, in order.
        let started = Instant::now();
        for i in 0..WRITE_AT {
            capture.server_line(&alice, "info", &format!("burst {i}"));
        }
        wait_emitted(&capture, 13).await;
        assert!(started.elapsed() < FLUSH_AFTER, "two hundred entries go at once, not after {:?}", started.elapsed());
        capture.server_line(&alice, "info", "last");
        tokio::time::resume();
        cancel.cancel();
        runner.await.unwrap();
        assert_eq!(store.event_count().await.unwrap(), 14, "shutdown flushes the rest");
        let events = store.events(Some("mcp.server.logs"), 0, 20).await.unwrap();
        let sizes: Vec<usize> = events.iter().map(|e| e.data["logs"].as_array().map_or(0, Vec::len)).collect();
        assert_eq!(sizes, [[1, 20, 5].as_slice(), &[20; 10], &[1]].concat(), "events of at most twenty entries");
        let burst: Vec<&str> = events[3..13]
            .iter()
            .flat_map(|e| e.data["logs"].as_array().unwrap())
            .filter_map(|l| l["message"].as_str())
            .collect();
        let expected: Vec<String> = (0..WRITE_AT).map(|i| format!("burst {i}")).collect();
        assert_eq!(burst, expected, "entries keep their order across events");
    }

    #[test]
    fn reading_back_skips_strings_whole_and_counts_depth_and_numbers_outside_them() {
        let nested = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        assert!(reads_back(&nested(MAX_LOGGED_DEPTH)));
        assert!(!reads_back(&nested(MAX_LOGGED_DEPTH + 1)));
        assert!(reads_back(&format!(r#"{{"a": "{}"}}"#, "[".repeat(500))), "brackets in a string are text");
        assert!(reads_back(r#"{"a": "\"1e400\" \\", "b": [1e-400, -2.5E+300, 12345678901234567890]}"#));
        assert!(!reads_back(r#"{"a": "x\\", "b": [1e400]}"#), "an escaped backslash ends no string early");
        assert!(!reads_back(&format!("[{}]", "7".repeat(400))));
    }

    /// Arguments or an answer that the outbox could not read back inside the event (nested past the value
    /// parser's limit, a number out of range) are left out of their entry; the event and its other calls go.
    #[tokio::test]
    async fn an_answer_the_outbox_could_not_read_back_is_left_out_and_the_event_still_goes() {
        let (_dir, store, capture) = capture().await;
        let raw = |text: String| -> Box<RawValue> { serde_json::from_str(&text).unwrap() };
        let deep = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        let record = |params: String, response: String| RequestRecord {
            tool_path: "github:get".into(),
            params: raw(params),
            response: Some(raw(response)),
            error: None,
            duration: Duration::from_millis(1),
            bytes: 10,
        };
        let alice = spec("alice", true);
        capture.request(&alice, record(r#"{"n": 1}"#.into(), r#"{"x": 1e400}"#.into()));
        capture.request(&alice, record(format!(r#"{{"a": {}}}"#, deep(126)), format!(r#"{{"b": {}}}"#, deep(126))));
        capture
            .request(&alice, record(r#"{"n": "-1e999 \"]]"}"#.into(), format!(r#"{{"x": 1e-7, "y": {}}}"#, deep(100))));
        capture.request(&alice, record(r#"{"n": 2}"#.into(), format!(r#"{{"big": {}}}"#, "9".repeat(400))));
        capture.flush().await;
        let events = store.events(Some("mcp.request.logs"), 0, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        let requests = events[0].data["requests"].as_array().cloned().unwrap_or_default();
        assert_eq!(requests.len(), 4, "the event reads back whole: {:?}", events[0].data);
        assert_eq!(requests[0]["tool_params"], json!({"n": 1}));
        assert!(requests[0].get("tool_response").is_none(), "1e400 is out of range");
        assert_eq!(requests[1]["tool_params"], json!({}), "nested too deep");
        assert!(requests[1].get("tool_response").is_none(), "nested too deep");
        assert_eq!(requests[2]["tool_params"], json!({"n": "-1e999 \"]]"}), "a string is not a number");
        assert_eq!(requests[2]["tool_response"]["x"], json!(1e-7), "small numbers and 100 levels are kept");
        assert!(requests[3].get("tool_response").is_none(), "400 digits are out of range");
    }

    /// Arguments a client sent as something other than an object (or none: `null`) are logged as `{}`, which the
    /// backend's schema requires; the answer is kept as it came.
    #[tokio::test]
    async fn arguments_that_are_not_an_object_are_logged_as_an_empty_one() {
        let (_dir, store, capture) = capture().await;
        for params in ["[1, 2]", "null", "\"text\"", " {\"spaced\": 1}"] {
            let record = RequestRecord {
                tool_path: "github:get".into(),
                params: serde_json::from_str(params).unwrap(),
                response: Some(text(json!([]))),
                error: None,
                duration: Duration::from_millis(1),
                bytes: 10,
            };
            capture.request(&spec("alice", true), record);
        }
        capture.flush().await;
        let events = store.events(Some("mcp.request.logs"), 0, 10).await.unwrap();
        let requests = events[0].data["requests"].as_array().cloned().unwrap_or_default();
        let params: Vec<&Value> = requests.iter().map(|r| &r["tool_params"]).collect();
        assert_eq!(params, [&json!({}), &json!({}), &json!({}), &json!({"spaced": 1})]);
        assert!(requests.iter().all(|r| r["tool_response"] == json!([])));
    }

    fn call(i: usize, response: Value) -> RequestRecord {
        let bytes = response.to_string().len() + 20;
        RequestRecord {
            tool_path: "github:get_file".into(),
            params: text(json!({"call": i})),
            response: Some(text(response)),
            error: None,
            duration: Duration::from_millis(3),
            bytes,
        }
    }

    /// A few calls with large results are written as soon as they add up to [`WRITE_BYTES`], not held for 3 s;
    /// a flush of many calls of one installation goes as events of twenty, in order, and large ones by bytes.
    #[tokio::test]
    async fn large_results_are_written_at_the_byte_bound_and_request_logs_go_as_events_of_twenty() {
        let (_dir, store, capture) = capture().await;
        let (cancel, runner) = paused_runner(&capture);
        let alice = spec("alice", true);
        let big = json!({"content": [{"type": "text", "text": "x".repeat(WRITE_BYTES / 4)}]});
        let started = Instant::now();
        for i in 0..3 {
            capture.request(&alice, call(i, big.clone()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(capture.buffered(), 3, "three quarters of the byte bound wait for their 3 s");
        capture.request(&alice, call(3, big.clone()));
        wait_emitted(&capture, 4).await;
        // Each is over half of EVENT_BYTES, so each is an event of its own.
        assert_eq!(capture.emitted(), 4, "the four large calls written at once");
        assert!(started.elapsed() < FLUSH_AFTER, "the byte bound writes at once, not after {:?}", started.elapsed());
        assert_eq!(capture.buffered(), 0);

        // Past the bound the count starts again: small calls wait for the clock.
        for i in 0..2 * FLUSH_AT + 5 {
            capture.request(&alice, call(100 + i, json!({"content": []})));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(capture.buffered(), 2 * FLUSH_AT + 5, "a written buffer's bytes are not counted again");
        tokio::time::resume();
        cancel.cancel();
        runner.await.unwrap();
        let events = store.events(Some("mcp.request.logs"), 0, 20).await.unwrap();
        let calls: Vec<Vec<i64>> = events
            .iter()
            .map(|e| {
                let requests = e.data["requests"].as_array().cloned().unwrap_or_default();
                requests.iter().filter_map(|r| r["tool_params"]["call"].as_i64()).collect()
            })
            .collect();
        let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1, 1, 1, 1, 20, 20, 5], "an event per large call, then events of at most twenty");
        let small: Vec<i64> = calls[4..].concat();
        assert_eq!(small, (100..100 + 2 * FLUSH_AT as i64 + 5).collect::<Vec<_>>(), "in the order they were made");
        let text = events[3].data["requests"][0]["tool_response"]["content"][0]["text"].as_str().map(str::len);
        assert_eq!(text, Some(WRITE_BYTES / 4), "results are kept whole");
    }

    /// A flush that cannot finish (the store stalled) does not let the buffers grow without bound: past
    /// `MAX_BUFFERED_BYTES` new entries are counted and dropped, and the next flush reports them.
    #[tokio::test]
    async fn buffers_stop_growing_at_their_bound_while_nothing_flushes() {
        let (_dir, _store, capture) = capture().await;
        let spec = spec("alice", true);
        let line = "x".repeat(64 * 1024);
        let fits = MAX_BUFFERED_BYTES / (line.len() + ENTRY_OVERHEAD_BYTES) + 1;
        for _ in 0..fits + 100 {
            capture.server_line(&spec, "info", &line);
        }
        assert_eq!(capture.buffered(), fits, "what fits in the bound");
        assert_eq!(capture.inner.dropped.load(std::sync::atomic::Ordering::Relaxed), 100);
        capture.flush().await;
        assert_eq!(capture.inner.dropped.load(std::sync::atomic::Ordering::Relaxed), 0, "reported once");
        capture.server_line(&spec, "info", "after");
        assert_eq!(capture.buffered(), 1, "taken again once flushed");
    }
}
