//! Lifecycle events (BP §8.4-§8.5): the closed set of event types
//! ([`EventKind`]), one typed constructor per event (`payload`), and the
//! `Emitter` that records them.
//!
//! An event counts as emitted once it is in the outbox (`store::Outbox`).
//! Status changes are written in the same transaction as the status history
//! row they report. In standalone mode the outbox is the event history that
//! analytics read; a managed satellite's uploader drains it to the backend.
//! A payload that cannot be serialised is still recorded, held with its
//! reason (never sent, never dropped silently), and logged.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde::Serialize;
use tracing::{error, warn};

use crate::model::{iso, InstanceSpec, InstanceStatus};
use crate::store::{NewEvent, Outbox, StatusHistory, StoreError};

mod payload;
mod throttle;

pub use payload::{
    AuthFailure, CallOutcome, ClientActivity, ClientConnected, ClientDisconnected, ConfigErrorKind, ConfigRefresh,
    CrashReport, LimitExceeded, LimitedResource, RequestLogEntry, ServerLogEntry, StopReason, ToolExecution,
};
pub use throttle::Throttle;

macro_rules! event_kinds {
    ($($variant:ident = $wire:literal),+ $(,)?) => {
        /// The event registry of BP §8.4, in its order: the one list of event types.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventKind {
            $($variant,)+
        }

        impl EventKind {
            /// Every type of the registry, in its order.
            pub const ALL: [EventKind; [$($wire),+].len()] = [$(EventKind::$variant),+];

            /// The registry name, as sent in an envelope's `type`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(EventKind::$variant => $wire,)+
                }
            }

            /// The kind with this registry name; `None` for a name the satellite does not know.
            pub fn parse(name: &str) -> Option<EventKind> {
                match name {
                    $($wire => Some(EventKind::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

event_kinds! {
    ServerStatusChanged = "mcp.server.status_changed",
    ServerLogs = "mcp.server.logs",
    RequestLogs = "mcp.request.logs",
    ToolsDiscovered = "mcp.tools.discovered",
    ToolsUpdated = "mcp.tools.updated",
    ServerStarted = "mcp.server.started",
    ServerCrashed = "mcp.server.crashed",
    ServerRestarted = "mcp.server.restarted",
    ServerPermanentlyFailed = "mcp.server.permanently_failed",
    ServerDormant = "mcp.server.dormant",
    ServerRespawned = "mcp.server.respawned",
    ServerLogRateLimitExceeded = "mcp.server.log_rate_limit_exceeded",
    ServerStopped = "mcp.server.stopped",
    ClientActivity = "mcp.client.activity",
    ClientConnected = "mcp.client.connected",
    ClientDisconnected = "mcp.client.disconnected",
    ToolExecuted = "mcp.tool.executed",
    ConfigRefreshed = "config.refreshed",
    ConfigError = "config.error",
    SecurityAuthFailed = "security.auth.failed",
    ResourceLimitExceeded = "resource.limit.exceeded",
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        EventKind::parse(&name).ok_or_else(|| serde::de::Error::custom(format!("Unknown event type: {name}")))
    }
}

/// One event ready for the outbox: its kind, the emission time, the payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    pub timestamp: DateTime<Utc>,
    /// The payload as the JSON text of an object, or why it could not be serialised into one. Text, not a
    /// `Value`: an event is written once, and a request-log batch carries twenty calls' arguments and results.
    pub data: Result<String, String>,
    /// The instance the event is about; the uploader keeps order per instance.
    pub process_id: Option<String>,
}

impl Event {
    /// An event of `kind` now, with `data` serialised; a payload that is not a JSON object is an error kept
    /// with the event.
    pub(crate) fn new(kind: EventKind, spec: Option<&InstanceSpec>, data: impl Serialize) -> Event {
        let data = match serde_json::to_string(&data) {
            Ok(text) if text.starts_with('{') => Ok(with_event_id(&text)),
            Ok(text) => Err(format!("payload is not a JSON object but {}", json_type(&text))),
            Err(err) => Err(format!("payload could not be serialised: {err}")),
        };
        Event { kind, timestamp: Utc::now(), data, process_id: spec.map(|s| s.process_id.0.clone()) }
    }

    /// The payload as a map, read back from its text (the outbox stores the text).
    #[cfg(test)]
    pub(crate) fn payload(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        serde_json::from_str(self.data.as_deref().ok()?).ok()
    }

    /// The row the outbox stores for this event.
    fn row(&self) -> NewEvent<'_> {
        NewEvent {
            event_type: self.kind.as_str(),
            emitted_at: iso(self.timestamp),
            data: std::borrow::Cow::Borrowed(self.data.as_deref().unwrap_or("null")),
            process_id: self.process_id.as_deref(),
            held: self.data.as_ref().err().map(String::as_str),
        }
    }
}

/// The payload's text with its dedupe key first (`{"event_id":"<UUIDv7>",…}`): given once, when the fact is recorded,
/// and kept through every retry, so a backend that stores each `event_id` once counts each fact once however often a
/// slow answer makes the satellite send it (proto/README.md). `text` is serde_json's text of an object.
fn with_event_id(text: &str) -> String {
    let rest = &text[1..];
    let separator = if rest.starts_with('}') { "" } else { "," };
    format!("{{\"event_id\":\"{}\"{separator}{rest}", uuid::Uuid::now_v7())
}

/// What a JSON text holds, by its first character (the text is serde_json's own output).
fn json_type(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

/// Records events in the outbox; cheap to clone.
#[derive(Debug, Clone)]
pub struct Emitter {
    outbox: Outbox,
    /// Status changes are written with their event (`status_changed`).
    statuses: StatusHistory,
    /// Events the outbox could not take (a full disk, a database locked past its timeout), written first with
    /// the next events and by `retry_unwritten`, so a passing failure loses none. Bounded by
    /// `MAX_UNWRITTEN_BYTES`: past it the oldest are dropped, each logged with its data.
    unwritten: Arc<Mutex<Unwritten>>,
}

#[derive(Debug, Default)]
struct Unwritten {
    /// Each with the writes it failed so far.
    events: std::collections::VecDeque<(Event, u32)>,
    bytes: usize,
}

/// Events refused one after the other before the rest of a batch is kept without trying each.
const REFUSED_IN_A_ROW: usize = 3;

/// Writes one event may fail before it is given up (logged with its data): a row the store refuses for good
/// must not hold back the ones after it for ever.
const MAX_WRITE_ATTEMPTS: u32 = 5;

/// Bytes of event payloads kept in memory while the outbox refuses writes, at most.
pub const MAX_UNWRITTEN_BYTES: usize = 16 * 1024 * 1024;

fn event_bytes(event: &Event) -> usize {
    event.data.as_ref().map_or_else(String::len, String::len) + 64
}

/// A batch on its way to the outbox: if the write is abandoned (the future awaiting it dropped, a client gone, a
/// shutdown's deadline), its events go back to the front of the queue instead of vanishing.
struct InFlight<'a> {
    emitter: &'a Emitter,
    events: Vec<(Event, u32)>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let mut unwritten = self.emitter.unwritten.lock();
        for (event, attempts) in std::mem::take(&mut self.events).into_iter().rev() {
            unwritten.bytes += event_bytes(&event);
            unwritten.events.push_front((event, attempts));
        }
    }
}

