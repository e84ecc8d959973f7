//! A result on its way from a server to a client.
//!
//! A stdio server's response is kept as the JSON text it wrote ([`Payload::Text`]): the satellite reads only
//! three things of a result on the way (whether it is an `isError` tool result, whether it has a `content`
//! array, its 2026-07-28 `resultType`), found by one scan that allocates nothing ([`Shape`]), and writes the
//! text on to the client as it came. Parsing a result into a `Value` tree and writing that tree out again was
//! most of what relaying a result cost, and the cost grows with the result (a file, a web page). Whoever must
//! look inside a result (the request log, a handshake-era client's reshaping) parses it then, once.
//!
//! Results the satellite makes itself, or reads from a transport that parsed them already, are
//! [`Payload::Value`].

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// A JSON-RPC result: as the server wrote it, or as a value.
#[derive(Debug, Clone)]
pub enum Payload {
    /// The server's own JSON text, with what the satellite reads of it.
    Text {
        text: Box<RawValue>,
        shape: Shape,
    },
    Value(Value),
}

/// The 2026-07-28 `resultType` of a result, when it has one as a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultType {
    Complete,
    InputRequired,
    /// A `CreateTaskResult` (the Tasks extension): the request became a task, fetched with `tasks/get`.
    Task,
    Other,
}

impl ResultType {
    fn of(text: &str) -> ResultType {
        match text {
            "complete" => ResultType::Complete,
            "input_required" => ResultType::InputRequired,
            "task" => ResultType::Task,
            _ => ResultType::Other,
        }
    }
}

/// What the satellite reads of a result on the way, read the way `Value::get` reads it (a member that is
/// not of the expected type counts as absent; of repeated members the last counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    pub result_type: Option<ResultType>,
    /// `content` is an array (a `CallToolResult` as the spec shapes it).
    pub content_is_array: bool,
    /// `isError` is `true`.
    pub is_error: bool,
    /// `task` is an object: a `CreateTaskResult`, the answer to a task-augmented request (2025-11-25).
    pub is_task: bool,
}

impl Shape {
    pub fn of_value(value: &Value) -> Shape {
        Shape {
            result_type: value.get("resultType").and_then(Value::as_str).map(ResultType::of),
            content_is_array: value.get("content").is_some_and(Value::is_array),
            is_error: value.get("isError").and_then(Value::as_bool) == Some(true),
            is_task: value.get("task").is_some_and(Value::is_object),
        }
    }

    /// The shape of a result's JSON text. The text is valid JSON (it was read as a `RawValue`).
    fn of_text(text: &RawValue) -> Shape {
        if !text.get().starts_with('{') {
            return Shape::default();
        }
        // Members are skipped as text, which has no nesting limit: this reads every valid object.
        serde_json::from_str(text.get()).unwrap_or_default()
    }
}

/// Results at least this long are moved out of the line they came in ([`Payload::moved_from`]) rather than copied.
pub const MOVED_AT_BYTES: usize = 64 * 1024;

impl Payload {
    /// The result at `range` of `line` (a response a server wrote, whose result was read there as JSON), in the
    /// line's own allocation: the result is moved to its front and the rest cut off, so that an answer of
    /// megabytes is never held twice. Checking the text again is the only way to make a `RawValue` of a `String`
    /// without copying it, and costs a scan of it: a result under [`MOVED_AT_BYTES`] is copied instead.
    pub fn moved_from(mut line: String, range: std::ops::Range<usize>) -> Result<Payload, serde_json::Error> {
        line.truncate(range.end);
        line.drain(..range.start);
        RawValue::from_string(line).map(Payload::text)
    }

    /// A result's JSON text, as a server wrote it.
    pub fn text(text: Box<RawValue>) -> Payload {
        let shape = Shape::of_text(&text);
        Payload::Text { text, shape }
    }

    pub fn shape(&self) -> Shape {
        match self {
            Payload::Text { shape, .. } => *shape,
            Payload::Value(value) => Shape::of_value(value),
        }
    }

    /// The result as a value, parsed from the text when it is text. A nesting deeper than the parser's limit
    /// (128) fails, which a result passed on untouched never needs, and so does a lone UTF-16 surrogate escape
    /// (see [`Payload::into_lenient_value`]).
    pub fn into_value(self) -> Result<Value, serde_json::Error> {
        match self {
            Payload::Text { text, .. } => serde_json::from_str(text.get()),
            Payload::Value(value) => Ok(value),
        }
    }

