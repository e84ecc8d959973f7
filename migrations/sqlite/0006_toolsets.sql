-- Toolsets defined through the API (issue 17): a member's own (`owner` = their user id) or their team's
-- (`owner` = '', written by a team admin). Toolsets of the standalone config file are not stored here.
CREATE TABLE toolsets (
    team_id     TEXT NOT NULL,
    owner       TEXT NOT NULL,
    name        TEXT NOT NULL,
    description TEXT,
    patterns    TEXT NOT NULL,   -- JSON array of patterns over `server:tool`
    updated_at  TEXT NOT NULL,
    updated_by  TEXT NOT NULL,
    PRIMARY KEY (team_id, owner, name)
);

-- The toolset a member's sessions use when they select none.
CREATE TABLE toolset_defaults (
    team_id    TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    name       TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
