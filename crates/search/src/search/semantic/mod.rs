//! The optional semantic stage of tool search (cargo feature `semantic`, switched on by
//! `SATELLITE_SEMANTIC_MODEL`): a sentence-embedding model re-ranks what the lexical stage found.
//!
//! - Each tool is embedded once per content hash (the SHA-256 of the text embedded), on one background task,
//!   in batches, off the request path; the vector is shared by every instance that has the same tool and kept
//!   in an append-only cache file in the data directory, so a restart embeds nothing it has seen.
//!   A cache cut short (a crash mid-write) keeps its whole records and drops the torn tail.
//! - Memory holds the vectors of the tools some indexed instance has, nothing more: a tool that goes away
//!   (an instance removed, dormant or changed) frees its vector, and one that comes back is read from the cache
//!   file by offset (on the blocking pool, the record's hash checked), not embedded again. The file grows by one
//!   record per distinct tool text ever seen (1.5 KiB at 384 dimensions); deleting it is safe (the referenced
//!   tools are embedded again), and caches of another model or text format are deleted when it is opened.
//! - A query in request shape (several words, see [`semantic_weight`]) is embedded (~10 ms on 2 cores), the
//!   caller's visible tools are scored by cosine, and the best of both stages are fused:
//!   `w * lexical / best_lexical + (1 - w) * min-max(cosine)` over the union of both candidate lists.
//!   Keyword queries (a tool name, `server tool`, one to three words) stay purely lexical.
//! - A tool not embedded yet scores the lowest cosine: search never waits for the encoder.

#[cfg(feature = "semantic")]
mod model;
#[cfg(not(feature = "semantic"))]
mod model {
    //! Built without the `semantic` feature: the stage cannot be switched on with a model.
    pub(super) struct Encoder;
    impl Encoder {
        pub(super) fn load(_: &std::path::Path, _: usize) -> Result<Encoder, super::SemanticError> {
            Err(super::SemanticError::NotCompiled)
        }
    }
    impl super::Embedder for Encoder {
        fn dimensions(&self) -> usize {
            0
        }
        fn fingerprint(&self) -> &str {
            ""
        }
        fn embed(&self, _: &[String], _: super::Role) -> Result<Vec<Vec<f32>>, super::SemanticError> {
            Err(super::SemanticError::NotCompiled)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

use std::collections::{HashMap, HashSet};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use self::model::Encoder;
use super::{Scope, SearchHit, ToolDoc};

/// Tokens kept of a tool's text (most tool descriptions are shorter; attention cost grows with the square).
const TOOL_MAX_TOKENS: usize = 128;

/// Texts embedded per model call.
const BATCH: usize = 32;

/// How many tools each stage proposes for fusion.
pub const CANDIDATES: usize = 100;

/// Bumped when the embedded text of a tool changes, so old caches are not read.
const TEXT_FORMAT: &str = "v1 server name: description";

#[derive(Debug, thiserror::Error)]
pub enum SemanticError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the embedding model: {0}")]
    Model(String),
    #[error(
        "this satellite was built without the `semantic` cargo feature, so SATELLITE_SEMANTIC_MODEL cannot be used"
    )]
    NotCompiled,
    #[error("the embedding cache {path}: {source}")]
    Cache { path: String, source: std::io::Error },
    #[error("the embedding task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What turns texts into unit vectors: the model ([`Encoder`]), or a stand-in in tests.
pub(crate) trait Embedder: Send + Sync + 'static {
    fn dimensions(&self) -> usize;
    /// Identifies the model: a cache written for one model is never read for another.
    fn fingerprint(&self) -> &str;
    /// One unit vector per text, in order; `role` says whether the texts are queries or tools (models trained
    /// with prompts, such as the E5 family, embed each with its own prompt).
    fn embed(&self, texts: &[String], role: Role) -> Result<Vec<Vec<f32>>, SemanticError>;
}

/// What a text embedded is: a request searched for, or a tool searched among.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Query,
    Tool,
}

type Hash = [u8; 32];

/// A tool text's hash and its vector.
type Vector = (Hash, Arc<[f32]>);

/// A visible tool's `(process_id, tool_name, cosine)`, borrowed from the stage's state.
type Scored<'a> = (&'a str, &'a str, f32);

/// Visible tools as `(process_id, tool_name)`, borrowed from the stage's state.
type Keys<'a> = HashSet<(&'a str, &'a str)>;

