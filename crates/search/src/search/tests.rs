//! Behaviour of the index handle on small hand-made instances.

use serde_json::json;

use super::writer::Writer;
use super::*;

fn tool(process_id: &str, slug: &str, name: &str, description: &str) -> ToolDoc {
    ToolDoc {
        process_id: process_id.to_owned(),
        server_slug: slug.to_owned(),
        tool_name: name.to_owned(),
        description: description.to_owned(),
        parameters: parameter_names(&json!({"type": "object", "properties": {"path": {"type": "string"}}})),
        position: NO_POSITION,
    }
}

fn visible(ids: &[&str]) -> Arc<Scope> {
    Arc::new(Scope::new(ids.iter().map(|id| (*id).to_owned()).collect()))
}

fn names(hits: &[SearchHit]) -> Vec<(&str, &str)> {
    hits.iter().map(|hit| (hit.process_id.as_str(), hit.tool_name.as_str())).collect()
}

async fn two_instances() -> SearchIndex {
    let index = SearchIndex::new().unwrap();
    index
        .replace_instance(
            "alice-fs",
            vec![
                tool("alice-fs", "filesystem", "read_file", "Read the complete contents of a file"),
                tool("alice-fs", "filesystem", "list_directory", "List files and directories in a path"),
            ],
        )
        .await
        .unwrap();
    index
        .replace_instance(
            "bob-fs",
            vec![
                tool("bob-fs", "filesystem", "read_file", "Read the complete contents of a file from disk"),
                tool("bob-fs", "filesystem", "readFileFast", "Read a file, read it fast: read file read file"),
            ],
        )
        .await
        .unwrap();
    index
        .replace_instance("bob-git", vec![tool("bob-git", "git", "git_status", "Show the working tree status")])
        .await
        .unwrap();
    index
}

