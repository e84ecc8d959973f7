//! Discover answers shaped by a token budget: what an agent pays for discovery is the tokens of the answer it
//! reads, and what it needs is the right tool *in* that answer (it ranks what it reads well itself).
//!
//! - The request is split into its needs ([`split_needs`]). The whole request's best tool comes first, then
//!   each need's best tools, round by round ([`NEED_ROUNDS`]), so every need is covered before any is repeated;
//!   then the rest of the whole request's ranking. Each entry of a split request names the need whose own
//!   ranking found it (`need`: an index into `needs`).
//! - Entries come in rank order in three forms: *full* (the schema, compact) for a result the ranker is
//!   confident about (its score leads the next one's by [`CONFIDENT_LEAD`]; at most [`MAX_FULL`]); then
//!   *compact* (tool path, the description's first sentence, the required argument names) for the next
//!   [`DESCRIBED`]; then the *path* alone. An entry that does not fit in its form is tried in the next
//!   smaller one; the answer ends at the first that fits in none.
//! - Tokens are counted with the satellite's own o200k counter ([`Counter::count_entry`] per entry, then the
//!   whole answer with [`Counter::count_answer`]); both remember what they counted, so an entry seen before costs a
//!   lookup. The answer is never over the budget: when the whole answer counts more than the entries did (the
//!   numbers in its tail), the longest prefix of entries that fits is kept.
//! - Budget answers are compact JSON whatever `pretty_results` says: indentation costs tokens and tells an agent
//!   nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::value::{to_raw_value, RawValue};
use serde_json::Value;

use super::super::{internal, RouteError};
use super::candidates::{search_failed, tool_entry, Candidates, Pick, Request, Seen, Shape, NO_MATCH_HINT};
use super::HierarchicalRouter;
use crate::model::namespace_ui_meta;
use crate::search::{split_needs, Scope};
use crate::tokens::Counter;

/// The budget of a request that names none.
pub(super) const DEFAULT_BUDGET_TOKENS: usize = 1_000;
/// Budgets are raised to this: less holds no more than an envelope and a few paths.
pub(super) const MIN_BUDGET_TOKENS: usize = 400;
pub(super) const MAX_BUDGET_TOKENS: usize = 32_000;
/// Entries at most, whatever the budget (and `limit`, when given, is lower).
const MAX_ENTRIES: usize = 100;
/// Results of the whole request read from the index (200 found nothing more within 1,000 tokens on dev).
const DEPTH: usize = 100;
/// Results of each need of a split request read from the index.
const NEED_DEPTH: usize = 20;
/// Rounds over the needs (each need's best, then each need's second) before the whole request's ranking.
const NEED_ROUNDS: usize = 2;
/// A result is full when its score is at least this many times the next result's of the same ranking: on the
/// dev set, 33 of 37 such leads were the right tool (0.89), against 0.47 for a top result at any lead.
const CONFIDENT_LEAD: f32 = 1.2;
/// How much a server's best match lifts its other tools (see `boost_servers`). Within 1,000 tokens on the dev set:
/// recall of needs 0.833 without, 0.852 at 0.25, 0.868 at 0.5 and at 1.0 (LiveMCPBench-style tasks 0.47 -> 0.57,
/// MCPVerse-style questions 0.56 -> 0.66); R@5 is unchanged (the first result never moves).
const SERVER_BOOST: f32 = 0.5;
/// Full entries at most.
const MAX_FULL: usize = 2;
/// Compact entries at most; later ones are paths alone (4 or 8 found the same needs within 1,000 tokens on dev,
/// 16 fewer: 0.841 against 0.868).
const DESCRIBED: usize = 8;
/// Tokens left unspent when packing, for the numbers of the answer's tail.
const SAFETY: usize = 4;
/// The query is echoed cut to this many characters, each need to half as many: with five needs and the hint,
/// the envelope stays under [`MIN_BUDGET_TOKENS`].
const ECHO_CHARS: usize = 200;

const COMPACT_HINT: &str =
    "Entries without input_schema: send their tool_path (several, space-separated) as the query for their schemas.";

/// The form of one entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    Full,
    Compact,
    Path,
}

/// The budget answer's text and the tool paths it lists.
pub(super) async fn answer<'a>(
    router: &HierarchicalRouter,
    request: &Request<'_>,
    scope: &Arc<Scope>,
    candidates: &Candidates<'a>,
    started: Instant,
) -> Result<(String, Vec<String>), RouteError> {
    let budget = request.budget.unwrap_or(DEFAULT_BUDGET_TOKENS).clamp(MIN_BUDGET_TOKENS, MAX_BUDGET_TOKENS);
    let max_entries = request.limit.unwrap_or(MAX_ENTRIES).clamp(1, MAX_ENTRIES);
    let needs = split_needs(request.query);
    let (order, matched) = ranked(router, request.query, &needs, scope, candidates).await?;
    let counter = counter().await?;
    let echoed_needs: Vec<String> =
        if needs.len() > 1 { needs.iter().map(|need| echo(need, ECHO_CHARS / 2)).collect() } else { Vec::new() };
    let mut written = Written {
        needs: &echoed_needs,
        query: echo(request.query, ECHO_CHARS),
        budget,
        matched,
        search_time_ms: 0,
        entries: Vec::with_capacity(order.len().min(max_entries)),
        compact: 0,
    };
    let shape = router.shape(request).compact();
    pack(&counter, &mut written, order.iter().take(max_entries), shape, router)?;
    written.search_time_ms = started.elapsed().as_millis() as u64;
    written.fit(&counter)
}

