//! Discover answers shaped by a token budget (issue 72), through the live `/mcp` endpoint: a real satellite
//! in front of the demo server serving 60 servers of the shared tool-search corpus over Streamable HTTP. Every
//! answer's tokens are counted here with the satellite's o200k counter, on the text the client received.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

const TOKEN: &str = "budget-member-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(120);

/// Servers the cases name, then enough others of the corpus to make a crowd.
const NAMED: &[&str] = &[
    "filesystem",
    "git",
    "mcp-deepwiki",
    "mindmap",
    "playwright",
    "osm-mcp-server",
    "yahoo-finance",
    "time",
    "word-document-server",
    "desktop-commander",
];
const CROWD: usize = 50;

fn corpus_slugs() -> Vec<String> {
    let text = std::fs::read_to_string(corpus_path()).expect("the shared corpus");
    let mut slugs: Vec<String> = NAMED.iter().map(|s| (*s).to_owned()).collect();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let tool: Value = serde_json::from_str(line).expect("corpus line");
        let slug = tool["server"].as_str().unwrap_or_default().to_owned();
        if slugs.len() < NAMED.len() + CROWD && !slugs.contains(&slug) {
            slugs.push(slug);
        }
    }
    slugs
}

fn config(demo: &HttpServer, slugs: &[String]) -> String {
    let mut config = format!(
        "[[teams]]\nid = \"t\"\n[[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n",
        satellite::config::sha256_hex(TOKEN)
    );
    for (at, slug) in slugs.iter().enumerate() {
        config.push_str(&format!(
            "[[servers]]\nslug = {}\ntransport = \"http\"\nurl = \"{}\"\n[[installations]]\nid = \"i{at}\"\nteam = \"t\"\nserver = {}\n",
            toml_str(slug),
            demo.url(&format!("/servers/{slug}/mcp")),
            toml_str(slug),
        ));
    }
    config
}

struct Corpus {
    _demo: HttpServer,
    sat: TestSatellite,
    tools: usize,
}

/// The satellite once every installed corpus server's tools are searchable.
async fn corpus() -> Corpus {
    let corpus = corpus_path().to_string_lossy().into_owned();
    let demo = HttpServer::demo(&["--corpus", &corpus]).await;
    let slugs = corpus_slugs();
    let text = std::fs::read_to_string(corpus_path()).expect("the shared corpus");
    let tools = text.lines().filter(|l| slugs.iter().any(|s| l.contains(&format!("\"server\": \"{s}\"")))).count();
    let sat = TestSatellite::start(&config(&demo, &slugs)).await;
    let caller = Caller::connect(&sat, "/mcp", Some(TOKEN)).await;
    wait_until(DEADLINE, "every corpus server's tools searchable", || async {
        let answer = discover(&caller, json!({"query": "*"})).await;
        (answer["total_available"].as_u64() == Some(tools as u64)).then_some(())
    })
    .await;
    Corpus { _demo: demo, sat, tools }
}

/// The discover answer's text, parsed.
async fn discover(caller: &Caller, arguments: Value) -> Value {
    let reply = caller.tool("discover_mcp_tools", arguments).await;
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no answer text: {reply}"));
    serde_json::from_str(text).expect("the answer is JSON")
}

/// The answer's text as received and its o200k tokens.
async fn discover_text(caller: &Caller, arguments: Value) -> (String, usize) {
    let reply = caller.tool("discover_mcp_tools", arguments).await;
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no answer text: {reply}"));
    let tokens = satellite::tokens::counter().expect("the o200k counter").count_text(text);
    (text.to_owned(), tokens)
}

fn paths(answer: &Value) -> Vec<String> {
    answer["tools"].as_array().into_iter().flatten().map(|t| t["tool_path"].as_str().unwrap_or("").to_owned()).collect()
}

fn is_full(entry: &Value) -> bool {
    entry.get("input_schema").is_some()
}

#[tokio::test]
async fn budget_discovery_through_the_live_endpoint() {
    let corpus = corpus().await;
    let caller = Caller::connect(&corpus.sat, "/mcp", Some(TOKEN)).await;
    assert!(corpus.tools > 500, "a crowd of tools to choose from: {}", corpus.tools);

    a_request_gets_many_more_entries_than_full_ones_within_the_default_budget(&caller).await;
    a_limit_alone_gets_the_answer_of_before(&caller).await;
    tool_paths_as_the_query_give_their_schemas(&caller).await;
    a_request_of_several_steps_covers_each_need_before_repeating_one(&caller).await;
    keywords_still_rank_the_exact_tool_first_and_in_full(&caller).await;
    budgets_are_kept_at_every_size_and_a_bad_one_is_refused(&caller).await;
}

