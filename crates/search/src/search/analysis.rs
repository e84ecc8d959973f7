//! Text analysis shared by indexing and querying: how tool text and user requests become terms.
//!
//! - [`ToolTokenizer`] splits at every non-alphanumeric character, at camelCase boundaries (acronyms
//!   too: `HTMLParser` → `html`, `parser`) and lowercases; digits never start a split (`s3`, `v2`,
//!   `ec2Instance` → `ec2`, `instance`). CJK ideographs and kana become one token each (those
//!   scripts have no spaces). Runs longer than [`MAX_RUN_CHARS`] (base64, hashes) are dropped.
//! - [`tool_analyzer`] adds English stopwords and Porter2 (Snowball English) stemming.
//! - [`normalize_query`] replaces argument values in a request by the words a schema would use
//!   for them (URL, path, selector) and drops long numbers, before analysis.
//! - [`canonical_name`] is the untokenized form used for exact tool-name matches.

use tantivy::tokenizer::{Language, Stemmer, StopWordFilter, TextAnalyzer, Token, TokenStream, Tokenizer};

/// Name under which [`tool_analyzer`] is registered in the index.
pub(crate) const TOOL_TOKENIZER: &str = "tool";

/// An alphanumeric run longer than this is not a word (base64 payloads, hashes, tokens).
const MAX_RUN_CHARS: usize = 64;

/// Digits in a value at or above which it is a "long number" (ids, dates, phone numbers): dropped.
const LONG_NUMBER_DIGITS: usize = 4;

/// English stopwords: the Snowball/NLTK list, minus words that name tool actions or directions
/// (`up`, `down`, `out`, `off`, `over`, `before`, `after`, `all`, `same`, `more`, `most`, `again`).
const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "against",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "me",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "on",
    "once",
    "only",
    "or",
    "other",
    "ought",
    "our",
    "ours",
    "ourselves",
    "own",
    "please",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
];

/// Whether `word` (lowercase) is one of the analyzer's English stopwords.
pub(crate) fn is_stopword(word: &str) -> bool {
    STOPWORDS.contains(&word)
}

/// The analyzer for every tokenized text field and for queries: split, lowercase, stopwords, stem.
pub(crate) fn tool_analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(ToolTokenizer::default())
        .filter(StopWordFilter::remove(STOPWORDS.iter().map(|word| (*word).to_owned())))
        .filter(Stemmer::new(Language::English))
        .build()
}

/// Runs `analyzer` over `text` and returns the terms in order (duplicates kept).
pub(crate) fn analyze(analyzer: &mut TextAnalyzer, text: &str) -> Vec<String> {
    let mut terms = Vec::new();
    let mut stream = analyzer.token_stream(text);
    while let Some(token) = stream.next() {
        terms.push(token.text.clone());
    }
    terms
}

/// Lowercased words of `text` joined by `_`: `getStoryWithComments`, `get-story-with-comments` and
/// "get story with comments" all give `get_story_with_comments`. No stopwords, no stemming.
pub(crate) fn canonical_name(text: &str) -> String {
    words(text).join("_")
}

/// The lowercased words of `text`, as [`canonical_name`] splits them.
pub(crate) fn words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    split_words(text, |from, to| words.push(text[from..to].to_lowercase()));
    words
}

/// Tokenizer splitting identifiers and prose into lowercase words (see the module doc).
#[derive(Clone, Default)]
pub(crate) struct ToolTokenizer {
    tokens: Vec<Token>,
}

pub(crate) struct ToolTokenStream<'a> {
    tokens: &'a mut [Token],
    /// Index of the current token plus one; 0 before the first `advance`.
    next: usize,
}

impl Tokenizer for ToolTokenizer {
    type TokenStream<'a> = ToolTokenStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> ToolTokenStream<'a> {
        self.tokens.clear();
        let tokens = &mut self.tokens;
        split_words(text, |offset_from, offset_to| {
            tokens.push(Token {
                offset_from,
                offset_to,
                position: tokens.len(),
                text: text[offset_from..offset_to].to_lowercase(),
                position_length: 1,
            });
        });
        ToolTokenStream { tokens: &mut self.tokens, next: 0 }
    }
}

impl TokenStream for ToolTokenStream<'_> {
    fn advance(&mut self) -> bool {
        if self.next < self.tokens.len() {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &Token {
        &self.tokens[self.next.saturating_sub(1)]
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.next.saturating_sub(1)]
    }
}

