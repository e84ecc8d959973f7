//! The fusion of both stages' rankings: lexical scores and cosines, weighed by the query's shape.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::{Blind, Keys, Scored, CANDIDATES};
use crate::search::{SearchHit, NO_POSITION};

/// How much of the lexical weight a tool keeps whose description the query's words cannot match (see
/// [`written_apart`] and [`Blind`]). Measured with multilingual-e5-small on 4,500 tools: 1.0 (no exception) finds 5
/// of the 9 requests of `english_requests_find_tools_described_in_chinese` in the top 5, 0.5 finds 7, 0.0 finds 8;
/// dev R@5 is 0.714, 0.711 and 0.704 (all-MiniLM-L6-v2, which cannot read Chinese: 0.724, 0.721, 0.699).
const APART_LEXICAL_SHARE: f32 = 0.5;

/// `w * lexical / best + (1 - w) * (cos - min) / (max - min)` over the union of the lexical hits and the best
/// [`CANDIDATES`] of `cosines` (every visible tool's `(process_id, tool_name, cosine)`), min and max over that
/// union; `lexical_cosines` are the lexical hits' cosines, in order (`None`: not embedded yet, counted as the
/// least similar). The lexical stage's first hit stays first (an exact name, `server tool`, or the tool whose
/// words the request shares most: measured on dev, moving it cost more than it won). Strings are copied only
/// for the `limit` hits returned. For a tool the lexical stage is `blind` to (its description written in Chinese,
/// Japanese or Korean and the request not, or the other way round, so the lexical stage saw at most its name;
/// `apart`: the visible tools written apart) the lexical share counts [`APART_LEXICAL_SHARE`] as much.
pub(super) fn fuse<'a>(
    weight: f32,
    lexical: &'a [SearchHit],
    lexical_cosines: &[Option<f32>],
    mut cosines: Vec<Scored<'a>>,
    blind: Blind,
    apart: &Keys<'a>,
    limit: usize,
) -> Vec<SearchHit> {
    if cosines.len() > CANDIDATES {
        cosines.select_nth_unstable_by(CANDIDATES - 1, by_cosine);
        cosines.truncate(CANDIDATES);
    }
    let Some(first) = lexical.first() else {
        cosines.sort_by(by_cosine);
        return cosines.into_iter().take(limit).map(|(id, name, cosine)| owned(id, name, cosine)).collect();
    };
    let best = if first.score > 0.0 { first.score } else { 1.0 };
    let candidates = candidates(lexical, lexical_cosines, cosines);
    let (low, span) = cosine_range(&candidates);
    let first_key = (first.process_id.as_str(), first.tool_name.as_str());
    let mut hits: Vec<((&str, &str), f32)> = candidates
        .into_iter()
        .filter(|(key, _)| *key != first_key)
        .map(|(key, (lexical, cosine))| {
            let semantic = cosine.map_or(0.0, |c| (c - low) / span);
            let weight = if blind.unscored(apart, &key) { weight * APART_LEXICAL_SHARE } else { weight };
            (key, weight * lexical / best + (1.0 - weight) * semantic)
        })
        .collect();
    hits.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    hits.truncate(limit.saturating_sub(1));
    let top = hits.first().map_or(0.0, |h| h.1);
    // The kept first hit scores at least as much as the next, so relevance stays in order.
    let mut fused = Vec::with_capacity(hits.len() + 1);
    fused.push(SearchHit { score: top.max(weight), ..first.clone() });
    fused.extend(hits.into_iter().map(|((id, name), score)| owned(id, name, score)));
    fused
}

/// (lexical score, cosine) per candidate tool.
type Candidates<'a> = HashMap<(&'a str, &'a str), (f32, Option<f32>)>;

/// The union of both stages' candidates: the lexical hits with their cosines, and the tools only the cosines
/// propose, with no lexical score.
fn candidates<'a>(
    lexical: &'a [SearchHit],
    lexical_cosines: &[Option<f32>],
    cosines: Vec<Scored<'a>>,
) -> Candidates<'a> {
    let mut candidates: Candidates<'a> = HashMap::with_capacity(2 * CANDIDATES);
    for (hit, cosine) in lexical.iter().zip(lexical_cosines.iter().chain(std::iter::repeat(&None))) {
        candidates.insert((&hit.process_id, &hit.tool_name), (hit.score, *cosine));
    }
    for (id, name, cosine) in cosines {
        candidates.entry((id, name)).or_insert((0.0, Some(cosine)));
    }
    candidates
}

/// The lowest cosine of the candidates and the span up to the highest (1 when there is none to divide by).
fn cosine_range(candidates: &Candidates<'_>) -> (f32, f32) {
    let (low, high) =
        candidates.values().filter_map(|(_, c)| *c).fold((f32::MAX, f32::MIN), |(lo, hi), c| (lo.min(c), hi.max(c)));
    (low, if high > low { high - low } else { 1.0 })
}

/// Best cosine first; equal cosines by key, so the order never depends on the input's.
fn by_cosine(a: &Scored<'_>, b: &Scored<'_>) -> Ordering {
    b.2.total_cmp(&a.2).then_with(|| (a.0, a.1).cmp(&(b.0, b.1)))
}

/// A hit returned: its strings copied.
fn owned(process_id: &str, tool_name: &str, score: f32) -> SearchHit {
    SearchHit {
        process_id: process_id.to_owned(),
        tool_name: tool_name.to_owned(),
        score,
        // The semantic stage keeps no places; a reader finds the tool by name.
        position: NO_POSITION,
    }
}
