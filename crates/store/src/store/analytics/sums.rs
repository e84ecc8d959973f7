//! The analytics rows summed for the admin API (`AnalyticsSums`): activity per group, calls per tool, the stored
//! catalogs' token cost and the recent failures. Every figure is one statement; the filter's conditions are
//! written into each table's part of it.

use sqlx::any::AnyRow;
use sqlx::Row;

use crate::store::sql::{Bind, Sql};
use crate::store::{Db, StoreError};

/// Which rows a figure covers. Times are compared as text, so they must be in `RowKey::at`'s format.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowFilter {
    pub team_id: Option<String>,
    pub user_id: Option<String>,
    pub installation_id: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// How activity rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    Total,
    Session,
    User,
    /// `substr(at, 1, n)`: 10 for days, 13 for hours.
    TimePrefix(u8),
}

/// Listings, discovers and calls summed over one group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActivitySums {
    pub group: String,
    pub team_id: String,
    pub user_id: String,
    pub first_at: Option<String>,
    pub last_at: Option<String>,
    pub sessions: u64,
    pub listings: u64,
    pub shown_tokens: u64,
    pub visible_tokens: u64,
    pub proxy_tokens: u64,
    pub discovers: u64,
    pub discover_results: u64,
    pub discover_tokens: u64,
    pub discover_hits: u64,
    pub calls: u64,
    pub call_errors: u64,
    pub tool_errors: u64,
}

/// Calls of one tool.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolSums {
    pub server_slug: String,
    pub tool_name: String,
    pub calls: u64,
    pub errors: u64,
    pub tool_errors: u64,
    pub from_discover: u64,
    pub avg_duration_ms: f64,
}

/// One instance's stored catalog and its token cost.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogCost {
    pub process_id: String,
    pub team_id: String,
    pub user_id: String,
    pub installation_id: String,
    pub server_slug: String,
    pub tools: u64,
    /// Tokens of every tool; `None` while some tool is not counted yet.
    pub tokens: Option<u64>,
}

/// A failed call or a status change into a failure state.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FailureRow {
    pub at: String,
    pub kind: &'static str,
    pub team_id: String,
    pub user_id: String,
    pub process_id: String,
    pub server_slug: Option<String>,
    pub detail: String,
}

/// Statuses that count as failures in the recent-failures list.
const FAILURE_STATUSES: &str = "'error','permanently_failed','requires_reauth','offline'";

/// The analytics rows, summed; cheap to clone.
#[derive(Debug, Clone)]
pub struct AnalyticsSums {
    pub(in crate::store) db: Db,
}

impl AnalyticsSums {
    /// Listings, discovers and calls summed per group, newest group first; and how many groups there are.
    pub async fn activity(
        &self,
        filter: &RowFilter,
        grouping: Grouping,
        limit: u64,
        offset: u64,
    ) -> Result<(Vec<ActivitySums>, u64), StoreError> {
        let mut q = activity_rows(filter);
        push_grouped(&mut q, &group_of(grouping));
        push_page(&mut q, limit, offset);
        let rows = q.query().fetch_all(&self.db.pool).await?;
        let total = total(&rows)?;
        let sums = rows.iter().map(activity_sums).collect::<Result<Vec<_>, _>>()?;
        Ok((sums, total))
    }

    /// Calls per tool, most called first; and how many tools were called.
    pub async fn tool_calls(
        &self,
        filter: &RowFilter,
        limit: u64,
        offset: u64,
    ) -> Result<(Vec<ToolSums>, u64), StoreError> {
        let mut q = Sql::new(format!(
            "WITH grouped AS (
               SELECT server_slug, tool_name, {calls} AS calls, {errors} AS errors,
                      {tool_errors} AS tool_errors, {from_discover} AS from_discover,
                      CAST(SUM(duration_ms) AS DOUBLE PRECISION) / SUM(calls) AS avg_duration_ms
               FROM analytics_calls WHERE 1=1",
            calls = sum("calls"),
            errors = sum("CASE WHEN outcome = 'error' THEN calls ELSE 0 END"),
            tool_errors = sum("CASE WHEN outcome = 'tool_error' THEN calls ELSE 0 END"),
            from_discover = sum("CASE WHEN discover_key IS NOT NULL THEN calls ELSE 0 END"),
        ));
        push_filter(&mut q, filter, true);
        q.push(
            " GROUP BY server_slug, tool_name)
             SELECT *, (SELECT COUNT(*) FROM grouped) AS total FROM grouped
             ORDER BY calls DESC, server_slug, tool_name LIMIT ",
        );
        push_page(&mut q, limit, offset);
        let rows = q.query().fetch_all(&self.db.pool).await?;
        let total = total(&rows)?;
        let tools = rows.iter().map(tool_sums).collect::<Result<Vec<_>, _>>()?;
        Ok((tools, total))
    }

