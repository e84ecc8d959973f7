//! The event outbox (`Outbox`): events appended, claimed by the replica that sends them, held, counted, and
//! pruned to their bounds (count, age, bytes on disk). Rows only: the event types and payloads are `events`'
//! business.

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::sql::{Bind, Sql};
use super::{Db, Engine, StoreError};

/// An event to append: its registry name, emission time (ISO-8601), payload and the instance it is about.
/// `held` keeps it out of every batch with the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent<'a> {
    pub event_type: &'a str,
    pub emitted_at: String,
    /// The payload as JSON text.
    pub data: std::borrow::Cow<'a, str>,
    pub process_id: Option<&'a str>,
    pub held: Option<&'a str>,
}

/// An event as stored, with its position in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub event_type: String,
    pub emitted_at: String,
    pub data: Value,
    pub process_id: Option<String>,
    /// Why the event is kept but never sent, if it is.
    pub held: Option<String>,
}

/// What `Outbox::prune_events_to_bytes` did: the events it dropped, and the outbox's bytes it measured before
/// (0 when the cheap check showed it under the bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BytesPruned {
    pub events: u64,
    pub outbox: u64,
}

/// Bytes of the database on disk (`Outbox::disk_usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    /// What the outbox may take, overstated (SQLite: every live page of the file).
    pub used: u64,
    /// SQLite: pages the file keeps free, given back by `release_free_pages`.
    pub free: u64,
    /// SQLite: the file's page size; PostgreSQL: 8192, its block size.
    pub page_size: u64,
}

/// What the outbox holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSummary {
    pub count: i64,
    pub held: i64,
    pub oldest_emitted_at: Option<String>,
}

/// Free pages a SQLite file keeps before `release_free_pages` gives them back (below a quarter of the file).
const RELEASE_FREE_BYTES: u64 = 8 * 1024 * 1024;

const INSERT_EVENTS: &str = "INSERT INTO event_outbox (event_type, emitted_at, data, process_id, held)";

fn event_values(event: &NewEvent<'_>) -> Vec<Bind> {
    vec![
        Bind::Text(event.event_type.to_owned()),
        Bind::Text(event.emitted_at.clone()),
        Bind::Text(event.data.clone().into_owned()),
        event.process_id.into(),
        event.held.into(),
    ]
}

/// One event, inside a caller's transaction (a status change and its event are written together).
pub(super) async fn insert_event(
    engine: Engine,
    tx: &mut Transaction<'_, Any>,
    event: &NewEvent<'_>,
) -> Result<(), StoreError> {
    for statement in Sql::inserts(engine, INSERT_EVENTS, std::slice::from_ref(event), event_values) {
        statement.query().execute(&mut **tx).await?;
    }
    Ok(())
}

/// The event outbox; cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub(super) db: Db,
}

impl Outbox {
    /// Append events atomically, in order: a few multi-row statements (`Sql::inserts`), not one per event (each
    /// statement is a round trip to the connection's worker thread).
    pub async fn append_events(&self, events: &[NewEvent<'_>]) -> Result<(), StoreError> {
        let statements = Sql::inserts(self.db.engine, INSERT_EVENTS, events, event_values);
        super::sql::execute_all(&self.db.pool, &statements).await?;
        Ok(())
    }

    /// Events in emission order, optionally of one type, after `after_seq`, held ones included.
    pub async fn events(
        &self,
        event_type: Option<&str>,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, event_type, emitted_at, data, process_id, held FROM event_outbox
             WHERE seq > $1 AND ($2 IS NULL OR event_type = $2) ORDER BY seq LIMIT $3",
        )
        .bind(after_seq)
        .bind(event_type)
        .bind(limit)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter().map(stored).collect()
    }

