//! Tool search: owns the in-RAM tantivy index of every instance's tools, its single writer task,
//! and the keyword query API the router uses for `discover_mcp_tools`.
//!
//! - Writes: [`SearchIndex::replace_instance`] / [`SearchIndex::remove_instance`] number a command and
//!   send it on a bounded channel ([`COMMAND_QUEUE_CAPACITY`]; a full queue makes the caller wait) to the
//!   one task that owns the `IndexWriter`, and return without waiting for the commit. A command carries the
//!   tools as an iterator: the writer makes each into a document as it adds it, on its own thread. The task
//!   applies every queued command, commits once on the blocking pool, reloads the reader, and then publishes
//!   the number of the last command applied. The task ends when the last handle is dropped. Once the index is
//!   merged and idle, the task drops its writer (tantivy's queue of 10,000 slots and the writer's threads)
//!   and opens one again at the next write.
//! - A search first waits until every command sent before it has been applied (no wait when none is
//!   pending), so a write that has returned is visible to every later search, while the writer's caller (an
//!   instance coming online) does not wait for the commit.
//! - Reads: [`SearchIndex::search`] builds one query (analysis in `analysis`, shape in `schema`) with
//!   the caller's [`Scope`] as a required clause (a doc-id bitset per segment, cached per scope and
//!   index generation: `visibility`), and runs it on the blocking pool against the reader
//!   (`ReloadPolicy::Manual`, reloaded only by the writer task).
//! - Nothing else in the crate touches tantivy. `*` (list everything) is the router's job.

mod analysis;
#[doc(hidden)]
pub mod eval;
mod needs;
mod schema;
pub mod semantic;
mod visibility;
mod writer;

#[cfg(test)]
mod eval_tests;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};
use tantivy::collector::{Count, TopDocs};
use tantivy::query::{BooleanQuery, Occur};
use tantivy::schema::Value as _;
use tantivy::{Index, IndexReader, ReloadPolicy, Searcher, TantivyDocument, TantivyError, Term};

use tokio::sync::{mpsc, watch};

use self::analysis::TOOL_TOKENIZER;
pub use self::needs::{split_needs, MAX_NEEDS};
use self::schema::IndexSchema;
pub use self::schema::{parameter_names, tool_key, Explainer};
pub use self::semantic::{Semantic, SemanticError};
pub use self::visibility::Scope;
use self::visibility::VisibleQuery;
use self::writer::{open_writer, run_writer, Applied, Command, Tools};

/// Commands waiting for the writer task; senders wait while it is full.
const COMMAND_QUEUE_CAPACITY: usize = 64;

/// A search whose caller sees at most this many tools (and whose filter is built) runs on the calling task:
/// at 4,500 tools such a search takes about 0.2 ms, less than the hop to the blocking pool and back.
const INLINE_MAX_DOCS: u64 = 20_000;

/// For the fuzz targets: analyse and normalise `text` and build its query, as [`SearchIndex::search`] does,
/// without an index.
#[doc(hidden)]
pub fn fuzz_query(text: &str) {
    thread_local! {
        static SCHEMA: IndexSchema = IndexSchema::new();
    }
    SCHEMA.with(|schema| {
        let _ = schema.query(text, |_| true);
    });
}

/// One tool as indexed.
#[derive(Debug, Clone)]
pub struct ToolDoc {
    pub process_id: String,
    pub server_slug: String,
    pub tool_name: String,
    pub description: String,
    /// The names of the tool's parameters, space-separated ([`parameter_names`] of its input schema): all the
    /// index needs of a schema. Text, not the parsed schema: a listing is indexed whole, and its thousands of
    /// schema trees alive at once left the allocator's pages stretched long after they were freed.
    pub parameters: String,
    /// Its place in its instance's catalog ([`NO_POSITION`] when not known): a hit finds its tool there without
    /// a scan of the catalog by name.
    pub position: u32,
}

/// The position of a tool whose place in its catalog is not known.
pub const NO_POSITION: u32 = u32::MAX;

