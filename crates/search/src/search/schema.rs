//! The tantivy schema, how a [`ToolDoc`] becomes a document, and how a request becomes a query.
//!
//! Fields:
//! - `process_id`: untokenized, stored; the visibility filter and the delete key.
//! - `tool_name`: stored only (returned in hits).
//! - `tool_key`: untokenized [`tool_key`] (process id and tool name): the visibility filter of a toolset that
//!   takes only some of an instance's tools.
//! - `exact_name`: untokenized [`canonical_name`] of the tool name, and of "slug name"; a query
//!   that canonicalises to one of them gets [`EXACT_NAME_SCORE`] on top of its BM25 score.
//! - `name`: the tool name, analysed.
//! - `text`: catch-all, analysed: server slug, tool name, description, parameter names.
//!
//! Scoring: BM25 over `text` plus half of BM25 over `name`. On the dev set this came within noise
//! of BM25F with per-field weights (shared/notes/search.md); separately boosted fields summed
//! together did worse.

use std::collections::HashSet;

use serde_json::Value;
use tantivy::query::{BooleanQuery, BoostQuery, ConstScoreQuery, Occur, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, STORED, STRING};
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{TantivyDocument, Term};

use super::analysis::{analyze, canonical_name, implied_words, normalize_query, tool_analyzer, words, TOOL_TOKENIZER};
use super::ToolDoc;

/// Weight of a match in the `name` field relative to the catch-all field.
const NAME_FIELD_BOOST: f32 = 0.5;

/// Added to the score of a tool whose exact name (or `slug:name`) is the whole query. Larger than
/// any BM25 score a short query reaches on this data, so an exact name always ranks first.
pub(crate) const EXACT_NAME_SCORE: f32 = 100.0;

/// Added to the tools of a server the request names ("… with yahoo finance", "use the git server"): any
/// run of up to [`MAX_SERVER_NAME_WORDS`] consecutive words that is a server's whole slug.
const SERVER_NAMED_SCORE: f32 = 3.0;
const MAX_SERVER_NAME_WORDS: usize = 3;

/// Weight of the words of a helper step the request implies (see `implied_words`).
const IMPLIED_WORD_BOOST: f32 = 0.3;

/// At most this many distinct query terms are used (a request pasted with a document in it).
const MAX_QUERY_TERMS: usize = 128;

/// Queries with more words than this are requests, not tool names: no exact-name clause.
const MAX_EXACT_NAME_WORDS: usize = 8;

/// JSON Schema nesting followed when collecting parameter names.
const MAX_SCHEMA_DEPTH: usize = 16;

/// One tool of one instance as a single term: the process id and the tool name, joined by a character
/// neither contains in practice (a unit separator).
pub fn tool_key(process_id: &str, tool_name: &str) -> String {
    format!("{process_id}\u{1f}{tool_name}")
}

#[derive(Clone, Copy)]
pub(crate) struct Fields {
    pub(crate) process_id: Field,
    pub(crate) tool_name: Field,
    /// Stored only: the tool's place in its catalog ([`super::ToolDoc::position`]).
    pub(crate) position: Field,
    pub(crate) tool_key: Field,
    exact_name: Field,
    /// [`canonical_name`] of the server slug.
    pub(crate) server: Field,
    name: Field,
    text: Field,
}

/// Schema, field handles and the analyzer used for both documents and queries.
#[derive(Clone)]
pub(crate) struct IndexSchema {
    pub(crate) schema: Schema,
    pub(crate) fields: Fields,
    pub(crate) analyzer: TextAnalyzer,
}

