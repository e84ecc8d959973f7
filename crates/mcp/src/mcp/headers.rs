//! The 2026-07-28 HTTP headers that mirror a request's body (Streamable HTTP, "Standard Request Headers" and
//! "Custom Headers from Tool Parameters"): `Mcp-Method`, `Mcp-Name`, and the `Mcp-Param-{Name}` headers a tool asks
//! for by marking properties of its `inputSchema` with `x-mcp-header`.
//!
//! Both ends of the satellite use this: as a client of a 2026-07-28 HTTP server it mirrors a call's arguments into
//! headers (`ParamHeaders::mirror`) and drops the tools whose annotations are invalid, as a client must; as a
//! server it checks that what a client's headers say agrees with the body it sends (`check_request`,
//! `ParamHeaders::check`), so nothing in front of the satellite can be told one thing while the satellite does
//! another. Data only: no I/O.

use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

/// The schema keyword naming a property's header (the catalog indexes the tools whose schemas mention it).
pub use crate::model::catalog::X_MCP_HEADER;
/// The prefix of a parameter header's name (header names are compared case-insensitively; this is the lower case
/// `http` stores them in).
pub const PARAM_PREFIX: &str = "mcp-param-";
pub const METHOD: &str = "mcp-method";
pub const NAME: &str = "mcp-name";

const SENTINEL_START: &str = "=?base64?";
const SENTINEL_END: &str = "?=";

/// The `params` key `Mcp-Name` mirrors for `method`, if it has one.
pub fn name_key(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        // The Tasks extension (SEP-2663): a task request names its task.
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}

/// A header value for `value`: as is when it is visible ASCII or spaces without space at either end, and not
/// itself shaped like the sentinel; else `=?base64?…?=` of its UTF-8.
pub fn encode_value(value: &str) -> String {
    let plain = value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && value.trim_matches(' ') == value
        && !(value.starts_with(SENTINEL_START) && value.ends_with(SENTINEL_END) && value.len() >= 11);
    if plain {
        value.to_owned()
    } else {
        use base64::Engine;
        format!("{SENTINEL_START}{}{SENTINEL_END}", base64::engine::general_purpose::STANDARD.encode(value))
    }
}

/// What a header value stands for: its text, or the decoded sentinel. `None` for bytes no client may send (outside
/// visible ASCII, space and tab) or a sentinel that is not canonical base64 of UTF-8.
pub fn decode_value(raw: &[u8]) -> Option<String> {
    if !raw.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    let Some(inner) =
        text.strip_prefix(SENTINEL_START).and_then(|rest| rest.strip_suffix(SENTINEL_END)).filter(|_| text.len() >= 11)
    else {
        return Some(text.to_owned());
    };
    use base64::Engine;
    // The standard engine refuses non-canonical trailing bits and missing padding: one value, one spelling.
    let bytes = base64::engine::general_purpose::STANDARD.decode(inner).ok()?;
    String::from_utf8(bytes).ok()
}

/// One property of a tool's arguments mirrored into a header.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParamHeader {
    /// The chain of `properties` keys from the schema's root to the property.
    path: Vec<String>,
    /// `mcp-param-{token}`, lower case, as `http` names it.
    header: String,
    /// `Mcp-Param-{token}` as the schema spells it, for messages.
    shown: String,
    /// The property is typed `integer`: compared numerically (`42.0` is `42`).
    integer: bool,
}

/// The `x-mcp-header` annotations of one tool's `inputSchema`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamHeaders(Vec<ParamHeader>);

/// How deep the walk of a schema goes: a schema is a client's or a server's JSON, bounded in size but not in depth.
const MAX_SCHEMA_DEPTH: usize = 64;

/// Schema keywords whose value is one subschema, a list of them, or a map of them (JSON Schema 2020-12 and the
/// draft-07 `definitions`). Only `properties` keeps a property statically reachable; crossing any of these
/// leaves it unreachable. Data keywords (`default`, `enum`, `const`, `examples`) are never entered, and `$ref` is
/// never followed.
const ONE_SUBSCHEMA: &[&str] = &[
    "items",
    "contains",
    "unevaluatedItems",
    "additionalProperties",
    "propertyNames",
    "unevaluatedProperties",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
    "additionalItems",
];
const SUBSCHEMA_LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
const SUBSCHEMA_MAP: &[&str] = &["patternProperties", "dependentSchemas", "$defs", "definitions"];

