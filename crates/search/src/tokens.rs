//! Per-tool token counts (SB §15): the tool as JS `JSON.stringify({name, description, parameters}, null, 2)`
//! would print it, encoded with `o200k_base` (the default of the npm `gpt-tokenizer` package, OQ-44).
//!
//! The text must be byte for byte what the JS reference prints, so it has its own pretty-printer instead of
//! `serde_json`'s (which writes `1.0` and `1e21` where JS writes `1` and `1e+21`). The rules, all JS:
//! - key order as received, except that array-index keys (`"0"`, `"17"`) come first in ascending order,
//!   because JS objects enumerate them that way;
//! - every number is printed as the JS number it would parse to: shortest round-trip digits, plain notation
//!   from 1e-6 up to 1e21, exponent form (`1e-7`, `1.5e+21`) outside, `-0` as `0`, integers beyond 2^53 rounded
//!   to the nearest double like `JSON.parse` does;
//! - strings escape `"`, `\`, `\b \f \n \r \t` and the other control characters as lowercase `\u00xx`,
//!   nothing else (non-ASCII, `/`, U+2028 stay as they are).
//!
//! Special-token look-alikes such as `<|endoftext|>` are encoded as ordinary text. The encoder (about 200k
//! ranks, ~45 MB) is shared, built on first use and released when idle ([`release_idle`]); counting is CPU
//! work, so `count_tools` runs it on the blocking pool.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use serde_json::{Map, Number, Value};
use tiktoken_rs::CoreBPE;
use tracing::{debug, error};

use crate::model::catalog::ToolDef;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the o200k_base encoder could not be built: {0}")]
    Encoder(String),
    #[error("the token counting task did not finish: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// An `o200k_base` encoder. Build it once: [`counter`] shares one per process.
pub struct Counter {
    bpe: CoreBPE,
    /// Token counts of the chunks [`Counter::count_answer`] saw, by a hash of their text.
    chunks: Mutex<HashMap<u64, u32>>,
}

/// Keys before which a discover answer's text is cut into chunks: each result's `tool_path` (so a result's name,
/// description and server are one chunk), its `relevance_score` (alone, as it varies per query) and its
/// `input_schema` (with the closing brackets after it).
const ANSWER_KEYS: [&str; 3] = ["\"tool_path\":", "\"relevance_score\":", "\"input_schema\":"];

/// Chunk counts kept at most; the memo starts over when full (a few hundred KB at most).
const MAX_CHUNKS: usize = 8192;

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counter(o200k_base)")
    }
}

impl Counter {
    /// Build a new encoder (tens of milliseconds in release builds). Prefer [`counter`].
    pub fn o200k_base() -> Result<Counter, TokenError> {
        let bpe = tiktoken_rs::o200k_base().map_err(|e| TokenError::Encoder(e.to_string()))?;
        Ok(Counter { bpe, chunks: Mutex::new(HashMap::new()) })
    }

    /// Tokens of `text`, special-token look-alikes counted as ordinary text.
    pub fn count_text(&self, text: &str) -> usize {
        self.bpe.encode_ordinary(text).len()
    }

