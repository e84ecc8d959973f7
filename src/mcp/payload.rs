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
    Other,
}

impl ResultType {
    fn of(text: &str) -> ResultType {
        match text {
            "complete" => ResultType::Complete,
            "input_required" => ResultType::InputRequired,
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

impl Payload {
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

    /// The result as a value, parsed from the text when it is text. Only a nesting deeper than the parser's
    /// limit (128) fails, which a result passed on untouched never needs.
    pub fn into_value(self) -> Result<Value, serde_json::Error> {
        match self {
            Payload::Text { text, .. } => serde_json::from_str(text.get()),
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