    /// Every stored catalog's tool count and token cost, filtered by team, user and installation.
    pub async fn catalog_costs(&self, filter: &RowFilter) -> Result<Vec<CatalogCost>, StoreError> {
        let mut q = Sql::new(format!(
            "SELECT i.process_id, i.team_id, i.user_id, i.installation_id, i.server_slug,
                    COUNT(t.name) AS tools, {tokens} AS tokens, {uncounted} AS uncounted
             FROM instance_catalog i LEFT JOIN catalog_tools t ON t.process_id = i.process_id WHERE 1=1",
            tokens = sum("t.tokens"),
            uncounted = sum("CASE WHEN t.name IS NOT NULL AND t.tokens IS NULL THEN 1 ELSE 0 END"),
        ));
        if let Some(team) = &filter.team_id {
            q.push(" AND i.team_id = ").push_bind(Bind::Text(team.clone()));
        }
        if let Some(user) = &filter.user_id {
            q.push(" AND i.user_id = ").push_bind(Bind::Text(user.clone()));
        }
        if let Some(installation) = &filter.installation_id {
            q.push(" AND i.installation_id = ").push_bind(Bind::Text(installation.clone()));
        }
        q.push(" GROUP BY i.process_id ORDER BY i.process_id");
        let rows = q.query().fetch_all(&self.db.pool).await?;
        rows.iter()
            .map(|row| {
                let uncounted = count(row, "uncounted")?;
                Ok(CatalogCost {
                    process_id: row.try_get("process_id")?,
                    team_id: row.try_get("team_id")?,
                    user_id: row.try_get("user_id")?,
                    installation_id: row.try_get("installation_id")?,
                    server_slug: row.try_get("server_slug")?,
                    tools: count(row, "tools")?,
                    tokens: (uncounted == 0).then(|| count(row, "tokens")).transpose()?,
                })
            })
            .collect()
    }

    /// Failed calls and status changes into a failure state, newest first; and how many there are.
    pub async fn recent_failures(
        &self,
        filter: &RowFilter,
        limit: u64,
        offset: u64,
    ) -> Result<(Vec<FailureRow>, u64), StoreError> {
        let mut q = Sql::new(
            "WITH failures AS (
               SELECT at, 'call' AS kind, team_id, user_id, process_id, server_slug,
                      tool_name || ': ' || CASE outcome WHEN 'error' THEN 'no result' ELSE 'tool reported an error' END AS detail
               FROM analytics_calls c WHERE outcome != 'ok'",
        );
        push_filter(&mut q, filter, true);
        q.push(format!(
            " UNION ALL
               SELECT h.at, 'status', h.team_id, h.user_id, h.process_id, i.server_slug,
                      h.status || COALESCE(': ' || h.message, '')
               FROM instance_status_history h LEFT JOIN instance_catalog i ON i.process_id = h.process_id
               WHERE h.status IN ({FAILURE_STATUSES})"
        ));
        push_status_filter(&mut q, filter);
        q.push(") SELECT *, (SELECT COUNT(*) FROM failures) AS total FROM failures ORDER BY at DESC LIMIT ");
        push_page(&mut q, limit, offset);
        let rows = q.query().fetch_all(&self.db.pool).await?;
        let total = total(&rows)?;
        let failures = rows.iter().map(failure_row).collect::<Result<Vec<_>, _>>()?;
        Ok((failures, total))
    }
}