    /// Tokens of a discover answer's text, the same as [`Counter::count_text`] of it, for a fraction of the
    /// work when its results were in earlier answers.
    ///
    /// The text is cut right after the opening quote of each [`ANSWER_KEYS`] key, and each chunk is counted once
    /// per distinct text (remembered by a 64-bit hash). Cutting there is exact: the `o200k_base` split pattern
    /// has no look-behind, and at such a cut the text before ends in a run of punctuation (`{"`, `,"`, `  "` in
    /// the pretty form) that the pattern's punctuation branch takes whole, stopping at the key's first letter, so
    /// a piece always starts at the cut, in the whole text and in the chunk alone. A key of the same name inside
    /// a schema is cut the same way; one inside a string value is escaped (`\"`) and never matches.
    pub fn count_answer(&self, text: &str) -> usize {
        static FINDERS: OnceLock<[memchr::memmem::Finder<'static>; 3]> = OnceLock::new();
        let finders = FINDERS.get_or_init(|| ANSWER_KEYS.map(memchr::memmem::Finder::new));
        let mut cuts: Vec<usize> =
            finders.iter().flat_map(|key| key.find_iter(text.as_bytes()).map(|at| at + 1)).collect();
        cuts.sort_unstable();
        let mut total = 0;
        let mut start = 0;
        for end in cuts.into_iter().chain(std::iter::once(text.len())) {
            if end > start {
                total += self.count_chunk(&text[start..end]);
            }
            start = end;
        }
        total
    }

    /// Tokens one entry of a discover answer's `tools` array adds to the answer when another entry follows it, as
    /// [`Counter::count_answer`] counts the answer: `entry` is the entry's compact JSON, starting with
    /// `{"tool_path":`. Counted from the key on, with the `,{"` that opens the next entry; the entry's own `{"`
    /// belongs to the text before it. Remembered like any chunk, so the answer's count reads it again for free.
    pub fn count_entry(&self, entry: &str) -> usize {
        let mut text = String::with_capacity(entry.len() + 3);
        text.push_str(entry);
        text.push_str(",{\"");
        self.count_answer(&text).saturating_sub(self.count_chunk("{\""))
    }

    fn count_chunk(&self, chunk: &str) -> usize {
        let key = text_hash(chunk);
        if let Some(n) = self.chunks.lock().get(&key) {
            return *n as usize;
        }
        let n = self.count_text(chunk);
        let mut chunks = self.chunks.lock();
        if chunks.len() >= MAX_CHUNKS {
            chunks.clear();
        }
        chunks.insert(key, u32::try_from(n).unwrap_or(u32::MAX));
        n
    }

    /// Tokens of one tool (SB §15.1).
    pub fn count_tool(&self, name: &str, description: Option<&str>, input_schema: &Value) -> usize {
        self.count_text(&tool_text(name, description, input_schema))
    }

    /// Tokens of each tool of one catalog, in order; the same as [`Counter::count_tool`] for each, about twice
    /// as fast on real catalogs.
    ///
    /// Half the bytes of a catalog's tool texts are lines seen before in the same catalog (`"type": "string",`
    /// at the same depth), so lines are counted once each and summed. That is exact because every line
    /// break of [`tool_text`] ends a token piece of the `o200k_base` split pattern: strings escape raw line
    /// breaks, a line never ends in whitespace, the next starts with a space, `}` or `]`, and the pattern has
    /// no look-behind, so no piece crosses a line end and each line splits alone as it does in place.
    ///
    /// Lines are remembered by a 64-bit hash, not by a copy: a large catalog has tens of thousands of distinct
    /// lines, and as many small copies alive at once left the allocator's pages stretched after they were freed.
    pub fn count_catalog(&self, tools: &[ToolDef]) -> Vec<usize> {
        let mut seen: HashMap<u64, usize> = HashMap::new();
        tools
            .iter()
            .map(|t| {
                let text = tool_text(t.name(), Some(t.description()), &t.input_schema());
                text.split_inclusive('\n')
                    .map(|line| *seen.entry(text_hash(line)).or_insert_with(|| self.count_text(line)))
                    .sum()
            })
            .collect()
    }
}

/// The 64-bit hash a text is remembered by (a discover answer's chunks, a catalog's lines), keyed per process.
fn text_hash(text: &str) -> u64 {
    use std::hash::BuildHasher;
    static HASHER: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    HASHER.get_or_init(Default::default).hash_one(text)
}

/// The process's shared encoder and when it was last handed out.
struct Shared {
    counter: Mutex<Option<Arc<Counter>>>,
    last_used: Mutex<Instant>,
    /// Building failed once: it would fail again (the ranks are compiled in), so it is not retried.
    failed: OnceLock<String>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        counter: Mutex::new(None),
        last_used: Mutex::new(Instant::now()),
        failed: OnceLock::new(),
    })
}

/// The process's shared encoder, built on first use and again after [`release_idle`] let it go. It holds
/// about 45 MB, most of an idle satellite's memory, so it is kept only while tools are being counted.
pub fn counter() -> Result<Arc<Counter>, TokenError> {
    let shared = shared();
    if let Some(reason) = shared.failed.get() {
        return Err(TokenError::Encoder(reason.clone()));
    }
    *shared.last_used.lock() = Instant::now();
    let mut slot = shared.counter.lock();
    if let Some(counter) = slot.as_ref() {
        return Ok(counter.clone());
    }
    let started = Instant::now();
    match Counter::o200k_base() {
        Ok(counter) => {
            debug!(elapsed_ms = started.elapsed().as_millis() as u64, "o200k_base encoder built");
            let counter = Arc::new(counter);
            *slot = Some(counter.clone());
            Ok(counter)
        }
        Err(err) => {
            error!(error = %err, "o200k_base encoder could not be built; tools will have no token counts");
            let _ = shared.failed.set(err.to_string());
            Err(err)
        }
    }
}