impl Emitter {
    pub fn new(outbox: Outbox, statuses: StatusHistory) -> Self {
        Self { outbox, statuses, unwritten: Arc::default() }
    }

    /// Write the event to the outbox. A payload that could not be serialised is recorded as held (kept, never
    /// sent) and logged; a write that fails is kept in memory and tried again (`Emitter::unwritten`).
    pub async fn emit(&self, event: Event) {
        self.emit_all(vec![event]).await;
    }

    /// Write several events to the outbox in one transaction, after those an earlier write could not take.
    pub async fn emit_all(&self, events: Vec<Event>) {
        for event in &events {
            if let Err(reason) = &event.data {
                error!(event_type = %event.kind, process_id = event.process_id.as_deref().unwrap_or("-"), reason = %reason,
                       "event payload could not be serialised; kept in the outbox as held, not sent");
            }
        }
        let mut batch = self.take_unwritten();
        batch.extend(events.into_iter().map(|event| (event, 0)));
        self.write(batch).await;
    }

    /// Write what earlier writes could not, now; how many events were still waiting.
    pub async fn retry_unwritten(&self) -> usize {
        let batch = self.take_unwritten();
        let waiting = batch.len();
        if waiting > 0 {
            self.write(batch).await;
        }
        waiting
    }

    /// Events waiting in memory for the outbox to take them.
    pub fn unwritten(&self) -> usize {
        self.unwritten.lock().events.len()
    }