/// The SQL expression a grouping groups by.
fn group_of(grouping: Grouping) -> String {
    match grouping {
        Grouping::Total => "'all'".to_owned(),
        Grouping::Session => "session".to_owned(),
        // U+001F (unit separator) between the two ids, written in the literal: both engines take it.
        Grouping::User => "team_id || '\u{1f}' || user_id".to_owned(),
        Grouping::TimePrefix(n) => format!("substr(at, 1, {n})"),
    }
}

/// The start of the activity query: the listings, discovers and calls `filter` covers as one table, `rows`, of
/// like columns.
fn activity_rows(filter: &RowFilter) -> Sql {
    let mut q = Sql::new(
        "WITH rows AS (
               SELECT session, team_id, user_id, at, listings, shown_tokens, visible_tokens, proxy_tokens,
                      0 AS discovers, 0 AS discover_results, 0 AS discover_tokens, 0 AS hits,
                      0 AS calls, 0 AS call_errors, 0 AS tool_errors
               FROM analytics_listings l WHERE 1=1",
    );
    push_filter(&mut q, filter, true);
    q.push(
        " UNION ALL
               SELECT session, team_id, user_id, at, 0, 0, 0, 0, 1, results, result_tokens,
                      CASE WHEN EXISTS (SELECT 1 FROM analytics_calls c WHERE c.discover_key = d.key) THEN 1 ELSE 0 END,
                      0, 0, 0
               FROM analytics_discovers d WHERE 1=1",
    );
    push_filter(&mut q, filter, false);
    q.push(
        " UNION ALL
               SELECT session, team_id, user_id, at, 0, 0, 0, 0, 0, 0, 0, 0, calls,
                      CASE WHEN outcome = 'error' THEN calls ELSE 0 END,
                      CASE WHEN outcome = 'tool_error' THEN calls ELSE 0 END
               FROM analytics_calls c WHERE 1=1",
    );
    push_filter(&mut q, filter, true);
    q
}

/// The rest of the activity query: `rows` summed per `group` (an SQL expression), newest group first, each with
/// the count of groups, up to the page's `LIMIT`.
fn push_grouped(q: &mut Sql, group: &str) {
    q.push(format!(
        "), grouped AS (
               SELECT {group} AS grp, MIN(team_id) AS team_id, MIN(user_id) AS user_id, MIN(at) AS first_at,
                      MAX(at) AS last_at, COUNT(DISTINCT session) AS sessions, {listings} AS listings,
                      {shown_tokens} AS shown_tokens, {visible_tokens} AS visible_tokens,
                      {proxy_tokens} AS proxy_tokens, {discovers} AS discovers,
                      {discover_results} AS discover_results, {discover_tokens} AS discover_tokens,
                      {hits} AS hits, {calls} AS calls, {call_errors} AS call_errors,
                      {tool_errors} AS tool_errors
               FROM rows GROUP BY grp
             )
             SELECT *, (SELECT COUNT(*) FROM grouped) AS total FROM grouped ORDER BY last_at DESC, grp LIMIT ",
        listings = sum("listings"),
        shown_tokens = sum("shown_tokens"),
        visible_tokens = sum("visible_tokens"),
        proxy_tokens = sum("proxy_tokens"),
        discovers = sum("discovers"),
        discover_results = sum("discover_results"),
        discover_tokens = sum("discover_tokens"),
        hits = sum("hits"),
        calls = sum("calls"),
        call_errors = sum("call_errors"),
        tool_errors = sum("tool_errors"),
    ));
}

fn activity_sums(row: &AnyRow) -> Result<ActivitySums, StoreError> {
    Ok(ActivitySums {
        group: row.try_get("grp")?,
        team_id: row.try_get("team_id")?,
        user_id: row.try_get("user_id")?,
        first_at: row.try_get("first_at")?,
        last_at: row.try_get("last_at")?,
        sessions: count(row, "sessions")?,
        listings: count(row, "listings")?,
        shown_tokens: count(row, "shown_tokens")?,
        visible_tokens: count(row, "visible_tokens")?,
        proxy_tokens: count(row, "proxy_tokens")?,
        discovers: count(row, "discovers")?,
        discover_results: count(row, "discover_results")?,
        discover_tokens: count(row, "discover_tokens")?,
        discover_hits: count(row, "hits")?,
        calls: count(row, "calls")?,
        call_errors: count(row, "call_errors")?,
        tool_errors: count(row, "tool_errors")?,
    })
}