/// Which tools the lexical stage cannot score for a query, because their descriptions and the query are written
/// in different scripts (see [`written_apart`]): a missing lexical score is weak evidence against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blind {
    /// None: the query and the tools share a script, or nothing is written apart.
    Nothing,
    /// An English (Latin-script) query: the tools written apart.
    ToApart,
    /// A query written apart: the tools that are not.
    ToTheRest,
}

impl Blind {
    /// For `query`, with `apart_indexed` saying whether any indexed tool is written apart.
    pub(super) fn for_query(query: &str, apart_indexed: bool) -> Blind {
        match (written_apart(query), apart_indexed) {
            (true, _) => Blind::ToTheRest,
            (false, true) => Blind::ToApart,
            (false, false) => Blind::Nothing,
        }
    }

    /// Whether the tool `key` is one the lexical stage is blind to, `apart` being the visible tools written apart.
    fn unscored(self, apart: &Keys<'_>, key: &(&str, &str)) -> bool {
        match self {
            Blind::Nothing => false,
            Blind::ToApart => apart.contains(key),
            Blind::ToTheRest => !apart.contains(key),
        }
    }
}

/// The semantic stage: the encoder, the vectors of the indexed tools, and the task that embeds new tools.
pub struct Semantic {
    embedder: Arc<dyn Embedder>,
    model: String,
    state: Arc<RwLock<State>>,
    cache: Option<Arc<Cache>>,
    queue: mpsc::UnboundedSender<Vec<(Hash, String)>>,
    /// Tools waiting for their vector.
    pending: Arc<AtomicUsize>,
}

#[derive(Default)]
struct State {
    /// The vectors of the tools some instance has (`refs` > 0).
    vectors: HashMap<Hash, Arc<[f32]>>,
    /// How many indexed tools (over all instances) have each text.
    refs: HashMap<Hash, usize>,
    /// Per instance: each tool and the hash of its text.
    tools: HashMap<String, Vec<(String, Hash)>>,
    /// Hashes being read from the cache or embedded.
    queued: HashSet<Hash>,
    /// The texts whose description is written in a script of its own ([`written_apart`]).
    apart: HashSet<Hash>,
}

impl State {
    /// Replaces an instance's tools, keeps `refs` and drops the vectors no tool refers to any more; the hashes
    /// that now need a vector (none yet, none on the way) are marked queued and returned.
    fn replace(&mut self, process_id: &str, entries: Vec<(String, Hash)>, apart: Vec<Hash>) -> Vec<Hash> {
        for (_, hash) in &entries {
            *self.refs.entry(*hash).or_default() += 1;
        }
        self.apart.extend(apart);
        let missing =
            entries.iter().map(|(_, hash)| *hash).filter(|h| !self.vectors.contains_key(h) && self.queued.insert(*h));
        let missing: Vec<Hash> = missing.collect();
        let old = if entries.is_empty() {
            self.tools.remove(process_id)
        } else {
            self.tools.insert(process_id.to_owned(), entries)
        };
        for (_, hash) in old.into_iter().flatten() {
            if let Some(count) = self.refs.get_mut(&hash) {
                *count -= 1;
                if *count == 0 {
                    self.refs.remove(&hash);
                    self.vectors.remove(&hash);
                    self.apart.remove(&hash);
                }
            }
        }
        missing
    }

    /// Stores a vector that arrived, if a tool still refers to it.
    fn arrived(&mut self, hash: Hash, vector: Arc<[f32]>) {
        if self.refs.contains_key(&hash) {
            self.vectors.insert(hash, vector);
        }
    }

    /// The cosine with `query` of every visible, embedded tool, and of each `lexical` hit (`None`: no vector);
    /// and, unless `blind` is [`Blind::Nothing`], the visible tools written apart (few: only those are collected).
    fn cosines<'a>(
        &'a self,
        query: &[f32],
        blind: Blind,
        scope: &'a Scope,
        lexical: &[SearchHit],
    ) -> (Vec<Scored<'a>>, Vec<Option<f32>>, Keys<'a>) {
        let dot = |hash: &Hash| {
            let vector = self.vectors.get(hash)?;
            Some(vector.iter().zip(query).map(|(a, b)| a * b).sum::<f32>()).filter(|cosine| cosine.is_finite())
        };
        let (mut scored, mut apart) = (Vec::new(), HashSet::new());
        let look = blind != Blind::Nothing && !self.apart.is_empty();
        let mut add = |id: &'a str, name: &'a str, hash: &Hash| {
            if let Some(cosine) = dot(hash) {
                scored.push((id, name, cosine));
                if look && self.apart.contains(hash) {
                    apart.insert((id, name));
                }
            }
        };
        for id in scope.ids() {
            for (tool, hash) in self.tools.get(id.as_str()).into_iter().flatten() {
                add(id.as_str(), tool.as_str(), hash);
            }
        }
        for key in scope.tool_keys() {
            let Some((id, name)) = key.split_once('\u{1f}') else { continue };
            if let Some(hash) = self.hash_of(id, name) {
                add(id, name, hash);
            }
        }
        let lexical = lexical.iter().map(|hit| self.hash_of(&hit.process_id, &hit.tool_name).and_then(dot)).collect();
        (scored, lexical, apart)
    }

    fn hash_of(&self, process_id: &str, tool_name: &str) -> Option<&Hash> {
        self.tools.get(process_id)?.iter().find(|(name, _)| name == tool_name).map(|(_, hash)| hash)
    }
}