    fn take_unwritten(&self) -> Vec<(Event, u32)> {
        let mut unwritten = self.unwritten.lock();
        unwritten.bytes = 0;
        std::mem::take(&mut unwritten.events).into()
    }

    async fn write(&self, events: Vec<(Event, u32)>) {
        if events.is_empty() {
            return;
        }
        let mut batch = InFlight { emitter: self, events };
        let rows: Vec<NewEvent<'_>> = batch.events.iter().map(|(event, _)| event.row()).collect();
        let written = self.outbox.append_events(&rows).await;
        drop(rows);
        let Err(err) = written else {
            batch.events.clear();
            return;
        };
        // The batch is refused whole; each event is tried alone so one bad row holds back nothing else. A store
        // that refuses several in a row refuses them all (a full disk, a lock): the rest are not tried.
        warn!(error = %err, events = batch.events.len(), "writing a batch of events failed; writing them one by one");
        // (event, its failed writes, whether it was tried in this round)
        let mut failed: Vec<(Event, u32, bool)> = Vec::new();
        let (mut refused_in_a_row, mut wrote_any, mut last_error) = (0, false, None);
        while !batch.events.is_empty() {
            let (event, attempts) = batch.events.remove(0);
            if refused_in_a_row >= REFUSED_IN_A_ROW {
                failed.push((event, attempts, false));
                continue;
            }
            match self.outbox.append_events(&[event.row()]).await {
                Ok(()) => (refused_in_a_row, wrote_any) = (0, true),
                Err(err) => {
                    refused_in_a_row += 1;
                    last_error = Some(err);
                    failed.push((event, attempts, true));
                }
            }
        }
        if let Some(err) = last_error {
            error!(error = %err, events = failed.len(), "the outbox refused events; kept in memory and tried again");
        }
        // A refusal counts against an event only when the store took others meanwhile: a store that is down
        // refuses everything, and its events wait for it however long that takes (within the memory bound).
        self.keep(failed.into_iter().map(|(event, attempts, tried)| (event, attempts + u32::from(tried && wrote_any))));
    }

    /// Keep events the outbox refused, dropping those refused `MAX_WRITE_ATTEMPTS` times and the oldest past
    /// `MAX_UNWRITTEN_BYTES` (each logged with its data, the last trace of it).
    fn keep(&self, events: impl Iterator<Item = (Event, u32)>) {
        let dropped = |event: &Event, why: &str| {
            let data = event.data.as_deref().unwrap_or_default();
            error!(event_type = %event.kind, process_id = event.process_id.as_deref().unwrap_or("-"), data = %data,
                   "event dropped: {why}");
        };
        let mut unwritten = self.unwritten.lock();
        for (event, attempts) in events {
            if attempts >= MAX_WRITE_ATTEMPTS {
                dropped(&event, "the outbox refused it every time it was written");
                continue;
            }
            unwritten.bytes += event_bytes(&event);
            unwritten.events.push_back((event, attempts));
        }
        while unwritten.bytes > MAX_UNWRITTEN_BYTES {
            let Some((event, _)) = unwritten.events.pop_front() else { break };
            unwritten.bytes = unwritten.bytes.saturating_sub(event_bytes(&event));
            dropped(&event, "the outbox refused it for too long and the memory kept for it is full");
        }
    }