fn tool_sums(row: &AnyRow) -> Result<ToolSums, StoreError> {
    Ok(ToolSums {
        server_slug: row.try_get("server_slug")?,
        tool_name: row.try_get("tool_name")?,
        calls: count(row, "calls")?,
        errors: count(row, "errors")?,
        tool_errors: count(row, "tool_errors")?,
        from_discover: count(row, "from_discover")?,
        avg_duration_ms: row.try_get::<Option<f64>, _>("avg_duration_ms")?.unwrap_or(0.0),
    })
}

fn failure_row(row: &AnyRow) -> Result<FailureRow, StoreError> {
    let kind: String = row.try_get("kind")?;
    Ok(FailureRow {
        at: row.try_get("at")?,
        kind: if kind == "call" { "call" } else { "status" },
        team_id: row.try_get("team_id")?,
        user_id: row.try_get("user_id")?,
        process_id: row.try_get("process_id")?,
        server_slug: row.try_get("server_slug")?,
        detail: row.try_get("detail")?,
    })
}

/// The filter's conditions on one analytics table; `has_installation` says whether the table has the column
/// (discovers span installations and are left out when one is asked for).
fn push_filter(q: &mut Sql, filter: &RowFilter, has_installation: bool) {
    if let Some(team) = &filter.team_id {
        q.push(" AND team_id = ").push_bind(Bind::Text(team.clone()));
    }
    if let Some(user) = &filter.user_id {
        q.push(" AND user_id = ").push_bind(Bind::Text(user.clone()));
    }
    if let Some(installation) = &filter.installation_id {
        if has_installation {
            q.push(" AND installation_id = ").push_bind(Bind::Text(installation.clone()));
        } else {
            q.push(" AND 1 = 0");
        }
    }
    if let Some(from) = &filter.from {
        q.push(" AND at >= ").push_bind(Bind::Text(from.clone()));
    }
    if let Some(to) = &filter.to {
        q.push(" AND at < ").push_bind(Bind::Text(to.clone()));
    }
}

/// The filter's conditions on the status history (`h`) joined with the catalogs (`i`, for the installation).
fn push_status_filter(q: &mut Sql, filter: &RowFilter) {
    if let Some(team) = &filter.team_id {
        q.push(" AND h.team_id = ").push_bind(Bind::Text(team.clone()));
    }
    if let Some(user) = &filter.user_id {
        q.push(" AND h.user_id = ").push_bind(Bind::Text(user.clone()));
    }
    if let Some(installation) = &filter.installation_id {
        q.push(" AND i.installation_id = ").push_bind(Bind::Text(installation.clone()));
    }
    if let Some(from) = &filter.from {
        q.push(" AND h.at >= ").push_bind(Bind::Text(from.clone()));
    }
    if let Some(to) = &filter.to {
        q.push(" AND h.at < ").push_bind(Bind::Text(to.clone()));
    }
}

/// The page's parameters, after a `LIMIT`.
fn push_page(q: &mut Sql, limit: u64, offset: u64) {
    q.push_bind(Bind::Int(limit as i64)).push(" OFFSET ").push_bind(Bind::Int(offset as i64));
}

/// The count of groups every row of a page carries (`total`); 0 for an empty page.
fn total(rows: &[AnyRow]) -> Result<u64, StoreError> {
    match rows.first() {
        Some(row) => count(row, "total"),
        None => Ok(0),
    }
}

/// `SUM(expr)` as a 64-bit integer on both engines (PostgreSQL sums `BIGINT` into `NUMERIC`).
fn sum(expr: &str) -> String {
    format!("CAST(SUM({expr}) AS BIGINT)")
}

/// A non-negative integer column (SUM over no rows is NULL: 0).
fn count(row: &AnyRow, column: &str) -> Result<u64, StoreError> {
    Ok(row.try_get::<Option<i64>, _>(column)?.unwrap_or(0).max(0) as u64)
}
