//! `satellite search QUERY`: what `discover_mcp_tools` finds, from a running satellite (over MCP, as the
//! caller whose token is given) or from the catalogs stored in the data directory (every instance, or one
//! user's), ranked by the same index.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::{Config, Mode};
use crate::mcp::protocol::{self, RequestId};
use crate::model::Catalog;
use crate::search::{relevance_score, Scope, SearchHit, SearchIndex, ToolDoc};
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum SearchCommandError {
    #[error("cannot reach {url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url} answered {status}: {body}")]
    Refused { url: String, status: u16, body: String },
    #[error("the satellite's answer is not what discover_mcp_tools returns: {0}")]
    Answer(String),
    #[error("cannot open the data directory's database: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("the search index failed: {0}")]
    Search(#[from] crate::search::SearchError),
    #[error("{0}")]
    Config(String),
}

/// One found tool.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Found {
    pub tool_path: String,
    pub score: f64,
    pub description: String,
    /// Stored catalogs: whose instance has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Ask a running satellite's `/mcp` endpoint, as the holder of `token`.
pub async fn remote(url: &url::Url, token: &str, query: &str, limit: usize) -> Result<Value, SearchCommandError> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|source| SearchCommandError::Http { url: url.to_string(), source })?;
    let endpoint = Endpoint { http, url, token };
    let hello = protocol::request(
        RequestId::Number(1),
        "initialize",
        Some(json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "satellite-search", "version": env!("CARGO_PKG_VERSION")}})),
    );
    let (session, _) = endpoint.post(hello, None).await?;
    endpoint.post(protocol::notification("notifications/initialized", None), session.clone()).await?;
    let call = protocol::request(
        RequestId::Number(2),
        "tools/call",
        Some(json!({"name": "discover_mcp_tools", "arguments": {"query": query, "limit": limit}})),
    );
    let (_, text) = endpoint.post(call, session).await?;
    let reply = json_rpc_reply(&text).ok_or_else(|| SearchCommandError::Answer(text.clone()))?;
    if let Some(error) = reply.get("error") {
        return Err(SearchCommandError::Answer(error.to_string()));
    }
    let document = reply
        .pointer("/result/content/0/text")
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .ok_or_else(|| SearchCommandError::Answer(reply.to_string()))?;
    Ok(document)
}

/// A satellite's `/mcp`, asked as one token's holder.
struct Endpoint<'a> {
    http: reqwest::Client,
    url: &'a url::Url,
    token: &'a str,
}

impl Endpoint<'_> {
    /// POST one message (in `session`, once there is one); the session id it answered with and its body.
    async fn post(&self, body: Value, session: Option<String>) -> Result<(Option<String>, String), SearchCommandError> {
        let url = self.url;
        let mut request = self
            .http
            .post(url.clone())
            .bearer_auth(self.token)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session).header("mcp-protocol-version", "2025-06-18");
        }
        let response =
            request.send().await.map_err(|source| SearchCommandError::Http { url: url.to_string(), source })?;
        let status = response.status();
        let session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let text = response.text().await.map_err(|source| SearchCommandError::Http { url: url.to_string(), source })?;
        if !status.is_success() {
            return Err(SearchCommandError::Refused { url: url.to_string(), status: status.as_u16(), body: text });
        }
        Ok((session, text))
    }
}

/// The JSON-RPC reply in a JSON body or in an SSE stream's `data:` lines.
fn json_rpc_reply(text: &str) -> Option<Value> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Some(value);
    }
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|value| value.get("id").is_some())
}

/// Search the catalogs stored in the config's data directory: every instance's, or `user`'s only.
pub async fn stored(
    config: &Config,
    query: &str,
    limit: usize,
    user: Option<&str>,
) -> Result<Vec<Found>, SearchCommandError> {
    if config.database.url.is_none() && !config.data_dir.join("satellite.db").exists() {
        return Err(SearchCommandError::Config(format!(
            "no database in {}: run `satellite serve` with this configuration first (or pass --url and --token)",
            config.data_dir.display()
        )));
    }
    let owners = owners(config)?;
    let store = Store::connect(&config.data_dir, &config.database).await?;
    let catalogs = store.catalogs().load_catalogs().await?;
    let _ = store.close().await;
    let index = SearchIndex::new()?;
    let mut scope = Vec::new();
    let mut described = Described::new();
    for (process_id, catalog) in &catalogs {
        let (slug, owner) = owners.get(&process_id.0).cloned().unwrap_or_else(|| (process_id.0.clone(), String::new()));
        if user.is_some_and(|wanted| wanted != owner) {
            continue;
        }
        let docs = docs_of(&process_id.0, &slug, &owner, catalog, &mut described);
        index.replace_instance(&process_id.0, docs).await?;
        scope.push(process_id.0.clone());
    }
    // A write the index lost would show as tools that match nothing: say so instead.
    index.written().await?;
    scope.sort();
    let hits = index.search(query, &Arc::new(Scope::new(scope)), limit).await?;
    Ok(found(hits, &described))
}

/// Each stored tool's (server slug, owner, description), by (process id, tool name).
type Described = HashMap<(String, String), (String, String, String)>;

/// Standalone: who owns each instance and its server slug, from the config; managed mode stores no names.
fn owners(config: &Config) -> Result<HashMap<String, (String, String)>, SearchCommandError> {
    Ok(match &config.mode {
        Mode::Standalone(_) => super::initial_standalone(config)
            .map_err(|err| SearchCommandError::Config(err.to_string()))?
            .desired_state()
            .instances
            .into_values()
            .map(|spec| (spec.process_id.0.clone(), (spec.server_slug.clone(), spec.user_id.0.clone())))
            .collect(),
        Mode::Managed(_) => HashMap::new(),
    })
}

/// One instance's tools as index documents, noting each one's owner and description for the answer.
fn docs_of(process_id: &str, slug: &str, owner: &str, catalog: &Catalog, described: &mut Described) -> Vec<ToolDoc> {
    catalog
        .tools
        .iter()
        .enumerate()
        .map(|(at, tool)| {
            described.insert(
                (process_id.to_owned(), tool.name().to_owned()),
                (slug.to_owned(), owner.to_owned(), tool.description().to_owned()),
            );
            ToolDoc::of(process_id, slug, tool, at)
        })
        .collect()
}

/// The hits in rank order, each with its path, owner and description and a score relative to the best.
fn found(hits: Vec<SearchHit>, described: &Described) -> Vec<Found> {
    let best = hits.first().map_or(0.0, |h| h.score);
    hits.into_iter()
        .filter_map(|hit| {
            let (slug, owner, description) = described.get(&(hit.process_id.clone(), hit.tool_name.clone()))?.clone();
            Some(Found {
                tool_path: crate::model::tool_path(&slug, &hit.tool_name),
                score: relevance_score(hit.score, best),
                description,
                user: (!owner.is_empty()).then_some(owner),
            })
        })
        .collect()
}

/// Found tools as aligned text lines, one per tool: score, path, owner, the description's first line.
pub fn table(found: &[Found]) -> String {
    let width = found.iter().map(|f| f.tool_path.len()).max().unwrap_or(0);
    let mut out = String::new();
    for tool in found {
        let first = tool.description.lines().next().unwrap_or("");
        let first: String = first.chars().take(100).collect();
        let owner = tool.user.as_deref().map(|u| format!(" [{u}]")).unwrap_or_default();
        out.push_str(&format!("{:.2}  {:<width$}{owner}  {first}\n", tool.score, tool.tool_path));
    }
    out
}
