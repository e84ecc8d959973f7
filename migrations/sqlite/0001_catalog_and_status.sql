-- What each instance offered at its last successful discovery, so tools stay
-- searchable across restarts and while an instance is dormant or away.
CREATE TABLE instance_catalog (
    process_id         TEXT PRIMARY KEY NOT NULL,
    team_id            TEXT NOT NULL,
    user_id            TEXT NOT NULL,
    installation_id    TEXT NOT NULL,
    server_slug        TEXT NOT NULL,
    discovered_at      TEXT NOT NULL,
    resources          TEXT NOT NULL, -- JSON array of resource definitions
    resource_templates TEXT NOT NULL  -- JSON array of template definitions
);

CREATE TABLE catalog_tools (
    process_id   TEXT NOT NULL REFERENCES instance_catalog(process_id) ON DELETE CASCADE,
    position     INTEGER NOT NULL,
    name         TEXT NOT NULL,
    definition   TEXT NOT NULL, -- the normalised tool definition as JSON
    content_hash TEXT NOT NULL, -- sha-256 of definition
    PRIMARY KEY (process_id, name)
);

-- Every status an instance went through, newest kept (pruned per instance).
CREATE TABLE instance_status_history (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    process_id TEXT NOT NULL,
    team_id    TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    message    TEXT,
    at         TEXT NOT NULL
);
CREATE INDEX instance_status_history_by_process ON instance_status_history (process_id, id);