impl ToolDoc {
    /// One tool of a catalog, as the instance `process_id` of server `server_slug` lists it.
    pub fn of(process_id: &str, server_slug: &str, tool: &crate::model::catalog::ToolDef, position: usize) -> ToolDoc {
        ToolDoc {
            process_id: process_id.to_owned(),
            server_slug: server_slug.to_owned(),
            tool_name: tool.name().to_owned(),
            description: tool.description().to_owned(),
            parameters: parameter_names(&tool.input_schema()),
            position: u32::try_from(position).unwrap_or(NO_POSITION),
        }
    }
}

/// Why a tool matched a query: the query's terms, after the search's own analysis (stemming, splitting of
/// `snake_case` and `camelCase`), found in each part of the tool.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Matched {
    /// The whole query is the tool's name (or `server tool`).
    pub exact_name: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub name: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub description: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,
}

/// One result of [`SearchIndex::search`]; `score` is the raw BM25-based score (higher is better).
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    pub process_id: String,
    pub tool_name: String,
    pub score: f32,
    /// The tool's place in its instance's catalog when it was indexed ([`NO_POSITION`]: not known); a catalog
    /// discovered since may have moved it, so a reader checks the name there.
    pub position: u32,
}

/// What [`SearchIndex::search_counted`] found: the best hits, and how many visible tools matched in all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    pub hits: Vec<SearchHit>,
    pub matched: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("search index error")]
    Tantivy(#[from] TantivyError),
    #[error("the search index writer task has stopped")]
    WriterGone,
    #[error("the search index needs a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    #[error("a search index task failed")]
    TaskFailed(#[source] tokio::task::JoinError),
    #[error("stored document {0:?} has no {1}")]
    MissingField(tantivy::DocAddress, &'static str),
    #[error("a search index commit failed (write {through} and those applied with it were rolled back): {error}")]
    CommitFailed { through: u64, error: Arc<str> },
}

/// How far the writer has come: commands are numbered as they are sent, in the order the writer receives
/// them, and the writer publishes the number of the last one it applied (committed, or failed and rolled back).
struct Progress {
    /// Serialises numbering and sending, so numbers reach the writer in order.
    order: tokio::sync::Mutex<()>,
    /// The number of the last command sent.
    sent: AtomicU64,
    /// What the writer has applied.
    applied: watch::Receiver<Applied>,
}

/// Cheap, cloneable handle on the index: a command sender and the shared reader.
#[derive(Clone)]
pub struct SearchIndex {
    commands: mpsc::Sender<Command>,
    progress: Arc<Progress>,
    reader: IndexReader,
    schema: Arc<IndexSchema>,
    semantic: Option<Arc<Semantic>>,
}

impl SearchIndex {
    /// In-RAM index; spawns the single writer task on the current tokio runtime.
    pub fn new() -> Result<SearchIndex, SearchError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(SearchError::NoRuntime)?;
        let schema = Arc::new(IndexSchema::new());
        let index = Index::create_in_ram(schema.schema.clone());
        index.tokenizers().register(TOOL_TOKENIZER, schema.analyzer.clone());
        // Opened now so that an index that cannot be written fails here, at start.
        let writer = open_writer(&index)?;
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE_CAPACITY);
        let (applied_tx, applied) = watch::channel(Applied::default());
        runtime.spawn(run_writer(index, writer, reader.clone(), schema.clone(), receiver, applied_tx));
        let progress = Arc::new(Progress { order: tokio::sync::Mutex::new(()), sent: AtomicU64::new(0), applied });
        Ok(SearchIndex { commands, progress, reader, schema, semantic: None })
    }

    /// The same index with the semantic stage re-ranking request-shaped queries.
    pub fn with_semantic(mut self, semantic: Arc<Semantic>) -> SearchIndex {
        self.semantic = Some(semantic);
        self
    }

    /// The stages a search runs, for the start log.
    pub fn describe_stages(&self) -> String {
        match &self.semantic {
            Some(semantic) => format!("lexical (BM25F, tantivy) + {}", semantic.describe()),
            None => "lexical (BM25F, tantivy); semantic stage off (SATELLITE_SEMANTIC_MODEL not set)".to_owned(),
        }
    }

    /// The semantic stage, when on.
    pub fn semantic(&self) -> Option<&Arc<Semantic>> {
        self.semantic.as_ref()
    }

    /// Replace every document of one instance (delete by process_id term, add docs, commit, reload
    /// reader). Resolves once the change is queued: every search that starts after it sees the change.
    /// `docs` is read by the writer, on the blocking pool, as it adds them (see `Tools`): it should only make
    /// documents from what it holds, never wait on anything, and never panic (a panic there leaves the index
    /// read-only, as any panic of the writer does).
    pub async fn replace_instance<D>(&self, process_id: &str, docs: D) -> Result<(), SearchError>
    where
        D: IntoIterator<Item = ToolDoc>,
        D::IntoIter: Send + 'static,
    {
        let tools: Tools = match &self.semantic {
            Some(semantic) => {
                let docs: Vec<ToolDoc> = docs.into_iter().collect();
                semantic.set_instance(process_id, &docs);
                Box::new(docs.into_iter())
            }
            None => Box::new(docs.into_iter()),
        };
        self.send(process_id, tools).await
    }

    /// Remove every document of one instance. Resolves once the change is queued, as `replace_instance`.
    pub async fn remove_instance(&self, process_id: &str) -> Result<(), SearchError> {
        if let Some(semantic) = &self.semantic {
            semantic.set_instance(process_id, &[]);
        }
        self.send(process_id, Box::new(std::iter::empty())).await
    }

    async fn send(&self, process_id: &str, tools: Tools) -> Result<(), SearchError> {
        let _order = self.progress.order.lock().await;
        let number = self.progress.sent.load(Ordering::Acquire) + 1;
        let command = Command { number, process_id: process_id.to_owned(), tools };
        self.commands.send(command).await.map_err(|_| SearchError::WriterGone)?;
        self.progress.sent.store(number, Ordering::Release);
        Ok(())
    }

    /// Wait until every command sent so far has been applied (at once when none is pending). A writer that
    /// has stopped applies nothing more: searches then read what it left.
    pub async fn settled(&self) {
        let sent = self.progress.sent.load(Ordering::Acquire);
        let mut applied = self.progress.applied.clone();
        if applied.borrow().through >= sent {
            return;
        }
        let _ = applied.wait_for(|applied| applied.through >= sent).await;
    }

    /// Wait, as [`settled`](Self::settled), then say whether every write this index was sent has been
    /// committed: the last failed commit's error otherwise. For a caller that builds an index and then relies
    /// on all of it, as the offline `satellite search` does; the serving satellite's writes are logged by the
    /// writer when they fail, and the instance is indexed again when its tools next change.
    pub async fn written(&self) -> Result<(), SearchError> {
        let sent = self.progress.sent.load(Ordering::Acquire);
        self.settled().await;
        let applied = self.progress.applied.borrow();
        match &applied.failed {
            Some((through, error)) => Err(SearchError::CommitFailed { through: *through, error: error.clone() }),
            // `settled` also returns when the writer has stopped (it panicked) with writes still queued.
            None if applied.through < sent => Err(SearchError::WriterGone),
            None => Ok(()),
        }
    }

    /// Best `limit` tools among documents whose process_id is in `scope`, best first. Runs on
    /// the blocking pool. An empty query, an empty `scope` or a zero `limit` give no hits.
    pub async fn search(&self, query: &str, scope: &Arc<Scope>, limit: usize) -> Result<Vec<SearchHit>, SearchError> {
        Ok(self.search_counted(query, scope, limit).await?.hits)
    }

    /// [`search`](Self::search), and how many visible tools matched in all (the hits are the best of them).
    pub async fn search_counted(&self, query: &str, scope: &Arc<Scope>, limit: usize) -> Result<Found, SearchError> {
        if query.trim().is_empty() || scope.is_empty() || limit == 0 {
            return Ok(Found::default());
        }
        self.settled().await;
        let weight = semantic::semantic_weight(query);
        match &self.semantic {
            Some(semantic) if weight < 1.0 => {
                let lexical = self.lexical(query, scope, limit.max(semantic::CANDIDATES)).await?;
                let matched = lexical.matched;
                match semantic.rerank(query, weight, &lexical.hits, scope, limit).await {
                    Ok(hits) => Ok(Found { matched: matched.max(hits.len()), hits }),
                    Err(error) => {
                        tracing::warn!(%error, "semantic stage failed; answering with the lexical ranking");
                        Ok(Found { hits: lexical.hits.into_iter().take(limit).collect(), matched })
                    }
                }
            }
            _ => self.lexical(query, scope, limit).await,
        }
    }

    /// The lexical stage alone.
    async fn lexical(&self, query: &str, scope: &Arc<Scope>, limit: usize) -> Result<Found, SearchError> {
        // Handing the work to the blocking pool costs about as much as a whole search of a few thousand
        // tools (a thread hop each way), so a scope whose filter is built and small runs here; a first search
        // at a new generation (the filter reads postings) or a large scope goes to the blocking pool.
        let searcher = self.reader.searcher();
        let generation = searcher.generation().generation_id();
        if scope.cached_docs(generation).is_some_and(|docs| docs <= INLINE_MAX_DOCS) {
            return search_blocking(&searcher, &self.schema, query, scope, limit);
        }
        let schema = self.schema.clone();
        let (query, scope) = (query.to_owned(), scope.clone());
        tokio::task::spawn_blocking(move || search_blocking(&searcher, &schema, &query, &scope, limit))
            .await
            .map_err(SearchError::TaskFailed)?
    }

    /// What says why tools match `query` (the `explain` option of `discover_mcp_tools`).
    pub fn explainer(&self, query: &str) -> Explainer {
        Explainer::new(&self.schema, query)
    }

    /// Number of indexed documents, every write sent so far applied.
    pub async fn num_docs(&self) -> u64 {
        self.settled().await;
        self.reader.searcher().num_docs()
    }

    /// Number of segments searches read (one once the index has been idle, see `run_writer`).
    pub fn num_segments(&self) -> usize {
        self.reader.searcher().segment_readers().len()
    }
}

