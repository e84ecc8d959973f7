//! How a listing's tools are held: one shared text per listing and a table of where each tool's parts are in it,
//! built tool by tool as a listing is read, and read through cheap `ToolDef` handles.

mod interner;

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use interner::intern;

/// One tool as the server described it, under its original name.
///
/// The definition is kept as its compact JSON text: a parsed `Value` tree of the same tool takes five to seven
/// times the bytes, and a catalog of thousands of tools is most of a loaded satellite's memory. What needs a part
/// of it (the input schema for a discover result or a token count) parses that part when it needs it.
///
/// The tools of one listing are held together, in one text and one table (a `Listing`), not as a handful of
/// allocations each: the allocator keeps a page of small blocks as long as one block in it lives, and thousands
/// of small definitions made while their listing was being read left pages a third to a half full (about 2 KiB
/// of resident memory per tool on top of its 1.3 KB; docs/performance-history.md). A `ToolDef` is a handle to its
/// listing and its place in it; cloning it is a reference count. Every instance of one server (one per team
/// member) lists the same tools, and all of them hold one copy of an identical listing (see [`Interner`](interner::Interner)).
#[derive(Clone)]
pub struct ToolDef {
    pub(super) listing: Arc<Listing>,
    index: u32,
}

/// The tools of one listing: every definition's compact JSON text one after another (followed by the names and
/// descriptions that do not appear verbatim in their definition), and where each tool's parts are in it.
pub(super) struct Listing {
    text: Box<str>,
    pub(super) tools: Box<[Entry]>,
}

/// A part of a listing's text, by byte offset.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + self.len as usize
    }
}

/// Where one tool's parts are in its listing's text.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Entry {
    /// The whole definition (title, annotations, outputSchema…), normalised: a string `description` and an
    /// object `inputSchema` are always there.
    definition: Span,
    name: Span,
    /// Missing descriptions are "".
    description: Span,
    /// SHA-256 of the definition's JSON text: tells whether a tool changed between discoveries.
    pub(super) content_hash: [u8; 32],
    /// The definition has a `_meta` object (read from the text when asked for).
    has_meta: bool,
}

/// What a handle whose entry is missing reads (never made: every handle is made with its entry).
const NO_ENTRY: Entry = Entry {
    definition: Span { start: 0, len: 0 },
    name: Span { start: 0, len: 0 },
    description: Span { start: 0, len: 0 },
    content_hash: [0; 32],
    has_meta: false,
};

impl std::fmt::Debug for ToolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolDef").field("name", &self.name()).field("definition", &self.definition_text()).finish()
    }
}

impl PartialEq for ToolDef {
    /// Equal definitions: the name and description are read from the definition, so they are equal too.
    fn eq(&self, other: &Self) -> bool {
        self.shares_body(other)
            || (self.entry().content_hash == other.entry().content_hash
                && self.definition_text() == other.definition_text())
    }
}

/// One `tools/list` entry, normalised into its definition's compact text: what a [`ListingBuilder`] takes.
#[derive(Debug)]
pub struct PreparedTool {
    name: String,
    description: String,
    definition: String,
    content_hash: [u8; 32],
    has_meta: bool,
}

