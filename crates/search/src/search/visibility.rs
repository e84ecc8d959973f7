//! The caller's visibility filter, built once per [`Scope`] and index generation rather than per query.
//!
//! A [`Scope`] is the set of process ids a caller may see. The first search of a scope against a given
//! searcher generation reads the postings of each visible `process_id` term once per segment into a doc-id
//! bitset; later searches of the same scope reuse those bitsets until the index commits again (a new
//! generation). The router keeps one scope per caller and visible-set version, so a query costs the text
//! clauses only. Deleted documents may still be set in a bitset: tantivy's collectors skip them anyway.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tantivy::index::SegmentId;
use tantivy::query::{ConstScorer, EmptyScorer, EnableScoring, Explanation, Query, Scorer, Weight};
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::{DocId, DocSet, Score, Searcher, SegmentReader, TantivyError, Term, TERMINATED};

/// The process ids one caller may see (every tool of each), and single tools of other instances (a toolset
/// that takes only some of an instance's tools, as [`super::tool_key`]s), with the filter built from them for
/// the current index generation.
#[derive(Debug, Default)]
pub struct Scope {
    ids: Vec<String>,
    tools: Vec<String>,
    cache: Mutex<Option<Arc<Filter>>>,
}

impl Scope {
    pub fn new(ids: Vec<String>) -> Scope {
        Scope { ids, tools: Vec::new(), cache: Mutex::new(None) }
    }

    /// Every tool of the instances `ids`, and the single tools `tool_keys` ([`super::tool_key`]).
    pub fn with_tools(ids: Vec<String>, tool_keys: Vec<String>) -> Scope {
        Scope { ids, tools: tool_keys, cache: Mutex::new(None) }
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.tools.is_empty()
    }

    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The single tools of other instances ([`super::tool_key`]s).
    pub fn tool_keys(&self) -> &[String] {
        &self.tools
    }

    /// How many documents the cached filter holds, when it was built for `generation`.
    pub(crate) fn cached_docs(&self, generation: u64) -> Option<u64> {
        self.cache.lock().as_ref().filter(|f| f.generation == generation).map(|f| f.docs)
    }

    /// The filter for `searcher`'s generation: cached, or built now from the `process_id` postings (`field`)
    /// and the `tool_key` postings (`tool_field`).
    pub(crate) fn filter(
        &self,
        searcher: &Searcher,
        field: Field,
        tool_field: Field,
    ) -> Result<Arc<Filter>, TantivyError> {
        let generation = searcher.generation().generation_id();
        if let Some(filter) = self.cache.lock().as_ref().filter(|f| f.generation == generation) {
            return Ok(filter.clone());
        }
        let mut segments = HashMap::with_capacity(searcher.segment_readers().len());
        let mut docs = 0;
        for segment in searcher.segment_readers() {
            let max_doc = segment.max_doc();
            let mut words = vec![0u64; (max_doc as usize).div_ceil(64)];
            for (field, values) in [(field, &self.ids), (tool_field, &self.tools)] {
                if values.is_empty() {
                    continue;
                }
                let inverted = segment.inverted_index(field)?;
                for value in values {
                    let term = Term::from_field_text(field, value);
                    let Some(mut postings) = inverted.read_postings(&term, IndexRecordOption::Basic)? else {
                        continue;
                    };
                    let mut doc = postings.doc();
                    while doc != TERMINATED {
                        words[(doc / 64) as usize] |= 1 << (doc % 64);
                        doc = postings.advance();
                    }
                }
            }
            docs += words.iter().map(|w| u64::from(w.count_ones())).sum::<u64>();
            segments.insert(segment.segment_id(), Arc::<[u64]>::from(words));
        }
        let filter = Arc::new(Filter { generation, segments, docs });
        *self.cache.lock() = Some(filter.clone());
        Ok(filter)
    }
}

/// Per segment of one searcher generation, the bitset of visible documents.
#[derive(Debug)]
pub(crate) struct Filter {
    generation: u64,
    segments: HashMap<SegmentId, Arc<[u64]>>,
    /// Visible documents, deleted ones included.
    docs: u64,
}

/// A query matching exactly the documents of a [`Filter`], with a constant score.
#[derive(Debug, Clone)]
pub(crate) struct VisibleQuery(pub(crate) Arc<Filter>);

impl Query for VisibleQuery {
    fn weight(&self, _scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(VisibleWeight(self.0.clone())))
    }
}

struct VisibleWeight(Arc<Filter>);

impl Weight for VisibleWeight {
    fn scorer(&self, reader: &SegmentReader, boost: Score) -> tantivy::Result<Box<dyn Scorer>> {
        match self.0.segments.get(&reader.segment_id()) {
            Some(words) => Ok(Box::new(ConstScorer::new(BitDocs::new(words.clone()), boost))),
            None => Ok(Box::new(EmptyScorer)),
        }
    }

    fn explain(&self, reader: &SegmentReader, doc: DocId) -> tantivy::Result<Explanation> {
        let mut scorer = self.scorer(reader, 1.0)?;
        if scorer.seek(doc) != doc {
            return Err(TantivyError::InvalidArgument(format!("document {doc} is not visible")));
        }
        Ok(Explanation::new("visible", 0.0))
    }
}

/// The set bits of a shared bitset as a doc set, positioned on its first document when created.
struct BitDocs {
    words: Arc<[u64]>,
    doc: DocId,
    len: u32,
}

impl BitDocs {
    fn new(words: Arc<[u64]>) -> BitDocs {
        let len = words.iter().map(|w| w.count_ones()).sum();
        let mut docs = BitDocs { words, doc: 0, len };
        docs.doc = docs.first_from(0);
        docs
    }

    /// The first set bit at or after `from`, or [`TERMINATED`].
    fn first_from(&self, from: DocId) -> DocId {
        let mut index = (from / 64) as usize;
        if index >= self.words.len() {
            return TERMINATED;
        }
        let mut word = self.words[index] & (u64::MAX << (from % 64));
        loop {
            if word != 0 {
                return index as DocId * 64 + word.trailing_zeros();
            }
            index += 1;
            match self.words.get(index) {
                Some(next) => word = *next,
                None => return TERMINATED,
            }
        }
    }
}

impl DocSet for BitDocs {
    fn advance(&mut self) -> DocId {
        if self.doc != TERMINATED {
            self.doc = self.first_from(self.doc + 1);
        }
        self.doc
    }

    fn seek(&mut self, target: DocId) -> DocId {
        if self.doc != TERMINATED && target > self.doc {
            self.doc = self.first_from(target);
        }
        self.doc
    }

    fn doc(&self) -> DocId {
        self.doc
    }

    fn size_hint(&self) -> u32 {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(mut docs: BitDocs) -> Vec<DocId> {
        let mut found = Vec::new();
        while docs.doc() != TERMINATED {
            found.push(docs.doc());
            docs.advance();
        }
        found
    }

    #[test]
    fn bit_docs_walk_every_set_bit_across_words() {
        let words: Arc<[u64]> = Arc::from(vec![1 | 1 << 63, 0, 1 << 5]);
        assert_eq!(collect(BitDocs::new(words.clone())), [0, 63, 133]);
        assert_eq!(collect(BitDocs::new(Arc::from(vec![0u64, 0]))), Vec::<DocId>::new());
        let mut docs = BitDocs::new(words);
        assert_eq!(docs.seek(1), 63);
        assert_eq!(docs.seek(63), 63, "seeking the current document stays on it");
        assert_eq!(docs.seek(64), 133);
        assert_eq!(docs.seek(134), TERMINATED);
        assert_eq!(docs.advance(), TERMINATED);
    }
}