    /// Record a status change and its event in one transaction.
    pub async fn status_changed(
        &self,
        spec: &InstanceSpec,
        status: InstanceStatus,
        message: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let event = Event::status_changed(spec, status, message, at);
        // Events the outbox refused earlier go first: a status kept from then must not land after this newer one.
        if self.unwritten() > 0 {
            self.retry_unwritten().await;
        }
        if self.unwritten() > 0 {
            // Still refused: this event waits behind them, in order; the history row is recorded now if it can be.
            self.keep(std::iter::once((event, 0)));
            return self.statuses.record_status(spec, status, message, at, None).await;
        }
        let recorded = self.statuses.record_status(spec, status, message, at, Some(&event.row())).await;
        if recorded.is_err() {
            // The history row goes with the refused transaction; the event, which the backend needs to show the
            // status, is kept and written later like every other event the outbox refuses.
            self.keep(std::iter::once((event, 0)));
        }
        recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn the_registry_is_closed_and_round_trips() {
        assert_eq!(EventKind::ALL.len(), 21);
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert_eq!(EventKind::parse("mcp.unknown.event"), None);
        assert!(serde_json::from_value::<EventKind>("mcp.unknown.event".into()).is_err());
    }

    /// A payload whose serialisation fails.
    struct Unserialisable;

    impl Serialize for Unserialisable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("a map key that is not a string"))
        }
    }

    #[tokio::test]
    async fn an_unserialisable_payload_is_reported_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let emitter = Emitter::new(store.outbox(), store.statuses());
        let event = Event::new(EventKind::ToolExecuted, None, Unserialisable);
        assert!(event.data.as_ref().unwrap_err().contains("a map key that is not a string"));
        emitter.emit(event).await;
        emitter.emit(Event::new(EventKind::ConfigRefreshed, None, 42)).await;
        let kept = store.outbox().events(None, 0, 10).await.unwrap();
        assert_eq!(kept.len(), 2, "both events are kept");
        assert_eq!(kept[0].event_type, "mcp.tool.executed");
        assert!(kept[0].held.as_deref().unwrap().contains("could not be serialised"));
        assert!(kept[1].held.as_deref().unwrap().contains("not a JSON object"));
        assert_eq!(store.outbox().sendable_events(10).await.unwrap(), vec![], "a held event is never sent");
    }

    use serde_json::Value;

    /// Take the outbox table away (`gone`), so the store refuses every event write, or bring it back.
    async fn outbox_gone(store: &Store, gone: bool) {
        let (from, to) =
            if gone { ("event_outbox", "event_outbox_away") } else { ("event_outbox_away", "event_outbox") };
        sqlx::query(&format!("ALTER TABLE {from} RENAME TO {to}")).execute(store.pool()).await.unwrap();
    }

    /// A store that refuses writes for a while (here its outbox table is gone) loses no event: they are kept in
    /// memory and written first with the next ones, or by `retry_unwritten`. Before, each was logged and dropped.
    #[tokio::test]
    async fn events_the_outbox_refused_are_written_once_it_takes_them_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let emitter = Emitter::new(store.outbox(), store.statuses());
        outbox_gone(&store, true).await;
        emitter.emit(Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"n": 1}))).await;
        emitter
            .emit_all(
                (2..6).map(|n| Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"n": n}))).collect(),
            )
            .await;
        assert_eq!(emitter.unwritten(), 5, "every refused event is kept");
        assert_eq!(emitter.retry_unwritten().await, 5);
        assert_eq!(emitter.unwritten(), 5, "still refused");

        outbox_gone(&store, false).await;
        emitter.emit(Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"n": 6}))).await;
        assert_eq!(emitter.unwritten(), 0);
        let kept: Vec<Value> =
            store.outbox().events(None, 0, 10).await.unwrap().into_iter().map(|e| e.data["n"].clone()).collect();
        assert_eq!(kept, (1..=6).map(Value::from).collect::<Vec<_>>(), "all of them, in order");
    }

    /// A status change the store refuses (the outbox gone for a while) keeps its event like any other, written
    /// once the store takes it again. Before, its write went straight to the store, and the backend never heard of
    /// the change (a `permanently_failed` instance shown online until its next change).
    #[tokio::test]
    async fn a_status_change_the_store_refused_is_written_later() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let emitter = Emitter::new(store.outbox(), store.statuses());
        outbox_gone(&store, true).await;
        let spec = crate::model::sample_spec();
        let failed =
            emitter.status_changed(&spec, InstanceStatus::PermanentlyFailed, Some("crashed"), Utc::now()).await;
        assert!(failed.is_err(), "the store refused it");
        assert_eq!(emitter.unwritten(), 1, "its event is kept");
        outbox_gone(&store, false).await;
        // A newer change lands after it, not before.
        emitter.status_changed(&spec, InstanceStatus::Online, None, Utc::now()).await.expect("taken");
        assert_eq!(emitter.unwritten(), 0);
        let kept = store.outbox().events(Some("mcp.server.status_changed"), 0, 10).await.unwrap();
        let statuses: Vec<&Value> = kept.iter().map(|e| &e.data["status"]).collect();
        assert_eq!(statuses, [&Value::from("permanently_failed"), &Value::from("online")]);
    }

    /// A row the store refuses for good (here a trigger refuses it) is given up after `MAX_WRITE_ATTEMPTS` writes
    /// in which others were taken, so it does not ride along with every later write for ever; the others are all
    /// written, in order.
    #[tokio::test]
    async fn a_row_refused_for_good_is_given_up_and_the_others_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let emitter = Emitter::new(store.outbox(), store.statuses());
        sqlx::query(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON event_outbox WHEN NEW.data LIKE '%poison%'
             BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .execute(store.pool())
        .await
        .unwrap();
        let event = |n: u32| Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"n": n}));
        emitter.emit(Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"poison": true}))).await;
        assert_eq!(emitter.unwritten(), 1);
        let mut rounds = 0;
        while emitter.unwritten() > 0 {
            rounds += 1;
            assert!(rounds <= MAX_WRITE_ATTEMPTS, "still kept after {rounds} writes");
            emitter.emit(event(rounds)).await;
        }
        assert_eq!(rounds, MAX_WRITE_ATTEMPTS, "given up after its attempts, not before");
        let kept: Vec<Value> =
            store.outbox().events(None, 0, 10).await.unwrap().into_iter().map(|e| e.data["n"].clone()).collect();
        assert_eq!(kept, (1..=MAX_WRITE_ATTEMPTS).map(Value::from).collect::<Vec<_>>());
    }

    /// A write abandoned while it waits for the database (the future awaiting it dropped: a client gone, a
    /// deadline) puts its events back in the queue; they are written with the next write.
    #[tokio::test]
    async fn an_abandoned_write_keeps_its_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).await.unwrap();
        let emitter = Emitter::new(store.outbox(), store.statuses());
        let mut holder = store.pool().acquire().await.unwrap();
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *holder).await.unwrap();
        let events = (1..=3).map(|n| Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"n": n})));
        let abandoned =
            tokio::time::timeout(std::time::Duration::from_millis(200), emitter.emit_all(events.collect())).await;
        assert!(abandoned.is_err(), "the write waits for the database's lock");
        assert_eq!(emitter.unwritten(), 3, "back in the queue");
        sqlx::query("ROLLBACK").execute(&mut *holder).await.unwrap();
        drop(holder);
        assert_eq!(emitter.retry_unwritten().await, 3);
        let kept: Vec<Value> =
            store.outbox().events(None, 0, 10).await.unwrap().into_iter().map(|e| e.data["n"].clone()).collect();
        assert_eq!(kept, (1..=3).map(Value::from).collect::<Vec<_>>());
    }

    #[test]
    fn the_oldest_unwritten_events_go_first_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = runtime.block_on(Store::open(dir.path())).unwrap();
        let emitter = Emitter::new(store.outbox(), store.statuses());
        let big = "x".repeat(MAX_UNWRITTEN_BYTES / 4);
        let events =
            (0..6).map(|n| Event::new(EventKind::ConfigRefreshed, None, serde_json::json!({"n": n, "pad": big})));
        emitter.keep(events.map(|event| (event, 0)));
        assert_eq!(emitter.unwritten(), 3, "what fits in the bound");
        let first = emitter.unwritten.lock().events.front().and_then(|(e, _)| e.payload()).unwrap()["n"].clone();
        assert_eq!(first, 3, "the newest are kept");
    }
}
