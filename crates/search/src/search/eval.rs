//! Scoring on the shared tool-search set (../shared/data/toolsearch): loading the corpus and the queries,
//! and the metrics of shared/tools/toolsearch_eval.py (Recall@1/5/10, MRR@10, nDCG@10 with one gain per
//! need), per source. Used by the quality gate in the test suite and by `benches/search.rs`; not part of
//! the satellite's request path.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::ToolDoc;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{path}: {source} (the shared tool-search data sits next to the repo, in ../shared)")]
    Read { path: String, source: std::io::Error },
    #[error("{path} line {line}: {source}")]
    Parse { path: String, line: usize, source: serde_json::Error },
}

fn read_jsonl(path: &Path) -> Result<Vec<Value>, EvalError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Read { path: shown.clone(), source })?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).map_err(|source| EvalError::Parse { path: shown.clone(), line: n + 1, source })
        })
        .collect()
}

fn text(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// The corpus as one instance per server: `process_id` and `server_slug` are both the server's slug.
pub fn load_corpus(path: &Path) -> Result<BTreeMap<String, Vec<ToolDoc>>, EvalError> {
    let mut servers: BTreeMap<String, Vec<ToolDoc>> = BTreeMap::new();
    for line in read_jsonl(path)? {
        let slug = text(&line, "server");
        servers.entry(slug.clone()).or_default().push(ToolDoc {
            process_id: slug.clone(),
            server_slug: slug,
            tool_name: text(&line, "name"),
            description: text(&line, "description"),
            parameters: super::parameter_names(line.get("inputSchema").unwrap_or(&Value::Null)),
            position: super::NO_POSITION,
        });
    }
    Ok(servers)
}

/// One query with its gold answers.
#[derive(Debug, Clone)]
pub struct EvalQuery {
    pub id: String,
    pub query: String,
    pub source: String,
    /// Every relevant `server:tool`.
    pub gold: HashSet<String>,
    /// The needs: any member of a need satisfies it.
    pub needs: Vec<HashSet<String>>,
}

pub fn load_queries(path: &Path) -> Result<Vec<EvalQuery>, EvalError> {
    let strings = |value: Option<&Value>| -> HashSet<String> {
        value.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let queries = read_jsonl(path)?.into_iter().map(|line| {
        let line = &line;
        let gold = strings(line.get("gold"));
        let needs = match line.get("gold_groups").and_then(Value::as_array) {
            Some(groups) => groups.iter().map(|group| strings(Some(group))).collect(),
            None => gold.iter().map(|tool| HashSet::from([tool.clone()])).collect(),
        };
        EvalQuery { id: text(line, "id"), query: text(line, "query"), source: text(line, "source"), gold, needs }
    });
    Ok(queries.filter(|q: &EvalQuery| !q.needs.is_empty()).collect())
}

/// The metrics of one ranking (`server:tool` ids, best first) for one query.
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    pub recall_at_1: f64,
    pub recall_at_5: f64,
    pub recall_at_10: f64,
    pub mrr_at_10: f64,
    pub ndcg_at_10: f64,
}

impl Metrics {
    pub fn of(query: &EvalQuery, ranking: &[String]) -> Metrics {
        let recall = |k: usize| {
            let top: HashSet<&String> = ranking.iter().take(k).collect();
            let met = query.needs.iter().filter(|need| need.iter().any(|tool| top.contains(tool))).count();
            met as f64 / query.needs.len() as f64
        };
        let mrr_at_10 = ranking
            .iter()
            .take(10)
            .position(|tool| query.needs.iter().any(|need| need.contains(tool)))
            .map_or(0.0, |rank| 1.0 / (rank + 1) as f64);
        let mut satisfied = HashSet::new();
        let mut dcg = 0.0;
        for (rank, tool) in ranking.iter().take(10).enumerate() {
            if let Some(need) =
                (0..query.needs.len()).find(|n| !satisfied.contains(n) && query.needs[*n].contains(tool))
            {
                satisfied.insert(need);
                dcg += 1.0 / ((rank + 2) as f64).log2();
            }
        }
        let ideal: f64 = (1..=query.needs.len().min(10)).map(|i| 1.0 / ((i + 1) as f64).log2()).sum();
        Metrics {
            recall_at_1: recall(1),
            recall_at_5: recall(5),
            recall_at_10: recall(10),
            mrr_at_10,
            ndcg_at_10: if ideal > 0.0 { dcg / ideal } else { 0.0 },
        }
    }
}

/// Sums of [`Metrics`] over a set of queries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub queries: usize,
    sum: Metrics,
}