impl Semantic {
    /// Loads the model in `model_dir` and the cache under `cache_dir`, and starts the embedding task on the
    /// current runtime. Fails when the model cannot be read (or the feature is not compiled in); a cache that
    /// cannot be opened is logged and the stage runs without it.
    pub fn load(model_dir: &Path, cache_dir: Option<&Path>) -> Result<Arc<Semantic>, SemanticError> {
        let encoder = Encoder::load(model_dir, TOOL_MAX_TOKENS)?;
        Ok(Semantic::start(Arc::new(encoder), model_dir.display().to_string(), cache_dir))
    }

    /// The stage over any [`Embedder`]; `model` names it in the start log.
    pub(crate) fn start(embedder: Arc<dyn Embedder>, model: String, cache_dir: Option<&Path>) -> Arc<Semantic> {
        let cache = cache_dir.and_then(|dir| {
            let fingerprint = fingerprint(embedder.as_ref());
            match Cache::open(dir, &fingerprint, embedder.dimensions()) {
                Ok(cache) => Some(Arc::new(cache)),
                Err(error) => {
                    tracing::warn!(%error, "the embedding cache cannot be used; vectors are kept in memory only");
                    None
                }
            }
        });
        Semantic::with_cache(embedder, model, cache)
    }

    fn with_cache(embedder: Arc<dyn Embedder>, model: String, cache: Option<Arc<Cache>>) -> Arc<Semantic> {
        let state = Arc::new(RwLock::new(State::default()));
        let pending = Arc::new(AtomicUsize::new(0));
        let (queue, receiver) = mpsc::unbounded_channel();
        let task = embed_task(embedder.clone(), state.clone(), pending.clone(), cache.clone(), receiver);
        tokio::spawn(task);
        Arc::new(Semantic { embedder, model, state, cache, queue, pending })
    }

    /// What the start log says about this stage.
    pub fn describe(&self) -> String {
        format!(
            "semantic ({} dimensions, model {}, {} tool vectors cached)",
            self.embedder.dimensions(),
            self.model,
            self.cache.as_ref().map_or(0, |cache| cache.records())
        )
    }

    /// Tools whose vector is still being computed.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Records an instance's tools (none: removes it). The new ones' vectors are read from the cache file on
    /// the blocking pool, and the ones never embedded go to the embedding task; until then they count in
    /// [`Semantic::pending`].
    pub(super) fn set_instance(&self, process_id: &str, tools: &[ToolDoc]) {
        let (mut texts, mut apart) = (HashMap::new(), Vec::new());
        let entries = tools
            .iter()
            .map(|tool| {
                let text = tool_text(tool);
                let hash: Hash = Sha256::digest(text.as_bytes()).into();
                texts.insert(hash, text);
                if written_apart(&tool.description) {
                    apart.push(hash);
                }
                (tool.tool_name.clone(), hash)
            })
            .collect();
        let missing = self.state.write().replace(process_id, entries, apart);
        if missing.is_empty() {
            return;
        }
        let work: Vec<(Hash, String)> =
            missing.into_iter().map(|hash| (hash, texts.remove(&hash).unwrap_or_default())).collect();
        self.pending.fetch_add(work.len(), Ordering::AcqRel);
        let Some(cache) = self.cache.clone() else {
            queue(&self.queue, &self.state, &self.pending, work);
            return;
        };
        let (state, pending, sender) = (self.state.clone(), self.pending.clone(), self.queue.clone());
        tokio::task::spawn_blocking(move || {
            let (found, new) = cache.read_many(work);
            if !found.is_empty() {
                let mut state = state.write();
                for (hash, vector) in found.iter() {
                    state.queued.remove(hash);
                    state.arrived(*hash, vector.clone());
                }
                pending.fetch_sub(found.len(), Ordering::AcqRel);
            }
            queue(&sender, &state, &pending, new);
        });
    }

