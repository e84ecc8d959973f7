//! The event outbox.

use serde_json::Value;
use sqlx::{Row, Sqlite, Transaction};

use super::{Store, StoreError};
use crate::events::{iso, Event};

/// An event as stored, with its position in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub event_type: String,
    pub emitted_at: String,
    pub data: Value,
    pub process_id: Option<String>,
}

pub(super) async fn insert_event(tx: &mut Transaction<'_, Sqlite>, event: &Event) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO event_outbox (event_type, emitted_at, data, process_id) VALUES (?, ?, ?, ?)")
        .bind(event.event_type)
        .bind(iso(event.timestamp))
        .bind(event.data.to_string())
        .bind(event.process_id.as_deref())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Store {
    /// Append events in one transaction, in order.
    pub async fn append_events(&self, events: &[Event]) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        for event in events {
            insert_event(&mut tx, event).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Events in emission order, optionally of one type, after `after_seq`.
    pub async fn events(
        &self,
        event_type: Option<&str>,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT seq, event_type, emitted_at, data, process_id FROM event_outbox
             WHERE seq > ?1 AND (?2 IS NULL OR event_type = ?2) ORDER BY seq LIMIT ?3",
        )
        .bind(after_seq)
        .bind(event_type)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|row| {
                let data: String = row.try_get("data")?;
                Ok(StoredEvent {
                    seq: row.try_get("seq")?,
                    event_type: row.try_get("event_type")?,
                    emitted_at: row.try_get("emitted_at")?,
                    data: serde_json::from_str(&data)?,
                    process_id: row.try_get("process_id")?,
                })
            })
            .collect()
    }

    /// Keep the newest `keep` events; returns how many were removed.
    pub async fn prune_events(&self, keep: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM event_outbox WHERE seq <= (SELECT seq FROM event_outbox ORDER BY seq DESC LIMIT 1 OFFSET ?)",
        )
        .bind(keep)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    /// Remove the events `first..=last` (a batch the backend accepted or rejected for good).
    pub async fn delete_events(&self, first: i64, last: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM event_outbox WHERE seq >= ? AND seq <= ?")
            .bind(first)
            .bind(last)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }

    /// How many events the outbox holds.
    pub async fn event_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) AS n FROM event_outbox").fetch_one(self.pool()).await?.try_get("n")?)
    }
}
