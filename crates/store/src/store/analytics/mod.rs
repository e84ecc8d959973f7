//! Analytics rows (migration 0004): appended in batches by `analytics::Recorder` and pruned by age
//! (`AnalyticsRows`), and summed for the admin API (`AnalyticsSums`, in `sums`). What the figures mean is
//! `analytics`'s business; this module only writes and sums.

use super::sql::{Bind, Sql};
use super::{Db, StoreError};

mod sums;

pub use sums::{ActivitySums, AnalyticsSums, CatalogCost, FailureRow, Grouping, RowFilter, ToolSums};

/// One row to append.
#[derive(Debug, Clone, PartialEq)]
pub enum AnalyticsRow {
    Listing(ListingRow),
    Discover(DiscoverRow),
    Call(CallRow),
}

/// Who and when, common to every row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowKey {
    /// ISO-8601 UTC with milliseconds and `Z`, so text order is time order.
    pub at: String,
    pub team_id: String,
    pub user_id: String,
    pub session: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListingRow {
    pub key: RowKey,
    pub router: &'static str,
    pub process_id: Option<String>,
    pub installation_id: Option<String>,
    /// Like listings this row stands for: its token figures are their totals, its tool counts those of one.
    pub listings: u64,
    pub tools_shown: u64,
    pub shown_tokens: u64,
    pub tools_visible: u64,
    pub visible_tokens: u64,
    pub proxy_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DiscoverRow {
    pub key: RowKey,
    pub discover_key: String,
    pub results: u64,
    pub result_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CallRow {
    pub key: RowKey,
    pub router: &'static str,
    pub process_id: String,
    pub installation_id: String,
    pub server_slug: String,
    pub tool_name: String,
    pub outcome: &'static str,
    /// Calls the row stands for: like successful calls of one session are merged (`analytics::Recorder::call`).
    pub calls: u64,
    /// The calls' durations added up.
    pub duration_ms: u64,
    pub discover_key: Option<String>,
}

/// The analytics rows as they are written and pruned; cheap to clone.
#[derive(Debug, Clone)]
pub struct AnalyticsRows {
    pub(in crate::store) db: Db,
}

impl AnalyticsRows {
    /// Append a batch of rows atomically: a few multi-row statements per table (`Sql::inserts`).
    pub async fn insert_analytics(&self, rows: &[AnalyticsRow]) -> Result<(), StoreError> {
        let (mut listings, mut discovers, mut calls) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            match row {
                AnalyticsRow::Listing(l) => listings.push(l),
                AnalyticsRow::Discover(d) => discovers.push(d),
                AnalyticsRow::Call(c) => calls.push(c),
            }
        }
        let engine = self.db.engine;
        let mut statements = Sql::inserts(engine, INSERT_LISTINGS, &listings, |l| listing_values(l));
        statements.extend(Sql::inserts(engine, INSERT_DISCOVERS, &discovers, |d| discover_values(d)));
        statements.extend(Sql::inserts(engine, INSERT_CALLS, &calls, |c| call_values(c)));
        super::sql::execute_all(&self.db.pool, &statements).await?;
        Ok(())
    }

    /// Delete analytics rows older than `before` (same text format as `RowKey::at`); the number deleted.
    pub async fn prune_analytics(&self, before: &str) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for table in ["analytics_listings", "analytics_discovers", "analytics_calls"] {
            deleted += sqlx::query(&format!("DELETE FROM {table} WHERE at < $1"))
                .bind(before)
                .execute(&self.db.pool)
                .await?
                .rows_affected();
        }
        Ok(deleted)
    }
}

const INSERT_LISTINGS: &str =
    "INSERT INTO analytics_listings (at, team_id, user_id, session, router, process_id, installation_id,
                listings, tools_shown, shown_tokens, tools_visible, visible_tokens, proxy_tokens)";
const INSERT_DISCOVERS: &str =
    "INSERT INTO analytics_discovers (key, at, team_id, user_id, session, results, result_tokens)";
const INSERT_CALLS: &str =
    "INSERT INTO analytics_calls (at, team_id, user_id, session, router, process_id, installation_id,
                server_slug, tool_name, outcome, calls, duration_ms, discover_key)";

fn text(s: &str) -> Bind {
    Bind::Text(s.to_owned())
}

fn int(n: u64) -> Bind {
    Bind::Int(n as i64)
}

/// A row's key: at, team_id, user_id, session.
fn key_values(k: &RowKey) -> [Bind; 4] {
    [text(&k.at), text(&k.team_id), text(&k.user_id), text(&k.session)]
}

/// A listing row's values in `INSERT_LISTINGS`' order.
fn listing_values(l: &ListingRow) -> Vec<Bind> {
    let [at, team_id, user_id, session] = key_values(&l.key);
    vec![
        at,
        team_id,
        user_id,
        session,
        text(l.router),
        l.process_id.as_deref().into(),
        l.installation_id.as_deref().into(),
        int(l.listings),
        int(l.tools_shown),
        int(l.shown_tokens),
        int(l.tools_visible),
        int(l.visible_tokens),
        int(l.proxy_tokens),
    ]
}

/// A discover row's values in `INSERT_DISCOVERS`' order.
fn discover_values(d: &DiscoverRow) -> Vec<Bind> {
    let [at, team_id, user_id, session] = key_values(&d.key);
    vec![text(&d.discover_key), at, team_id, user_id, session, int(d.results), int(d.result_tokens)]
}

/// A call row's values in `INSERT_CALLS`' order.
fn call_values(c: &CallRow) -> Vec<Bind> {
    let [at, team_id, user_id, session] = key_values(&c.key);
    vec![
        at,
        team_id,
        user_id,
        session,
        text(c.router),
        text(&c.process_id),
        text(&c.installation_id),
        text(&c.server_slug),
        text(&c.tool_name),
        text(c.outcome),
        int(c.calls),
        int(c.duration_ms),
        c.discover_key.as_deref().into(),
    ]
}

#[cfg(test)]
mod tests;