fn search_blocking(
    searcher: &Searcher,
    schema: &IndexSchema,
    query: &str,
    scope: &Scope,
    limit: usize,
) -> Result<Found, SearchError> {
    let is_indexed = |term: &Term| {
        searcher.segment_readers().iter().any(|segment| {
            let index = segment.inverted_index(term.field());
            index.is_ok_and(|index| index.get_term_info(term).is_ok_and(|info| info.is_some()))
        })
    };
    let Some(text) = schema.query(query, is_indexed) else {
        return Ok(Found::default());
    };
    let visible = VisibleQuery(scope.filter(searcher, schema.fields.process_id, schema.fields.tool_key)?);
    // Visibility is a required clause of the query itself, so the top `limit` are the best visible
    // tools, never best-overall tools filtered afterwards.
    let query = BooleanQuery::new(vec![(Occur::Must, Box::new(visible)), (Occur::Must, text)]);
    let (matched, top) = searcher.search(&query, &(Count, TopDocs::with_limit(limit)))?;
    let mut hits = Vec::with_capacity(top.len());
    for (score, address) in top {
        let document: TantivyDocument = searcher.doc(address)?;
        let text_of = |field, name| {
            document
                .get_first(field)
                .and_then(|value| value.as_str())
                .map(str::to_owned)
                .ok_or(SearchError::MissingField(address, name))
        };
        let position = document.get_first(schema.fields.position).and_then(|value| value.as_u64());
        hits.push(SearchHit {
            process_id: text_of(schema.fields.process_id, "process_id")?,
            tool_name: text_of(schema.fields.tool_name, "tool_name")?,
            score,
            position: position.and_then(|p| u32::try_from(p).ok()).unwrap_or(NO_POSITION),
        });
    }
    Ok(Found { hits, matched })
}

/// Fuse-style relevance as DeployStack reports it (`relevance_score`): 0 is the best match, and
/// it never exceeds 1. BM25 scores have no fixed scale, so the score is taken relative to the best
/// hit of the same query:
///
/// `relevance = clamp(1 - score / best, 0, 1)`
///
/// The best hit gets 0, a hit with half the best score 0.5, a hit scoring nothing 1. A
/// non-positive or non-finite `best` (or `score`) gives 1.
pub fn relevance_score(score: f32, best: f32) -> f64 {
    if !(best.is_finite() && best > 0.0 && score.is_finite()) {
        return 1.0;
    }
    (1.0 - f64::from(score) / f64::from(best)).clamp(0.0, 1.0)
}
