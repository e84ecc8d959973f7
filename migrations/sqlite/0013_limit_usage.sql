-- Quotas on tool calls (issue 76): the calls each rule's counter took in a calendar period ('2026-12-06', '2026-12').
-- On PostgreSQL, replicas share these rows, so a quota holds across them.
CREATE TABLE limit_usage (
    rule      TEXT NOT NULL,
    counter   TEXT NOT NULL,   -- 'team/user', or 'team' for a rule of the whole team
    period    TEXT NOT NULL,
    calls     BIGINT NOT NULL,
    granted   BIGINT NOT NULL,  -- what the last take granted (read back by that take)
    PRIMARY KEY (rule, counter, period)
);