/// Calls `emit(from, to)` with the byte range of every word of `text`, in order.
fn split_words(text: &str, mut emit: impl FnMut(usize, usize)) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |index: usize| chars.get(index).map_or(text.len(), |(offset, _)| *offset);
    let mut index = 0;
    while index < chars.len() {
        let (offset, c) = chars[index];
        if is_ideograph(c) {
            emit(offset, end_of(index + 1));
            index += 1;
            continue;
        }
        if !c.is_alphanumeric() {
            index += 1;
            continue;
        }
        let run_start = index;
        while index < chars.len() && chars[index].1.is_alphanumeric() && !is_ideograph(chars[index].1) {
            index += 1;
        }
        if index - run_start > MAX_RUN_CHARS {
            continue;
        }
        let mut word_start = run_start;
        for split in run_start + 1..index {
            if is_camel_boundary(&chars, split, index) {
                emit(chars[word_start].0, chars[split].0);
                word_start = split;
            }
        }
        emit(chars[word_start].0, end_of(index));
    }
}

/// Whether a new word starts at `at` inside the alphanumeric run ending (exclusive) at `run_end`.
fn is_camel_boundary(chars: &[(usize, char)], at: usize, run_end: usize) -> bool {
    let previous = chars[at - 1].1;
    let current = chars[at].1;
    if !current.is_uppercase() {
        return false;
    }
    let next_is_lower = at + 1 < run_end && chars[at + 1].1.is_lowercase();
    // `getFile`; `V2Data` (a capitalised word after digits); `HTMLParser` (last capital of an acronym).
    previous.is_lowercase() || (previous.is_numeric() && next_is_lower) || (previous.is_uppercase() && next_is_lower)
}

/// CJK ideographs and Japanese kana: written without spaces, so each is its own token.
fn is_ideograph(c: char) -> bool {
    matches!(c, '\u{3040}'..='\u{30ff}' | '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}' | '\u{f900}'..='\u{faff}')
}

/// Rewrites argument values in a user request into the words a tool description or schema would
/// use for them, leaving other words unchanged:
/// - a URL (`https://www.bbc.co.uk/news`) → "url website bbc" (host labels without `www` and TLDs);
/// - a path with a separator → "path file <ext>" or "path directory"; a bare `name.ext` → "file name.ext";
/// - a CSS-like selector (`#password`, `.submit-btn`, `input[name=q]`) → "selector";
/// - a number with [`LONG_NUMBER_DIGITS`] or more digits (ids, dates, phone numbers) → dropped.
pub(crate) fn normalize_query(query: &str) -> String {
    let mut out = Vec::new();
    for chunk in query.split_whitespace() {
        let value = chunk.trim_matches(|c: char| "\"'`“”‘’()<>[]{},;!?。，：".contains(c));
        let value = value.trim_end_matches(['.', ':']);
        if let Some(host) = url_host(value) {
            out.push("url website".to_owned());
            out.push(site_words(host));
        } else if is_long_number(value) {
            continue;
        } else if is_selector(value) {
            out.push("selector".to_owned());
        } else if value.contains('/') || value.contains('\\') {
            out.push(path_words(value));
        } else if let Some(host) = bare_domain(value) {
            out.push("url website".to_owned());
            out.push(site_words(host));
        } else if let Some(extension) = file_extension(value) {
            out.push(format!("file {value}{}", format_words(extension)));
        } else {
            out.push(chunk.to_owned());
        }
    }
    out.join(" ")
}

/// Words for a helper step the request implies but does not name: "tomorrow", "next Wednesday" need
/// today's date first. Searched at a lower weight than the request's own words.
pub(crate) fn implied_words(query: &str) -> Option<&'static str> {
    // Tried and dropped: an information request ("what…", "latest news…") implying "search web
    // information" cost LiveMCPBench R@1 0.111 -> 0.074 on dev and gained nothing on MCPVerse.
    let relative_date = query.split_whitespace().any(|chunk| {
        let value = chunk.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'').to_lowercase();
        RELATIVE_DATES.contains(&value.as_str())
    });
    relative_date.then_some("current date time")
}

/// Words that make a request depend on today's date.
const RELATIVE_DATES: &[&str] = &[
    "today",
    "today's",
    "tomorrow",
    "tomorrow's",
    "yesterday",
    "yesterday's",
    "tonight",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "weekend",
    "24h",
];

const TOP_LEVEL_DOMAINS: &[&str] =
    &["com", "org", "net", "io", "cn", "edu", "gov", "co", "uk", "de", "jp", "fr", "ai", "dev", "app", "info", "me"];

fn url_host(value: &str) -> Option<&str> {
    let lower = value.chars().take(8).collect::<String>().to_ascii_lowercase();
    let rest = if lower.starts_with("https://") {
        &value[8..]
    } else if lower.starts_with("http://") {
        &value[7..]
    } else if lower.starts_with("www.") {
        value
    } else {
        return None;
    };
    let host_end = rest.find(['/', '?', '#', ':']).unwrap_or(rest.len());
    Some(&rest[..host_end])
}

