-- Like successful calls of one session to one tool, made with no discover between them, are one row (issue 19:
-- a row per call cost more than the rest of a proxied call's records). `calls` is how many calls a row stands
-- for, and `duration_ms` becomes their total. Rows written before stand for one call each.
ALTER TABLE analytics_calls ADD COLUMN calls INTEGER NOT NULL DEFAULT 1;