impl ParamHeaders {
    /// The annotations of `schema`, or why they are invalid (the tool must then be left out of a listing): an
    /// annotation off the `properties` chain, not an RFC 9110 token, on a property that is not a string, an integer
    /// or a boolean, or naming a header another one names.
    pub fn of(schema: &Value) -> Result<ParamHeaders, String> {
        let mut found = Vec::new();
        let mut stack: Vec<Subschema> = vec![(Some(Vec::new()), schema, 0)];
        while let Some((path, node, depth)) = stack.pop() {
            let Value::Object(node) = node else { continue };
            if depth > MAX_SCHEMA_DEPTH {
                // Not walked further (each level would copy its path), but an annotation down there is not
                // silently dropped: the tool is refused only when there is one.
                if mentions_annotation(node) {
                    return Err(format!("{X_MCP_HEADER} nested deeper than {MAX_SCHEMA_DEPTH} levels"));
                }
                continue;
            }
            if let Some(token) = node.get(X_MCP_HEADER) {
                found.push(annotation(path.as_deref(), token, node)?);
            }
            push_subschemas(&mut stack, path.as_deref(), node, depth + 1);
        }
        refuse_shared_headers(&found)?;
        // In schema order, so the headers a call sends do not depend on the walk.
        found.reverse();
        Ok(ParamHeaders(found))
    }

