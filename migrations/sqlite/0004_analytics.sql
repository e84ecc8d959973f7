-- Token-savings analytics (docs/analytics.md). Rows are facts about what the satellite sent and did; the
-- figures (schema-only and realized savings, calls, hit rates) are computed from them by `store::analytics`.

-- Each tool's o200k token count (SB §15), counted once per discovery. NULL on rows saved before this
-- migration: the satellite counts those at start.
ALTER TABLE catalog_tools ADD COLUMN tokens INTEGER;

-- One `tools/list` answered: what the client was shown, and what a plain proxy would have sent it.
CREATE TABLE analytics_listings (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at             TEXT NOT NULL,    -- ISO-8601 UTC, millisecond precision
    team_id        TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    session        TEXT NOT NULL,    -- hash of the MCP session id, or 'stateless:<row>' for a 2026-07-28 request
    router         TEXT NOT NULL,    -- 'hierarchical' | 'instance'
    process_id     TEXT,             -- the instance, on the instance router
    installation_id TEXT,            -- its installation, on the instance router
    tools_shown    INTEGER NOT NULL, -- tool definitions in the answer
    shown_tokens   INTEGER NOT NULL, -- their tokens
    tools_visible  INTEGER NOT NULL, -- tools of the caller's instances that are up
    visible_tokens INTEGER NOT NULL, -- their tokens: what listing every tool would cost
    proxy_tokens   INTEGER NOT NULL  -- what a plain proxy would have sent for this listing: visible_tokens the
                                     -- first time in a session and after each change of the visible set, else 0
);
CREATE INDEX analytics_listings_by_time ON analytics_listings (at);
CREATE INDEX analytics_listings_by_session ON analytics_listings (session);

-- One `discover_mcp_tools` answered.
CREATE TABLE analytics_discovers (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    key           TEXT NOT NULL UNIQUE, -- random, made by the satellite: calls name the discover they followed
    at            TEXT NOT NULL,
    team_id       TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    session       TEXT NOT NULL,
    results       INTEGER NOT NULL, -- tools in the answer
    result_tokens INTEGER NOT NULL  -- tokens of the answer's text
);
CREATE INDEX analytics_discovers_by_time ON analytics_discovers (at);

-- One tool call that reached an instance (execute_mcp_tool or a direct call on the instance router).
CREATE TABLE analytics_calls (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              TEXT NOT NULL,
    team_id         TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    session         TEXT NOT NULL,
    router          TEXT NOT NULL,
    process_id      TEXT NOT NULL,
    installation_id TEXT NOT NULL,
    server_slug     TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    outcome         TEXT NOT NULL,   -- 'ok' | 'tool_error' (isError result) | 'error' (no result)
    duration_ms     INTEGER NOT NULL,
    discover_key    TEXT             -- the caller's recent discover that listed this tool, if any (a "hit")
);
CREATE INDEX analytics_calls_by_time ON analytics_calls (at);
CREATE INDEX analytics_calls_by_discover ON analytics_calls (discover_key);
