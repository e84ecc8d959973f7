//! The figures admins see (docs/analytics.md), computed from the stored rows: schema-only savings from the
//! stored catalogs, realized savings from what sessions were actually sent, calls, errors and the discover hit
//! rate. Every figure here is the API's; the page and `satellite tokens` show the same numbers.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::MetaCost;
use crate::store::analytics::{ActivitySums, CatalogCost, Grouping, RowFilter};
use crate::store::{AnalyticsSums, StoreError};

/// The context window the "tools that fit" figures are computed for.
pub const CONTEXT_WINDOW: u64 = 200_000;

/// A page of items.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub total: u64,
    pub limit: u64,
    pub offset: u64,
    /// The offset of the next page, when there is one.
    pub next_offset: Option<u64>,
}

impl<T> Page<T> {
    pub fn new(items: Vec<T>, total: u64, limit: u64, offset: u64) -> Self {
        let next = offset + items.len() as u64;
        Self { items, total, limit, offset, next_offset: (next < total).then_some(next) }
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            total: self.total,
            limit: self.limit,
            offset: self.offset,
            next_offset: self.next_offset,
        }
    }
}

/// Listing every tool against the four meta-tools.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SchemaOnly {
    /// Users with at least one stored catalog in scope.
    pub callers: u64,
    pub instances: u64,
    /// Distinct installations.
    pub servers: u64,
    pub tools: u64,
    /// Tokens of every tool of every instance in scope.
    pub tool_tokens: u64,
    /// Instances whose tools are not counted yet (left out of the token figures).
    pub uncounted_instances: u64,
    /// What one `tools/list` of every tool costs a caller, on average over the callers.
    pub tool_tokens_per_caller: f64,
    pub meta_tools: u64,
    /// What one `tools/list` costs through the hierarchical router: the meta-tools, counted like any tool.
    pub meta_tool_tokens: u64,
    /// `tool_tokens_per_caller - meta_tool_tokens`.
    pub saved_tokens_per_listing: f64,
    /// Share of a listing's tokens the router saves (0 to 1; negative when the meta-tools cost more).
    pub saved_ratio: Option<f64>,
    pub context_window: u64,
    pub avg_tokens_per_tool: Option<f64>,
    /// Tool definitions of average size that fit the context window when all are listed.
    pub tools_fit_direct: Option<u64>,
    /// Tools whose discover results fit the window after the meta-tools, at the measured tokens per
    /// discovered tool; `None` until a discover has been answered.
    pub tools_fit_router: Option<u64>,
}

/// What sessions were actually sent, against a plain proxy.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Realized {
    pub sessions: u64,
    pub listings: u64,
    /// Tool definitions sent in `tools/list` answers.
    pub listing_tokens: u64,
    /// `discover_mcp_tools` answers.
    pub discover_tokens: u64,
    /// `listing_tokens + discover_tokens`.
    pub received_tokens: u64,
    /// Every tool definition once per session and again on each change of the visible tools.
    pub proxy_tokens: u64,
    /// `proxy_tokens - received_tokens` (negative when the router cost more).
    pub saved_tokens: i64,
    pub saved_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Calls {
    pub total: u64,
    /// Calls with no result (server failed, timed out, refused).
    pub errors: u64,
    /// Results with `isError: true`.
    pub tool_errors: u64,
    /// `(errors + tool_errors) / total`.
    pub error_rate: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Discovers {
    pub total: u64,
    /// Discovers followed by a call of one of their results in the same session.
    pub hits: u64,
    pub hit_rate: Option<f64>,
    pub avg_results: Option<f64>,
    pub avg_tokens: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub schema_only: SchemaOnly,
    pub realized: Realized,
    pub calls: Calls,
    pub discovers: Discovers,
}

/// One row of a per-session, per-user or per-time table.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ActivityRow {
    pub key: String,
    pub team_id: String,
    pub user_id: String,
    pub first_at: Option<String>,
    pub last_at: Option<String>,
    pub realized: Realized,
    pub calls: Calls,
    pub discovers: Discovers,
}

/// A server (installation) by token cost.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerCost {
    pub installation_id: String,
    pub server_slug: String,
    pub team_id: String,
    pub instances: u64,
    /// Tools of its largest instance.
    pub tools: u64,
    /// Tokens of its largest instance: what listing it costs one user.
    pub tool_tokens: u64,
    /// Tokens over every instance.
    pub total_tokens: u64,
}