    /// The oldest `limit` events that may be sent (not held), in emission order.
    pub async fn sendable_events(&self, limit: i64) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, event_type, emitted_at, data, process_id, held FROM event_outbox
             WHERE held IS NULL ORDER BY seq LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter().map(stored).collect()
    }

    /// Claim the oldest `limit` sendable events for the replica `owner` for `lease_ms`, in emission order. Events
    /// another replica holds under a live lease are passed over (on PostgreSQL with `FOR UPDATE SKIP LOCKED`, so
    /// claimers never wait for each other); events whose lease ran out (their claimer died mid-batch) and the
    /// owner's own claims are taken again. Leases are read on the database's clock, so replicas' clocks need not
    /// agree; `at_ms` stands in for that clock (tests).
    pub async fn claim_events(
        &self,
        owner: &str,
        limit: i64,
        lease_ms: i64,
        at_ms: Option<i64>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let sql = match self.db.engine {
            // Materialized, so the locked pick is made once however the planner joins it.
            Engine::Postgres => {
                "WITH picked AS MATERIALIZED (
                   SELECT seq FROM event_outbox
                   WHERE held IS NULL AND (claimed_until IS NULL OR claimed_by = $1
                         OR claimed_until < COALESCE($3, (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT))
                   ORDER BY seq LIMIT $4 FOR UPDATE SKIP LOCKED)
                 UPDATE event_outbox
                 SET claimed_by = $1,
                     claimed_until = COALESCE($3, (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT) + $2
                 FROM picked WHERE event_outbox.seq = picked.seq
                 RETURNING event_outbox.seq, event_outbox.event_type, event_outbox.emitted_at, event_outbox.data,
                           event_outbox.process_id, event_outbox.held"
            }
            // One writer at a time holds the whole file: nothing to skip.
            Engine::Sqlite => {
                "UPDATE event_outbox
                 SET claimed_by = $1,
                     claimed_until = COALESCE($3, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) + $2
                 WHERE seq IN (SELECT seq FROM event_outbox
                               WHERE held IS NULL AND (claimed_until IS NULL OR claimed_by = $1
                                     OR claimed_until < COALESCE($3, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)))
                               ORDER BY seq LIMIT $4)
                 RETURNING seq, event_type, emitted_at, data, process_id, held"
            }
        };
        let rows = sqlx::query(sql).bind(owner).bind(lease_ms).bind(at_ms).bind(limit).fetch_all(&self.db.pool).await?;
        let mut events = rows.iter().map(stored).collect::<Result<Vec<_>, _>>()?;
        events.sort_by_key(|e| e.seq);
        Ok(events)
    }

    /// Remove the events `seqs` that `owner` still claims (a batch the backend accepted or rejected for good);
    /// held events and what another replica took over stay.
    pub async fn delete_claimed(&self, owner: &str, seqs: &[i64]) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let mut sql = Sql::new("DELETE FROM event_outbox WHERE held IS NULL AND claimed_by = ");
        sql.push_bind(Bind::Text(owner.to_owned())).push(" AND seq IN (");
        for (i, seq) in seqs.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.push_bind(Bind::Int(*seq));
        }
        sql.push(")");
        Ok(sql.query().execute(&self.db.pool).await?.rows_affected())
    }

    /// A SQLite database has one satellite process: a claim found when its uploader starts is a dead process's,
    /// released at once instead of after its lease. (On PostgreSQL other replicas' claims are live.)
    pub async fn release_stale_claims(&self) -> Result<u64, StoreError> {
        if self.db.engine != Engine::Sqlite {
            return Ok(0);
        }
        let done =
            sqlx::query("UPDATE event_outbox SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by IS NOT NULL")
                .execute(&self.db.pool)
                .await?;
        Ok(done.rows_affected())
    }

    /// The replicas holding claims on events now (lapsed ones included), in claim order.
    pub async fn claims(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT claimed_by FROM event_outbox WHERE claimed_by IS NOT NULL GROUP BY claimed_by ORDER BY MIN(seq)",
        )
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter().map(|row| Ok(row.try_get("claimed_by")?)).collect()
    }

    /// Give up `owner`'s claims (at shutdown), so another replica sends them without waiting for the lease.
    pub async fn release_claims(&self, owner: &str) -> Result<u64, StoreError> {
        let done = sqlx::query("UPDATE event_outbox SET claimed_by = NULL, claimed_until = NULL WHERE claimed_by = $1")
            .bind(owner)
            .execute(&self.db.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Keep the event but never send it, for `reason`.
    pub async fn hold_event(&self, seq: i64, reason: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE event_outbox SET held = $1 WHERE seq = $2")
            .bind(reason)
            .bind(seq)
            .execute(&self.db.pool)
            .await?;
        Ok(())
    }

    /// Offer the held events `seqs` again (held by a refusal the backend no longer makes); returns how many.
    pub async fn release_held(&self, seqs: &[i64]) -> Result<u64, StoreError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let mut sql = Sql::new("UPDATE event_outbox SET held = NULL, claimed_by = NULL, claimed_until = NULL WHERE held IS NOT NULL AND seq IN (");
        for (i, seq) in seqs.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.push_bind(Bind::Int(*seq));
        }
        sql.push(")");
        Ok(sql.query().execute(&self.db.pool).await?.rows_affected())
    }

    /// Keep the newest `keep` events; returns how many were removed.
    pub async fn prune_events(&self, keep: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM event_outbox WHERE seq <= (SELECT seq FROM event_outbox ORDER BY seq DESC LIMIT 1 OFFSET $1)",
        )
        .bind(keep)
        .execute(&self.db.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Hold the outbox to `max_bytes` on disk, dropping the oldest events; returns how many went. Cheap while
    /// under: one look at the space that can only overstate the outbox's (SQLite: the file's live pages, every
    /// table; PostgreSQL: the outbox table's files, dead rows included). Only past it is the outbox itself
    /// measured: SQLite's pages of `event_outbox` (`dbstat`), PostgreSQL's stored payloads (`pg_column_size`, as
    /// compressed; its files keep dead rows until its vacuum, so they cannot say what is live). The other tables
    /// never count against the events: a big analytics table prunes none. Events are pruned to 90% of the bound,
    /// the payloads kept scaled by their share of the outbox's pages, so a busy satellite trims in steps.
    pub async fn prune_events_to_bytes(&self, max_bytes: u64) -> Result<BytesPruned, StoreError> {
        let none = |outbox| Ok(BytesPruned { events: 0, outbox });
        if self.disk_usage().await?.used <= max_bytes {
            return none(0);
        }
        let size = match self.db.engine {
            Engine::Sqlite => "octet_length(data)",
            // A row's other columns and header too: a table of small events is more than its payloads.
            Engine::Postgres => "(pg_column_size(data) + pg_column_size(event_type) + pg_column_size(emitted_at) + 32)",
        };
        let payloads: i64 =
            sqlx::query(&format!("SELECT CAST(COALESCE(SUM({size}), 0) AS BIGINT) AS n FROM event_outbox"))
                .fetch_one(&self.db.pool)
                .await?
                .try_get("n")?;
        let payloads = u64::try_from(payloads).unwrap_or(0);
        let outbox = match self.db.engine {
            Engine::Sqlite => self.outbox_pages().await?,
            Engine::Postgres => payloads,
        };
        if outbox <= max_bytes {
            return none(outbox);
        }
        let target = max_bytes / 10 * 9;
        let keep =
            u64::try_from(u128::from(target) * u128::from(payloads) / u128::from(outbox.max(1))).unwrap_or(u64::MAX);
        let done = sqlx::query(&format!(
            "DELETE FROM event_outbox WHERE seq <= (
               SELECT seq FROM (SELECT seq, SUM({size}) OVER (ORDER BY seq DESC) AS newer FROM event_outbox) AS kept
               WHERE newer > $1 ORDER BY seq DESC LIMIT 1)"
        ))
        .bind(i64::try_from(keep).unwrap_or(i64::MAX))
        .execute(&self.db.pool)
        .await?;
        Ok(BytesPruned { events: done.rows_affected(), outbox })
    }

    /// What the outbox takes on disk: SQLite, the pages of `event_outbox` (walked: not for every call);
    /// PostgreSQL, its stored payloads.
    pub async fn outbox_bytes(&self) -> Result<u64, StoreError> {
        match self.db.engine {
            Engine::Sqlite => self.outbox_pages().await,
            Engine::Postgres => {
                let n: i64 = sqlx::query(
                    "SELECT CAST(COALESCE(SUM(pg_column_size(data) + pg_column_size(event_type) + pg_column_size(emitted_at) + 32), 0) AS BIGINT) AS n FROM event_outbox",
                )
                        .fetch_one(&self.db.pool)
                        .await?
                        .try_get("n")?;
                Ok(u64::try_from(n).unwrap_or(0))
            }
        }
    }

    /// SQLite: the bytes of the pages `event_outbox` takes, overflow pages included.
    async fn outbox_pages(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query(
            "SELECT CAST(COALESCE(SUM(pgsize), 0) AS BIGINT) AS n FROM dbstat WHERE name = 'event_outbox' AND aggregate = 1",
        )
        .fetch_one(&self.db.pool)
        .await?
        .try_get("n")?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The space the outbox may take on disk, overstated, never under: SQLite's live pages (the whole file but its
    /// free pages) and its free pages; PostgreSQL's `event_outbox` table with its TOAST, dead rows included (its
    /// own vacuum reuses them: no free pages counted).
    pub async fn disk_usage(&self) -> Result<DiskUsage, StoreError> {
        let sql = match self.db.engine {
            Engine::Sqlite => {
                "SELECT (p.page_count - f.freelist_count) * s.page_size AS used, f.freelist_count * s.page_size AS free,
                        s.page_size AS page_size
                 FROM pragma_page_count() AS p, pragma_freelist_count() AS f, pragma_page_size() AS s"
            }
            Engine::Postgres => "SELECT pg_table_size('event_outbox') AS used, CAST(0 AS BIGINT) AS free, CAST(8192 AS BIGINT) AS page_size",
        };
        let row = sqlx::query(sql).fetch_one(&self.db.pool).await?;
        let bytes = |column: &str| -> Result<u64, StoreError> {
            Ok(u64::try_from(row.try_get::<i64, _>(column)?).unwrap_or(0))
        };
        Ok(DiskUsage { used: bytes("used")?, free: bytes("free")?, page_size: bytes("page_size")? })
    }

    /// SQLite: give back to the disk at most `at_most` bytes of the file's free pages, once those are
    /// `RELEASE_FREE_BYTES` or a quarter of the file (a file in incremental auto-vacuum mode; the store converts
    /// older files when it opens them). Returns the bytes given back. PostgreSQL's own vacuum does this there: 0.
    ///
    /// A pruning job passes what was free *before* it pruned (`disk_usage().free`, 0 on PostgreSQL): pages that stayed free since an earlier round, which
    /// the inserts meanwhile did not need. The pages its own prune just freed wait for a later round. On a busy
    /// satellite whose history is full, the next seconds' inserts reuse them; giving them back at once made SQLite
    /// move pages to shrink the file and then grow it again, page by page: 24% of its thread's time under load
    /// (docs/performance-history.md, 2026-12-01 22:30).
    pub async fn release_free_pages(&self, at_most: u64) -> Result<u64, StoreError> {
        if self.db.engine != Engine::Sqlite {
            return Ok(0);
        }
        let usage = self.disk_usage().await?;
        let free = usage.free.min(at_most);
        if free < RELEASE_FREE_BYTES && free.saturating_mul(3) < usage.used {
            return Ok(0);
        }
        // `incremental_vacuum(0)` would free the whole list.
        let pages = free / usage.page_size.max(1);
        if pages == 0 {
            return Ok(0);
        }
        // Every page the pragma frees is a row it steps through: sqlx's `execute` steps to the end. Its argument
        // is a number made here, not text from anywhere else.
        sqlx::query(&format!("PRAGMA incremental_vacuum({pages})")).execute(&self.db.pool).await?;
        Ok(usage.free.saturating_sub(self.disk_usage().await?.free))
    }

    /// Drop events emitted before `cutoff` (an ISO timestamp, compared as text in the one format `iso` writes).
    pub async fn prune_events_before(&self, cutoff: &str) -> Result<u64, StoreError> {
        let done =
            sqlx::query("DELETE FROM event_outbox WHERE emitted_at < $1").bind(cutoff).execute(&self.db.pool).await?;
        Ok(done.rows_affected())
    }

    /// Depth, held events and the oldest emission time of the outbox.
    pub async fn outbox_summary(&self) -> Result<OutboxSummary, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) AS n, COUNT(held) AS held, MIN(emitted_at) AS oldest FROM event_outbox")
            .fetch_one(&self.db.pool)
            .await?;
        Ok(OutboxSummary {
            count: row.try_get("n")?,
            held: row.try_get("held")?,
            oldest_emitted_at: row.try_get("oldest")?,
        })
    }

    /// The sequence number of the newest event ever appended (0 when none was): how many events were produced.
    pub async fn outbox_last_seq(&self) -> Result<i64, StoreError> {
        let sql = match self.db.engine {
            Engine::Sqlite => "SELECT seq FROM sqlite_sequence WHERE name = 'event_outbox'",
            // NULL until the sequence was first used.
            Engine::Postgres => {
                "SELECT pg_sequence_last_value(pg_get_serial_sequence('event_outbox', 'seq')::regclass) AS seq"
            }
        };
        let row = sqlx::query(sql).fetch_optional(&self.db.pool).await?;
        Ok(match row {
            Some(row) => row.try_get::<Option<i64>, _>("seq")?.unwrap_or(0),
            None => 0,
        })
    }

    /// How many events the outbox holds.
    pub async fn event_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) AS n FROM event_outbox").fetch_one(&self.db.pool).await?.try_get("n")?)
    }

    /// The newest event's sequence number less the oldest's, plus one (0 when empty): never less than the count,
    /// and read from the primary key's two ends, not by walking the table. (Two subqueries: SQLite uses the index
    /// for a lone `MIN` or `MAX` only.)
    pub async fn event_seq_span(&self) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE((SELECT MAX(seq) FROM event_outbox) - (SELECT MIN(seq) FROM event_outbox) + 1, 0)
                    AS BIGINT) AS n",
        )
        .fetch_one(&self.db.pool)
        .await?;
        Ok(row.try_get("n")?)
    }

    /// Deletes outbox rows behind the outbox's back: the gap a crashed writer or an operator leaves, for the
    /// uploader's tests in the crates above (`test-support`).
    #[cfg(any(test, feature = "test-support"))]
    pub async fn delete_events_for_tests(&self, seqs: &[i64]) -> Result<(), StoreError> {
        let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query(&format!("DELETE FROM event_outbox WHERE seq IN ({list})")).execute(&self.db.pool).await?;
        Ok(())
    }
}

