//! Quality gate on the shared tool-search set (../shared/data/toolsearch, see its README): the
//! 4,500-tool corpus with process_id = server slug, every dev query with every server visible.
//!
//! Metrics follow shared/tools/toolsearch_eval.py: Recall@k is the fraction of a query's needs
//! (`gold_groups`, or each `gold` entry alone) with a member in the top k; MRR@10 is 1/rank of the
//! first `gold` tool in the top 10; both averaged over queries. Set `TOOLSEARCH_RANKINGS_OUT` to a
//! file path to also write the rankings in the scorer's format, to cross-check with
//! `toolsearch_eval.py score --queries dev.jsonl --rankings <file>`.

use std::collections::{BTreeMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

const MIN_RECALL_AT_5: f64 = 0.68;

fn data_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/toolsearch").join(file)
}

fn read_jsonl(file: &str) -> Vec<Value> {
    let path = data_path(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!("{}: {error} (the shared tool-search data sits next to the repo)", path.display())
    });
    text.lines().filter(|line| !line.trim().is_empty()).map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_owned()
}

struct DevQuery {
    id: String,
    query: String,
    source: String,
    gold: HashSet<String>,
    needs: Vec<HashSet<String>>,
}

fn dev_queries() -> Vec<DevQuery> {
    let strings = |value: &Value| -> HashSet<String> {
        value.as_array().unwrap().iter().map(|item| item.as_str().unwrap().to_owned()).collect()
    };
    read_jsonl("dev.jsonl")
        .iter()
        .map(|line| {
            let gold = strings(&line["gold"]);
            let needs = match line.get("gold_groups") {
                Some(groups) => groups.as_array().unwrap().iter().map(strings).collect(),
                None => gold.iter().map(|tool| HashSet::from([tool.clone()])).collect(),
            };
            DevQuery { id: text(line, "id"), query: text(line, "query"), source: text(line, "source"), gold, needs }
        })
        .collect()
}

/// Indexes the corpus, one instance per server.
async fn corpus_index() -> (SearchIndex, Vec<String>) {
    let mut servers: BTreeMap<String, Vec<ToolDoc>> = BTreeMap::new();
    for line in read_jsonl("corpus.jsonl") {
        let slug = text(&line, "server");
        servers.entry(slug.clone()).or_default().push(ToolDoc {
            process_id: slug.clone(),
            server_slug: slug,
            tool_name: text(&line, "name"),
            description: text(&line, "description"),
            input_schema: line["inputSchema"].clone(),
        });
    }
    let index = SearchIndex::new().unwrap();
    let started = Instant::now();
    let writes = servers.iter().map(|(slug, tools)| index.replace_instance(slug, tools.clone()));
    for result in futures::future::join_all(writes).await {
        result.unwrap();
    }
    println!("indexed {} tools on {} servers in {:?}", index.num_docs(), servers.len(), started.elapsed());
    assert_eq!(index.num_docs(), 4500);
    (index, servers.into_keys().collect())
}

#[derive(Default)]
struct Scores {
    queries: usize,
    recall_at_5: f64,
    recall_at_10: f64,
    mrr_at_10: f64,
}

impl Scores {
    fn add(&mut self, query: &DevQuery, ranking: &[String]) {
        let recall = |k: usize| {
            let top: HashSet<&String> = ranking.iter().take(k).collect();
            let met = query.needs.iter().filter(|need| need.iter().any(|tool| top.contains(tool))).count();
            met as f64 / query.needs.len() as f64
        };
        self.queries += 1;
        self.recall_at_5 += recall(5);
        self.recall_at_10 += recall(10);
        if let Some(rank) = ranking.iter().take(10).position(|tool| query.gold.contains(tool)) {
            self.mrr_at_10 += 1.0 / (rank + 1) as f64;
        }
    }

    fn mean(&self) -> (f64, f64, f64) {
        let n = self.queries.max(1) as f64;
        (self.recall_at_5 / n, self.recall_at_10 / n, self.mrr_at_10 / n)
    }

    fn line(&self, label: &str) -> String {
        let (r5, r10, mrr) = self.mean();
        format!("{label:<16} n={:<4} R@5={r5:.3} R@10={r10:.3} MRR@10={mrr:.3}", self.queries)
    }
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * fraction).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_set_recall_at_5_meets_the_gate() {
    let (index, servers) = corpus_index().await;
    let queries = dev_queries();
    let mut overall = Scores::default();
    let mut by_source: BTreeMap<String, Scores> = BTreeMap::new();
    let mut latencies = Vec::with_capacity(queries.len());
    let mut rankings = String::new();
    for query in &queries {
        let started = Instant::now();
        let hits = index.search(&query.query, &servers, 10).await.unwrap();
        let latency = started.elapsed();
        latencies.push(latency);
        let ranking: Vec<String> = hits.iter().map(|hit| format!("{}:{}", hit.process_id, hit.tool_name)).collect();
        overall.add(query, &ranking);
        by_source.entry(query.source.clone()).or_default().add(query, &ranking);
        let line = serde_json::json!({
            "id": query.id, "query": query.query, "results": ranking, "latency_ms": latency.as_secs_f64() * 1000.0,
        });
        rankings.push_str(&line.to_string());
        rankings.push('\n');
    }
    if let Ok(path) = std::env::var("TOOLSEARCH_RANKINGS_OUT") {
        std::fs::File::create(&path).unwrap().write_all(rankings.as_bytes()).unwrap();
        println!("rankings written to {path}");
    }
    latencies.sort();
    println!("{}", overall.line("all"));
    for (source, scores) in &by_source {
        println!("{}", scores.line(source));
    }
    println!(
        "search latency over {} queries: p50 {:?}, p95 {:?}, max {:?}",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.95),
        percentile(&latencies, 1.0)
    );
    let (recall_at_5, _, _) = overall.mean();
    assert_eq!(overall.queries, 150);
    assert!(recall_at_5 >= MIN_RECALL_AT_5, "R@5 {recall_at_5:.3} < {MIN_RECALL_AT_5}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_tool_names_rank_first_on_the_corpus() {
    let (index, servers) = corpus_index().await;
    let cases = [
        ("read_file", "read_file"),
        ("git_status", "git_status"),
        ("git status", "git_status"),
        ("getStoryWithComments", "getStoryWithComments"),
        ("playwright_navigate", "playwright_navigate"),
        ("tavily-search", "tavily-search"),
        ("git:git_status", "git_status"),
    ];
    for (query, expected) in cases {
        let hits = index.search(query, &servers, 5).await.unwrap();
        assert_eq!(hits.first().map(|hit| hit.tool_name.as_str()), Some(expected), "query {query:?}");
    }
    // With one filesystem server visible, its read_file is first.
    let hits = index.search("read_file", &["filesystem".to_owned()], 5).await.unwrap();
    assert_eq!((hits[0].process_id.as_str(), hits[0].tool_name.as_str()), ("filesystem", "read_file"));
}