    /// [`Payload::into_value`], except that a lone UTF-16 surrogate escape (what a JavaScript server writes for a
    /// string cut inside an emoji), which a Rust string cannot hold, is read as U+FFFD: for an answer the satellite
    /// must build as a value, where a result with one character replaced is closer to what the client would have
    /// got than none. Not for what the satellite reads itself (a cursor changed so would be a different cursor).
    pub fn into_lenient_value(self) -> Result<Value, serde_json::Error> {
        match self {
            Payload::Text { text, .. } => parse_text(text.get()),
            Payload::Value(value) => Ok(value),
        }
    }

    /// A copy of the result as a value (the request log's).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        match self {
            Payload::Text { text, .. } => serde_json::from_str(text.get()),
            Payload::Value(value) => Ok(value.clone()),
        }
    }

    /// The result as a value, or null when it is too deeply nested to parse (logged); for the paths that
    /// must read or change a result (2026-07-28 answers, streamed responses).
    pub fn into_value_or_null(self) -> Value {
        self.into_value().unwrap_or_else(|err| {
            tracing::warn!(error = %err, "a result could not be read as JSON");
            Value::Null
        })
    }

    /// The size of the result as JSON text.
    pub fn json_len(&self) -> usize {
        match self {
            Payload::Text { text, .. } => text.get().len(),
            Payload::Value(value) => json_len(value),
        }
    }
}

/// Parse a result's text; on failure, once more with its lone surrogate escapes replaced (see
/// [`Payload::into_value`]), and the first error when that does not help.
fn parse_text(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str(text).or_else(|err| match without_lone_surrogates(text) {
        Some(repaired) => serde_json::from_str(&repaired).map_err(|_| err),
        None => Err(err),
    })
}

/// `text` (valid JSON but for its `\u` escapes) with every escape of an unpaired UTF-16 surrogate made `\ufffd`;
/// `None` when it has none. In valid JSON a backslash only ever starts an escape inside a string, so the escapes
/// are found without tracking strings.
fn without_lone_surrogates(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let unit = |at: usize| -> Option<u16> {
        let escape = bytes.get(at..at + 6)?;
        if escape[0] != b'\\' || escape[1] != b'u' {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&escape[2..]).ok()?, 16).ok()
    };
    let is_high = |u: u16| (0xD800..0xDC00).contains(&u);
    let is_low = |u: u16| (0xDC00..0xE000).contains(&u);
    let mut out: Option<String> = None;
    let (mut copied, mut at) = (0, 0);
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        let Some(first) = unit(at) else {
            at += 2;
            continue;
        };
        if is_high(first) && unit(at + 6).is_some_and(is_low) {
            at += 12;
            continue;
        }
        if is_high(first) || is_low(first) {
            let repaired = out.get_or_insert_with(|| String::with_capacity(text.len()));
            repaired.push_str(&text[copied..at]);
            repaired.push_str("\\ufffd");
            copied = at + 6;
        }
        at += 6;
    }
    let mut repaired = out?;
    repaired.push_str(&text[copied..]);
    Some(repaired)
}

impl From<Value> for Payload {
    fn from(value: Value) -> Payload {
        Payload::Value(value)
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Payload::Text { text, .. } => text.serialize(serializer),
            Payload::Value(value) => value.serialize(serializer),
        }
    }
}

/// The size of a value as compact JSON text, counted without writing it anywhere.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