/// Whether the shared encoder is built now (counting is then a matter of microseconds, not ~130 ms).
pub fn is_built() -> bool {
    shared().counter.lock().is_some()
}

/// Let the shared encoder go when nothing asked for it for `idle`, and give the freed memory back to the
/// operating system. True when it was released. Blocking (the heap trim takes a few milliseconds).
pub fn release_idle(idle: Duration) -> bool {
    let shared = shared();
    if shared.last_used.lock().elapsed() < idle {
        return false;
    }
    let Some(counter) = shared.counter.lock().take() else {
        return false;
    };
    drop(counter); // callers still counting keep their own Arc; the memory goes when the last one ends
    crate::memory::return_free_memory();
    debug!(idle_seconds = idle.as_secs(), "o200k_base encoder released after being idle");
    true
}

/// Tokens of one tool with the shared encoder. CPU-bound: call it from blocking code, not from async tasks.
pub fn count_tool(name: &str, description: Option<&str>, input_schema: &Value) -> Result<usize, TokenError> {
    Ok(counter()?.count_tool(name, description, input_schema))
}

/// Tokens of every tool of one catalog, in order ([`Counter::count_catalog`]), counted on the blocking pool.
/// Descriptions are taken as stored (raw, `""` when the server gave none: OQ-10).
pub async fn count_tools(tools: Vec<ToolDef>) -> Result<Vec<usize>, TokenError> {
    tokio::task::spawn_blocking(move || Ok(counter()?.count_catalog(&tools))).await?
}

/// JS `JSON.stringify({name, description, parameters: input_schema}, null, 2)`; the `description` key is left
/// out only when it is `None`.
pub fn tool_text(name: &str, description: Option<&str>, input_schema: &Value) -> String {
    let mut out = String::with_capacity(128);
    out.push_str("{\n  \"name\": ");
    write_string(&mut out, name);
    if let Some(description) = description {
        out.push_str(",\n  \"description\": ");
        write_string(&mut out, description);
    }
    out.push_str(",\n  \"parameters\": ");
    write_value(&mut out, input_schema, 1);
    out.push_str("\n}");
    out
}

/// JS `JSON.stringify(value, null, 2)` of any JSON value.
pub fn js_pretty(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, 0);
    out
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_value(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => write_array(out, items, depth),
        Value::Object(map) => write_object(out, map, depth),
    }
}

fn write_array(out: &mut String, items: &[Value], depth: usize) {
    if items.is_empty() {
        out.push_str("[]");
        return;
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        indent(out, depth + 1);
        write_value(out, item, depth + 1);
    }
    out.push('\n');
    indent(out, depth);
    out.push(']');
}

fn write_object(out: &mut String, map: &Map<String, Value>, depth: usize) {
    if map.is_empty() {
        out.push_str("{}");
        return;
    }
    out.push('{');
    let mut first = true;
    let mut member = |out: &mut String, key: &str, value: &Value| {
        out.push_str(if first { "\n" } else { ",\n" });
        first = false;
        indent(out, depth + 1);
        write_string(out, key);
        out.push_str(": ");
        write_value(out, value, depth + 1);
    };
    if map.keys().any(|k| array_index(k).is_some()) {
        for (key, value) in js_key_order(map) {
            member(out, key, value);
        }
    } else {
        for (key, value) in map {
            member(out, key, value);
        }
    }
    out.push('\n');
    indent(out, depth);
    out.push('}');
}

/// JS property order: array indices ascending, then the other keys in insertion order.
fn js_key_order(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut indices: Vec<(u32, &String, &Value)> =
        map.iter().filter_map(|(k, v)| array_index(k).map(|i| (i, k, v))).collect();
    indices.sort_by_key(|(i, _, _)| *i);
    let mut ordered: Vec<(&String, &Value)> = indices.into_iter().map(|(_, k, v)| (k, v)).collect();
    ordered.extend(map.iter().filter(|(k, _)| array_index(k).is_none()));
    ordered
}