fn stored(row: &AnyRow) -> Result<StoredEvent, StoreError> {
    let data: String = row.try_get("data")?;
    Ok(StoredEvent {
        seq: row.try_get("seq")?,
        event_type: row.try_get("event_type")?,
        emitted_at: row.try_get("emitted_at")?,
        // A row that is not JSON any more is still read (as its text), so the uploader can hold it and move on.
        data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
        process_id: row.try_get("process_id")?,
        held: row.try_get("held")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[tokio::test]
    async fn the_history_is_pruned_by_age_and_by_count() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path()).await?.outbox();
        let at = |day: u32| format!("2026-11-{day:02}T00:00:00.000Z");
        let rows: Vec<NewEvent<'_>> = (1..=9)
            .map(|day| NewEvent {
                event_type: "mcp.tool.executed",
                emitted_at: at(day),
                data: serde_json::json!({"day": day}).to_string().into(),
                process_id: None,
                held: None,
            })
            .collect();
        store.append_events(&rows).await?;
        assert_eq!(store.prune_events_before(&at(4)).await?, 3, "days 1-3 are older than the cutoff");
        assert_eq!(store.prune_events(4).await?, 2, "of days 4-9, the newest four stay");
        let left: Vec<Value> = store.events(None, 0, 100).await?.into_iter().map(|e| e.data["day"].clone()).collect();
        assert_eq!(left, [6, 7, 8, 9].map(Value::from));
        Ok(())
    }

    /// Request-log rows of about 10 KB each, numbered `n`.
    fn request_logs(numbers: std::ops::Range<u32>) -> Vec<NewEvent<'static>> {
        numbers
            .map(|n| NewEvent {
                event_type: "mcp.request.logs",
                emitted_at: "2026-11-29T00:00:00.000Z".into(),
                data: serde_json::json!({"n": n, "pad": "x".repeat(10_000)}).to_string().into(),
                process_id: None,
                held: None,
            })
            .collect()
    }

    /// 300 events of 10 KB (3 MB) against a 1 MiB bound: the oldest go until the file's live pages are back under
    /// it, the newest stay, and the freed pages go back to the disk.
    #[tokio::test]
    async fn the_history_is_held_to_its_bytes_and_the_file_shrinks() -> Result<(), Box<dyn std::error::Error>> {
        const MAX: u64 = 1024 * 1024;
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path()).await?.outbox();
        for first in (0..300).step_by(50) {
            store.append_events(&request_logs(first..first + 50)).await?;
        }
        let before = store.disk_usage().await?.used;
        assert!(before > 3 * MAX, "{before} bytes in use");
        assert_eq!(store.prune_events_to_bytes(before).await?.events, 0, "nothing goes while under the bound");
        // A pruning round: what was free before it prunes, then the prune.
        let free_before = store.disk_usage().await?.free;
        let pruned = store.prune_events_to_bytes(MAX).await?.events;
        let left = store.events(None, 0, 1000).await?;
        assert_eq!(pruned as usize + left.len(), 300);
        assert!((1..=95).contains(&left.len()), "{} events left", left.len());
        assert_eq!(left.last().map(|e| e.data["n"].clone()), Some(Value::from(299)), "the newest stay");
        assert!(store.outbox_bytes().await? <= MAX, "{} bytes of outbox after", store.outbox_bytes().await?);
        let file = dir.path().join("satellite.db");
        let grown = std::fs::metadata(&file)?.len() + std::fs::metadata(dir.path().join("satellite.db-wal"))?.len();
        // That round gives back only what was free before it: the pages it freed wait for a later round, which
        // finds them still free (no insert took them meanwhile) and gives them back.
        assert!(free_before < MAX, "{free_before} bytes free before the prune");
        assert_eq!(
            store.release_free_pages(free_before).await?,
            0,
            "the pages a prune just freed wait for a later round"
        );
        let released = store.release_free_pages(store.disk_usage().await?.free).await?;
        assert!(released > 2 * MAX, "{released} bytes given back");
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&store.db.pool).await?;
        let shrunk = std::fs::metadata(&file)?.len();
        assert!(shrunk < 2 * MAX && shrunk < grown, "the file is {shrunk} bytes (with its WAL {grown} before)");
        Ok(())
    }

    /// The other tables (analytics kept 90 days, catalogs) never count against the events: a file over the bound
    /// because of them prunes no event. Before, the events were scaled by their share of the whole file, and a big
    /// analytics table emptied the outbox tick after tick.
    #[tokio::test]
    async fn other_tables_never_prune_the_events() -> Result<(), Box<dyn std::error::Error>> {
        const MAX: u64 = 1024 * 1024;
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path()).await?.outbox();
        sqlx::query("CREATE TABLE filler (v TEXT)").execute(&store.db.pool).await?;
        for _ in 0..30 {
            sqlx::query("INSERT INTO filler VALUES (hex(randomblob(50000)))").execute(&store.db.pool).await?;
        }
        let rows = request_logs(0..20);
        store.append_events(&rows).await?;
        assert!(store.disk_usage().await?.used > 2 * MAX, "the file is over the bound");
        assert!(store.outbox_bytes().await? < MAX / 2, "the outbox is not");
        assert_eq!(store.prune_events_to_bytes(MAX).await?.events, 0);
        assert_eq!(store.event_count().await?, 20);
        Ok(())
    }
}
