-- Every proxied call appends an outbox row (`mcp.tool.executed`), so each index on the outbox is written once per
-- call. No query reads `event_outbox_by_type`: the outbox is read in `seq` order (its primary key), by type only
-- in tests, and `$2 IS NULL OR event_type = $2` never uses it. Dropping it makes every append cheaper (issue 19).
DROP INDEX IF EXISTS event_outbox_by_type;
