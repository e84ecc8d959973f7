//! Token-count parity (SB §15): the satellite's count of every tool of the shared corpus equals the npm
//! `gpt-tokenizer` package's, as computed by tests/node/token_counts.mjs into tests/node/token_counts.json
//! (`scripts/test.sh` generates it before `cargo test`).

use serde::Deserialize;
use serde_json::Value;

use satellite::model::catalog::ToolDef;
use satellite::tokens::{count_tools, counter, js_pretty, tool_text};

use crate::common::*;

#[derive(Deserialize)]
struct Fixture {
    encoding: String,
    generator: String,
    tools: Vec<Expected>,
    extras: Vec<Extra>,
    /// `[JSON number literal, JSON.stringify(JSON.parse(literal))]`.
    numbers: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct Extra {
    json: String,
    text: String,
    count: usize,
}

#[derive(Deserialize)]
struct Expected {
    server: String,
    name: String,
    count: usize,
}

fn fixture() -> Fixture {
    let path = repo_path("tests/node/token_counts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{} is missing ({e}): run `bash scripts/test.sh`, which generates it with Node \
             (node tests/node/token_counts.mjs ../shared/data/toolsearch/corpus.jsonl tests/node/token_counts.json)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("token_counts.json is the fixture token_counts.mjs writes")
}

fn corpus() -> Vec<Value> {
    let text =
        std::fs::read_to_string(corpus_path()).expect("the shared corpus ../shared/data/toolsearch/corpus.jsonl");
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("corpus line")).collect()
}

#[test]
fn every_corpus_tool_counts_like_gpt_tokenizer() {
    let fixture = fixture();
    assert_eq!(fixture.encoding, "o200k_base");
    let corpus = corpus();
    assert_eq!(
        fixture.tools.len(),
        corpus.len(),
        "the fixture was made from another corpus: run `bash scripts/test.sh` again"
    );
    let counter = counter().expect("o200k_base");
    let mut mismatches = Vec::new();
    for (tool, expected) in corpus.iter().zip(&fixture.tools) {
        let (server, name) = (tool["server"].as_str().unwrap_or(""), tool["name"].as_str().unwrap_or(""));
        assert_eq!(
            (server, name),
            (expected.server.as_str(), expected.name.as_str()),
            "fixture out of step with the corpus: run `bash scripts/test.sh` again"
        );
        let text = tool_text(name, tool["description"].as_str(), &tool["inputSchema"]);
        let count = counter.count_text(&text);
        if count != expected.count {
            mismatches.push(format!("{server}:{name}: rust {count}, js {}\n{text}", expected.count));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} tools count differently from {}; the first ones:\n{}",
        mismatches.len(),
        corpus.len(),
        fixture.generator,
        mismatches.iter().take(3).cloned().collect::<Vec<_>>().join("\n---\n")
    );
}

#[test]
fn edge_case_tools_print_and_count_like_javascript() {
    let counter = counter().expect("o200k_base");
    for extra in fixture().extras {
        let tool: Value = serde_json::from_str(&extra.json).expect("extra tool json");
        let text = tool_text(tool["name"].as_str().unwrap_or(""), tool["description"].as_str(), &tool["inputSchema"]);
        assert_eq!(text, extra.text, "printed differently from JSON.stringify");
        assert_eq!(counter.count_text(&text), extra.count, "counted differently from gpt-tokenizer:\n{text}");
    }
    // The same through the catalog path (line memo), for the tools that have a description.
    let (tools, expected): (Vec<ToolDef>, Vec<usize>) = fixture()
        .extras
        .iter()
        .map(|e| (serde_json::from_str::<Value>(&e.json).expect("json"), e.count))
        .filter(|(tool, _)| tool["description"].is_string())
        .map(|(tool, count)| (ToolDef::from_listing(&tool).expect("tool"), count))
        .unzip();
    assert_eq!(counter.count_catalog(&tools), expected);
}

#[test]
fn number_literals_print_like_javascript() {
    let numbers = fixture().numbers;
    assert!(numbers.len() > 1000);
    let wrong: Vec<String> = numbers
        .iter()
        .filter_map(|(literal, js)| {
            let value: Value = serde_json::from_str(literal).expect("number literal");
            let ours = js_pretty(&value);
            (&ours != js).then(|| format!("{literal}: rust {ours}, js {js}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} numbers differ: {:?}",
        wrong.len(),
        numbers.len(),
        &wrong[..wrong.len().min(10)]
    );
}

/// The catalog path (lines counted once per catalog, on the blocking pool) over every corpus server.
#[tokio::test]
async fn catalogs_count_like_gpt_tokenizer() {
    let fixture = fixture();
    let corpus = corpus();
    assert_eq!(fixture.tools.len(), corpus.len(), "run `bash scripts/test.sh` again");
    let mut servers: Vec<(String, Vec<ToolDef>, Vec<usize>)> = Vec::new();
    for (tool, expected) in corpus.iter().zip(&fixture.tools) {
        let server = tool["server"].as_str().unwrap_or("");
        if servers.last().is_none_or(|(s, _, _)| s != server) {
            servers.push((server.to_owned(), Vec::new(), Vec::new()));
        }
        if let Some((_, tools, counts)) = servers.last_mut() {
            // The catalog's normalisation (missing description "", missing schema {}) keeps corpus tools as they are.
            tools.push(ToolDef::from_listing(tool).expect("tool"));
            counts.push(expected.count);
        }
    }
    assert!(servers.len() > 100);
    for (server, tools, expected) in servers {
        assert_eq!(count_tools(tools).await.expect("counted"), expected, "server {server}");
    }
}