impl IndexSchema {
    pub(crate) fn new() -> IndexSchema {
        let analysed = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default().set_tokenizer(TOOL_TOKENIZER).set_index_option(IndexRecordOption::WithFreqs),
        );
        let mut builder = Schema::builder();
        let fields = Fields {
            process_id: builder.add_text_field("process_id", STRING | STORED),
            tool_name: builder.add_text_field("tool_name", STORED),
            position: builder.add_u64_field("position", STORED),
            tool_key: builder.add_text_field("tool_key", STRING),
            exact_name: builder.add_text_field("exact_name", STRING),
            server: builder.add_text_field("server", STRING),
            name: builder.add_text_field("name", analysed.clone()),
            text: builder.add_text_field("text", analysed),
        };
        IndexSchema { schema: builder.build(), fields, analyzer: tool_analyzer() }
    }

    /// The tool's document. Its buffer is sized to its values: tantivy's default (1 KiB, doubled as it fills) made a
    /// listing's thousands of documents, alive together until indexed, about twice their size.
    pub(crate) fn document(&self, tool: &ToolDoc) -> TantivyDocument {
        let fields = &self.fields;
        let key = tool_key(&tool.process_id, &tool.tool_name);
        let [exact, exact_with_server] = exact_names(&tool.server_slug, &tool.tool_name);
        let server = canonical_name(&tool.server_slug);
        let values = [
            (fields.process_id, tool.process_id.as_str()),
            (fields.tool_name, &tool.tool_name),
            (fields.tool_key, &key),
            (fields.exact_name, &exact),
            (fields.exact_name, &exact_with_server),
            (fields.server, &server),
            (fields.name, &tool.tool_name),
            (fields.text, &tool.server_slug),
            (fields.text, &tool.tool_name),
            (fields.text, &tool.description),
            (fields.text, &tool.parameters),
        ];
        // The parameters (last) only when there are some.
        let values = if tool.parameters.is_empty() { &values[..values.len() - 1] } else { &values[..] };
        // Each text is stored after its length as a varint of at most 5 bytes.
        let mut document = TantivyDocument::with_capacity(values.iter().map(|(_, text)| text.len() + 5).sum());
        for (field, text) in values {
            document.add_text(*field, text);
        }
        if tool.position != super::NO_POSITION {
            document.add_u64(fields.position, u64::from(tool.position));
        }
        document
    }

    /// The scoring query for `text`, or `None` when `text` has no term; the caller adds visibility.
    /// `is_indexed` says whether a term is in the index (used for the server-name runs).
    ///
    /// Shape: `t1 | t2 | … | name:t1^0.5 | … | exact_name | server:named…`.
    pub(crate) fn query(&self, text: &str, is_indexed: impl Fn(&Term) -> bool) -> Option<Box<dyn Query>> {
        let mut analyzer = self.analyzer.clone();
        let terms = query_terms(&mut analyzer, text);
        let mut seen: HashSet<String> = terms.iter().cloned().collect();
        let mut clauses = self.term_clauses(terms, &is_indexed);
        // A helper step the request implies (today's date for "tomorrow") counts, but less than its own words.
        for term in implied_words(text).map(|words| analyze(&mut analyzer, words)).unwrap_or_default() {
            let text_term = Term::from_field_text(self.fields.text, &term);
            if seen.insert(term) && is_indexed(&text_term) {
                clauses.push(boosted(text_term, IMPLIED_WORD_BOOST));
            }
        }
        clauses.extend(self.exact_name_clause(text));
        if clauses.is_empty() {
            return None;
        }
        clauses.extend(self.server_named_clauses(text, &is_indexed));
        Some(Box::new(BooleanQuery::new(clauses)))
    }

    /// Each indexed term in the catch-all text, and where the name has it too, in the name at
    /// [`NAME_FIELD_BOOST`].
    fn term_clauses(&self, terms: Vec<String>, is_indexed: &dyn Fn(&Term) -> bool) -> Vec<Clause> {
        let mut clauses: Vec<Clause> = Vec::new();
        for term in terms {
            // A term no tool has scores nothing: leaving it out saves building its weight and scorers, which is
            // most of a long request's cost. Names are part of the catch-all text, so no text, no name either.
            let text_term = Term::from_field_text(self.fields.text, &term);
            if !is_indexed(&text_term) {
                continue;
            }
            clauses.push((Occur::Should, Box::new(TermQuery::new(text_term, IndexRecordOption::WithFreqs))));
            let name_term = Term::from_field_text(self.fields.name, &term);
            if is_indexed(&name_term) {
                clauses.push(boosted(name_term, NAME_FIELD_BOOST));
            }
        }
        clauses
    }

    /// [`EXACT_NAME_SCORE`] for a tool whose name the whole query is, unless the query is a request (more than
    /// [`MAX_EXACT_NAME_WORDS`] words) or has no name in it.
    fn exact_name_clause(&self, text: &str) -> Option<Clause> {
        if text.split_whitespace().count() > MAX_EXACT_NAME_WORDS {
            return None;
        }
        let exact = canonical_name(text);
        if exact.is_empty() {
            return None;
        }
        let exact_query =
            TermQuery::new(Term::from_field_text(self.fields.exact_name, &exact), IndexRecordOption::Basic);
        Some((Occur::Should, Box::new(ConstScoreQuery::new(Box::new(exact_query), EXACT_NAME_SCORE))))
    }

    /// [`SERVER_NAMED_SCORE`] for the tools of each server the request names.
    fn server_named_clauses(&self, text: &str, is_indexed: &dyn Fn(&Term) -> bool) -> Vec<Clause> {
        // Only runs that are a server's slug become clauses (a dictionary lookup each, no query).
        let words = words(text);
        let mut named = HashSet::new();
        let mut clauses: Vec<Clause> = Vec::new();
        for length in 1..=MAX_SERVER_NAME_WORDS {
            for run in words.windows(length).take(MAX_QUERY_TERMS) {
                let term = Term::from_field_text(self.fields.server, &run.join("_"));
                if is_indexed(&term) && named.insert(term.clone()) {
                    let query = TermQuery::new(term, IndexRecordOption::Basic);
                    clauses.push((Occur::Should, Box::new(ConstScoreQuery::new(Box::new(query), SERVER_NAMED_SCORE))));
                }
            }
        }
        clauses
    }
}

/// One clause of a query: every clause is optional (`Should`); visibility is added as the required one.
type Clause = (Occur, Box<dyn Query>);