    /// Fuses `lexical` (best first) with the cosine ranking of the tools `scope` may see, for `query` whose
    /// lexical weight is `weight`; the best `limit`.
    pub(super) async fn rerank(
        &self,
        query: &str,
        weight: f32,
        lexical: &[SearchHit],
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<SearchHit>, SemanticError> {
        let embedder = self.embedder.clone();
        let text = vec![query.to_owned()];
        let vector = tokio::task::spawn_blocking(move || embedder.embed(&text, Role::Query)).await??;
        let Some(vector) = vector.into_iter().next() else {
            return Ok(lexical.iter().take(limit).cloned().collect());
        };
        let state = self.state.read();
        // With no tool written apart, an English request needs no per-tool look-up.
        let blind = Blind::for_query(query, !state.apart.is_empty());
        let (cosines, lexical_cosines, apart) = state.cosines(&vector, blind, scope, lexical);
        Ok(fuse(weight, lexical, &lexical_cosines, cosines, blind, &apart, limit))
    }
}

/// The lexical stage's weight for a query, by its shape: 1 (lexical only) for keyword queries of up to three
/// words, where the exact and lexical matches are what is asked for; `REQUEST_LEXICAL_WEIGHT` for requests.
/// Chinese and Japanese put no spaces between words: a query written apart counts at least one word per two such
/// characters (a Chinese word is one to three characters, most often two), not one per run without spaces.
pub fn semantic_weight(query: &str) -> f32 {
    const REQUEST_LEXICAL_WEIGHT: f32 = 0.5;
    let mut words = query.split_whitespace().count();
    let (apart, latin) = letters(query);
    if is_written_apart(apart, latin) {
        words = words.max(apart.div_ceil(2));
    }
    if words <= 3 {
        1.0
    } else {
        REQUEST_LEXICAL_WEIGHT
    }
}

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
    mut cosines: Vec<(&'a str, &'a str, f32)>,
    blind: Blind,
    apart: &Keys<'a>,
    limit: usize,
) -> Vec<SearchHit> {
    let by_cosine =
        |a: &(&str, &str, f32), b: &(&str, &str, f32)| b.2.total_cmp(&a.2).then_with(|| (a.0, a.1).cmp(&(b.0, b.1)));
    if cosines.len() > CANDIDATES {
        cosines.select_nth_unstable_by(CANDIDATES - 1, by_cosine);
        cosines.truncate(CANDIDATES);
    }
    let owned = |process_id: &str, tool_name: &str, score| SearchHit {
        process_id: process_id.to_owned(),
        tool_name: tool_name.to_owned(),
        score,
        // The semantic stage keeps no places; a reader finds the tool by name.
        position: super::NO_POSITION,
    };
    let Some(first) = lexical.first() else {
        cosines.sort_by(by_cosine);
        return cosines.into_iter().take(limit).map(|(id, name, cosine)| owned(id, name, cosine)).collect();
    };
    let best = if first.score > 0.0 { first.score } else { 1.0 };
    // (lexical score, cosine) per candidate.
    let mut candidates: HashMap<(&str, &str), (f32, Option<f32>)> = HashMap::with_capacity(2 * CANDIDATES);
    for (hit, cosine) in lexical.iter().zip(lexical_cosines.iter().chain(std::iter::repeat(&None))) {
        candidates.insert((&hit.process_id, &hit.tool_name), (hit.score, *cosine));
    }
    for (id, name, cosine) in cosines {
        candidates.entry((id, name)).or_insert((0.0, Some(cosine)));
    }
    let (low, high) =
        candidates.values().filter_map(|(_, c)| *c).fold((f32::MAX, f32::MIN), |(lo, hi), c| (lo.min(c), hi.max(c)));
    let span = if high > low { high - low } else { 1.0 };
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

/// Whether `text` is written mostly in a script without spaces between words (Chinese, Japanese; Korean), whose
/// words an English query never shares: three Latin letters count as much as one such character.
pub(super) fn written_apart(text: &str) -> bool {
    let (apart, latin) = letters(text);
    is_written_apart(apart, latin)
}

fn is_written_apart(apart: usize, latin: usize) -> bool {
    apart > 0 && apart * 3 > latin
}

/// How many characters of `text` are written apart ([`is_apart`]) and how many are Latin letters.
fn letters(text: &str) -> (usize, usize) {
    let (mut apart, mut latin) = (0usize, 0usize);
    for c in text.chars() {
        if c.is_ascii_alphabetic() {
            latin += 1;
        } else if is_apart(c) {
            apart += 1;
        }
    }
    (apart, latin)
}

/// Kana, CJK ideographs (with extension A) and Hangul syllables.
fn is_apart(c: char) -> bool {
    matches!(c, '\u{3040}'..='\u{30ff}' | '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}' | '\u{ac00}'..='\u{d7af}')
}

/// The text embedded for a tool: its server, its name with `_`/`-` as spaces, and its description.
fn tool_text(tool: &ToolDoc) -> String {
    let words = |s: &str| s.replace(['_', '-'], " ");
    format!("{} {}: {}", words(&tool.server_slug), words(&tool.tool_name), tool.description)
}

/// Names the cache file: the model, the text format and the truncation, so no cache is read for another.
fn fingerprint(embedder: &dyn Embedder) -> String {
    let mut hasher = Sha256::new();
    hasher.update(TEXT_FORMAT);
    hasher.update(TOOL_MAX_TOKENS.to_le_bytes());
    hasher.update(embedder.fingerprint());
    hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Hands `work` (already counted in `pending`) to the embedding task; if it has stopped, the tools stay
/// lexical-only and are no longer waited for.
fn queue(
    sender: &mpsc::UnboundedSender<Vec<(Hash, String)>>,
    state: &RwLock<State>,
    pending: &AtomicUsize,
    work: Vec<(Hash, String)>,
) {
    if work.is_empty() {
        return;
    }
    if let Err(mpsc::error::SendError(work)) = sender.send(work) {
        tracing::warn!("the embedding task has stopped; new tools are searched lexically only");
        let mut state = state.write();
        for (hash, _) in &work {
            state.queued.remove(hash);
        }
        pending.fetch_sub(work.len(), Ordering::AcqRel);
    }
}

/// The background task: embeds queued tools in batches on the blocking pool, caches every vector and keeps
/// the ones a tool still refers to.
async fn embed_task(
    embedder: Arc<dyn Embedder>,
    state: Arc<RwLock<State>>,
    pending: Arc<AtomicUsize>,
    cache: Option<Arc<Cache>>,
    mut receiver: mpsc::UnboundedReceiver<Vec<(Hash, String)>>,
) {
    while let Some(mut work) = receiver.recv().await {
        while let Ok(more) = receiver.try_recv() {
            work.extend(more);
        }
        // A batch is padded to its longest text: batching texts of like length costs ~4x less on tool catalogs.
        work.sort_by_key(|(_, text)| text.len());
        for chunk in work.chunks(BATCH) {
            let (hashes, texts): (Vec<Hash>, Vec<String>) = chunk.iter().cloned().unzip();
            let embedder = embedder.clone();
            let vectors = match tokio::task::spawn_blocking(move || embedder.embed(&texts, Role::Tool)).await {
                Ok(Ok(vectors)) => vectors,
                Ok(Err(error)) => {
                    tracing::warn!(%error, tools = hashes.len(), "embedding failed; these tools are searched lexically only");
                    Vec::new()
                }
                Err(error) => {
                    tracing::warn!(%error, "the embedding task panicked; these tools are searched lexically only");
                    Vec::new()
                }
            };
            let vectors: Vec<(Hash, Arc<[f32]>)> =
                hashes.iter().copied().zip(vectors.into_iter().map(Into::into)).collect();
            if let Some(cache) = &cache {
                if let Err(error) = cache.append(&vectors) {
                    tracing::warn!(%error, "the embedding cache could not be written; vectors are kept in memory");
                }
            }
            {
                let mut state = state.write();
                for hash in &hashes {
                    state.queued.remove(hash);
                }
                for (hash, vector) in vectors {
                    state.arrived(hash, vector);
                }
            }
            pending.fetch_sub(hashes.len(), Ordering::AcqRel);
        }
    }
}

/// Deletes the caches of other models or text formats in `dir` (one satellite, one model): they are never read
/// again and each holds 1.5 KiB per tool text.
fn remove_other_caches(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("embeddings-") && name.ends_with(".bin") && name != keep {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed the embedding cache of another model or text format")
                }
                Err(error) => {
                    tracing::warn!(path = %entry.path().display(), %error, "cannot remove an old embedding cache")
                }
            }
        }
    }
}