impl PreparedTool {
    /// Normalise a `tools/list` entry: a string `description` (`""` when missing) and an object `inputSchema`
    /// (`{}` when missing), the rest as the server wrote it. An entry with no string name, an empty name, or that
    /// is not an object, is handed back whole (for the warning that shows it): a tool named `""` cannot be called
    /// by its path (`slug:`), and every event that names tools requires a name (`minLength: 1`), so one such tool
    /// made the backend refuse the whole `mcp.tools.discovered` of its server.
    pub fn new(raw: Value) -> Result<Self, Value> {
        let name = match raw.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => return Err(raw),
        };
        let Value::Object(mut definition) = raw else { return Err(raw) };
        let description = definition.get("description").and_then(Value::as_str).unwrap_or("").to_owned();
        definition.insert("description".into(), Value::String(description.clone()));
        if !definition.get("inputSchema").is_some_and(Value::is_object) {
            definition.insert("inputSchema".into(), Value::Object(Map::new()));
        }
        let has_meta = definition.get("_meta").is_some_and(Value::is_object);
        let definition = Value::Object(definition).to_string();
        let content_hash = Sha256::digest(definition.as_bytes()).into();
        Ok(PreparedTool { name, description, definition, content_hash, has_meta })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The tools of one listing being read, made into one shared listing by [`finish`](Self::finish).
///
/// Each tool's definition is copied into the listing's text as it is pushed, and the tool's own strings are
/// freed at once: a listing being read holds one growing text, not thousands of small blocks that live until
/// its end (those are what kept the allocator's pages of small blocks resident; see [`ToolDef`]).
pub struct ListingBuilder {
    /// The most text one listing holds ([`MAX_LISTING_TEXT`]; less in tests).
    max_text: usize,
    /// Listings already made, when the tools pushed outgrow one listing's text.
    pub(super) sealed: Vec<Listing>,
    /// The definitions pushed since the last seal, one after another.
    text: String,
    /// Each name or description not found verbatim in its definition (one JSON escapes), until the seal puts
    /// them after the definitions.
    appended: String,
    /// The parts held in `appended` (their spans are offsets into it), in push order.
    moved: Vec<(u32, Part)>,
    tools: Vec<Entry>,
    /// Where the first tool of each name is (listing, index), by a hash of the name.
    names: HashMap<u64, (u32, u32)>,
    hasher: std::hash::RandomState,
}

impl Default for ListingBuilder {
    fn default() -> Self {
        ListingBuilder {
            max_text: MAX_LISTING_TEXT,
            sealed: Vec::new(),
            text: String::new(),
            appended: String::new(),
            moved: Vec::new(),
            tools: Vec::new(),
            names: HashMap::new(),
            hasher: std::hash::RandomState::new(),
        }
    }
}

/// The two parts of a tool that are spans of the listing's text besides its definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Name,
    Description,
}

/// A listing's text is addressed with 32-bit offsets; a larger one (no real server lists 4 GiB of tools) is
/// held as several listings.
const MAX_LISTING_TEXT: usize = u32::MAX as usize;

impl ListingBuilder {
    /// Add a tool at the end of the listing.
    pub fn push(&mut self, tool: PreparedTool) {
        let hash = self.hasher.hash_one(&tool.name);
        self.push_hashed(tool, hash);
    }

    /// [`push`](Self::push) unless a tool of the same name was pushed already (handed back).
    pub fn push_new(&mut self, tool: PreparedTool) -> Result<(), PreparedTool> {
        let hash = self.hasher.hash_one(&tool.name);
        let taken = match self.names.get(&hash) {
            None => false,
            Some(&at) if self.name_at(at) == Some(tool.name.as_str()) => true,
            // Another name with the same 64-bit hash: every name is read.
            Some(_) => self.every_name().any(|name| name == tool.name),
        };
        if taken {
            return Err(tool);
        }
        self.push_hashed(tool, hash);
        Ok(())
    }

    fn push_hashed(&mut self, tool: PreparedTool, hash: u64) {
        let size = tool.definition.len() + tool.name.len() + tool.description.len();
        if !self.tools.is_empty() && self.text.len() + self.appended.len() + size > self.max_text {
            self.seal();
        }
        let index = self.tools.len() as u32;
        // The first tool of a name is the one a duplicate is compared with.
        self.names.entry(hash).or_insert((self.sealed.len() as u32, index));
        let definition = span(self.text.len(), tool.definition.len());
        let mut place = |part: &str, which: Part| match tool.definition.find(part) {
            Some(at) => span(definition.start as usize + at, part.len()),
            None => {
                self.moved.push((index, which));
                let placed = span(self.appended.len(), part.len());
                self.appended.push_str(part);
                placed
            }
        };
        let name = place(&tool.name, Part::Name);
        let description = place(&tool.description, Part::Description);
        self.text.push_str(&tool.definition);
        self.tools.push(Entry {
            definition,
            name,
            description,
            content_hash: tool.content_hash,
            has_meta: tool.has_meta,
        });
    }

    /// The name of the tool at (listing, index), sealed or not.
    fn name_at(&self, (listing, index): (u32, u32)) -> Option<&str> {
        if let Some(sealed) = self.sealed.get(listing as usize) {
            return sealed.tools.get(index as usize).map(|entry| sealed.part(entry.name));
        }
        let entry = self.tools.get(index as usize)?;
        let moved = self.moved.binary_search(&(index, Part::Name)).is_ok();
        let source = if moved { &self.appended } else { &self.text };
        source.get(entry.name.range())
    }

