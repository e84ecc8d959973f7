-- Every change a re-discovery found in an instance's tools (issue 17): `added`, `removed`, or `updated` with
-- the parts that changed; `drifted` marks a changed description or schema of a tool called within the drift
-- window (how tool poisoning arrives). Kept as the instance's tool history.
CREATE TABLE tool_changes (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              TEXT NOT NULL,
    process_id      TEXT NOT NULL,
    team_id         TEXT NOT NULL,
    installation_id TEXT NOT NULL,
    server_slug     TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    change          TEXT NOT NULL,   -- 'added' | 'removed' | 'updated'
    parts           TEXT NOT NULL,   -- JSON array of the changed parts of an 'updated' tool
    old_hash        TEXT,
    new_hash        TEXT,
    drifted         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tool_changes_by_process ON tool_changes (process_id, at);