/// The append-only vector cache: records of a 32-byte hash and `dimensions` little-endian f32s, and in memory
/// only where each record starts.
struct Cache {
    path: PathBuf,
    file: Mutex<CacheFile>,
    dimensions: usize,
}

struct CacheFile {
    file: std::fs::File,
    /// Where each hash's vector starts.
    offsets: HashMap<Hash, u64>,
    /// The file's length: where the next record goes.
    end: u64,
    /// A write failed part-way: the file's end is unknown until the next start cuts the torn tail.
    failed: bool,
}

impl Cache {
    /// Opens (or creates) the cache and indexes its whole records; a torn tail is cut off so later appends
    /// stay aligned.
    fn open(dir: &Path, fingerprint: &str, dimensions: usize) -> Result<Cache, SemanticError> {
        let name = format!("embeddings-{fingerprint}.bin");
        let path = dir.join(&name);
        let error = |source| SemanticError::Cache { path: path.display().to_string(), source };
        std::fs::create_dir_all(dir).map_err(error)?;
        remove_other_caches(dir, &name);
        let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(error)?;
        let record = 32 + 4 * dimensions as u64;
        let length = file.metadata().map_err(error)?.len();
        let end = length / record * record;
        if end != length {
            tracing::warn!(path = %path.display(), dropped = length - end, "embedding cache ends in a torn record; dropping it");
            file.set_len(end).map_err(error)?;
        }
        let mut offsets = HashMap::with_capacity((end / record) as usize);
        let mut reader = std::io::BufReader::new(&mut file);
        let mut hash = [0u8; 32];
        let mut skip = vec![0u8; 4 * dimensions];
        let mut offset = 0;
        while offset < end {
            reader.read_exact(&mut hash).map_err(error)?;
            reader.read_exact(&mut skip).map_err(error)?;
            offsets.insert(hash, offset + 32);
            offset += record;
        }
        Ok(Cache { path, file: Mutex::new(CacheFile { file, offsets, end, failed: false }), dimensions })
    }