#[tokio::test]
async fn results_stay_inside_the_visible_set_even_when_a_hidden_tool_matches_best() -> Result<(), SearchError> {
    let index = two_instances().await;
    // bob's `readFileFast` is the best BM25 match for this query over all documents.
    let everyone = index.search("read file fast", &visible(&["alice-fs", "bob-fs", "bob-git"]), 10).await?;
    assert_eq!(names(&everyone)[0], ("bob-fs", "readFileFast"));

    let alice = index.search("read file fast", &visible(&["alice-fs"]), 10).await?;
    assert!(!alice.is_empty());
    assert!(alice.iter().all(|hit| hit.process_id == "alice-fs"), "{:?}", names(&alice));

    // A limit smaller than the number of matches still fills up with visible tools only.
    let limited = index.search("file", &visible(&["alice-fs", "bob-git"]), 2).await?;
    assert_eq!(limited.len(), 2);
    assert!(limited.iter().all(|hit| hit.process_id == "alice-fs"));

    assert!(index.search("status", &visible(&["alice-fs"]), 10).await?.is_empty());
    assert!(index.search("read", &visible(&[]), 10).await?.is_empty());
    assert!(index.search("read", &visible(&["nobody"]), 10).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn replace_instance_replaces_and_remove_instance_removes() -> Result<(), SearchError> {
    let index = two_instances().await;
    assert_eq!(index.num_docs().await, 5);
    let bob = visible(&["bob-fs"]);
    assert_eq!(index.search("read", &bob, 10).await?.len(), 2, "the scope's filter is now cached");

    index.replace_instance("bob-fs", vec![tool("bob-fs", "filesystem", "write_file", "Write a file")]).await?;
    assert_eq!(index.num_docs().await, 4);
    assert!(index.search("read", &bob, 10).await?.is_empty(), "old tools are gone");
    assert_eq!(names(&index.search("write", &bob, 10).await?), [("bob-fs", "write_file")]);
    // Other instances are untouched.
    assert_eq!(index.search("read", &visible(&["alice-fs"]), 10).await?.len(), 1);

    index.remove_instance("bob-fs").await?;
    assert_eq!(index.num_docs().await, 3);
    assert!(index.search("write file", &bob, 10).await?.is_empty());
    index.remove_instance("never-indexed").await?;
    assert_eq!(index.num_docs().await, 3);
    Ok(())
}

/// A write returns once it is queued (an instance goes online without waiting for the commit), and a search
/// that starts after it waits for the commit: it never misses tools whose write has returned.
#[tokio::test]
async fn a_search_after_a_returned_write_sees_it_though_the_write_did_not_wait_for_the_commit() {
    let index = SearchIndex::new().unwrap();
    for round in 0..3 {
        let id = format!("big-{round}");
        let tools: Vec<ToolDoc> =
            (0..2_000).map(|n| tool(&id, "bulk", &format!("tool_{n}"), &format!("bulk operation {round}"))).collect();
        index.replace_instance(&id, tools).await.unwrap();
        assert_eq!(index.progress.sent.load(Ordering::Acquire), round + 1, "each write is numbered once");
        let hits = index.search(&format!("bulk operation {round}"), &visible(&[id.as_str()]), 5).await.unwrap();
        assert_eq!(hits.len(), 5, "round {round}: the search ran before the commit it had to wait for");
        assert!(index.progress.applied.borrow().through > round, "the commit it waited for is the one applied");
    }
    index.remove_instance("big-0").await.unwrap();
    assert!(index.search("bulk operation 0", &visible(&["big-0"]), 5).await.unwrap().is_empty());
    assert_eq!(index.num_docs().await, 4_000);
}

/// Indexing the tools of this process id fails, as a commit that tantivy refuses would (`write_and_commit`).
pub(super) const FAILS_TO_INDEX: &str = "fails-to-index";

#[tokio::test]
async fn a_failed_commit_is_told_to_whoever_waits_for_the_writes_and_the_index_goes_on() -> Result<(), SearchError> {
    let index = SearchIndex::new()?;
    index.replace_instance("good", vec![tool("good", "fs", "read_file", "Read a file")]).await?;
    index.written().await?;
    index.replace_instance(FAILS_TO_INDEX, vec![tool(FAILS_TO_INDEX, "git", "git_status", "Show the status")]).await?;
    match index.written().await {
        Err(SearchError::CommitFailed { through, error }) => {
            assert_eq!(through, 2, "the failed write is the second one sent");
            assert!(error.contains("fails to index"), "the commit's own error is told: {error}");
        }
        other => panic!("a lost write must be told to the caller waiting for it, got {other:?}"),
    }
    // The failed commit was rolled back: the index still answers with what it held, and takes later writes.
    let scope = visible(&["good", FAILS_TO_INDEX, "later"]);
    assert_eq!(names(&index.search("read", &scope, 5).await?), vec![("good", "read_file")]);
    assert!(index.search("status", &scope, 5).await?.is_empty());
    index.replace_instance("later", vec![tool("later", "fs", "write_file", "Write a file")]).await?;
    assert_eq!(names(&index.search("write", &scope, 5).await?), vec![("later", "write_file")]);
    assert!(index.written().await.is_err(), "a lost write stays told: the index never held it");
    Ok(())
}

/// Indexing the tools of this process id panics, which ends the writer task (`on_blocking_pool`).
pub(super) const STOPS_THE_WRITER: &str = "stops-the-writer";

#[tokio::test]
async fn writes_a_stopped_writer_never_applied_are_told_as_lost() -> Result<(), SearchError> {
    let index = SearchIndex::new()?;
    index.replace_instance("good", vec![tool("good", "fs", "read_file", "Read a file")]).await?;
    index.written().await?;
    index.replace_instance(STOPS_THE_WRITER, vec![tool(STOPS_THE_WRITER, "git", "git_status", "Status")]).await?;
    match index.written().await {
        Err(SearchError::WriterGone) => {}
        other => panic!("a write the stopped writer never applied must not read as written, got {other:?}"),
    }
    // Searches go on with what the index held.
    assert_eq!(names(&index.search("read", &visible(&["good"]), 5).await?), vec![("good", "read_file")]);
    Ok(())
}

#[tokio::test]
async fn concurrent_writes_are_all_applied() {
    let index = SearchIndex::new().unwrap();
    let writes = (0..40).map(|n| {
        let index = index.clone();
        async move {
            let id = format!("p{n}");
            index.replace_instance(&id, vec![tool(&id, "s", &format!("tool_{n}"), "does things")]).await
        }
    });
    for result in futures::future::join_all(writes).await {
        result.unwrap();
    }
    assert_eq!(index.num_docs().await, 40);
    let all = Arc::new(Scope::new((0..40).map(|n| format!("p{n}")).collect()));
    assert_eq!(index.search("things", &all, 50).await.unwrap().len(), 40);
}

#[tokio::test]
async fn exact_names_rank_first() {
    let index = two_instances().await;
    let all = visible(&["alice-fs", "bob-fs", "bob-git"]);
    for query in ["git_status", "git status", "Git-Status", "git:git_status"] {
        let hits = index.search(query, &all, 5).await.unwrap();
        assert_eq!(hits[0].tool_name, "git_status", "{query}");
    }
    for query in ["readFileFast", "read file fast"] {
        assert_eq!(index.search(query, &all, 5).await.unwrap()[0].tool_name, "readFileFast", "{query}");
    }
    let hits = index.search("read_file", &all, 5).await.unwrap();
    assert_eq!(hits[0].tool_name, "read_file");
    assert_eq!(hits[1].tool_name, "read_file");
}

#[tokio::test]
async fn empty_queries_and_zero_limits_give_nothing() {
    let index = two_instances().await;
    let all = visible(&["alice-fs", "bob-fs", "bob-git"]);
    for query in ["", "   ", "\n\t", "?!"] {
        assert!(index.search(query, &all, 10).await.unwrap().is_empty(), "{query:?}");
    }
    assert!(index.search("read", &all, 0).await.unwrap().is_empty());
    // Query syntax characters are plain text here.
    let hits = index.search("\"read\" -file: (status) AND OR", &all, 10).await.unwrap();
    assert!(!hits.is_empty());
}

#[test]
fn relevance_is_zero_for_the_best_hit_and_at_most_one() {
    assert_eq!(relevance_score(8.0, 8.0), 0.0);
    assert_eq!(relevance_score(4.0, 8.0), 0.5);
    assert_eq!(relevance_score(0.0, 8.0), 1.0);
    assert_eq!(relevance_score(9.0, 8.0), 0.0);
    assert_eq!(relevance_score(1.0, 0.0), 1.0);
    assert_eq!(relevance_score(f32::NAN, 1.0), 1.0);
}

#[test]
fn new_outside_a_runtime_is_an_error() {
    assert!(matches!(SearchIndex::new(), Err(SearchError::NoRuntime(_))));
}

/// Property: over random instances, tools and visible sets, a search returns only tools of visible
/// instances, and every visible tool is found when asked for by name (the router's candidate set is
/// exactly the caller's callable tools).
#[tokio::test]
async fn results_are_exactly_the_visible_tools() -> Result<(), SearchError> {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    const VERBS: [&str; 6] = ["create", "list", "delete", "search", "update", "read"];
    const NOUNS: [&str; 6] = ["issue", "file", "page", "record", "message", "branch"];
    let mut rng = StdRng::seed_from_u64(0x5a7e_111e);
    for case in 0..60 {
        let index = SearchIndex::new()?;
        let instances = rng.gen_range(1..7);
        let mut all: Vec<(String, String)> = Vec::new();
        for i in 0..instances {
            let process_id = format!("p{case}-{i}");
            let tools = rng.gen_range(0..6);
            let mut docs = Vec::new();
            for _ in 0..tools {
                let name = format!("{}_{}", VERBS[rng.gen_range(0..6)], NOUNS[rng.gen_range(0..6)]);
                if docs.iter().any(|d: &ToolDoc| d.tool_name == name) {
                    continue;
                }
                docs.push(tool(&process_id, &format!("srv{i}"), &name, &name.replacen('_', " a ", 1)));
                all.push((process_id.clone(), name));
            }
            index.replace_instance(&process_id, docs).await?;
        }
        let visible_ids: Vec<String> =
            (0..instances).filter(|_| rng.gen_bool(0.5)).map(|i| format!("p{case}-{i}")).collect();
        let scope = Arc::new(Scope::new(visible_ids.clone()));
        for (process_id, name) in &all {
            let hits = index.search(name, &scope, 50).await?;
            assert!(
                hits.iter().all(|h| visible_ids.contains(&h.process_id)),
                "case {case}: hit outside the visible set"
            );
            let found = hits.iter().any(|h| &h.process_id == process_id && &h.tool_name == name);
            assert_eq!(found, visible_ids.contains(process_id), "case {case}: {process_id}/{name}");
        }
        for word in VERBS.iter().chain(NOUNS.iter()) {
            let hits = index.search(word, &scope, 50).await?;
            let expected: usize = all.iter().filter(|(p, n)| visible_ids.contains(p) && n.contains(word)).count();
            assert!(hits.iter().all(|h| visible_ids.contains(&h.process_id)));
            assert_eq!(hits.len(), expected, "case {case}: query {word}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_cached_scope_sees_instances_indexed_after_it_was_first_used() -> Result<(), SearchError> {
    let index = two_instances().await;
    let scope = visible(&["alice-fs", "carol-db"]);
    assert!(index.search("query database", &scope, 10).await?.is_empty());
    index.replace_instance("carol-db", vec![tool("carol-db", "db", "run_query", "Query the database")]).await?;
    assert_eq!(names(&index.search("query database", &scope, 10).await?), [("carol-db", "run_query")]);
    index.replace_instance("dave-db", vec![tool("dave-db", "db", "run_query", "Query the database")]).await?;
    assert_eq!(index.search("query database", &scope, 10).await?.len(), 1, "dave's tools stay hidden");
    Ok(())
}

#[tokio::test]
async fn segments_are_merged_into_one_once_writes_stop_and_searches_still_agree() -> Result<(), SearchError> {
    let index = SearchIndex::new()?;
    for n in 0..6 {
        let id = format!("p{n}");
        index.replace_instance(&id, vec![tool(&id, "s", &format!("tool_{n}"), "does things")]).await?;
    }
    let scope = Arc::new(Scope::new((0..6).map(|n| format!("p{n}")).collect()));
    assert_eq!(index.search("things", &scope, 10).await?.len(), 6, "the scope's filter is cached now");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while index.num_segments() > 1 {
        assert!(std::time::Instant::now() < deadline, "still {} segments", index.num_segments());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(index.num_docs().await, 6);
    assert_eq!(index.search("things", &scope, 10).await?.len(), 6, "the cached filter follows the merge");
    index.remove_instance("p3").await?;
    assert_eq!(index.search("things", &scope, 10).await?.len(), 5);
    Ok(())
}

/// A writer of `index`'s own tantivy index, opened as soon as the index's writer task has let go of its own
/// (tantivy holds a lock for as long as a writer is open); it holds the lock in turn until dropped.
async fn writer_once_released(index: &SearchIndex) -> Result<Writer, SearchError> {
    let shared = index.reader.searcher().index().clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match open_writer(&shared) {
            Ok(writer) => return Ok(writer),
            Err(TantivyError::LockFailure(..)) => {
                assert!(std::time::Instant::now() < deadline, "the idle index still holds its writer");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(other) => return Err(other.into()),
        }
    }
}

#[tokio::test]
async fn an_idle_index_lets_go_of_its_writer_and_opens_one_again_at_the_next_write() -> Result<(), SearchError> {
    let index = two_instances().await;
    drop(writer_once_released(&index).await?);
    assert_eq!(index.num_segments(), 1, "released once merged");
    index.replace_instance("carol-db", vec![tool("carol-db", "db", "run_query", "Query the database")]).await?;
    index.written().await?;
    assert_eq!(names(&index.search("query database", &visible(&["carol-db"]), 10).await?), [("carol-db", "run_query")]);
    index.remove_instance("bob-git").await?;
    assert!(index.search("working tree status", &visible(&["bob-git"]), 10).await?.is_empty());
    assert_eq!(index.num_docs().await, 5);
    Ok(())
}

#[tokio::test]
async fn a_writer_that_cannot_be_opened_fails_that_write_and_the_next_write_opens_one() -> Result<(), SearchError> {
    let index = two_instances().await;
    let held = writer_once_released(&index).await?;
    index.replace_instance("carol-db", vec![tool("carol-db", "db", "run_query", "Query the database")]).await?;
    assert!(matches!(index.written().await, Err(SearchError::CommitFailed { .. })), "the lost write is told");
    assert!(index.search("query database", &visible(&["carol-db"]), 10).await?.is_empty());
    drop(held);
    index.replace_instance("dave-db", vec![tool("dave-db", "db", "run_query", "Query the database")]).await?;
    assert_eq!(names(&index.search("query database", &visible(&["dave-db"]), 10).await?), [("dave-db", "run_query")]);
    assert_eq!(index.num_docs().await, 6, "the index before, and the write after");
    Ok(())
}

#[tokio::test]
async fn a_server_named_in_the_request_boosts_its_tools() -> Result<(), SearchError> {
    let index = SearchIndex::new()?;
    let issue = |id: &str, slug: &str| tool(id, slug, "create_issue", "Create a new issue in a project");
    index.replace_instance("gh", vec![issue("gh", "github")]).await?;
    index.replace_instance("gl", vec![issue("gl", "gitlab")]).await?;
    index.replace_instance("yf", vec![tool("yf", "yahoo-finance", "get_price", "Get a quote")]).await?;
    let news = |id: &str| tool(id, "news-api", "get_latest_news", "Get the latest news headlines about a topic");
    index.replace_instance("news", vec![news("news")]).await?;
    index.replace_instance("brave", vec![tool("brave", "brave-search", "web_search", "Search the web")]).await?;
    let scope = visible(&["gh", "gl", "yf", "news", "brave"]);
    for (query, first) in [
        ("open an issue for the login bug using gitlab", "gl"),
        ("open an issue for the login bug using github", "gh"),
        ("find the latest news about the rust language with brave search", "brave"),
    ] {
        let hits = index.search(query, &scope, 3).await?;
        assert_eq!(hits.first().map(|h| h.process_id.as_str()), Some(first), "{query}: {hits:?}");
    }
    Ok(())
}

#[tokio::test]
async fn implied_steps_and_file_formats_reach_their_tools() -> Result<(), SearchError> {
    let index = SearchIndex::new()?;
    index
        .replace_instance("time", vec![tool("time", "time", "get_current_time", "Get the current date and time")])
        .await?;
    index
        .replace_instance("rail", vec![tool("rail", "rail", "get_tickets", "Search train tickets between cities")])
        .await?;
    let excel = tool("xl", "excel", "excel_read_sheet", "Read values from an Excel spreadsheet sheet");
    index.replace_instance("xl", vec![excel]).await?;
    index.replace_instance("fs", vec![tool("fs", "fs", "read_file", "Read a file from disk")]).await?;
    let scope = visible(&["time", "rail", "xl", "fs"]);
    let hits = index.search("train tickets from Beijing to Shanghai next Wednesday", &scope, 5).await?;
    assert_eq!(names(&hits)[..2], [("rail", "get_tickets"), ("time", "get_current_time")], "{hits:?}");
    let hits = index.search("tell me the bmi in /root/excel/people_data.xlsx", &scope, 5).await?;
    assert_eq!(names(&hits)[0], ("xl", "excel_read_sheet"), "{hits:?}");
    Ok(())
}

#[tokio::test]
async fn a_scope_of_single_tools_finds_exactly_those_tools_among_whole_instances() -> Result<(), SearchError> {
    let index = two_instances().await;
    // A toolset taking all of bob-git and only `read_file` of bob-fs: `readFileFast` (the best match) is out.
    let scope = Arc::new(Scope::with_tools(vec!["bob-git".into()], vec![tool_key("bob-fs", "read_file")]));
    assert_eq!(names(&index.search("read file fast", &scope, 10).await?), [("bob-fs", "read_file")]);
    assert_eq!(names(&index.search("status", &scope, 10).await?), [("bob-git", "git_status")]);
    let nothing = Arc::new(Scope::with_tools(vec![], vec![tool_key("bob-fs", "no_such_tool")]));
    assert!(index.search("read", &nothing, 10).await?.is_empty());
    assert!(Scope::with_tools(vec![], vec![]).is_empty());
    Ok(())
}

/// The writer reads an instance's tools as it indexes them, on its own thread: a caller hands over handles and
/// goes on, and never holds a whole listing's documents (see `Tools`).
#[tokio::test]
async fn an_instances_tools_are_read_by_the_writer_not_by_the_caller() -> Result<(), SearchError> {
    let index = SearchIndex::new()?;
    let caller = std::thread::current().id();
    let readers = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = readers.clone();
    let tools = (0..3).map(move |n| {
        seen.lock().push(std::thread::current().id());
        tool("lazy", "lazy", &format!("lazy_tool_{n}"), "made when the writer asks for it")
    });
    index.replace_instance("lazy", tools).await?;
    index.written().await?;
    let readers = readers.lock().clone();
    assert_eq!(readers.len(), 3, "every tool is read once");
    assert!(readers.iter().all(|thread| *thread != caller), "the caller read a tool: {readers:?}");
    assert_eq!(names(&index.search("lazy_tool_2", &visible(&["lazy"]), 1).await?), [("lazy", "lazy_tool_2")]);
    Ok(())
}
