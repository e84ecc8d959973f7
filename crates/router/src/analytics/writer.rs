//! The analytics writer: one task that turns queued facts into rows ([`Ledger`]) and writes them in batches. Rows
//! the database refuses (locked past its busy timeout, full, read-only) are kept, in order, and written first at
//! the writer's next turn; only past [`PENDING_MAX`] rows are the oldest dropped, counted
//! (`satellite_analytics_dropped_total{stage="store"}`) and warned about once per outage.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::*;
use crate::store::analytics::AnalyticsRow;

/// Rows a refused write keeps for the next turn: a minute of a busy satellite's facts, a few MB.
pub(super) const PENDING_MAX: usize = 65_536;

pub(super) struct SessionState {
    last_fingerprint: Option<u64>,
    discovers: VecDeque<(String, HashSet<String>)>,
    seen: Instant,
}

impl SessionState {
    fn new() -> Self {
        Self { last_fingerprint: None, discovers: VecDeque::new(), seen: Instant::now() }
    }
}

/// Turns facts into rows: proxy cost per listing, discover keys and hits, discover text tokens.
pub(super) struct Ledger {
    pub(super) sessions: HashMap<String, SessionState>,
}

impl Ledger {
    fn session(&mut self, key: &str) -> &mut SessionState {
        if self.sessions.len() >= SESSIONS_KEPT && !self.sessions.contains_key(key) {
            let mut ages: Vec<Instant> = self.sessions.values().map(|s| s.seen).collect();
            ages.sort_unstable();
            let cutoff = ages[ages.len() / 2];
            self.sessions.retain(|_, s| s.seen > cutoff);
        }
        let state = self.sessions.entry(key.to_owned()).or_insert_with(SessionState::new);
        state.seen = Instant::now();
        state
    }

    pub(super) fn rows(&mut self, facts: Vec<Fact>, discover_tokens: &[u64]) -> Vec<AnalyticsRow> {
        let mut tokens = discover_tokens.iter();
        facts
            .into_iter()
            .map(|fact| match fact {
                Fact::Listing(fact) => self.listing_row(*fact),
                Fact::Discover { key, text: _, tool_paths } => {
                    self.discover_row(key, tool_paths, tokens.next().copied().unwrap_or(0))
                }
                Fact::Call(call) => self.call_row(*call),
            })
            .collect()
    }

    fn listing_row(&mut self, fact: ListingFact) -> AnalyticsRow {
        let ListingFact { key, stateless, listing, listings, .. } = fact;
        let state = self.session(&key.session);
        // A plain proxy sends the list once per session and again when it changed; a stateless
        // client asks every time, and a stateless proxy answers every time. Of like listings joined
        // in one row, only the first can be a change.
        let resent = if stateless { listings } else { u64::from(state.last_fingerprint != Some(listing.fingerprint)) };
        state.last_fingerprint = Some(listing.fingerprint);
        let (process_id, installation_id) = listing.instance.unzip();
        // The token figures are the row's listings' totals; the tool counts, those of one.
        AnalyticsRow::Listing(ListingRow {
            key,
            router: listing.router.as_str(),
            process_id,
            installation_id,
            listings,
            tools_shown: listing.tools_shown,
            shown_tokens: listing.shown_tokens * listings,
            tools_visible: listing.tools_visible,
            visible_tokens: listing.visible_tokens * listings,
            proxy_tokens: listing.visible_tokens * resent,
        })
    }

    /// A discover's row, under a new key the session remembers with the tools it found (`result_tokens`: the
    /// tokens of its text).
    fn discover_row(&mut self, key: RowKey, tool_paths: Vec<String>, result_tokens: u64) -> AnalyticsRow {
        let discover_key = uuid::Uuid::new_v4().simple().to_string();
        let results = tool_paths.len() as u64;
        let state = self.session(&key.session);
        state.discovers.push_front((discover_key.clone(), tool_paths.into_iter().collect()));
        state.discovers.truncate(DISCOVERS_KEPT);
        AnalyticsRow::Discover(DiscoverRow { key, discover_key, results, result_tokens })
    }

    /// A call's row, with the key of the session's latest discover that found its tool.
    fn call_row(&mut self, call: CallFact) -> AnalyticsRow {
        let path = crate::model::tool_path(&call.server_slug, &call.tool_name);
        let state = self.session(&call.key.session);
        let discover_key = state.discovers.iter().find(|(_, paths)| paths.contains(&path)).map(|(k, _)| k.clone());
        AnalyticsRow::Call(CallRow {
            key: call.key,
            router: call.router.as_str(),
            process_id: call.process_id,
            installation_id: call.installation_id,
            server_slug: call.server_slug,
            tool_name: call.tool_name,
            outcome: call.outcome.as_str(),
            calls: call.calls,
            duration_ms: call.duration_ms,
            discover_key,
        })
    }
}

