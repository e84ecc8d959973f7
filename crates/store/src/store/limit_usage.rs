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
    /// Take one call from `counter` of `rule` in `period` when it has taken fewer than `most`: the count after
    /// taking it, or `None` when the quota is spent (nothing taken). One statement, so replicas sharing the
    /// database never take the last call twice.
    pub async fn take(&self, rule: &str, counter: &str, period: &str, most: u64) -> Result<Option<u64>, StoreError> {
        let most = i64::try_from(most).unwrap_or(i64::MAX);
        if most <= 0 {
            return Ok(None);
        }
        let row = sqlx::query(
            "INSERT INTO limit_usage (rule, counter, period, calls) VALUES ($1, $2, $3, 1)
             ON CONFLICT (rule, counter, period) DO UPDATE SET calls = limit_usage.calls + 1
             WHERE limit_usage.calls < $4
             RETURNING calls",
        )
        .bind(rule)
        .bind(counter)
        .bind(period)
        .bind(most)
        .fetch_optional(&self.db.pool)
        .await?;
        match row {
            Some(row) => Ok(Some(u64::try_from(row.try_get::<i64, _>("calls")?).unwrap_or_default())),
            None => Ok(None),
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