/// `Some(i)` when `key` is the canonical decimal form of an integer 0 ..= 2^32 - 2 (an ECMAScript array index).
fn array_index(key: &str) -> Option<u32> {
    let bytes = key.as_bytes();
    if bytes.is_empty() || bytes.len() > 10 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return None;
    }
    let value: u64 = key.parse().ok()?;
    (value < u64::from(u32::MAX)).then_some(value as u32)
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\x08' => "\\b",
            b'\x0c' => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// The largest integer every double up to which is exact (2^53).
const MAX_SAFE: u64 = 1 << 53;

fn write_number(out: &mut String, n: &Number) {
    if let Some(i) = n.as_u64() {
        if i <= MAX_SAFE {
            let _ = write!(out, "{i}");
            return;
        }
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= MAX_SAFE {
            let _ = write!(out, "{i}");
            return;
        }
    }
    // Floats, and integers JS would have parsed into a rounded double.
    match n.as_f64() {
        Some(f) => write_js_f64(out, f),
        None => out.push_str("null"),
    }
}

/// ECMAScript `Number.prototype.toString()` (Number::toString, radix 10), by `ryu-js`; non-finite values print
/// as `null`, as `JSON.stringify` does.
pub fn write_js_f64(out: &mut String, f: f64) {
    if !f.is_finite() {
        out.push_str("null");
        return;
    }
    out.push_str(ryu_js::Buffer::new().format_finite(f));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_encoder_is_released_when_idle_and_built_again_on_use() -> Result<(), TokenError> {
        let before = counter()?;
        assert!(!release_idle(Duration::from_secs(3600)), "used a moment ago");
        let count = before.count_text("hello world, again");
        release_idle(Duration::ZERO);
        let after = counter()?;
        assert!(!Arc::ptr_eq(&before, &after), "a new encoder after the release");
        assert_eq!(after.count_text("hello world, again"), count);
        Ok(())
    }
    use serde_json::json;

    fn js(f: f64) -> String {
        let mut s = String::new();
        write_js_f64(&mut s, f);
        s
    }

    #[test]
    fn numbers_print_like_javascript() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1"),
            (-1.0, "-1"),
            (0.0, "0"),
            (-0.0, "0"),
            (0.5, "0.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1.7, "1.7"),
            (320.0, "320"),
            (123.456, "123.456"),
            (1e-6, "0.000001"),
            (1.5e-6, "0.0000015"),
            (1e-7, "1e-7"),
            (1e-9, "1e-9"),
            (-2.5e-8, "-2.5e-8"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (1.5e21, "1.5e+21"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (123456789012345680000.0, "123456789012345680000"),
            (f64::NAN, "null"),
            (f64::INFINITY, "null"),
        ];
        for (value, expected) in cases {
            assert_eq!(js(*value), *expected, "{value:e}");
        }
        let parsed: Value = serde_json::from_str(
            r#"[1.0, 0.0, -0.0, 1e-09, 2.5E3, 1e21, 9007199254740993, -9007199254740993, 18446744073709551615,
                9007199254740992, 100000000000000000000000]"#,
        )
        .unwrap();
        assert_eq!(
            js_pretty(&parsed).replace(['\n', ' '], ""),
            "[1,0,0,1e-9,2500,1e+21,9007199254740992,-9007199254740992,18446744073709552000,9007199254740992,1e+23]"
        );
    }

    #[test]
    fn strings_escape_like_javascript() {
        let text = js_pretty(&json!("q\"b\\s/é😀\u{2028}\u{7f}\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{1b}"));
        assert_eq!(text, "\"q\\\"b\\\\s/é😀\u{2028}\u{7f}\\b\\f\\n\\r\\t\\u0000\\u001f\\u001b\"");
    }

    #[test]
    fn tool_text_keeps_key_order_and_indentation() {
        let schema: Value = serde_json::from_str(
            r#"{"type":"object","properties":{"z":{"type":"string","enum":["a","b"]},"a":{"type":"number","default":1.0}},"required":[],"additionalProperties":{}}"#,
        )
        .unwrap();
        let text = tool_text("search", Some("Find things"), &schema);
        let expected = r#"{
  "name": "search",
  "description": "Find things",
  "parameters": {
    "type": "object",
    "properties": {
      "z": {
        "type": "string",
        "enum": [
          "a",
          "b"
        ]
      },
      "a": {
        "type": "number",
        "default": 1
      }
    },
    "required": [],
    "additionalProperties": {}
  }
}"#;
        assert_eq!(text, expected);
    }

    #[test]
    fn missing_description_is_left_out_and_empty_kept() {
        assert_eq!(tool_text("t", None, &json!({})), "{\n  \"name\": \"t\",\n  \"parameters\": {}\n}");
        assert_eq!(
            tool_text("t", Some(""), &json!({})),
            "{\n  \"name\": \"t\",\n  \"description\": \"\",\n  \"parameters\": {}\n}"
        );
    }

    #[test]
    fn array_index_keys_come_first_like_js_objects() {
        let schema: Value = serde_json::from_str(r#"{"b":1,"10":2,"2":3,"01":4,"-1":5,"4294967295":6,"0":7}"#).unwrap();
        let keys: Vec<String> = js_pretty(&schema)
            .lines()
            .filter_map(|l| l.trim().split_once("\": ").map(|(k, _)| k.trim_start_matches('"').to_owned()))
            .collect();
        assert_eq!(keys, ["0", "2", "10", "b", "01", "-1", "4294967295"]);
    }

    /// A discover answer's text as the hierarchical router writes it, compact or pretty.
    fn answer(tools: &[Value], query: &str, pretty: bool) -> Result<String, serde_json::Error> {
        let entries: Vec<Value> = tools
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                json!({
                    "tool_path": format!("server-{i}:{}", tool["name"].as_str().unwrap_or("tool")),
                    "description": tool["description"],
                    "server_name": format!("server-{i}"),
                    "transport": "http",
                    "relevance_score": i as f64 * 0.137,
                    "input_schema": tool["inputSchema"],
                })
            })
            .collect();
        let document = json!({"total_found": tools.len(), "tools": entries, "search_time_ms": 0, "query": query});
        if pretty {
            serde_json::to_string_pretty(&document)
        } else {
            serde_json::to_string(&document)
        }
    }

    #[test]
    fn an_answer_counted_in_chunks_counts_what_the_whole_text_does() -> Result<(), Box<dyn std::error::Error>> {
        let counter = Counter::o200k_base()?;
        // Texts that could make a piece cross a cut: the keys inside schemas and inside strings, spaces and
        // punctuation before a quote, non-ASCII next to quotes, numbers next to keys.
        let hostile = vec![
            json!({"name": "a", "description": "says \"tool_path\": and \"input_schema\":{", "inputSchema": {}}),
            json!({"name": "b", "description": "ends in spaces   ", "inputSchema": {"type": "object",
                "properties": {"tool_path": {"type": "string"}, "input_schema": {"default": "\"relevance_score\":"},
                "relevance_score": {"type": "number", "default": 12345678}}}}),
            json!({"name": "c", "description": "数据 «引号»\"", "inputSchema": {"properties": {"x": {"enum": ["'s", " ", "\n"]}}}}),
            json!({"name": "d", "description": "", "inputSchema": {"properties": {"q'tool_path": {}, "99tool_path": 1}}}),
        ];
        let mut answers = vec![String::new(), "{}".into(), answer(&[], "nothing", false)?];
        for pretty in [false, true] {
            answers.push(answer(&hostile, "a \"quoted\" query   ", pretty)?);
            for n in 1..=hostile.len() {
                answers.push(answer(&hostile[..n], "x", pretty)?);
            }
        }
        // Real tools: every 7th group of ten from the corpus, both forms.
        let corpus = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/toolsearch/corpus.jsonl"),
        )?;
        let tools: Vec<Value> = corpus.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        assert!(tools.len() > 1000, "the corpus is there");
        for (n, group) in tools.chunks(10).enumerate().filter(|(n, _)| n % 7 == 0) {
            answers.push(answer(group, "find the latest news and save it to /tmp/a.txt", n % 2 == 1)?);
        }
        for text in &answers {
            assert_eq!(counter.count_answer(text), counter.count_text(text), "{text}");
        }
        // Counted again, the chunks come from the memo, with the same totals.
        let remembered = counter.chunks.lock().len();
        assert!(remembered > answers.len(), "{remembered} chunks remembered");
        for text in &answers {
            assert_eq!(counter.count_answer(text), counter.count_text(text));
        }
        assert_eq!(counter.chunks.lock().len(), remembered, "nothing counted twice");
        Ok(())
    }

    /// A budget answer (entries compact, path alone or full, each maybe with a `need`; `needs` and the budget's
    /// fields around them) counted in chunks counts what the whole text does: the analytics' realized figures, which
    /// count answers so, count what the agent received.
    #[test]
    fn a_budget_answer_counts_entry_by_entry_what_the_whole_text_does() -> Result<(), Box<dyn std::error::Error>> {
        let counter = Counter::o200k_base()?;
        let corpus = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/toolsearch/corpus.jsonl"),
        )?;
        let tools: Vec<Value> = corpus.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        for (n, group) in tools.chunks(12).enumerate().filter(|(n, _)| n % 11 == 0) {
            let entries: Vec<String> = group
                .iter()
                .enumerate()
                .map(|(i, tool)| {
                    let path = format!("{}:{}", tool["server"].as_str().unwrap_or("s"), tool["name"].as_str().unwrap_or("t"));
                    let need = (n % 2 == 0).then_some(i % 3);
                    let entry = match i % 3 {
                        0 => json!({"tool_path": path, "need": need, "description": tool["description"], "server_name": "s",
                            "transport": "http", "relevance_score": 0.25, "input_schema": tool["inputSchema"]}),
                        1 => json!({"tool_path": path, "need": need, "description": "First sentence.", "required": ["a", "b"]}),
                        _ => json!({"tool_path": path, "need": need}),
                    };
                    entry.to_string()
                })
                .collect();
            let text = format!(
                "{{\"needs\":[\"read the file\",\"plot it\"],\"tools\":[{}],\"total_found\":{},\"more_matched\":7,\"budget_tokens\":1000,\"hint\":\"h\",\"search_time_ms\":0,\"query\":\"q\"}}",
                entries.join(","),
                entries.len()
            );
            assert_eq!(counter.count_answer(&text), counter.count_text(&text), "{text}");
        }
        Ok(())
    }

    /// Past its bound the memo starts over: it never holds more than `MAX_CHUNKS` counts, and what is counted
    /// after it started over is still exact.
    #[test]
    fn the_chunk_memo_stays_bounded_and_exact_when_full() -> Result<(), TokenError> {
        let counter = Counter::o200k_base()?;
        for n in 0..MAX_CHUNKS + 10 {
            counter.count_answer(&format!("{n} word{n}"));
            assert!(counter.chunks.lock().len() <= MAX_CHUNKS);
        }
        assert!(counter.chunks.lock().len() < MAX_CHUNKS, "it started over");
        let text = r#"{"tools":[{"tool_path":"s:t","relevance_score":0.5,"input_schema":{}}]}"#;
        assert_eq!(counter.count_answer(text), counter.count_text(text));
        assert_eq!(counter.count_answer(text), counter.count_text(text), "from the memo");
        Ok(())
    }

    #[test]
    fn counts_with_o200k_base_and_special_tokens_as_text() {
        let counter = counter().unwrap();
        assert_eq!(counter.count_text(""), 0);
        assert_eq!(counter.count_text("hello world"), 2);
        // As text, `<|endoftext|>` is several ordinary tokens, never the single special one.
        assert!(counter.count_text("<|endoftext|>") > 1);
        let n = counter.count_tool("echo", Some("Echo the text back"), &json!({"type": "object"}));
        assert_eq!(n, counter.count_text(&tool_text("echo", Some("Echo the text back"), &json!({"type": "object"}))));
    }

    #[tokio::test]
    async fn count_tools_runs_in_order_on_the_blocking_pool() -> Result<(), TokenError> {
        let tools: Vec<ToolDef> = ["a", "a longer description of a tool"]
            .iter()
            .enumerate()
            .map(|(i, d)| {
                ToolDef::from_listing(&json!({"name": format!("t{i}"), "description": d, "inputSchema": {}})).unwrap()
            })
            .collect();
        let expected: Vec<usize> = tools
            .iter()
            .map(|t| count_tool(t.name(), Some(t.description()), &t.input_schema()))
            .collect::<Result<_, _>>()?;
        assert_eq!(count_tools(tools).await?, expected);
        assert!(expected[1] > expected[0]);
        Ok(())
    }
}
