//! The semantic stage's state: which tools each instance has, and the vectors of those texts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Blind, Hash, Keys, Scored};
use crate::search::{Scope, SearchHit};

/// What the stage knows of the indexed tools: each instance's tools, the hash of each text and the vectors a
/// tool refers to.
#[derive(Default)]
pub(super) struct State {
    /// The vectors of the tools some instance has (`refs` > 0).
    pub(super) vectors: HashMap<Hash, Arc<[f32]>>,
    /// How many indexed tools (over all instances) have each text.
    pub(super) refs: HashMap<Hash, usize>,
    /// Per instance: each tool and the hash of its text.
    pub(super) tools: HashMap<String, Vec<(String, Hash)>>,
    /// Hashes being read from the cache or embedded.
    pub(super) queued: HashSet<Hash>,
    /// The texts whose description is written in a script of its own ([`written_apart`](super::written_apart)).
    pub(super) apart: HashSet<Hash>,
}

impl State {
    /// Replaces an instance's tools, keeps `refs` and drops the vectors no tool refers to any more; the hashes
    /// that now need a vector (none yet, none on the way) are marked queued and returned.
    pub(super) fn replace(&mut self, process_id: &str, entries: Vec<(String, Hash)>, apart: Vec<Hash>) -> Vec<Hash> {
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
    pub(super) fn arrived(&mut self, hash: Hash, vector: Arc<[f32]>) {
        if self.refs.contains_key(&hash) {
            self.vectors.insert(hash, vector);
        }
    }

    /// The cosine with `query` of every visible, embedded tool, and of each `lexical` hit (`None`: no vector);
    /// and, unless `blind` is [`Blind::Nothing`], the visible tools written apart (few: only those are collected).
    pub(super) fn cosines<'a>(
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