    /// The annotations of a tool definition's `inputSchema` (none when it has no schema).
    pub fn of_tool(tool: &Value) -> Result<ParamHeaders, String> {
        tool.get("inputSchema").map_or_else(|| Ok(ParamHeaders::default()), ParamHeaders::of)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The headers a `tools/call` with `arguments` sends: one per annotated property with a string, integer or
    /// boolean value (absent or `null`: no header), its value encoded for a header.
    pub fn mirror(&self, arguments: Option<&Value>) -> Vec<(String, String)> {
        self.0
            .iter()
            .filter_map(|param| {
                let rendered = render(value_at(arguments, &param.path)?)?;
                Some((param.header.clone(), encode_value(&rendered)))
            })
            .collect()
    }

    /// Whether the `Mcp-Param-*` headers of a `tools/call` agree with its arguments: each annotated property with a
    /// value has its header once, decoding to that value; one without a value has none. Headers no annotation
    /// names are not looked at (an intermediary forwards and ignores them).
    pub fn check(&self, arguments: Option<&Value>, headers: &HeaderMap) -> Result<(), String> {
        for param in &self.0 {
            let mut sent = headers.get_all(param.header.as_str()).iter();
            let (first, second) = (sent.next(), sent.next());
            let shown = &param.shown;
            if second.is_some() {
                return Err(format!("{shown} header appears more than once"));
            }
            let argument = param.path.join(".");
            let value = value_at(arguments, &param.path);
            let rendered = value.and_then(render);
            match (first, rendered) {
                (None, None) => {}
                (Some(_), None) if value.is_none() => {
                    return Err(format!("{shown} header is present but the body has no {argument:?} argument"))
                }
                (Some(_), None) => {
                    return Err(format!("{shown} header does not match the body's {argument:?} argument"))
                }
                (None, Some(_)) => {
                    return Err(format!("{shown} header is missing but the body has the {argument:?} argument"))
                }
                (Some(raw), Some(rendered)) => {
                    let decoded = decode_value(raw.as_bytes())
                        .ok_or_else(|| format!("{shown} header carries characters or base64 it may not"))?;
                    let same =
                        decoded == rendered || (param.integer && value.is_some_and(|v| same_integer(&decoded, v)));
                    if !same {
                        return Err(format!("{shown} header does not match the body's {argument:?} argument"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A subschema still to walk: the chain of `properties` keys that reaches it (none once another keyword was
/// crossed), the subschema, its depth.
type Subschema<'a> = (Option<Vec<String>>, &'a Value, usize);

/// Put the subschemas of `node` (reached by `path`) on `stack`, at `depth`: its properties with their path, those
/// under any other schema keyword with none.
fn push_subschemas<'a>(
    stack: &mut Vec<Subschema<'a>>,
    path: Option<&[String]>,
    node: &'a Map<String, Value>,
    depth: usize,
) {
    for (keyword, value) in node {
        let keyword = keyword.as_str();
        if keyword == "properties" {
            if let Value::Object(properties) = value {
                for (name, sub) in properties {
                    let path = path.map(|p| p.iter().cloned().chain([name.clone()]).collect());
                    stack.push((path, sub, depth));
                }
            }
        } else if ONE_SUBSCHEMA.contains(&keyword) {
            stack.push((None, value, depth));
        } else if SUBSCHEMA_LIST.contains(&keyword) {
            if let Value::Array(items) = value {
                stack.extend(items.iter().map(|sub| (None, sub, depth)));
            }
        } else if SUBSCHEMA_MAP.contains(&keyword) {
            if let Value::Object(map) = value {
                stack.extend(map.values().map(|sub| (None, sub, depth)));
            }
        }
    }
}

/// Refuse two annotations that name the same header.
fn refuse_shared_headers(found: &[ParamHeader]) -> Result<(), String> {
    for (i, one) in found.iter().enumerate() {
        if let Some(other) = found[..i].iter().find(|other| other.header == one.header) {
            return Err(format!(
                "{X_MCP_HEADER} on property {:?} names the header property {:?} names",
                one.path.join("."),
                other.path.join(".")
            ));
        }
    }
    Ok(())
}

fn annotation(path: Option<&[String]>, token: &Value, node: &Map<String, Value>) -> Result<ParamHeader, String> {
    let path = match path {
        Some(path) if !path.is_empty() => path,
        _ => return Err(format!("{X_MCP_HEADER} stands where no chain of `properties` alone reaches")),
    };
    let at = path.join(".");
    let Some(token) = token.as_str() else {
        return Err(format!("property {at:?}: {X_MCP_HEADER} must be a string"));
    };
    if token.is_empty() || !token.bytes().all(is_tchar) {
        return Err(format!("property {at:?}: {X_MCP_HEADER} {token:?} is not an HTTP header name token"));
    }
    let integer = match node.get("type").and_then(Value::as_str) {
        Some("integer") => true,
        Some("string" | "boolean") => false,
        other => {
            return Err(format!(
                "property {at:?}: {X_MCP_HEADER} is allowed on string, integer and boolean properties only, not {}",
                other.map_or_else(|| "one without a single type".to_owned(), |t| format!("{t:?}"))
            ))
        }
    };
    Ok(ParamHeader {
        path: path.to_vec(),
        header: format!("{PARAM_PREFIX}{}", token.to_ascii_lowercase()),
        shown: format!("Mcp-Param-{token}"),
        integer,
    })
}

/// Whether any object under `node` has an `x-mcp-header` key (walked with a stack: no recursion to overflow).
/// Data keywords (`default`, `enum`, `const`, `examples`) are not looked into: what is there is a value, not a schema.
fn mentions_annotation(node: &Map<String, Value>) -> bool {
    fn schema_values(map: &Map<String, Value>) -> impl Iterator<Item = &Value> {
        const DATA: [&str; 4] = ["default", "enum", "const", "examples"];
        map.iter().filter(|(key, _)| !DATA.contains(&key.as_str())).map(|(_, value)| value)
    }
    if node.contains_key(X_MCP_HEADER) {
        return true;
    }
    let mut stack: Vec<&Value> = schema_values(node).collect();
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) if map.contains_key(X_MCP_HEADER) => return true,
            Value::Object(map) => stack.extend(schema_values(map)),
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    false
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn value_at<'a>(arguments: Option<&'a Value>, path: &[String]) -> Option<&'a Value> {
    let mut node = arguments?;
    for key in path {
        node = node.as_object()?.get(key)?;
    }
    (!node.is_null()).then_some(node)
}

/// A value as its header carries it: strings as they are, booleans lower case, numbers as JSON writes them. Arrays
/// and objects have no header.
fn render(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `decoded` (a plain decimal, maybe with a fraction of zeros) is the integer `value` (`42`, `42.0`).
fn same_integer(decoded: &str, value: &Value) -> bool {
    let (whole, fraction) = decoded.split_once('.').unwrap_or((decoded, ""));
    if !fraction.bytes().all(|b| b == b'0') || (decoded.contains('.') && fraction.is_empty()) {
        return false;
    }
    let digits = whole.strip_prefix('-').unwrap_or(whole);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let Ok(header) = whole.parse::<i128>() else { return false };
    match value {
        Value::Number(n) => {
            n.as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e38).map(|f| f as i128))
                == Some(header)
        }
        _ => false,
    }
}

/// Whether the standard headers of a 2026-07-28 request agree with its body: `Mcp-Method` naming its method, and
/// for `tools/call`, `prompts/get` and `resources/read` `Mcp-Name` naming its tool, prompt or resource (decoded), each
/// sent once. With `required`, each must be there; without (a batch, which one set of headers cannot describe),
/// only those sent are compared. `MCP-Protocol-Version` is the envelope check's. `Err` says what disagrees.
pub fn check_request(headers: &HeaderMap, method: &str, params: Option<&Value>, required: bool) -> Result<(), String> {
    let one = |name: &str| -> Result<Option<&[u8]>, String> {
        let mut all = headers.get_all(name).iter();
        match (all.next(), all.next()) {
            (_, Some(_)) => Err(format!("{} header appears more than once", shown_standard(name))),
            (first, None) => Ok(first.map(|v| v.as_bytes())),
        }
    };
    match one(METHOD)? {
        None if required => return Err("Mcp-Method header is missing".into()),
        Some(sent) if sent != method.as_bytes() => {
            return Err(format!(
                "Mcp-Method header {:?} does not match the body's method {method:?}",
                String::from_utf8_lossy(sent)
            ))
        }
        _ => {}
    }
    let sent_name = one(NAME)?;
    let Some(key) = name_key(method) else { return Ok(()) };
    let Some(body) = params.and_then(|p| p.get(key)).and_then(Value::as_str) else {
        // No name in the body: the method's own validation tells the client what is missing.
        return Ok(());
    };
    let sent = match sent_name {
        Some(sent) => sent,
        None if required => return Err(format!("Mcp-Name header is missing (the body's {key} is {body:?})")),
        None => return Ok(()),
    };
    match decode_value(sent) {
        Some(decoded) if decoded == body => Ok(()),
        Some(decoded) => Err(format!("Mcp-Name header {decoded:?} does not match the body's {key} {body:?}")),
        None => Err("Mcp-Name header carries characters or base64 it may not".into()),
    }
}

fn shown_standard(lower: &str) -> &'static str {
    if lower == METHOD {
        "Mcp-Method"
    } else {
        "Mcp-Name"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;
    use serde_json::json;

    /// The spec's table of encodings, and what comes back from each.
    #[test]
    fn values_are_encoded_as_the_specification_shows() {
        for (value, encoded) in [
            ("us-west1", "us-west1"),
            ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
            (" padded ", "=?base64?IHBhZGRlZCA=?="),
            ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
            ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
            ("", ""),
        ] {
            assert_eq!(encode_value(value), encoded, "{value:?}");
            assert_eq!(decode_value(encoded.as_bytes()).as_deref(), Some(value), "{encoded:?}");
        }
        // A sentinel that is not canonical base64 of UTF-8, and bytes no header may carry, stand for nothing.
        for bad in
            [&b"=?base64?not base64?="[..], b"=?base64?SGVsbG9=?=", b"=?base64?/w==?=", b"caf\xc3\xa9", b"a\x01b"]
        {
            assert_eq!(decode_value(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(decode_value(b"a\tb").as_deref(), Some("a\tb"));
    }

    #[test]
    fn annotations_are_read_along_properties_only() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "query": {"type": "string"},
            "options": {"type": "object", "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry-Run"}}},
            "limit": {"type": "integer", "x-mcp-header": "Limit"},
        }});
        let headers = ParamHeaders::of(&schema).unwrap();
        let mirrored =
            headers.mirror(Some(&json!({"region": "eu 1 ", "query": "q", "options": {"dry": true}, "limit": 7})));
        let mut mirrored: Vec<_> = mirrored.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        mirrored.sort();
        assert_eq!(
            mirrored,
            [("mcp-param-dry-run", "true"), ("mcp-param-limit", "7"), ("mcp-param-region", "=?base64?ZXUgMSA=?=")]
        );
        // Absent, null, or not a scalar: no header.
        assert!(headers.mirror(Some(&json!({"region": null, "options": "x", "limit": [1]}))).is_empty());
        assert!(headers.mirror(None).is_empty());
        assert!(ParamHeaders::of(&json!({"type": "object"})).unwrap().is_empty());
    }

    #[test]
    fn invalid_annotations_are_named() {
        let invalid = [
            json!({"properties": {"a": {"type": "number", "x-mcp-header": "A"}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": ""}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": "Bad Name"}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": 7}}}),
            json!({"properties": {"a": {"type": ["string", "null"], "x-mcp-header": "A"}}}),
            json!({"properties": {"a": {"type": "string", "x-mcp-header": "A"}, "b": {"type": "string", "x-mcp-header": "a"}}}),
            json!({"properties": {"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}}),
            json!({"anyOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]}),
            json!({"$defs": {"a": {"type": "string", "x-mcp-header": "A"}}}),
            json!({"type": "string", "x-mcp-header": "Root"}),
        ];
        for schema in invalid {
            assert!(ParamHeaders::of(&schema).is_err(), "{schema}");
        }
        // Data is not schema: an `x-mcp-header` inside `default` or `enum` is a value, not an annotation.
        let data = json!({"properties": {"a": {"type": "object", "default": {"x-mcp-header": 1}}}});
        assert!(ParamHeaders::of(&data).unwrap().is_empty());
        // Deeper than the walk goes: refused only when an annotation is down there (a deep schema without one is a
        // tool like any other).
        let nest = |leaf: Value| (0..100).fold(leaf, |deep, _| json!({"properties": {"p": deep}}));
        assert!(ParamHeaders::of(&nest(json!({"type": "string"}))).unwrap().is_empty());
        assert!(ParamHeaders::of(&nest(json!({"type": "string", "x-mcp-header": "Deep"}))).is_err());
        let data = json!({"type": "object", "default": {"x-mcp-header": "A value"}});
        assert!(ParamHeaders::of(&nest(data)).unwrap().is_empty(), "deep down too, data is not schema");
    }

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value.as_bytes()).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn parameter_headers_must_agree_with_the_arguments() {
        let schema = json!({"properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "limit": {"type": "integer", "x-mcp-header": "Limit"},
        }});
        let headers = ParamHeaders::of(&schema).unwrap();
        let args = json!({"region": "日本", "limit": 42});
        let ok =
            map(&[("Mcp-Param-Region", "=?base64?5pel5pys?="), ("mcp-param-limit", "42.0"), ("mcp-param-other", "x")]);
        assert_eq!(headers.check(Some(&args), &ok), Ok(()));
        for (pairs, args, why) in [
            (&[("mcp-param-limit", "42")][..], json!({"region": "x", "limit": 42}), "missing"),
            (
                &[("mcp-param-region", "y"), ("mcp-param-limit", "42")],
                json!({"region": "x", "limit": 42}),
                "does not match",
            ),
            (
                &[("mcp-param-region", "x"), ("mcp-param-limit", "42.5")],
                json!({"region": "x", "limit": 42}),
                "does not match",
            ),
            (&[("mcp-param-region", "x")], json!({"region": "x"}).clone(), ""),
            (&[("mcp-param-region", "x"), ("mcp-param-region", "x")], json!({"region": "x"}), "more than once"),
            (&[("mcp-param-region", "x")], json!({}), "present but"),
            (&[("mcp-param-region", "=?base64?!!?=")], json!({"region": "=?base64?!!?="}), "base64"),
        ] {
            let checked = headers.check(Some(&args), &map(pairs));
            if why.is_empty() {
                assert_eq!(checked, Ok(()), "{pairs:?}");
            } else {
                let err = checked.expect_err(why);
                assert!(err.contains(why), "{pairs:?}: {err}");
            }
        }
    }

    #[test]
    fn standard_headers_must_agree_with_the_body() {
        let params = json!({"name": "日本"});
        let named = map(&[("mcp-method", "tools/call"), ("mcp-name", "=?base64?5pel5pys?=")]);
        assert_eq!(check_request(&named, "tools/call", Some(&params), true), Ok(()));
        assert_eq!(check_request(&map(&[("mcp-method", "tools/list")]), "tools/list", None, true), Ok(()));
        // Not required (a batch): none is fine, one that disagrees is not.
        assert_eq!(check_request(&map(&[]), "tools/call", Some(&params), false), Ok(()));
        assert!(check_request(&map(&[("mcp-name", "other")]), "tools/call", Some(&params), false).is_err());
        for (pairs, method, why) in [
            (&[][..], "tools/list", "Mcp-Method header is missing"),
            (&[("mcp-method", "tools/list")], "tools/call", "does not match"),
            (&[("mcp-method", "tools/call")], "tools/call", "Mcp-Name header is missing"),
            (&[("mcp-method", "tools/call"), ("mcp-name", "other")], "tools/call", "does not match"),
            (&[("mcp-method", "tools/list"), ("mcp-method", "tools/list")], "tools/list", "more than once"),
        ] {
            let err = check_request(&map(pairs), method, Some(&params), true).expect_err(why);
            assert!(err.contains(why), "{pairs:?}: {err}");
        }
    }
}