/// The members of a result object the shape needs.
enum Key {
    ResultType,
    Content,
    IsError,
    Task,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "resultType" => Key::ResultType,
                    "content" => Key::Content,
                    "isError" => Key::IsError,
                    "task" => Key::Task,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Shape, D::Error> {
        struct ShapeVisitor;
        impl<'de> Visitor<'de> for ShapeVisitor {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a result object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
                let mut shape = Shape::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::ResultType => {
                            let value: &RawValue = map.next_value()?;
                            shape.result_type = match value.get() {
                                "\"complete\"" => Some(ResultType::Complete),
                                "\"input_required\"" => Some(ResultType::InputRequired),
                                "\"task\"" => Some(ResultType::Task),
                                text if text.starts_with('"') => {
                                    // Escapes (`\u0063omplete`) spell the same names.
                                    serde_json::from_str::<String>(text).ok().map(|s| ResultType::of(&s))
                                }
                                _ => None,
                            };
                        }
                        Key::Content => {
                            let value: &RawValue = map.next_value()?;
                            shape.content_is_array = value.get().starts_with('[');
                        }
                        Key::IsError => {
                            let value: &RawValue = map.next_value()?;
                            shape.is_error = value.get() == "true";
                        }
                        Key::Task => {
                            let value: &RawValue = map.next_value()?;
                            shape.is_task = value.get().starts_with('{');
                        }
                        Key::Other => {
                            // Skipped as text: no allocation, and no nesting limit.
                            map.next_value::<&RawValue>()?;
                        }
                    }
                }
                Ok(shape)
            }
        }
        deserializer.deserialize_map(ShapeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("valid JSON")
    }

    /// A result moved out of its line is its text exactly, with the shape read off it.
    #[test]
    fn a_result_moved_out_of_its_line_is_its_text() {
        let result = r#"{ "content" : [ {"type": "text", "text": "caf\u00e9 1.10"} ], "isError": true }"#;
        let line = format!(r#"  {{"jsonrpc": "2.0", "id": 4, "result": {result} }}"#);
        let start = line.find(result).expect("inside");
        let moved = Payload::moved_from(line, start..start + result.len()).expect("valid JSON");
        let Payload::Text { text, shape } = moved else { panic!("text") };
        assert_eq!(text.get(), result);
        assert!(shape.is_error && shape.content_is_array);
    }

    /// The scan reads a result the way `Value::get` does, on every shape a server may send.
    #[test]
    fn the_shape_of_text_is_the_shape_of_its_value() {
        let cases = [
            r#"{"content":[{"type":"text","text":"hi"}]}"#,
            r#"{"content":[],"isError":true}"#,
            r#"{"content":"not an array","isError":"true"}"#,
            r#"{ "isError" : true , "content" : [ ] }"#,
            r#"{"resultType":"complete","content":[]}"#,
            r#"{"resultType":"input_required","inputRequests":{}}"#,
            r#"{"resultType":"\u0063omplete"}"#,
            r#"{"resultType":"something new"}"#,
            r#"{"resultType":7,"isError":1}"#,
            r#"{"isError":true,"isError":false}"#,
            r#"{"content":{"a":[1,2,{"b":"]"}]},"content":[1]}"#,
            r#"{"nested":{"isError":true,"content":[]}}"#,
            r#"{"task":{"taskId":"t-1","status":"working"}}"#,
            r#"{"task":"not an object"}"#,
            r#"{"\u0074ask":{}}"#,
            r#"{"a\"b":"content","text":"\"isError\":true"}"#,
            r#"{}"#,
            r#"[]"#,
            r#"null"#,
            r#""text""#,
            r#"42"#,
        ];
        for case in cases {
            let value: Value = serde_json::from_str(case).expect("valid JSON");
            assert_eq!(Payload::text(raw(case)).shape(), Shape::of_value(&value), "{case}");
        }
    }

    #[test]
    fn text_goes_out_as_it_came_and_reads_as_its_value() {
        let text = r#"{"content":[{"type":"text","text":"a\u00e9b"}],"z":1,"a":{"y":2.50}}"#;
        let payload = Payload::text(raw(text));
        assert_eq!(serde_json::to_string(&payload).expect("serializes"), text);
        assert_eq!(payload.json_len(), text.len());
        let value = payload.into_value().expect("parses");
        assert_eq!(value, serde_json::from_str::<Value>(text).expect("valid JSON"));
        // Member order is kept when read as a value, too.
        let keys: Vec<&String> = value.as_object().expect("an object").keys().collect();
        assert_eq!(keys, ["content", "z", "a"]);
    }

    /// A JavaScript server's string cut inside an emoji (a lone surrogate escape) cannot be a Rust string: read as
    /// a value it holds U+FFFD there, and the rest as written. Before, the whole result read as nothing (a streamed
    /// or 2026-07-28 answer carried `"result": null`).
    #[test]
    fn a_lone_surrogate_escape_reads_as_the_replacement_character() {
        for (text, expected) in [
            (r#"{"t":"ab\ud83d"}"#, "ab\u{fffd}"),
            (r#"{"t":"\ude00 and \ud83d\ude00"}"#, "\u{fffd} and \u{1f600}"),
            (r#"{"t":"\\ud83d \ud83d\u0041"}"#, "\\ud83d \u{fffd}A"),
        ] {
            let payload = Payload::text(raw(text));
            assert_eq!(serde_json::to_string(&payload).expect("serializes"), text, "passed on untouched");
            let value = payload.into_lenient_value().unwrap_or_else(|err| panic!("{text}: {err}"));
            assert_eq!(value["t"], expected, "{text}");
        }
        assert_eq!(without_lone_surrogates(r#"{"t":"\ud83d\ude00 \\ud800"}"#), None, "nothing to repair");
    }

    /// A result nested deeper than the parser goes is passed on untouched; only reading it fails, with an error.
    #[test]
    fn a_result_nested_too_deep_to_parse_still_passes_as_text() {
        let deep = format!("{{\"content\":[],\"x\":{}{}}}", "[".repeat(300), "]".repeat(300));
        let text: Box<RawValue> = serde_json::from_str(&deep).expect("the raw reader has no depth limit");
        let payload = Payload::text(text);
        assert!(payload.shape().content_is_array);
        assert_eq!(serde_json::to_string(&payload).expect("serializes"), deep);
        assert!(payload.into_value().is_err());
    }
}
