//! What a compact discover entry says of a tool: the first sentence of its description, cut to
//! [`SUMMARY_CHARS`], and the names of its required arguments. Remembered by the tool's content hash, as
//! trimmed schemas are: an answer of forty compact entries then reads forty summaries instead of parsing forty
//! schemas, and one tool installed for many members is one summary.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

use crate::model::ToolDef;

/// A summary is the description's first sentence, cut at a word boundary when it is longer than this.
pub const SUMMARY_CHARS: usize = 120;

/// At most this many summaries are kept; a full memo starts over.
const MAX_SUMMARIES: usize = 8192;

/// One tool in a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub sentence: Box<str>,
    /// The `required` names of the input schema, in its order (strings only).
    pub required: Box<[Box<str>]>,
}

/// Summaries remembered by content hash.
#[derive(Clone, Default)]
pub struct Summaries {
    memo: Arc<Mutex<HashMap<[u8; 32], Arc<Summary>>>>,
}

impl Summaries {
    pub fn get(&self, tool: &ToolDef) -> Arc<Summary> {
        if let Some(known) = self.memo.lock().get(tool.content_hash_bytes()) {
            return known.clone();
        }
        let summary =
            Arc::new(Summary { sentence: first_sentence(tool.description()).into(), required: required(tool) });
        let mut memo = self.memo.lock();
        if memo.len() >= MAX_SUMMARIES {
            memo.clear();
        }
        memo.insert(*tool.content_hash_bytes(), summary.clone());
        summary
    }
}

fn required(tool: &ToolDef) -> Box<[Box<str>]> {
    let schema = tool.input_schema();
    let names = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    names.map(Box::from).collect()
}

/// The first sentence of `description` with its whitespace collapsed: up to the first `.`, `!`, `?` (or a
/// full-width stop) followed by a space or the end, cut at a word boundary with `…` when longer than
/// [`SUMMARY_CHARS`].
pub fn first_sentence(description: &str) -> String {
    let mut sentence = String::with_capacity(description.len().min(SUMMARY_CHARS + 8));
    for word in description.split_whitespace() {
        if !sentence.is_empty() {
            sentence.push(' ');
        }
        sentence.push_str(word);
        let ends = word.ends_with(['.', '!', '?']) && !is_abbreviation(word);
        if ends || word.ends_with(['。', '！', '？']) || sentence.chars().count() > SUMMARY_CHARS {
            break;
        }
        // A full-width stop inside a word ends the sentence there (CJK text has no spaces).
        if let Some(at) = word.find(['。', '！', '？']) {
            let cut = sentence.len() - word.len() + at + '。'.len_utf8();
            sentence.truncate(cut);
            break;
        }
    }
    cut_to_length(sentence)
}

/// `e.g.`, `i.e.`, `etc.`, `U.S.`: a dot that does not end a sentence.
fn is_abbreviation(word: &str) -> bool {
    let bare = word.trim_end_matches(['.', '!', '?']);
    bare.contains('.') || matches!(bare.to_lowercase().as_str(), "etc" | "vs" | "approx" | "incl" | "no")
}

fn cut_to_length(sentence: String) -> String {
    if sentence.chars().count() <= SUMMARY_CHARS {
        return sentence;
    }
    let limit = sentence.char_indices().nth(SUMMARY_CHARS).map_or(sentence.len(), |(at, _)| at);
    let head = &sentence[..limit];
    let head = match head.rfind(' ') {
        Some(space) if space > SUMMARY_CHARS / 2 => &head[..space],
        _ => head,
    };
    format!("{}…", head.trim_end_matches([',', ';', ':', ' ']))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_sentence_is_cut_at_its_end_or_at_a_word() {
        assert_eq!(first_sentence("Create an issue.  It needs a repo."), "Create an issue.");
        assert_eq!(first_sentence("List files, e.g. logs. Then more."), "List files, e.g. logs.");
        assert_eq!(
            first_sentence("  Multi\n line\tdescription without a stop  "),
            "Multi line description without a stop"
        );
        assert_eq!(first_sentence(""), "");
        assert_eq!(first_sentence("获取天气。返回温度"), "获取天气。");
        let long = "word ".repeat(60);
        let cut = first_sentence(&long);
        assert!(cut.ends_with('…') && cut.chars().count() <= SUMMARY_CHARS + 1, "{cut}");
        assert!(!cut.contains("  ") && !cut.ends_with(" …"));
        let unbroken = "x".repeat(300);
        assert_eq!(first_sentence(&unbroken).chars().count(), SUMMARY_CHARS + 1);
    }

    #[test]
    fn a_summary_names_the_required_arguments_and_is_remembered() {
        let tools = ToolDef::listing([json!({"name": "t", "description": "Do it. Well.",
            "inputSchema": {"type": "object", "required": ["a", 3, "b"], "properties": {}}})]);
        let summaries = Summaries::default();
        let summary = summaries.get(&tools[0]);
        assert_eq!(&*summary.sentence, "Do it.");
        assert_eq!(summary.required.iter().map(|r| &**r).collect::<Vec<_>>(), ["a", "b"]);
        assert!(Arc::ptr_eq(&summary, &summaries.get(&tools[0])), "the second read is the remembered one");
        let bare = ToolDef::listing([json!({"name": "u", "inputSchema": {"required": "not a list"}})]);
        assert!(summaries.get(&bare[0]).required.is_empty());
    }
}
