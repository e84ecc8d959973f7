//! The optional semantic stage of tool search (cargo feature `semantic`, switched on by
//! `SATELLITE_SEMANTIC_MODEL`): a sentence-embedding model re-ranks what the lexical stage found.
//!
//! - Each tool is embedded once per content hash (the SHA-256 of the text embedded), on one background task,
//!   in batches, off the request path; the vector is shared by every instance that has the same tool and kept
//!   in an append-only cache file in the data directory, so a restart embeds nothing it has seen.
//!   A cache cut short (a crash mid-write) keeps its whole records and drops the torn tail.
//! - A query in request shape (several words, see [`semantic_weight`]) is embedded (~10 ms on 2 cores), the
//!   caller's visible tools are scored by cosine, and the best of both stages are fused:
//!   `w * lexical / best_lexical + (1 - w) * min-max(cosine)` over the union of both candidate lists.
//!   Keyword queries (a tool name, `server tool`, one to three words) stay purely lexical.
//! - A tool not embedded yet scores the lowest cosine: search never waits for the encoder.

#[cfg(feature = "semantic")]
mod model;
#[cfg(not(feature = "semantic"))]
mod model {
    //! Built without the `semantic` feature: the stage cannot be switched on.
    pub(super) struct Encoder;
    impl Encoder {
        pub(super) fn load(_: &std::path::Path, _: usize) -> Result<Encoder, super::SemanticError> {
            Err(super::SemanticError::NotCompiled)
        }
        pub(super) fn dimensions(&self) -> usize {
            0
        }
        pub(super) fn embed(&self, _: &[String]) -> Result<Vec<Vec<f32>>, super::SemanticError> {
            Err(super::SemanticError::NotCompiled)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
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

type Hash = [u8; 32];

/// The semantic stage: the encoder, every tool's vector, and the task that embeds new tools.
pub struct Semantic {
    encoder: Arc<Encoder>,
    model_dir: PathBuf,
    state: Arc<RwLock<State>>,
    queue: mpsc::UnboundedSender<Vec<(Hash, String)>>,
    /// Tools waiting for their vector.
    pending: Arc<AtomicUsize>,
    cached: usize,
}

#[derive(Default)]
struct State {
    vectors: HashMap<Hash, Arc<[f32]>>,
    /// Per instance: each tool and the hash of its text.
    tools: HashMap<String, Vec<(String, Hash)>>,
    /// Hashes queued or being embedded.
    queued: HashSet<Hash>,
}

impl Semantic {
    /// Loads the model in `model_dir` and the cache under `cache_dir`, and starts the embedding task on the
    /// current runtime. Fails when the model cannot be read (or the feature is not compiled in).
    pub fn load(model_dir: &Path, cache_dir: Option<&Path>) -> Result<Arc<Semantic>, SemanticError> {
        let encoder = Arc::new(Encoder::load(model_dir, TOOL_MAX_TOKENS)?);
        let cache = match cache_dir {
            Some(dir) => Some(Cache::open(dir, &fingerprint(model_dir)?, encoder.dimensions())?),
            None => None,
        };
        let mut state = State::default();
        if let Some(cache) = &cache {
            state.vectors = cache.read_all()?;
        }
        let cached = state.vectors.len();
        let state = Arc::new(RwLock::new(state));
        let pending = Arc::new(AtomicUsize::new(0));
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(embed_task(encoder.clone(), state.clone(), pending.clone(), cache, receiver));
        Ok(Arc::new(Semantic { encoder, model_dir: model_dir.to_owned(), state, queue, pending, cached }))
    }

    /// What the start log says about this stage.
    pub fn describe(&self) -> String {
        format!(
            "semantic ({} dimensions, model {}, {} tool vectors cached)",
            self.encoder.dimensions(),
            self.model_dir.display(),
            self.cached
        )
    }

    /// Tools whose vector is still being computed.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Records an instance's tools (none: removes it) and queues the ones never embedded.
    pub(super) fn set_instance(&self, process_id: &str, tools: &[ToolDoc]) {
        let mut state = self.state.write();
        if tools.is_empty() {
            state.tools.remove(process_id);
            return;
        }
        let mut new = Vec::new();
        let mut entries = Vec::with_capacity(tools.len());
        for tool in tools {
            let text = tool_text(tool);
            let hash: Hash = Sha256::digest(text.as_bytes()).into();
            if !state.vectors.contains_key(&hash) && state.queued.insert(hash) {
                new.push((hash, text));
            }
            entries.push((tool.tool_name.clone(), hash));
        }
        state.tools.insert(process_id.to_owned(), entries);
        if !new.is_empty() {
            self.pending.fetch_add(new.len(), Ordering::AcqRel);
            if self.queue.send(new).is_err() {
                tracing::warn!("the embedding task has stopped; new tools are searched lexically only");
            }
        }
    }

    /// Fuses `lexical` (best first) with the cosine ranking of the tools `scope` may see, for `query` whose
    /// lexical weight is `weight`; the best `limit`.
    pub(super) async fn rerank(
        &self,
        query: &str,
        weight: f32,
        lexical: Vec<SearchHit>,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<SearchHit>, SemanticError> {
        let encoder = self.encoder.clone();
        let text = vec![query.to_owned()];
        let vector = tokio::task::spawn_blocking(move || encoder.embed(&text)).await??;
        let Some(vector) = vector.into_iter().next() else {
            return Ok(lexical);
        };
        let cosines = self.cosines(&vector, scope);
        Ok(fuse(weight, lexical, cosines, limit))
    }

    /// Cosine of every visible, embedded tool with `query`: `((process_id, tool_name), cosine)`.
    pub(super) fn cosines(&self, query: &[f32], scope: &Scope) -> Vec<((String, String), f32)> {
        let state = self.state.read();
        let mut scored = Vec::new();
        let mut score = |process_id: &str, tool: &str, hash: &Hash| {
            if let Some(vector) = state.vectors.get(hash) {
                let cosine = vector.iter().zip(query).map(|(a, b)| a * b).sum::<f32>();
                scored.push(((process_id.to_owned(), tool.to_owned()), cosine));
            }
        };
        for id in scope.ids() {
            for (tool, hash) in state.tools.get(id).into_iter().flatten() {
                score(id, tool, hash);
            }
        }
        for key in scope.tool_keys() {
            let Some((id, name)) = key.split_once('\u{1f}') else { continue };
            if let Some((tool, hash)) = state.tools.get(id).and_then(|tools| tools.iter().find(|(t, _)| t == name)) {
                score(id, tool, hash);
            }
        }
        scored
    }
}

/// The lexical stage's weight for a query, by its shape: 1 (lexical only) for keyword queries of up to three
/// words, where the exact and lexical matches are what is asked for; `REQUEST_LEXICAL_WEIGHT` for requests.
pub fn semantic_weight(query: &str) -> f32 {
    const REQUEST_LEXICAL_WEIGHT: f32 = 0.5;
    if query.split_whitespace().count() <= 3 {
        1.0
    } else {
        REQUEST_LEXICAL_WEIGHT
    }
}

/// `w * lexical / best + (1 - w) * (cos - min) / (max - min)` over the union of both stages' best [`CANDIDATES`]
/// (min and max over that union); the lexical stage's first hit stays first (an exact name, `server tool`, or
/// the tool whose words the request shares most: measured on dev, moving it cost more than it won).
pub(super) fn fuse(
    weight: f32,
    lexical: Vec<SearchHit>,
    mut cosines: Vec<((String, String), f32)>,
    limit: usize,
) -> Vec<SearchHit> {
    let Some(first) = lexical.first().cloned() else {
        cosines.sort_by(|a, b| b.1.total_cmp(&a.1));
        return cosines
            .into_iter()
            .take(limit)
            .map(|((process_id, tool_name), score)| SearchHit { process_id, tool_name, score })
            .collect();
    };
    let best = if first.score > 0.0 { first.score } else { 1.0 };
    let all: HashMap<(String, String), f32> = cosines.iter().cloned().collect();
    cosines.sort_by(|a, b| b.1.total_cmp(&a.1));
    cosines.truncate(CANDIDATES);
    let mut candidates: HashMap<(String, String), (f32, f32)> = HashMap::new();
    for hit in &lexical {
        let key = (hit.process_id.clone(), hit.tool_name.clone());
        let cosine = all.get(&key).copied().unwrap_or(f32::NAN);
        candidates.insert(key, (hit.score, cosine));
    }
    for (key, cosine) in cosines {
        candidates.entry(key).or_insert((0.0, cosine));
    }
    let (low, high) = candidates
        .values()
        .filter(|(_, c)| c.is_finite())
        .fold((f32::MAX, f32::MIN), |(lo, hi), (_, c)| (lo.min(*c), hi.max(*c)));
    let span = if high > low { high - low } else { 1.0 };
    let first_key = (first.process_id.clone(), first.tool_name.clone());
    let mut hits: Vec<SearchHit> = candidates
        .into_iter()
        .filter(|(key, _)| *key != first_key)
        .map(|((process_id, tool_name), (lexical, cosine))| {
            // A tool not embedded yet counts as the least similar.
            let semantic = if cosine.is_finite() { (cosine - low) / span } else { 0.0 };
            SearchHit { process_id, tool_name, score: weight * lexical / best + (1.0 - weight) * semantic }
        })
        .collect();
    hits.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then_with(|| (&a.process_id, &a.tool_name).cmp(&(&b.process_id, &b.tool_name)))
    });
    hits.truncate(limit.saturating_sub(1));
    let top = hits.first().map_or(0.0, |h| h.score);
    // The kept first hit scores at least as much as the next, so relevance stays in order.
    hits.insert(0, SearchHit { score: top.max(weight), ..first });
    hits
}

/// The text embedded for a tool: its server, its name with `_`/`-` as spaces, and its description.
fn tool_text(tool: &ToolDoc) -> String {
    let words = |s: &str| s.replace(['_', '-'], " ");
    format!("{} {}: {}", words(&tool.server_slug), words(&tool.tool_name), tool.description)
}

/// Identifies a model and text format: a cache written for one is never read for another.
fn fingerprint(model_dir: &Path) -> Result<String, SemanticError> {
    let mut hasher = Sha256::new();
    hasher.update(TEXT_FORMAT);
    hasher.update(TOOL_MAX_TOKENS.to_le_bytes());
    for name in ["config.json", "tokenizer.json"] {
        let path = model_dir.join(name);
        let bytes =
            std::fs::read(&path).map_err(|source| SemanticError::Read { path: path.display().to_string(), source })?;
        hasher.update(&bytes);
    }
    let weights = model_dir.join("model.safetensors");
    let length = std::fs::metadata(&weights)
        .map_err(|source| SemanticError::Read { path: weights.display().to_string(), source })?
        .len();
    hasher.update(length.to_le_bytes());
    Ok(hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The background task: embeds queued tools in batches on the blocking pool, stores and caches the vectors.
async fn embed_task(
    encoder: Arc<Encoder>,
    state: Arc<RwLock<State>>,
    pending: Arc<AtomicUsize>,
    cache: Option<Cache>,
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
            let encoder = encoder.clone();
            let vectors = match tokio::task::spawn_blocking(move || encoder.embed(&texts)).await {
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
            if let Some(cache) = &cache {
                if let Err(error) = cache.append(hashes.iter().zip(&vectors)) {
                    tracing::warn!(%error, "the embedding cache could not be written; vectors are kept in memory");
                }
            }
            {
                let mut state = state.write();
                for (hash, vector) in hashes.iter().zip(vectors) {
                    state.vectors.insert(*hash, vector.into());
                }
                for hash in &hashes {
                    state.queued.remove(hash);
                }
            }
            pending.fetch_sub(hashes.len(), Ordering::AcqRel);
        }
    }
}

/// The append-only vector cache: records of a 32-byte hash and `dimensions` little-endian f32s.
struct Cache {
    path: PathBuf,
    file: Mutex<std::fs::File>,
    dimensions: usize,
}

impl Cache {
    fn open(dir: &Path, fingerprint: &str, dimensions: usize) -> Result<Cache, SemanticError> {
        let path = dir.join(format!("embeddings-{fingerprint}.bin"));
        let error = |source| SemanticError::Cache { path: path.display().to_string(), source };
        std::fs::create_dir_all(dir).map_err(error)?;
        let file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(error)?;
        Ok(Cache { path, file: Mutex::new(file), dimensions })
    }

    fn record_len(&self) -> usize {
        32 + 4 * self.dimensions
    }

    /// Every whole record; a torn tail is cut off so later appends stay aligned.
    fn read_all(&self) -> Result<HashMap<Hash, Arc<[f32]>>, SemanticError> {
        let error = |source| SemanticError::Cache { path: self.path.display().to_string(), source };
        let bytes = std::fs::read(&self.path).map_err(error)?;
        let record = self.record_len();
        let whole = bytes.len() / record * record;
        if whole != bytes.len() {
            tracing::warn!(path = %self.path.display(), dropped = bytes.len() - whole, "embedding cache ends in a torn record; dropping it");
            self.file.lock().set_len(whole as u64).map_err(error)?;
        }
        let mut vectors = HashMap::with_capacity(whole / record);
        for chunk in bytes[..whole].chunks_exact(record) {
            let (hash, values) = chunk.split_at(32);
            let Ok(hash) = <Hash>::try_from(hash) else { continue };
            let vector: Arc<[f32]> =
                values.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            vectors.insert(hash, vector);
        }
        Ok(vectors)
    }

    fn append<'a>(&self, records: impl Iterator<Item = (&'a Hash, &'a Vec<f32>)>) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for (hash, vector) in records {
            if vector.len() != self.dimensions {
                continue;
            }
            bytes.extend_from_slice(hash);
            for value in vector {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
        // One write per batch: a crash leaves at most one torn record at the end.
        self.file.lock().write_all(&bytes)
    }
}
