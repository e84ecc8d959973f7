-- Drifted tools held out of discover and calls (`hold_drifted_tools`) until an admin accepts the change
-- (issue 17). Kept here so a restart does not release a tool nobody reviewed.
CREATE TABLE tool_holds (
    installation_id TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    process_id      TEXT NOT NULL,   -- the instance whose re-discovery found the drift
    held_at         TEXT NOT NULL,
    PRIMARY KEY (installation_id, tool_name)
);
