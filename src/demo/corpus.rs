//! The tool-search corpus (`corpus.jsonl`: one tool per line with its server
//! slug) turned into one demo server per slug.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{DemoServer, Offer, ProtocolSupport};

#[derive(Debug, Deserialize)]
struct CorpusLine {
    server: String,
    name: String,
    #[serde(default)]
    description: String,
    #[serde(rename = "inputSchema", default)]
    input_schema: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("cannot read corpus {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("corpus line {line}: {source}")]
    Line { line: usize, source: serde_json::Error },
}

/// Tools grouped by server slug, in file order.
pub fn load(path: &Path) -> Result<BTreeMap<String, Vec<Value>>, CorpusError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| CorpusError::Read { path: path.display().to_string(), source })?;
    let mut servers: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let tool: CorpusLine =
            serde_json::from_str(line).map_err(|source| CorpusError::Line { line: i + 1, source })?;
        let schema = if tool.input_schema.is_object() { tool.input_schema } else { json!({"type": "object"}) };
        servers
            .entry(tool.server)
            .or_default()
            .push(json!({"name": tool.name, "description": tool.description, "inputSchema": schema}));
    }
    Ok(servers)
}

/// One demo server per corpus slug.
pub fn servers(corpus: BTreeMap<String, Vec<Value>>, support: ProtocolSupport) -> HashMap<String, DemoServer> {
    corpus
        .into_iter()
        .map(|(slug, tools)| {
            let offer = Offer {
                name: slug.clone(),
                tools,
                with_resources: false,
                corpus_slug: Some(slug.clone()),
                label: None,
            };
            (
                slug,
                DemoServer {
                    support,
                    page_size: None,
                    offer: Arc::new(offer),
                    quirks: Arc::default(),
                    live: Arc::default(),
                },
            )
        })
        .collect()
}