impl Totals {
    pub fn add(&mut self, metrics: Metrics) {
        self.queries += 1;
        self.sum.recall_at_1 += metrics.recall_at_1;
        self.sum.recall_at_5 += metrics.recall_at_5;
        self.sum.recall_at_10 += metrics.recall_at_10;
        self.sum.mrr_at_10 += metrics.mrr_at_10;
        self.sum.ndcg_at_10 += metrics.ndcg_at_10;
    }

    pub fn mean(&self) -> Metrics {
        let n = self.queries.max(1) as f64;
        Metrics {
            recall_at_1: self.sum.recall_at_1 / n,
            recall_at_5: self.sum.recall_at_5 / n,
            recall_at_10: self.sum.recall_at_10 / n,
            mrr_at_10: self.sum.mrr_at_10 / n,
            ndcg_at_10: self.sum.ndcg_at_10 / n,
        }
    }
}

/// Totals pooled and per source.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub all: Totals,
    pub by_source: BTreeMap<String, Totals>,
}

impl Report {
    pub fn add(&mut self, query: &EvalQuery, ranking: &[String]) {
        let metrics = Metrics::of(query, ranking);
        self.all.add(metrics);
        self.by_source.entry(query.source.clone()).or_default().add(metrics);
    }

    /// The table toolsearch_eval.py prints, with `label` on the pooled row.
    pub fn table(&self, label: &str) -> String {
        let mut out =
            format!("{:<18}{:>5}{:>8}{:>8}{:>8}{:>8}{:>9}\n", "subset", "n", "R@1", "R@5", "R@10", "MRR@10", "nDCG@10");
        let rows = std::iter::once((label, &self.all)).chain(self.by_source.iter().map(|(s, t)| (s.as_str(), t)));
        for (name, totals) in rows {
            let m = totals.mean();
            let _ = writeln!(
                out,
                "{name:<18}{:>5}{:>8.3}{:>8.3}{:>8.3}{:>8.3}{:>9.3}",
                totals.queries, m.recall_at_1, m.recall_at_5, m.recall_at_10, m.mrr_at_10, m.ndcg_at_10
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(needs: &[&[&str]]) -> EvalQuery {
        let needs: Vec<HashSet<String>> =
            needs.iter().map(|need| need.iter().map(|t| (*t).to_owned()).collect()).collect();
        EvalQuery {
            id: "q".into(),
            query: "q".into(),
            source: "s".into(),
            gold: needs.iter().flatten().cloned().collect(),
            needs,
        }
    }

    fn ranking(tools: &[&str]) -> Vec<String> {
        tools.iter().map(|t| (*t).to_owned()).collect()
    }

    #[test]
    fn metrics_follow_the_shared_scorer() {
        // Two needs; the first is met at rank 2, the second (by either alternative) at rank 6.
        let q = query(&[&["a:x"], &["b:y", "c:y"]]);
        let m = Metrics::of(&q, &ranking(&["z:z", "a:x", "a:x", "q:q", "r:r", "c:y"]));
        assert_eq!((m.recall_at_1, m.recall_at_5, m.recall_at_10), (0.0, 0.5, 1.0));
        assert_eq!(m.mrr_at_10, 0.5);
        let ideal = 1.0 + 1.0 / 3f64.log2();
        let dcg = 1.0 / 3f64.log2() + 1.0 / 7f64.log2();
        assert!((m.ndcg_at_10 - dcg / ideal).abs() < 1e-12, "a repeated need earns no second gain");
        let perfect = Metrics::of(&q, &ranking(&["a:x", "b:y"]));
        assert_eq!((perfect.recall_at_1, perfect.ndcg_at_10), (0.5, 1.0));
    }
}