fn ratio(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

fn realized(s: &ActivitySums) -> Realized {
    let received = s.shown_tokens + s.discover_tokens;
    Realized {
        sessions: s.sessions,
        listings: s.listings,
        listing_tokens: s.shown_tokens,
        discover_tokens: s.discover_tokens,
        received_tokens: received,
        proxy_tokens: s.proxy_tokens,
        saved_tokens: s.proxy_tokens as i64 - received as i64,
        saved_ratio: ratio(s.proxy_tokens as f64 - received as f64, s.proxy_tokens as f64),
    }
}

fn calls(s: &ActivitySums) -> Calls {
    Calls {
        total: s.calls,
        errors: s.call_errors,
        tool_errors: s.tool_errors,
        error_rate: ratio((s.call_errors + s.tool_errors) as f64, s.calls as f64),
    }
}

fn discovers(s: &ActivitySums) -> Discovers {
    Discovers {
        total: s.discovers,
        hits: s.discover_hits,
        hit_rate: ratio(s.discover_hits as f64, s.discovers as f64),
        avg_results: ratio(s.discover_results as f64, s.discovers as f64),
        avg_tokens: ratio(s.discover_tokens as f64, s.discovers as f64),
    }
}

fn activity_row(s: ActivitySums) -> ActivityRow {
    ActivityRow {
        realized: realized(&s),
        calls: calls(&s),
        discovers: discovers(&s),
        key: s.group,
        team_id: s.team_id,
        user_id: s.user_id,
        first_at: s.first_at,
        last_at: s.last_at,
    }
}

/// Listing every stored tool in scope against the meta-tools; `per_discovered_tool` is the measured token cost
/// of one tool in a discover answer.
pub fn schema_only(costs: &[CatalogCost], meta: MetaCost, per_discovered_tool: Option<f64>) -> SchemaOnly {
    let counted: Vec<&CatalogCost> = costs.iter().filter(|c| c.tokens.is_some()).collect();
    let callers: HashSet<(&str, &str)> = costs.iter().map(|c| (c.team_id.as_str(), c.user_id.as_str())).collect();
    let servers: HashSet<&str> = costs.iter().map(|c| c.installation_id.as_str()).collect();
    let tools: u64 = counted.iter().map(|c| c.tools).sum();
    let tool_tokens: u64 = counted.iter().map(|c| c.tokens.unwrap_or(0)).sum();
    let per_caller = if callers.is_empty() { 0.0 } else { tool_tokens as f64 / callers.len() as f64 };
    let avg_tokens_per_tool = ratio(tool_tokens as f64, tools as f64);
    SchemaOnly {
        callers: callers.len() as u64,
        instances: costs.len() as u64,
        servers: servers.len() as u64,
        tools: costs.iter().map(|c| c.tools).sum(),
        tool_tokens,
        uncounted_instances: (costs.len() - counted.len()) as u64,
        tool_tokens_per_caller: per_caller,
        meta_tools: meta.tools,
        meta_tool_tokens: meta.tokens,
        saved_tokens_per_listing: per_caller - meta.tokens as f64,
        saved_ratio: ratio(per_caller - meta.tokens as f64, per_caller),
        context_window: CONTEXT_WINDOW,
        avg_tokens_per_tool,
        tools_fit_direct: avg_tokens_per_tool.filter(|a| *a > 0.0).map(|a| (CONTEXT_WINDOW as f64 / a).floor() as u64),
        tools_fit_router: per_discovered_tool
            .filter(|p| *p > 0.0)
            .map(|p| (CONTEXT_WINDOW.saturating_sub(meta.tokens) as f64 / p).floor() as u64),
    }
}

/// Every figure for the filter.
pub async fn summary(store: &AnalyticsSums, filter: &RowFilter, meta: MetaCost) -> Result<Summary, StoreError> {
    let (totals, _) = store.activity(filter, Grouping::Total, 1, 0).await?;
    let totals = totals.into_iter().next().unwrap_or_default();
    let costs = store.catalog_costs(filter).await?;
    let per_discovered_tool = ratio(totals.discover_tokens as f64, totals.discover_results as f64);
    Ok(Summary {
        schema_only: schema_only(&costs, meta, per_discovered_tool),
        realized: realized(&totals),
        calls: calls(&totals),
        discovers: discovers(&totals),
    })
}

/// Per session, per user or per time bucket.
pub async fn activity(
    store: &AnalyticsSums,
    filter: &RowFilter,
    grouping: Grouping,
    limit: u64,
    offset: u64,
) -> Result<Page<ActivityRow>, StoreError> {
    let (rows, total) = store.activity(filter, grouping, limit, offset).await?;
    Ok(Page::new(rows, total, limit, offset).map(activity_row))
}

/// Installations by what listing them costs one user, largest first.
pub async fn servers(
    store: &AnalyticsSums,
    filter: &RowFilter,
    limit: u64,
    offset: u64,
) -> Result<Page<ServerCost>, StoreError> {
    let costs = store.catalog_costs(filter).await?;
    let mut by: BTreeMap<String, ServerCost> = BTreeMap::new();
    for c in &costs {
        let entry = by.entry(c.installation_id.clone()).or_insert_with(|| ServerCost {
            installation_id: c.installation_id.clone(),
            server_slug: c.server_slug.clone(),
            team_id: c.team_id.clone(),
            instances: 0,
            tools: 0,
            tool_tokens: 0,
            total_tokens: 0,
        });
        let tokens = c.tokens.unwrap_or(0);
        entry.instances += 1;
        entry.total_tokens += tokens;
        if tokens > entry.tool_tokens || (tokens == entry.tool_tokens && c.tools > entry.tools) {
            entry.tool_tokens = tokens;
            entry.tools = c.tools;
        }
    }
    let mut all: Vec<ServerCost> = by.into_values().collect();
    all.sort_by(|a, b| b.tool_tokens.cmp(&a.tool_tokens).then_with(|| a.server_slug.cmp(&b.server_slug)));
    let total = all.len() as u64;
    let items = all.into_iter().skip(offset as usize).take(limit as usize).collect();
    Ok(Page::new(items, total, limit, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(user: &str, installation: &str, tools: u64, tokens: Option<u64>) -> CatalogCost {
        CatalogCost {
            process_id: format!("{installation}-{user}"),
            team_id: "t".into(),
            user_id: user.into(),
            installation_id: installation.into(),
            server_slug: installation.into(),
            tools,
            tokens,
        }
    }

    #[test]
    fn schema_only_is_per_caller_against_the_measured_meta_tools() {
        let costs = [cost("a", "x", 10, Some(1000)), cost("a", "y", 5, Some(1000)), cost("b", "x", 10, Some(1000))];
        let meta = MetaCost { tools: 4, tokens: 500 };
        let s = schema_only(&costs, meta, Some(50.0));
        assert_eq!((s.callers, s.instances, s.servers, s.tools, s.tool_tokens), (2, 3, 2, 25, 3000));
        assert_eq!(s.tool_tokens_per_caller, 1500.0);
        assert_eq!(s.saved_tokens_per_listing, 1000.0);
        assert_eq!(s.saved_ratio, Some(1000.0 / 1500.0));
        assert_eq!(s.avg_tokens_per_tool, Some(120.0));
        assert_eq!(s.tools_fit_direct, Some(1666));
        assert_eq!(s.tools_fit_router, Some((199_500.0f64 / 50.0) as u64));
    }

    #[test]
    fn uncounted_catalogs_are_reported_and_left_out_of_token_figures() {
        let costs = [cost("a", "x", 10, Some(1000)), cost("a", "y", 5, None)];
        let s = schema_only(&costs, MetaCost { tools: 4, tokens: 100 }, None);
        assert_eq!((s.tools, s.tool_tokens, s.uncounted_instances), (15, 1000, 1));
        assert_eq!(s.tools_fit_router, None);
        assert_eq!(s.avg_tokens_per_tool, Some(100.0));
    }

    #[test]
    fn pages_say_where_the_next_one_starts() {
        assert_eq!(Page::new(vec![1, 2], 5, 2, 0).next_offset, Some(2));
        assert_eq!(Page::new(vec![5], 5, 2, 4).next_offset, None);
    }
}