/// `example.com`, `en.wikipedia.org`: dotted labels ending with a common top-level domain.
fn bare_domain(value: &str) -> Option<&str> {
    let labels: Vec<&str> = value.split('.').collect();
    let last = labels.last()?.to_ascii_lowercase();
    let well_formed = labels.len() >= 2
        && labels.iter().all(|label| !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    (well_formed && TOP_LEVEL_DOMAINS.contains(&last.as_str())).then_some(value)
}

fn site_words(host: &str) -> String {
    let labels: Vec<&str> = host.split('.').filter(|label| !label.eq_ignore_ascii_case("www")).collect();
    let keep = if labels.len() > 1 { &labels[..labels.len() - 1] } else { &labels[..] };
    keep.iter()
        .filter(|label| !TOP_LEVEL_DOMAINS.contains(&label.to_ascii_lowercase().as_str()))
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

fn path_words(value: &str) -> String {
    let last = value.trim_end_matches(['/', '\\']).rsplit(['/', '\\']).next().unwrap_or("");
    match file_extension(last) {
        Some(extension) => format!("path file {extension}{}", format_words(extension)),
        None => "path directory".to_owned(),
    }
}

/// The words tools use for a file format, after a space (`xlsx` → " excel spreadsheet"), or "".
fn format_words(extension: &str) -> &'static str {
    match extension.to_ascii_lowercase().as_str() {
        "xlsx" | "xls" | "xlsm" | "csv" | "tsv" => " excel spreadsheet",
        "docx" | "doc" => " word document",
        "pptx" | "ppt" => " powerpoint presentation",
        "md" | "markdown" => " markdown",
        "png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" => " image",
        "htm" | "html" => " html",
        _ => "",
    }
}

/// `report.pdf` → `pdf`: a stem of at least two characters and a 1-5 character extension with a letter.
fn file_extension(name: &str) -> Option<&str> {
    let (stem, extension) = name.rsplit_once('.')?;
    let plausible = stem.chars().count() >= 2
        && (1..=5).contains(&extension.len())
        && extension.chars().all(|c| c.is_ascii_alphanumeric())
        && extension.chars().any(|c| c.is_ascii_alphabetic());
    plausible.then_some(extension)
}

fn is_selector(value: &str) -> bool {
    let mut chars = value.chars();
    let first = chars.next();
    let second = chars.next();
    let id_or_class = matches!(first, Some('#' | '.')) && second.is_some_and(|c| c.is_ascii_alphabetic());
    let attribute = value.contains('[') && value.contains('=') && value.ends_with(']');
    id_or_class || attribute
}

fn is_long_number(value: &str) -> bool {
    let digits = value.chars().filter(char::is_ascii_digit).count();
    digits >= LONG_NUMBER_DIGITS && value.chars().all(|c| c.is_ascii_digit() || "+-.,:/".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        analyze(&mut tool_analyzer(), text)
    }

    #[test]
    fn identifiers_split_at_case_and_punctuation_but_not_digits() {
        assert_eq!(words("getStoryWithComments"), ["get", "stori", "comment"]);
        assert_eq!(
            words("HTMLParser s3_bucket-list ec2Instance V2Data"),
            ["html", "parser", "s3", "bucket", "list", "ec2", "instanc", "v2", "data"]
        );
        assert_eq!(words("playwright_get_visible_html"), ["playwright", "get", "visibl", "html"]);
    }

    #[test]
    fn ideographs_are_single_tokens_and_long_runs_are_dropped() {
        assert_eq!(words("查询 ok"), ["查", "询", "ok"]);
        assert!(words(&"A".repeat(200)).is_empty());
    }

    #[test]
    fn canonical_names_match_across_styles() {
        assert_eq!(canonical_name("git status"), "git_status");
        assert_eq!(canonical_name("git_status"), "git_status");
        assert_eq!(canonical_name("getStoryWithComments"), "get_story_with_comments");
        assert_eq!(canonical_name("  Read-File "), "read_file");
    }

    #[test]
    fn query_values_become_schema_words() {
        assert_eq!(normalize_query("Open https://www.bbc.co.uk/news now"), "Open url website bbc now");
        assert_eq!(normalize_query("read ./src/utils/file_utils.py"), "read path file py");
        assert_eq!(normalize_query("list /home/user/docs/"), "list path directory");
        assert_eq!(normalize_query("fill '#password' with 'x'"), "fill selector with 'x'");
        assert_eq!(normalize_query("call 13800138000 on 2025-01-15"), "call on");
        assert_eq!(normalize_query("visit example.com"), "visit url website example");
        assert_eq!(normalize_query("open report.pdf"), "open file report.pdf");
        assert_eq!(normalize_query("e.g. 42"), "e.g. 42");
    }

    #[test]
    fn file_formats_and_relative_dates_add_the_words_tools_use() {
        assert_eq!(normalize_query("read /root/excel/people.xlsx"), "read path file xlsx excel spreadsheet");
        assert_eq!(normalize_query("save it as notes.docx"), "save it as file notes.docx word document");
        assert_eq!(implied_words("trains on next Wednesday."), Some("current date time"));
        assert_eq!(implied_words("what's on TODAY?"), Some("current date time"));
        assert_eq!(implied_words("todays list"), None, "only whole words");
    }
}