/// The picks in answer order, each with whether it may be full, and how many visible tools matched.
async fn ranked<'a>(
    router: &HierarchicalRouter,
    query: &str,
    needs: &[String],
    scope: &Arc<Scope>,
    candidates: &Candidates<'a>,
) -> Result<(Vec<(Pick<'a>, bool)>, usize), RouteError> {
    let whole = router.search.search_counted(query, scope, DEPTH).await.map_err(search_failed)?;
    let whole_picks = boost_servers(candidates.picks(&whole.hits, None));
    if needs.len() < 2 {
        let lead = leads(&whole_picks);
        let order = whole_picks.into_iter().enumerate().map(|(at, pick)| (pick, at == 0 && lead)).collect();
        return Ok((order, whole.matched));
    }
    let mut lists = Vec::with_capacity(needs.len());
    for (index, need) in needs.iter().enumerate() {
        let found = router.search.search(need, scope, NEED_DEPTH).await.map_err(search_failed)?;
        lists.push(candidates.picks(&found, Some(index)));
    }
    Ok((merge(lists, whole_picks), whole.matched))
}

/// The whole request's best first (a single command that happens to split keeps its tool on top), then each
/// need's best, round by round, then the rest of the whole request's ranking, then what is left of the needs'
/// rankings; every path once, each labelled with the need whose own ranking has it.
fn merge<'a>(lists: Vec<Vec<Pick<'a>>>, whole: Vec<Pick<'a>>) -> Vec<(Pick<'a>, bool)> {
    let leading: Vec<bool> = lists.iter().map(|list| leads(list)).collect();
    let whole_leads = leads(&whole);
    let need_of: HashMap<u64, usize, std::hash::BuildHasherDefault<super::candidates::KeyHasher>> =
        lists.iter().flatten().rev().filter_map(|pick| Some((pick.key(), pick.need?))).collect();
    let mut lists: Vec<VecDeque<Pick<'a>>> = lists.into_iter().map(VecDeque::from).collect();
    let mut whole = VecDeque::from(whole);
    let mut seen = Seen::default();
    let mut order = Vec::new();
    let mut push = |mut pick: Pick<'a>, full: bool, order: &mut Vec<(Pick<'a>, bool)>| {
        let key = pick.key();
        if !seen.insert(key) {
            return false;
        }
        pick.need = need_of.get(&key).copied();
        order.push((pick, full));
        true
    };
    if let Some(first) = whole.pop_front() {
        push(first, whole_leads, &mut order);
    }
    for round in 0..NEED_ROUNDS {
        for (index, list) in lists.iter_mut().enumerate() {
            while let Some(pick) = list.pop_front() {
                if push(pick, round == 0 && leading[index], &mut order) {
                    break;
                }
            }
        }
    }
    for pick in whole.into_iter().chain(lists.into_iter().flatten()) {
        push(pick, false, &mut order);
    }
    order
}

