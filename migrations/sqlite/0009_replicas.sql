-- Managed mode with replicas on one database (issue 18, docs/scale-out.md). Replicas share one identity with
-- the backend: whichever registers first keeps the credentials here (under an advisory lock), the others verify
-- and adopt them. Used on PostgreSQL; a lone SQLite satellite keeps its credentials in backend.key.json.
CREATE TABLE satellite_identity (
    satellite_name TEXT PRIMARY KEY NOT NULL,
    satellite_id   TEXT NOT NULL,
    api_key        TEXT NOT NULL,   -- as secret as backend.key.json: readable by whoever can read this database
    registered_at  TEXT NOT NULL,
    last_verified  TEXT NOT NULL
);

-- Commands the leader ran that change what a replica runs (configure, spawn, kill, restart, token-cache
-- invalidation): every other replica runs them too, in `id` order. Pruned after an hour.
CREATE TABLE replica_signals (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    origin  TEXT NOT NULL,   -- the replica that ran it first (it does not run it again)
    command TEXT NOT NULL,   -- the command as the backend sent it (JSON)
    at      TEXT NOT NULL
);
