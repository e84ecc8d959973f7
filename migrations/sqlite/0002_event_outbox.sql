-- Lifecycle events (BP §8.4), written before they count as emitted. A
-- managed satellite uploads them in `seq` order and deletes what the backend
-- accepted; a standalone satellite keeps them as its event history.
CREATE TABLE event_outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    event_type TEXT NOT NULL,
    emitted_at TEXT NOT NULL, -- ISO-8601, the envelope timestamp
    data       TEXT NOT NULL, -- the event's `data` object as JSON
    process_id TEXT           -- the instance the event is about, if any
);
CREATE INDEX event_outbox_by_type ON event_outbox (event_type, seq);