/// Re-ranks all but the first pick by its score plus [`SERVER_BOOST`] times the best score of its server's
/// picks, both relative to the first's: the tools of a server the request matches strongly rise (a task that
/// needs one tool of a server often needs its siblings). The first stays first; equal keys keep their order.
fn boost_servers(picks: Vec<Pick<'_>>) -> Vec<Pick<'_>> {
    let Some(best) = picks.first().map(|p| p.score).filter(|b| b.is_finite() && *b > 0.0) else { return picks };
    // Hits come best first: a server's first pick carries its best score.
    let mut strength: HashMap<&str, f32> = HashMap::with_capacity(picks.len());
    for pick in &picks {
        strength.entry(pick.instance.spec().server_slug.as_str()).or_insert(pick.score / best);
    }
    let key = |pick: &Pick<'_>| {
        let server = strength.get(pick.instance.spec().server_slug.as_str()).copied().unwrap_or(0.0);
        pick.score / best + SERVER_BOOST * server
    };
    let mut picks = picks.into_iter();
    let first = picks.next();
    let mut rest: Vec<(f32, Pick<'_>)> = picks.map(|pick| (key(&pick), pick)).collect();
    rest.sort_by(|a, b| b.0.total_cmp(&a.0));
    first.into_iter().chain(rest.into_iter().map(|(_, pick)| pick)).collect()
}

/// Whether the first of a ranking leads the second by [`CONFIDENT_LEAD`] (or stands alone).
fn leads(picks: &[Pick<'_>]) -> bool {
    match picks {
        [] => false,
        [_] => true,
        [first, second, ..] => first.score >= CONFIDENT_LEAD * second.score,
    }
}

/// The process's token counter, built off the runtime's threads when it is not built yet (~130 ms).
async fn counter() -> Result<Arc<Counter>, RouteError> {
    let built = if crate::tokens::is_built() {
        crate::tokens::counter()
    } else {
        tokio::task::spawn_blocking(crate::tokens::counter)
            .await
            .map_err(|err| internal(format!("the token counter did not start: {err}")))?
    };
    built.map_err(|err| internal(format!("discover cannot count its answer: {err}")))
}

/// `text` cut to `chars` characters.
fn echo(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Adds entries in order while they fit: each in the largest form it may take that fits the budget.
fn pack<'p, 'a: 'p>(
    counter: &Counter,
    written: &mut Written<'_>,
    order: impl Iterator<Item = &'p (Pick<'a>, bool)>,
    mut shape: Shape<'_>,
    router: &HierarchicalRouter,
) -> Result<(), RouteError> {
    let mut spent = counter.count_answer(&written.text(0)?) + SAFETY;
    let mut full = 0;
    for (pick, may_be_full) in order {
        let mut form = match (*may_be_full && full < MAX_FULL, written.compact < DESCRIBED) {
            (true, _) => Form::Full,
            (false, true) => Form::Compact,
            (false, false) => Form::Path,
        };
        let path = pick.path();
        loop {
            let entry = entry(pick, &path, form, &mut shape, router)?;
            let cost = counter.count_entry(entry.get());
            if spent + cost <= written.budget {
                spent += cost;
                full += usize::from(form == Form::Full);
                written.compact += usize::from(form == Form::Compact);
                written.entries.push((entry, path, form));
                break;
            }
            form = match form {
                Form::Full => Form::Compact,
                Form::Compact => Form::Path,
                Form::Path => return Ok(()),
            };
        }
    }
    Ok(())
}

/// One entry of `pick` in `form`, as compact JSON.
fn entry(
    pick: &Pick<'_>,
    path: &str,
    form: Form,
    shape: &mut Shape<'_>,
    router: &HierarchicalRouter,
) -> Result<Box<RawValue>, RouteError> {
    let written = match form {
        Form::Full => to_raw_value(&tool_entry(pick, shape)),
        Form::Compact => {
            let summary = router.summaries.get(pick.tool());
            let meta = pick.tool().meta().map(|meta| namespace_ui_meta(&meta, &pick.instance.spec().server_slug));
            to_raw_value(&Compact {
                tool_path: path,
                need: pick.need,
                description: Some(&summary.sentence),
                required: &summary.required,
                meta,
            })
        }
        Form::Path => {
            to_raw_value(&Compact { tool_path: path, need: pick.need, description: None, required: &[], meta: None })
        }
    };
    written.map_err(|err| internal(format!("could not write a discover entry: {err}")))
}

/// A compact entry, or (without a description) a path alone.
#[derive(Serialize)]
struct Compact<'a> {
    tool_path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    need: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    required: &'a [Box<str>],
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<Value>,
}

/// The answer being written: its envelope's parts and the entries packed so far.
struct Written<'n> {
    needs: &'n [String],
    query: String,
    budget: usize,
    matched: usize,
    search_time_ms: u64,
    entries: Vec<(Box<RawValue>, String, Form)>,
    /// Compact entries among `entries`.
    compact: usize,
}

/// The answer document, in the order an agent reads it.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    needs: &'a [String],
    tools: Vec<&'a RawValue>,
    total_found: usize,
    more_matched: usize,
    budget_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<&'static str>,
    search_time_ms: u64,
    query: &'a str,
}

impl Written<'_> {
    /// The answer with its first `shown` entries.
    fn text(&self, shown: usize) -> Result<String, RouteError> {
        let entries = &self.entries[..shown.min(self.entries.len())];
        let hint = match entries.iter().any(|(_, _, form)| *form != Form::Full) {
            true => Some(COMPACT_HINT),
            false if entries.is_empty() => Some(NO_MATCH_HINT),
            false => None,
        };
        let document = Document {
            needs: self.needs,
            tools: entries.iter().map(|(entry, _, _)| &**entry).collect(),
            total_found: entries.len(),
            more_matched: self.matched.saturating_sub(entries.len()),
            budget_tokens: self.budget,
            hint,
            search_time_ms: self.search_time_ms,
            query: &self.query,
        };
        serde_json::to_string(&document).map_err(|err| internal(format!("could not write the discover answer: {err}")))
    }

    /// The answer with as many entries as fit the budget, counted whole, and their paths.
    fn fit(mut self, counter: &Counter) -> Result<(String, Vec<String>), RouteError> {
        let mut shown = self.entries.len();
        let mut text = self.text(shown)?;
        if counter.count_answer(&text) > self.budget {
            // The longest prefix that fits: fewer entries never count more.
            let (mut fits, mut over) = (0, shown);
            while over - fits > 1 {
                let middle = (fits + over) / 2;
                if counter.count_answer(&self.text(middle)?) <= self.budget {
                    fits = middle;
                } else {
                    over = middle;
                }
            }
            shown = fits;
            text = self.text(shown)?;
        }
        self.entries.truncate(shown);
        Ok((text, self.entries.into_iter().map(|(_, path, _)| path).collect()))
    }
}