    fn every_name(&self) -> impl Iterator<Item = &str> {
        let sealed = self.sealed.iter().flat_map(|listing| listing.tools.iter().map(|entry| listing.part(entry.name)));
        let open = (0..self.tools.len() as u32).filter_map(|index| self.name_at((self.sealed.len() as u32, index)));
        sealed.chain(open)
    }

    /// Make the tools pushed since the last seal one listing: the moved parts go after the definitions. The
    /// listing is copied into allocations of its exact size (the texts grew by doubling).
    pub(super) fn seal(&mut self) {
        let (definitions, appended) = (std::mem::take(&mut self.text), std::mem::take(&mut self.appended));
        let base = definitions.len();
        let mut text = String::with_capacity(base + appended.len());
        text.push_str(&definitions);
        text.push_str(&appended);
        drop((definitions, appended));
        let mut tools = std::mem::take(&mut self.tools);
        for (index, which) in self.moved.drain(..) {
            if let Some(entry) = tools.get_mut(index as usize) {
                let part = if which == Part::Name { &mut entry.name } else { &mut entry.description };
                *part = span(base + part.start as usize, part.len as usize);
            }
        }
        let tools: Box<[Entry]> = tools.as_slice().into();
        self.sealed.push(Listing { text: text.into_boxed_str(), tools });
    }

    /// Every tool pushed, in order, as handles to one listing: an identical listing already held (another
    /// instance of the same server) is shared instead of made again.
    pub fn finish(mut self) -> Vec<ToolDef> {
        if !self.tools.is_empty() {
            self.seal();
        }
        let count = self.sealed.iter().map(|listing| listing.tools.len()).sum();
        let mut handles = Vec::with_capacity(count);
        for listing in self.sealed {
            let tools = listing.tools.len();
            let listing = intern(listing);
            handles.extend((0..tools).map(|index| ToolDef { listing: listing.clone(), index: index as u32 }));
        }
        handles
    }
}

impl Listing {
    fn part(&self, span: Span) -> &str {
        self.text.get(span.range()).unwrap_or_default()
    }

    /// Each tool's content hash and definition text, in order.
    fn definitions(&self) -> impl ExactSizeIterator<Item = (&[u8; 32], &str)> {
        self.tools.iter().map(|entry| (&entry.content_hash, self.part(entry.definition)))
    }

    /// The same definitions in the same order (hashes first, the texts to be sure).
    pub(super) fn same_listing(&self, other: &Listing) -> bool {
        self.tools.len() == other.tools.len() && self.definitions().zip(other.definitions()).all(|(a, b)| a == b)
    }
}

/// A span of `len` bytes at `start`. `ListingBuilder::finish` keeps a listing's text under 4 GiB unless one tool is
/// larger (no transport delivers one: a stdio line is capped at 16 MiB); such a tool would read as empty.
fn span(start: usize, len: usize) -> Span {
    Span { start: u32::try_from(start).unwrap_or(u32::MAX), len: u32::try_from(len).unwrap_or(0) }
}

impl ToolDef {
    /// Normalise one `tools/list` entry (see [`PreparedTool::new`]); `None` when it has no string name.
    pub fn from_listing(raw: &Value) -> Option<Self> {
        Self::listing([raw.clone()]).pop()
    }

    /// The usable entries of a listing, in order, held as one listing; entries that cannot be a tool are
    /// skipped (discovery, which warns about them, uses a [`ListingBuilder`]).
    pub fn listing(entries: impl IntoIterator<Item = Value>) -> Vec<Self> {
        let mut builder = ListingBuilder::default();
        entries.into_iter().filter_map(|raw| PreparedTool::new(raw).ok()).for_each(|tool| builder.push(tool));
        builder.finish()
    }

    /// Whether two handles hold the very same definition (not only an equal one).
    pub fn shares_body(&self, other: &ToolDef) -> bool {
        Arc::ptr_eq(&self.listing, &other.listing) && self.index == other.index
    }

    fn entry(&self) -> &Entry {
        self.listing.tools.get(self.index as usize).unwrap_or(&NO_ENTRY)
    }

    fn part(&self, span: Span) -> &str {
        self.listing.part(span)
    }

    pub fn name(&self) -> &str {
        self.part(self.entry().name)
    }

