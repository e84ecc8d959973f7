//! Instance status history (`StatusHistory`): each instance's newest statuses, written with the event that
//! reports the change.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::sql::TxConnection;
use super::{Db, StoreError, STATUS_HISTORY_KEPT};
use crate::model::{InstanceSpec, InstanceStatus, ProcessId};

#[derive(Debug, Clone, PartialEq)]
pub struct StatusRecord {
    pub status: String,
    pub message: Option<String>,
    pub at: String,
}

/// The instances' status history; cheap to clone.
#[derive(Debug, Clone)]
pub struct StatusHistory {
    pub(super) db: Db,
}

impl StatusHistory {
    /// Append a status change (and the event that reports it, in the same transaction) and prune the instance's history to the newest rows.
    pub async fn record_status(
        &self,
        spec: &InstanceSpec,
        status: InstanceStatus,
        message: Option<&str>,
        at: DateTime<Utc>,
        event: Option<&super::NewEvent<'_>>,
    ) -> Result<(), StoreError> {
        let mut conn = TxConnection::acquire(&self.db.pool).await?;
        let mut tx = conn.begin().await?;
        if let Some(event) = event {
            super::outbox::insert_event(self.db.engine, &mut tx, event).await?;
        }
        sqlx::query("INSERT INTO instance_status_history (process_id, team_id, user_id, status, message, at) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(spec.process_id.as_str())
            .bind(spec.team_id.as_str())
            .bind(spec.user_id.as_str())
            .bind(status.as_str())
            .bind(message)
            .bind(at.to_rfc3339())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "DELETE FROM instance_status_history WHERE process_id = $1 AND id NOT IN
               (SELECT id FROM instance_status_history WHERE process_id = $1 ORDER BY id DESC LIMIT $2)",
        )
        .bind(spec.process_id.as_str())
        .bind(STATUS_HISTORY_KEPT)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    /// The instance's statuses, oldest first.
    pub async fn status_history(&self, process_id: &ProcessId) -> Result<Vec<StatusRecord>, StoreError> {
        let rows =
            sqlx::query("SELECT status, message, at FROM instance_status_history WHERE process_id = $1 ORDER BY id")
                .bind(process_id.as_str())
                .fetch_all(&self.db.pool)
                .await?;
        rows.into_iter()
            .map(|row| {
                Ok(StatusRecord {
                    status: row.try_get("status")?,
                    message: row.try_get("message")?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }
}
