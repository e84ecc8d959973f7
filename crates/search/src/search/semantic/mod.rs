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

mod cache;
mod fusion;
mod script;
mod state;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use self::cache::{fingerprint, Cache};
use self::fusion::fuse;
use self::model::Encoder;
use self::script::{is_written_apart, letters, written_apart, Blind};
use self::state::State;
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

/// The text embedded for a tool: its server, its name with `_`/`-` as spaces, and its description.
fn tool_text(tool: &ToolDoc) -> String {
    let words = |s: &str| s.replace(['_', '-'], " ");
    format!("{} {}: {}", words(&tool.server_slug), words(&tool.tool_name), tool.description)
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