    /// The description (`""` when the server gave none).
    pub fn description(&self) -> &str {
        self.part(self.entry().description)
    }

    /// SHA-256 of the definition's JSON text, as 64 hex digits: tells whether a tool changed between discoveries.
    pub fn content_hash(&self) -> String {
        hex::encode(self.entry().content_hash)
    }

    /// [`content_hash`](Self::content_hash) as bytes.
    pub fn content_hash_bytes(&self) -> &[u8; 32] {
        &self.entry().content_hash
    }

    /// The whole definition as compact JSON text, to be written out as is.
    pub fn definition_text(&self) -> &str {
        self.part(self.entry().definition)
    }

    /// The whole definition, parsed.
    pub fn definition_value(&self) -> Value {
        serde_json::from_str(self.definition_text()).unwrap_or(Value::Null)
    }

    /// The definition's `_meta` object, if it has one.
    pub fn meta(&self) -> Option<Value> {
        #[derive(serde::Deserialize)]
        struct MetaOnly {
            #[serde(rename = "_meta")]
            meta: Option<Value>,
        }
        if !self.entry().has_meta {
            return None;
        }
        serde_json::from_str::<MetaOnly>(self.definition_text()).ok().and_then(|d| d.meta).filter(Value::is_object)
    }

    /// The tool's input schema as it is written in the definition, not parsed (`None` only for a definition
    /// that is not an object, which a listing never holds).
    pub fn input_schema_text(&self) -> Option<&RawValue> {
        #[derive(serde::Deserialize)]
        struct SchemaText<'a> {
            #[serde(rename = "inputSchema", borrow)]
            input_schema: Option<&'a RawValue>,
        }
        serde_json::from_str::<SchemaText>(self.definition_text()).ok().and_then(|d| d.input_schema)
    }

    /// The tool's input schema (`{}` when the server gave none), parsed from the definition alone.
    pub fn input_schema(&self) -> Value {
        #[derive(serde::Deserialize)]
        struct SchemaOnly {
            #[serde(rename = "inputSchema")]
            input_schema: Option<Value>,
        }
        serde_json::from_str::<SchemaOnly>(self.definition_text())
            .ok()
            .and_then(|d| d.input_schema)
            .unwrap_or_else(|| Value::Object(Map::new()))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn listings_are_normalised() {
        let tool = ToolDef::from_listing(&json!({"name": "t"})).unwrap();
        assert_eq!(tool.description(), "");
        assert_eq!(tool.input_schema(), json!({}));
        assert_eq!(tool.definition_value(), json!({"name": "t", "description": "", "inputSchema": {}}));
        assert_eq!(tool.definition_text(), r#"{"name":"t","description":"","inputSchema":{}}"#);
        assert!(ToolDef::from_listing(&json!({"description": "no name"})).is_none());
        // An entry that cannot be a tool comes back whole, for the warning that shows it.
        let unusable =
            [json!({"name": 7, "description": "numeric name"}), json!({"name": ""}), json!(["t"]), json!("t")];
        for unusable in unusable.into_iter().chain([Value::Null]) {
            assert_eq!(PreparedTool::new(unusable.clone()).err(), Some(unusable));
        }
        let a = ToolDef::from_listing(&json!({"name": "t", "description": "x"})).unwrap();
        assert_ne!(a.content_hash(), tool.content_hash());
    }

    #[test]
    fn a_definition_kept_as_text_reads_back_as_the_server_wrote_it() {
        // Key order, floats, integers beyond f64, escapes and non-ASCII text all survive the compact text.
        let listed = json!({
            "name": "t",
            "title": "Tëst \"quoted\"\n",
            "inputSchema": {
                "type": "object",
                "properties": {"z": {"type": "number", "minimum": 0.1, "maximum": 1.0e300}, "a": {"default": 18446744073709551615u64}},
                "required": ["z"]
            },
            "annotations": {"readOnlyHint": true},
            "_meta": {"ui": {"resourceUri": "ui://t"}}
        });
        let tool = ToolDef::from_listing(&listed).unwrap();
        let mut expected = listed.clone();
        expected["description"] = json!("");
        assert_eq!(tool.definition_value(), expected);
        assert_eq!(tool.input_schema(), listed["inputSchema"]);
        let keys: Vec<String> = tool.input_schema()["properties"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["z", "a"], "the server's key order is kept");
        assert_eq!(tool.meta(), Some(listed["_meta"].clone()));
        // The hash is over the same text the store keeps and a listing writes.
        assert_eq!(tool.content_hash(), hex::encode(Sha256::digest(tool.definition_text().as_bytes())));
        assert_eq!(ToolDef::from_listing(&tool.definition_value()).unwrap(), tool);
    }
    /// A listing that outgrows one text is held as several; every tool still reads back whole, its escaped
    /// parts too, and a name is known as taken whichever of them holds it.
    #[test]
    fn a_listing_larger_than_one_text_is_held_as_several() {
        let entries: Vec<Value> = (0..40)
            .map(|n| json!({"name": format!("tool_{n}"), "description": format!("Line {n}\n\"quoted\""), "inputSchema": {}}))
            .collect();
        let mut builder = ListingBuilder { max_text: 300, ..Default::default() };
        for entry in &entries {
            builder.push_new(PreparedTool::new(entry.clone()).expect("named")).expect("a new name");
        }
        let again = PreparedTool::new(json!({"name": "tool_0"})).expect("named");
        assert!(builder.push_new(again).is_err(), "a name in a sealed listing is taken");
        let last = PreparedTool::new(json!({"name": "tool_39"})).expect("named");
        assert!(builder.push_new(last).is_err(), "a name in the listing being read is taken");
        let tools = builder.finish();
        assert_eq!(tools.len(), 40);
        assert!(!tools[0].listing.tools.is_empty() && !Arc::ptr_eq(&tools[0].listing, &tools[39].listing));
        for (tool, entry) in tools.iter().zip(&entries) {
            assert_eq!(tool.name(), entry["name"]);
            assert_eq!(tool.description(), entry["description"]);
            assert_eq!(tool.definition_value(), *entry);
        }
    }

    /// A name is refused only when the very same name was pushed: found through its hash, read back from the
    /// text (escaped names too), and a different name under the same hash is told apart by reading every name.
    #[test]
    fn only_the_same_name_is_refused() {
        let tool = |name: &str| PreparedTool::new(json!({"name": name})).expect("named");
        let mut builder = ListingBuilder::default();
        for name in ["a", "quo\"ted", "b"] {
            builder.push_new(tool(name)).expect("new");
        }
        for name in ["quo\"ted", "a"] {
            assert!(builder.push_new(tool(name)).is_err(), "{name}");
        }
        // "quo" made to collide with "a": its hash now leads to "a", and it is still new.
        let colliding = builder.hasher.hash_one("quo");
        builder.names.insert(colliding, (0, 0));
        assert!(builder.push_new(tool("quo")).is_ok(), "a colliding name that was not pushed");
        let colliding = builder.hasher.hash_one("b");
        builder.names.insert(colliding, (0, 0));
        assert!(builder.push_new(tool("b")).is_err(), "a colliding name that was pushed");
        assert_eq!(builder.finish().iter().map(ToolDef::name).collect::<Vec<_>>(), ["a", "quo\"ted", "b", "quo"]);
    }
    /// Names and descriptions are read from the definition's text where they appear in it as they are, and
    /// kept beside it where JSON escapes them; either way they read back as the server wrote them.
    #[test]
    fn names_and_descriptions_read_back_whether_or_not_json_escapes_them() {
        let tools = ToolDef::listing(vec![
            json!({"name": "plain", "description": "Read a file", "inputSchema": {"type": "object"}}),
            json!({"name": "quo\"ted", "description": "Line one\nline \"two\" \\ \u{1}", "inputSchema": {}}),
            json!({"name": "t", "description": "t"}),
            json!({"name": "ünï", "description": ""}),
            json!({"description": "no name, skipped"}),
        ]);
        let read: Vec<(&str, &str)> = tools.iter().map(|t| (t.name(), t.description())).collect();
        assert_eq!(
            read,
            [("plain", "Read a file"), ("quo\"ted", "Line one\nline \"two\" \\ \u{1}"), ("t", "t"), ("ünï", ""),]
        );
        for tool in &tools {
            let definition = tool.definition_value();
            assert_eq!(definition["name"], tool.name());
            assert_eq!(definition["description"], tool.description());
            assert_eq!(ToolDef::from_listing(&definition).as_ref(), Some(tool));
        }
        assert_eq!(tools[0].meta(), None);
    }
}
