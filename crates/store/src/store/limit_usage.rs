//! The calls each quota's counter took in a period (migration 0013), as the `LimitUsage` repository. Rows only:
//! what a rule counts and when it refuses is `router::limits`' business.

use sqlx::Row;

use super::{Db, StoreError};

/// The quota counters; cheap to clone.
#[derive(Debug, Clone)]
pub struct LimitUsage {
    pub(super) db: Db,
}

impl LimitUsage {
    /// Take up to `want` calls from `counter` of `rule` in `period`, never past `most` in all: how many were
    /// granted (0 when the quota is spent). One statement, so replicas sharing the database never take the same
    /// calls twice; `granted` is written by the same statement as `calls`, both from the row as it was.
    pub async fn take(&self, rule: &str, counter: &str, period: &str, want: u64, most: u64) -> Result<u64, StoreError> {
        let (want, most) = (i64::try_from(want).unwrap_or(i64::MAX), i64::try_from(most).unwrap_or(i64::MAX));
        if most <= 0 || want <= 0 {
            return Ok(0);
        }
        let first = want.min(most);
        let row = sqlx::query(
            "INSERT INTO limit_usage (rule, counter, period, calls, granted) VALUES ($1, $2, $3, $4, $4)
             ON CONFLICT (rule, counter, period) DO UPDATE SET
               granted = CASE WHEN limit_usage.calls + $5 > $6 THEN $6 - limit_usage.calls ELSE $5 END,
               calls = CASE WHEN limit_usage.calls + $5 > $6 THEN $6 ELSE limit_usage.calls + $5 END
             WHERE limit_usage.calls < $6
             RETURNING granted",
        )
        .bind(rule)
        .bind(counter)
        .bind(period)
        .bind(first)
        .bind(want)
        .bind(most)
        .fetch_optional(&self.db.pool)
        .await?;
        match row {
            Some(row) => Ok(u64::try_from(row.try_get::<i64, _>("granted")?).unwrap_or_default()),
            None => Ok(0),
        }
    }

    /// Give back a call taken for a call that another rule then refused.
    pub async fn give_back(&self, rule: &str, counter: &str, period: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE limit_usage SET calls = calls - 1 WHERE rule = $1 AND counter = $2 AND period = $3 AND calls > 0",
        )
        .bind(rule)
        .bind(counter)
        .bind(period)
        .execute(&self.db.pool)
        .await?;
        Ok(())
    }

    /// The calls taken so far (0 when none).
    pub async fn taken(&self, rule: &str, counter: &str, period: &str) -> Result<u64, StoreError> {
        let row = sqlx::query("SELECT calls FROM limit_usage WHERE rule = $1 AND counter = $2 AND period = $3")
            .bind(rule)
            .bind(counter)
            .bind(period)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>("calls")).transpose()?.map_or(0, |c| u64::try_from(c).unwrap_or_default()))
    }

    /// Forget the periods before `period` of every rule (they are over; the upkeep calls this).
    pub async fn forget_before(&self, period: &str) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM limit_usage WHERE period < $1 AND length(period) = length($1)")
            .bind(period)
            .execute(&self.db.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