pub(super) async fn writer(recorder: Arc<RecorderInner>, store: AnalyticsRows, shutdown: CancellationToken) {
    let mut ledger = Ledger { sessions: HashMap::new() };
    let mut pending = Pending::default();
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = recorder.full.notified() => {}
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        drain(&recorder, &mut ledger, &store, &mut pending).await;
    }
    drain(&recorder, &mut ledger, &store, &mut pending).await;
    if !pending.rows.is_empty() {
        error!(rows = pending.rows.len(), "shutdown: analytics rows the database refused are lost to the figures");
    }
}

/// Rows the database refused, oldest first, written before newer ones at the next turn.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) rows: VecDeque<AnalyticsRow>,
    /// The database refuses writes now (one warning per outage, one info when it takes them again).
    refusing: bool,
}

impl Pending {
    /// Writes what is kept and then `rows`, [`BATCH`] at a time, stopping at the first refusal: what is left waits
    /// for the next turn. Past [`PENDING_MAX`] the oldest rows are dropped and counted.
    pub(super) async fn write(&mut self, store: &AnalyticsRows, rows: Vec<AnalyticsRow>, recorder: &RecorderInner) {
        self.rows.extend(rows);
        while !self.rows.is_empty() {
            let take = self.rows.len().min(BATCH);
            let batch = &self.rows.make_contiguous()[..take];
            match store.insert_analytics(batch).await {
                Ok(()) => {
                    debug!(rows = take, "analytics rows written");
                    self.rows.drain(..take);
                    if std::mem::take(&mut self.refusing) {
                        info!(
                            left = self.rows.len(),
                            "the database takes analytics rows again; the kept ones are written"
                        );
                    }
                }
                Err(err) => {
                    if !std::mem::replace(&mut self.refusing, true) {
                        warn!(rows = self.rows.len(), error = %err, "writing analytics rows failed; kept and tried again every half second");
                    }
                    break;
                }
            }
        }
        let over = self.rows.len().saturating_sub(PENDING_MAX);
        if over > 0 {
            self.rows.drain(..over);
            let dropped = recorder.rows_dropped.fetch_add(over as u64, Ordering::Relaxed) + over as u64;
            if dropped == over as u64 || dropped.is_power_of_two() {
                warn!(
                    dropped,
                    kept = PENDING_MAX,
                    "analytics rows dropped: the database refused them for too long; figures will undercount"
                );
            }
        }
    }
}

/// Write every queued fact, [`BATCH`] at a time, after the rows kept from refused writes.
pub(super) async fn drain(recorder: &RecorderInner, ledger: &mut Ledger, store: &AnalyticsRows, pending: &mut Pending) {
    let facts = {
        let mut queue = recorder.queue.lock();
        queue.open_calls.clear();
        queue.open_listings.clear();
        std::mem::take(&mut queue.facts)
    };
    let mut facts = facts.into_iter();
    loop {
        let batch: Vec<Fact> = facts.by_ref().take(BATCH).collect();
        if batch.is_empty() {
            break;
        }
        let rows = rows_of(ledger, batch).await;
        pending.write(store, rows, recorder).await;
    }
    // Nothing new: what the database refused before is tried again.
    if !pending.rows.is_empty() {
        pending.write(store, Vec::new(), recorder).await;
    }
}

/// Add the tokens of listed tools that had no count yet to their listings (on the blocking pool; the encoder they
/// waited for is being built or is built).
pub(super) async fn count_uncounted(facts: &mut [Fact]) {
    for fact in facts.iter_mut() {
        let Fact::Listing(fact) = fact else { continue };
        let listing = &mut fact.listing;
        if listing.uncounted.is_empty() {
            continue;
        }
        let tools = std::mem::take(&mut listing.uncounted);
        match crate::tokens::count_tools(tools).await {
            Ok(counts) => {
                let tokens: u64 = counts.iter().map(|n| *n as u64).sum();
                listing.visible_tokens += tokens;
                if listing.router == Router::Instance {
                    listing.shown_tokens += tokens;
                }
            }
            Err(err) => warn!(error = %err, "counting listed tools' tokens failed; they count as 0"),
        }
    }
}

/// The rows of a batch of facts, with the tokens of discover answers and of tools listed before they were counted.
async fn rows_of(ledger: &mut Ledger, facts: Vec<Fact>) -> Vec<AnalyticsRow> {
    let texts: Vec<String> = facts
        .iter()
        .filter_map(|f| match f {
            Fact::Discover { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    let counted = if texts.is_empty() {
        Vec::new()
    } else {
        match tokio::task::spawn_blocking(move || {
            crate::tokens::counter().map(|c| texts.iter().map(|t| c.count_answer(t) as u64).collect::<Vec<_>>())
        })
        .await
        {
            Ok(Ok(counts)) => counts,
            Ok(Err(err)) => {
                warn!(error = %err, "counting discover answer tokens failed; they count as 0");
                Vec::new()
            }
            Err(err) => {
                warn!(error = %err, "the token counting task failed; discover answers count as 0");
                Vec::new()
            }
        }
    };
    let mut facts = facts;
    count_uncounted(&mut facts).await;
    ledger.rows(facts, &counted)
}