async fn a_request_gets_many_more_entries_than_full_ones_within_the_default_budget(caller: &Caller) {
    let query = "Read the sales data in the excel workbook and plot a bar chart of it, then save the chart as a file";
    let (text, tokens) = discover_text(caller, json!({"query": query})).await;
    assert!(tokens <= 1_000, "the default budget is 1,000 tokens: {tokens}\n{text}");
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    let entries = answer["tools"].as_array().expect("tools");
    let full = entries.iter().filter(|e| is_full(e)).count();
    assert!(entries.len() >= 20, "compact entries buy many results: {} in {tokens} tokens", entries.len());
    assert!(full <= 2, "full entries only where the ranker is confident: {full}");
    assert!(entries.iter().all(|e| e["tool_path"].as_str().is_some_and(|p| p.contains(':'))), "{text}");
    let compact = entries.iter().find(|e| !is_full(e) && e.get("description").is_some()).expect("a compact entry");
    assert!(compact["description"].as_str().is_some_and(|d| d.chars().count() <= 121), "one sentence: {compact}");
    assert_eq!(answer["total_found"].as_u64(), Some(entries.len() as u64));
    assert!(answer["more_matched"].as_u64().is_some_and(|more| more > 0), "says how many more matched: {text}");
    assert_eq!(answer["budget_tokens"], 1000);
    assert!(answer["hint"].as_str().is_some_and(|h| h.contains("tool_path")), "says how to get a schema: {text}");
    let unique: HashSet<String> = paths(&answer).into_iter().collect();
    assert_eq!(unique.len(), entries.len(), "each tool once");
}

async fn a_limit_alone_gets_the_answer_of_before(caller: &Caller) {
    let answer = discover(caller, json!({"query": "read file", "limit": 5})).await;
    let entries = answer["tools"].as_array().expect("tools");
    assert_eq!(entries.len(), 5);
    for entry in entries {
        for key in ["tool_path", "description", "server_name", "transport", "relevance_score", "input_schema"] {
            assert!(entry.get(key).is_some(), "{key} in every entry of a limit answer: {entry}");
        }
    }
    for key in ["budget_tokens", "more_matched", "needs"] {
        assert!(answer.get(key).is_none(), "{key} is new to budget answers only: {answer}");
    }
    assert_eq!(answer["total_found"], 5);
}

async fn tool_paths_as_the_query_give_their_schemas(caller: &Caller) {
    let answer = discover(caller, json!({"query": "git:git_status filesystem:read_file"})).await;
    assert_eq!(paths(&answer), ["git:git_status", "filesystem:read_file"]);
    for entry in answer["tools"].as_array().expect("tools") {
        assert!(entry["input_schema"]["properties"].is_object(), "the schema: {entry}");
    }
    // A path the caller cannot use is searched for, not described.
    let answer = discover(caller, json!({"query": "git:no_such_tool"})).await;
    assert!(answer.get("budget_tokens").is_some(), "searched as a request: {answer}");
}

async fn a_request_of_several_steps_covers_each_need_before_repeating_one(caller: &Caller) {
    let query = "Get deepwiki for vercel/ai and convert its structure to mindmap";
    let (text, tokens) = discover_text(caller, json!({"query": query})).await;
    assert!(tokens <= 1_000, "{tokens}");
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(answer["needs"], json!(["Get deepwiki for vercel/ai", "convert its structure to mindmap"]));
    let entries = answer["tools"].as_array().expect("tools");
    // The whole request's best, then each need's best: both needs answered within the first three entries.
    let first: HashSet<u64> = entries.iter().take(3).filter_map(|e| e["need"].as_u64()).collect();
    assert_eq!(first, HashSet::from([0, 1]), "each need early: {text}");
    let found = paths(&answer);
    for tool in ["mcp-deepwiki:deepwiki_fetch", "mindmap:convert_markdown_to_mindmap"] {
        let at = found.iter().position(|p| p == tool);
        assert!(at.is_some_and(|at| at < 4), "{tool} among the first entries: {found:?}");
    }
}