    fn records(&self) -> usize {
        self.file.lock().offsets.len()
    }

    /// The cached vectors of `work` and the work left to embed. Each record is read whole and its hash checked:
    /// a record that does not match (the file changed under this process) or cannot be read is forgotten and
    /// embedded again.
    fn read_many(&self, work: Vec<(Hash, String)>) -> (Vec<Vector>, Vec<(Hash, String)>) {
        let mut file = self.file.lock();
        let mut record = vec![0u8; 32 + 4 * self.dimensions];
        let (mut found, mut new) = (Vec::new(), Vec::new());
        for (hash, text) in work {
            let Some(&offset) = file.offsets.get(&hash) else {
                new.push((hash, text));
                continue;
            };
            let read = file.file.read_exact_at(&mut record, offset - 32);
            if read.is_err() || record[..32] != hash {
                tracing::warn!(path = %self.path.display(), error = ?read.err(), "a cached vector is not where it was indexed; embedding it again");
                file.offsets.remove(&hash);
                new.push((hash, text));
                continue;
            }
            let vector: Arc<[f32]> =
                record[32..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            found.push((hash, vector));
        }
        (found, new)
    }

    /// Appends the records in one write (a crash leaves at most one torn record at the end); vectors of the
    /// wrong length are skipped.
    fn append(&self, records: &[(Hash, Arc<[f32]>)]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        let mut written = Vec::new();
        let mut file = self.file.lock();
        if file.failed {
            return Err(std::io::Error::other(
                "an earlier write failed; the cache takes no more records until restart",
            ));
        }
        let planned_start = file.end;
        for (hash, vector) in records {
            if vector.len() != self.dimensions || file.offsets.contains_key(hash) {
                continue;
            }
            written.push((*hash, file.end + bytes.len() as u64 + 32));
            bytes.extend_from_slice(hash);
            for value in vector.iter() {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if let Err(error) = file.file.write_all(&bytes) {
            // What part of the write landed is unknown: the next start cuts a torn tail, and nothing after it
            // is written here (offsets past the tail would be wrong).
            file.failed = true;
            return Err(error);
        }
        // The write went to the file's end (append mode), wherever that was: offsets follow the real length, and
        // each read checks the record's hash in case another writer interleaved.
        let length = file.file.metadata()?.len();
        let start = length.saturating_sub(bytes.len() as u64);
        file.end = length;
        file.offsets.extend(written.into_iter().map(|(hash, offset)| (hash, offset - planned_start + start)));
        Ok(())
    }
}