/// `term` (with its frequencies) at `boost` times its BM25 score.
fn boosted(term: Term, boost: f32) -> Clause {
    let query = TermQuery::new(term, IndexRecordOption::WithFreqs);
    (Occur::Should, Box::new(BoostQuery::new(Box::new(query), boost)))
}

/// The distinct analysed terms of a request, in order, at most [`MAX_QUERY_TERMS`]: what [`IndexSchema::query`]
/// searches and [`Explainer`] reports.
fn query_terms(analyzer: &mut TextAnalyzer, text: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut terms = analyze(analyzer, &normalize_query(text));
    terms.retain(|term| seen.insert(term.clone()));
    terms.truncate(MAX_QUERY_TERMS);
    terms
}

/// The untokenized names a query matches exactly: the tool's name, and "server tool".
fn exact_names(server_slug: &str, tool_name: &str) -> [String; 2] {
    [canonical_name(tool_name), canonical_name(&format!("{server_slug} {tool_name}"))]
}

/// Says why tools match one request: the request is analysed once, each tool's parts as asked.
pub struct Explainer {
    analyzer: TextAnalyzer,
    terms: Vec<String>,
    exact: String,
}

impl Explainer {
    pub(crate) fn new(schema: &IndexSchema, text: &str) -> Explainer {
        let mut analyzer = schema.analyzer.clone();
        let terms = query_terms(&mut analyzer, text);
        Explainer { analyzer, terms, exact: canonical_name(text) }
    }

    /// Which of the request's terms each part of the tool holds, and whether the request is its exact name.
    pub fn explain(&mut self, server_slug: &str, tool: &crate::model::catalog::ToolDef) -> super::Matched {
        let parameters = parameter_names(&tool.input_schema());
        let (analyzer, terms) = (&mut self.analyzer, &self.terms);
        let mut found = |part: &str| -> Vec<String> {
            let held: HashSet<String> = analyze(analyzer, part).into_iter().collect();
            terms.iter().filter(|t| held.contains(*t)).cloned().collect()
        };
        super::Matched {
            exact_name: !self.exact.is_empty() && exact_names(server_slug, tool.name()).contains(&self.exact),
            server: found(server_slug),
            name: found(tool.name()),
            description: found(tool.description()),
            parameters: found(&parameters),
        }
    }
}

/// The names of every property declared anywhere in `schema`, space-separated, in the order written: nested
/// `properties`, `items`, `anyOf`/`oneOf`/`allOf`, `$defs`… (every object and array is walked).
pub fn parameter_names(schema: &Value) -> String {
    let mut names = Vec::new();
    collect_parameter_names(schema, 0, &mut names);
    names.join(" ")
}

fn collect_parameter_names(schema: &Value, depth: usize, names: &mut Vec<String>) {
    if depth > MAX_SCHEMA_DEPTH {
        return;
    }
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "properties" {
                    if let Value::Object(properties) = value {
                        for (name, property) in properties {
                            names.push(name.clone());
                            collect_parameter_names(property, depth + 1, names);
                        }
                        continue;
                    }
                }
                collect_parameter_names(value, depth + 1, names);
            }
        }
        Value::Array(values) => {
            for value in values {
                collect_parameter_names(value, depth + 1, names);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parameter_names_are_collected_recursively() {
        let schema = json!({
            "type": "object",
            "properties": {
                "filter": {"type": "object", "properties": {"startDate": {"type": "string"}}},
                "rows": {"type": "array", "items": {"properties": {"cellValue": {}}}},
                "target": {"anyOf": [{"properties": {"url": {}}}, {"type": "null"}]}
            },
            "$defs": {"Thing": {"properties": {"thingId": {}}}}
        });
        let mut names = Vec::new();
        collect_parameter_names(&schema, 0, &mut names);
        names.sort();
        assert_eq!(names, ["cellValue", "filter", "rows", "startDate", "target", "thingId", "url"]);
    }

    #[test]
    fn a_document_is_allocated_once_at_its_size() {
        let schema = IndexSchema::new();
        let tool = ToolDoc {
            process_id: "team-user-github".to_owned(),
            server_slug: "github".to_owned(),
            tool_name: "createIssue".to_owned(),
            description: "Create an issue. ".repeat(200),
            parameters: "owner repo title body".to_owned(),
            position: super::super::NO_POSITION,
        };
        let document = schema.document(&tool);
        let (used, held) = (document.node_data.len(), document.node_data.capacity());
        assert!(used > tool.description.len(), "{used} bytes");
        assert!(held - used <= 11 * 4, "{held} bytes held for {used}");
        assert_eq!(document.field_values().count(), 11);
        let without = schema.document(&ToolDoc { parameters: String::new(), ..tool });
        assert_eq!(without.field_values().count(), 10, "no parameters, no value");
    }

    #[test]
    fn a_query_without_terms_is_none() {
        let schema = IndexSchema::new();
        assert!(schema.query("  ?! ", |_| true).is_none());
        assert!(schema.query("the of", |_| true).is_some(), "exact-name clause still applies");
    }
}