async fn keywords_still_rank_the_exact_tool_first_and_in_full(caller: &Caller) {
    for (query, tool) in [("git_status", "git:git_status"), ("git status", "git:git_status")] {
        let answer = discover(caller, json!({"query": query})).await;
        assert_eq!(paths(&answer).first().map(String::as_str), Some(tool), "{query}: {answer}");
        assert!(is_full(&answer["tools"][0]), "an exact name leads: full entry: {answer}");
        assert!(answer.get("needs").is_none(), "keywords are one need");
    }
}

async fn budgets_are_kept_at_every_size_and_a_bad_one_is_refused(caller: &Caller) {
    let query = "find a route with charging stations for an electric car from Beijing to Chengdu";
    let mut entries = Vec::new();
    for budget in [1, 400, 2_000, 8_000] {
        let (text, tokens) = discover_text(caller, json!({"query": query, "budget_tokens": budget})).await;
        let kept = budget.max(400);
        assert!(tokens <= kept, "budget {budget}: {tokens} tokens");
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["budget_tokens"], kept);
        entries.push(answer["tools"].as_array().map_or(0, Vec::len));
    }
    assert!(
        entries.windows(2).all(|w| w[0] <= w[1]) && entries[3] > entries[1],
        "more budget, more entries: {entries:?}"
    );
    let answer = discover(caller, json!({"query": query, "budget_tokens": 8_000, "limit": 7})).await;
    assert_eq!(answer["tools"].as_array().map(Vec::len), Some(7), "limit caps a budget answer's entries");
    for bad in [json!("lots"), json!(-5), json!(0)] {
        let reply = caller.tool("discover_mcp_tools", json!({"query": query, "budget_tokens": bad})).await;
        assert_eq!(reply["error"]["code"], -32602, "{bad}: {reply}");
    }
}

/// Two demo servers over stdio for one member; a second team's member with a third.
fn demo_config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let mut config = format!(
        "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n[[teams]]\nid = \"o\"\n\
         [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n\
         [[users]]\nid = \"w\"\nteams = [\"o\"]\ntoken_sha256 = [\"{}\"]\n",
        satellite::config::sha256_hex(TOKEN),
        satellite::config::sha256_hex(OTHER),
    );
    for (slug, team) in [("demo", "t"), ("more", "t"), ("elsewhere", "o")] {
        config.push_str(&format!(
            "[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
             [[installations]]\nid = \"{slug}-i\"\nteam = \"{team}\"\nserver = \"{slug}\"\n"
        ));
    }
    config
}

const OTHER: &str = "budget-other-team-token-0123456";

async fn demo_satellite() -> TestSatellite {
    let sat = TestSatellite::start(&demo_config()).await;
    let caller = Caller::connect(&sat, "/mcp", Some(TOKEN)).await;
    wait_until(DEADLINE, "both demo servers searchable", || async {
        let answer = discover(&caller, json!({"query": "*"})).await;
        let found = paths(&answer);
        (found.contains(&"demo:echo".to_owned()) && found.contains(&"more:echo".to_owned())).then_some(())
    })
    .await;
    sat
}

/// Arguments that do not fit: the server's -32602 carries the tool's schema and what does not fit; a failure
/// whose arguments fit is passed on as the server wrote it, and a call that fits is untouched.
#[tokio::test]
async fn a_call_whose_arguments_do_not_fit_gets_the_tools_schema() {
    let sat = demo_satellite().await;
    let caller = Caller::connect(&sat, "/mcp", Some(TOKEN)).await;
    let reply = caller.execute("demo:echo", json!({"txt": "typo"})).await;
    let error = &reply["error"];
    assert_eq!(error["code"], -32602, "{reply}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"text\"") && message.contains("demo:echo"), "names what is missing: {message}");
    assert_eq!(error["data"]["input_schema"]["required"], json!(["text"]), "{reply}");
    assert!(error["data"]["problems"].as_array().is_some_and(|p| !p.is_empty()), "{reply}");

    // A tool error with arguments that fit: as the server wrote it.
    let reply = caller.execute("demo:fail", json!({})).await;
    let content = reply["result"]["content"].as_array().expect("content");
    assert_eq!(reply["result"]["isError"], true);
    assert_eq!(content.len(), 1, "nothing added when the arguments fit: {reply}");
    let reply = caller.execute("demo:echo", json!({"text": "fine"})).await;
    assert_eq!(reply["result"]["content"][0]["text"], "fine");
    assert!(sat.satellite.shutdown().await);
}

fn modern(method: &str, params: Value, extension: bool) -> Value {
    let extensions = if extension { json!({satellite::router::catalog::EXTENSION: {}}) } else { json!({}) };
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
    });
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
}

/// The draft SEP-2636 shape on `/mcp` for 2026-07-28 clients that declare the extension: catalog, describe and
/// call by path agree with one another and with discover; a client that does not declare it never sees it; a
/// member of another team can neither list nor describe nor call these tools.
#[tokio::test]
async fn progressive_disclosure_is_served_only_to_clients_that_ask_for_it() {
    let sat = demo_satellite().await;
    let client = Caller::new(&sat, "/mcp", Some(TOKEN));
    let ext = satellite::router::catalog::EXTENSION;

    let (_, _, plain) = client.post_modern(&modern("server/discover", json!({}), false)).await;
    assert!(plain["result"]["capabilities"]["extensions"].get(ext).is_none(), "{plain}");
    let (_, _, asked) = client.post_modern(&modern("server/discover", json!({}), true)).await;
    assert!(asked["result"]["capabilities"]["extensions"][ext].is_object(), "{asked}");
    let (_, _, refused) = client.post_modern(&modern("tools/catalog", json!({}), false)).await;
    assert_eq!(refused["error"]["code"], -32601, "not declared, not served: {refused}");

    let (_, _, catalog) = client.post_modern(&modern("tools/catalog", json!({}), true)).await;
    let entries = catalog["result"]["tools"].as_array().unwrap_or_else(|| panic!("{catalog}")).clone();
    let names: Vec<&str> = entries.iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.contains(&"demo:echo") && names.contains(&"more:echo"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("elsewhere:")), "only the caller's own tools: {names:?}");
    assert_eq!(catalog["result"]["cacheScope"], "private");
    for entry in &entries {
        assert!(entry.get("inputSchema").is_none(), "no schema in the catalog: {entry}");
        assert!(entry["summary"].is_string() && entry["schemaHash"].as_str().is_some_and(|h| h.len() == 64));
    }
    let (_, _, found) = client.post_modern(&modern("tools/catalog", json!({"query": "echo text"}), true)).await;
    let first = found["result"]["tools"][0]["name"].as_str().unwrap_or_default().to_owned();
    assert!(first.ends_with(":echo"), "a query ranks as discover does: {found}");

    let (_, _, described) =
        client.post_modern(&modern("tools/describe", json!({"names": ["demo:echo", "more:add"]}), true)).await;
    let tools = described["result"]["tools"].as_array().unwrap_or_else(|| panic!("{described}"));
    assert_eq!(tools[0]["name"], "demo:echo");
    assert_eq!(tools[0]["inputSchema"]["required"], json!(["text"]));
    assert_eq!(tools[1]["name"], "more:add");
    // The catalog's hash is of exactly what describe returns.
    let hash = entries.iter().find(|e| e["name"] == "demo:echo").map(|e| e["schemaHash"].clone());
    let canonical = serde_json_canonicalizer::to_vec(&tools[0]).expect("canonical");
    assert_eq!(hash, Some(json!(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(canonical)))));

    let (_, _, unknown) = client
        .post_modern(&modern("tools/describe", json!({"names": ["demo:echo", "elsewhere:echo", "demo:nope"]}), true))
        .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert_eq!(unknown["error"]["data"]["unknownNames"], json!(["elsewhere:echo", "demo:nope"]));

    let call = modern("tools/call", json!({"name": "more:echo", "arguments": {"text": "by path"}}), true);
    let (_, _, called) = client.post_modern(&call).await;
    assert_eq!(called["result"]["content"][0]["text"], "by path", "{called}");
    let stranger = Caller::new(&sat, "/mcp", Some(OTHER));
    let (_, _, denied) = stranger.post_modern(&call).await;
    assert!(denied["error"]["message"].as_str().is_some_and(|m| m.contains("do not have access")), "{denied}");
    let names: Vec<String> = wait_until(DEADLINE, "the other team's server listed", || async {
        let (_, _, theirs) = stranger.post_modern(&modern("tools/catalog", json!({}), true)).await;
        let names: Vec<String> = theirs["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str().map(str::to_owned))
            .collect();
        (!names.is_empty()).then_some(names)
    })
    .await;
    assert!(names.iter().all(|n| n.starts_with("elsewhere:")), "{names:?}");
    assert!(sat.satellite.shutdown().await);
}
