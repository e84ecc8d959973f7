//! Masking of secret values for logs, listings and `check-config` (SB §22).

use std::collections::BTreeMap;

use serde_json::value::{to_raw_value, RawValue};
use serde_json::Value;
use url::Url;

use crate::model::{InstanceSpec, SecretNames, Upstream};

/// What the satellite keeps and reports of a session id (events, activity, logs): a stable reference that pairs
/// a session's connect and disconnect, from which the id itself (a credential-like handle) cannot be recovered.
pub fn session_reference(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    format!("session-{:016x}", u64::from_be_bytes(first))
}

/// Keep the first 3 characters and append `*****`; values of 3 characters or fewer become `***` (SB §22 keeps 3
/// characters of a 3-character value, which shows it whole; found by the `masking` fuzz target).
pub fn mask(value: &str) -> String {
    if value.chars().count() <= 3 {
        return "***".into();
    }
    let head: String = value.chars().take(3).collect();
    format!("{head}*****")
}

/// Every secret value an instance's configuration holds, longest first (so a secret containing another is
/// masked whole): env and header values whose names are listed as secret or look secret, secret query
/// parameters, and argument values of secret-looking flags (`--api-key VALUE`, `--token=VALUE`). Values shorter
/// than 4 characters (not bytes) are left out (masking them would mangle ordinary text). The one list every sink masks with.
pub fn secret_values(spec: &InstanceSpec) -> Vec<String> {
    let listed = |names: &[String], name: &str| names.iter().any(|n| n.eq_ignore_ascii_case(name));
    let mut values: Vec<String> = Vec::new();
    match &spec.upstream {
        Upstream::Stdio { env, args, .. } => {
            for (name, value) in env {
                if listed(&spec.secrets.env, name) || looks_secret(name) {
                    values.push(value.clone());
                }
            }
            values.extend(secret_arguments(args));
        }
        Upstream::StreamableHttp { url, headers, .. } | Upstream::Sse { url, headers, .. } => {
            for (name, value) in headers {
                if listed(&spec.secrets.headers, name) || looks_secret(name) {
                    values.push(value.clone());
                }
            }
            // Each parameter as sent, one `&`-separated piece at a time: a server that echoes its request line
            // (an error page, a log it returns) shows the value percent-encoded (`sk%2BAbC%3D`), which no
            // search for the decoded value finds. Both forms are hidden.
            for piece in url.query().unwrap_or_default().split('&') {
                let Some((name, value)) = url::form_urlencoded::parse(piece.as_bytes()).next() else { continue };
                if listed(&spec.secrets.query_params, &name) || looks_secret(&name) {
                    let sent = piece.split_once('=').map_or("", |(_, sent)| sent);
                    if sent != value {
                        values.push(sent.to_owned());
                    }
                    values.push(value.into_owned());
                }
            }
        }
    }
    values.retain(|v| v.chars().count() >= MIN_HIDDEN_CHARS);
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values.dedup();
    values
}

/// The values of secret-looking flags among `args`: `--token=VALUE`, and `--api-key VALUE`.
pub fn secret_arguments(args: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for (index, arg) in args.iter().enumerate() {
        if !arg.starts_with('-') {
            continue;
        }
        match arg.split_once('=') {
            Some((name, value)) if looks_secret(name) => found.push(value.to_owned()),
            Some(_) => {}
            None if looks_secret(arg) => {
                if let Some(value) = args.get(index + 1).filter(|v| !v.starts_with('-')) {
                    found.push(value.clone());
                }
            }
            None => {}
        }
    }
    found
}

/// Values shorter than this many characters are masked whole where they stand but not hidden inside other text.
const MIN_HIDDEN_CHARS: usize = 4;

/// `text` with every occurrence of each of `values` replaced by its masked form, in one pass (leftmost, longest
/// first), so what a replacement writes is never searched again. Values under 4 characters are left alone: an
/// empty one matched everywhere and, replaced in turn, multiplied the text until memory ran out (found by the
/// `masking` fuzz target).
pub fn hide(text: &str, values: &[String]) -> String {
    // Most texts hold no secret: no search to build for them.
    if !values.iter().any(|v| v.chars().count() >= MIN_HIDDEN_CHARS && text.contains(v.as_str())) {
        return text.to_owned();
    }
    Hider::new(values).hide(text)
}

/// `value` copied with every occurrence of each of `values` masked in its strings, object keys and numbers, as
/// [`hide`] would mask its JSON text but without writing the text and reading it back (which cost two passes
/// over every tool call's arguments and answer); a string is searched only if it holds one of the values.
pub fn hide_json(value: &Value, values: &[String]) -> Value {
    let long: Vec<&str> = values.iter().map(String::as_str).filter(|v| v.chars().count() >= MIN_HIDDEN_CHARS).collect();
    if long.is_empty() {
        return value.clone();
    }
    let numeric = long.iter().any(|v| looks_numeric(v));
    let hider = std::cell::OnceCell::new();
    let hide = |text: &str| -> Option<String> {
        long.iter().any(|v| text.contains(v)).then(|| hider.get_or_init(|| Hider::new(values)).hide(text))
    };
    copy_hidden(value, numeric, &hide)
}

/// A value [`hide_json`] also looks for in numbers (it writes each number as text to search it).
fn looks_numeric(value: &str) -> bool {
    value.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
}

/// Whether JSON `text` holds none of `values` where [`hide_json`] would find one, read off the text without
/// parsing it. In a text without a backslash every string and key is written as its own characters, so a value
/// inside one is a value inside the text; numbers are searched as [`hide_json`] writes them, not as the text
/// spells them, so a value that looks numeric always sends the text to be parsed.
fn json_text_is_clear(text: &str, values: &[String]) -> bool {
    let mut long = values.iter().filter(|v| v.chars().count() >= MIN_HIDDEN_CHARS).peekable();
    long.peek().is_none() || (!text.contains('\\') && long.all(|v| !looks_numeric(v) && !text.contains(v.as_str())))
}

/// A JSON text with `values` masked as [`hide_json`] masks the value it holds, as text again: the text itself
/// when none of them can be in it, which is read off the text without parsing it. A tool call's answer is
/// logged this way: most answers hold no secret, and parsing one into a tree to copy it and write it out again
/// was most of what logging a call cost. `None` when the text had to be parsed and is nested deeper than the
/// parser reads; a text kept as it is was not read that far (the request log checks what it keeps).
pub fn hide_json_text(text: &RawValue, values: &[String]) -> Option<Box<RawValue>> {
    if json_text_is_clear(text.get(), values) {
        return Some(text.to_owned());
    }
    let value: Value = serde_json::from_str(text.get()).ok()?;
    to_raw_value(&hide_json(&value, values)).ok()
}

/// `value` with `values` masked as [`hide_json`] masks it, written as JSON text: written straight from `value`
/// (no copy of the tree) when none of them is in it. Writing a value cannot fail (its keys are strings, its
/// numbers finite); `null` stands in should it ever.
pub fn hide_json_written(value: &Value, values: &[String]) -> Box<RawValue> {
    let write = |value: &Value| to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned());
    let text = write(value);
    if json_text_is_clear(text.get(), values) {
        return text;
    }
    write(&hide_json(value, values))
}

fn copy_hidden(value: &Value, numeric: bool, hide: &dyn Fn(&str) -> Option<String>) -> Value {
    match value {
        Value::String(text) => Value::String(hide(text).unwrap_or_else(|| text.clone())),
        Value::Number(n) if numeric => hide(&n.to_string()).map_or_else(|| value.clone(), Value::String),
        Value::Array(items) => Value::Array(items.iter().map(|item| copy_hidden(item, numeric, hide)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| (hide(key).unwrap_or_else(|| key.clone()), copy_hidden(item, numeric, hide)))
                .collect(),
        ),
        Value::Number(_) | Value::Bool(_) | Value::Null => value.clone(),
    }
}

/// The search for a set of secret values, built once and used on many texts.
pub struct Hider {
    matcher: Option<aho_corasick::AhoCorasick>,
    masks: Vec<String>,
    /// Set when the values could not be searched for (too many at once): every text is masked whole.
    blind: bool,
}

impl Hider {
    pub fn new(values: &[String]) -> Hider {
        let values: Vec<&str> =
            values.iter().map(String::as_str).filter(|v| v.chars().count() >= MIN_HIDDEN_CHARS).collect();
        if values.is_empty() {
            return Hider { matcher: None, masks: Vec::new(), blind: false };
        }
        let masks = values.iter().map(|v| mask(v)).collect();
        // A handful of short values searched in short texts: the NFA builds in microseconds, where the default
        // may build a DFA first (the masking fuzz target spent most of its time there).
        let built = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .kind(Some(aho_corasick::AhoCorasickKind::NoncontiguousNFA))
            .build(&values);
        match built {
            Ok(matcher) => Hider { matcher: Some(matcher), masks, blind: false },
            Err(_) => Hider { matcher: None, masks, blind: true },
        }
    }

    pub fn hide(&self, text: &str) -> String {
        match &self.matcher {
            Some(matcher) if matcher.is_match(text) => matcher.replace_all(text, &self.masks),
            Some(_) => text.to_owned(),
            // Showing nothing of the text is the safe answer when the values cannot be searched for.
            None if self.blind => mask(text),
            None => text.to_owned(),
        }
    }
}

/// `args` as they may be shown: the values of secret-looking flags masked.
pub fn mask_arguments(args: &[String]) -> Vec<String> {
    let hidden = secret_arguments(args);
    let hider = Hider::new(&hidden);
    args.iter().map(|arg| if hidden.contains(arg) { mask(arg) } else { hider.hide(arg) }).collect()
}

/// Names that carry credentials even when no metadata says so.
pub fn looks_secret(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["token", "secret", "password", "passwd", "key", "auth", "credential", "cookie", "session"]
        .iter()
        .any(|needle| lower.contains(needle))
}

/// Mask the values of a map whose names are listed as secret or look secret.
pub fn mask_map(values: &BTreeMap<String, String>, listed: &[String]) -> BTreeMap<String, String> {
    values
        .iter()
        .map(|(k, v)| {
            let secret = looks_secret(k) || listed.iter().any(|n| n.eq_ignore_ascii_case(k));
            (k.clone(), if secret { mask(v) } else { v.clone() })
        })
        .collect()
}

/// A URL with the values of secret query parameters masked.
pub fn mask_url(url: &Url, secrets: &SecretNames) -> String {
    if url.query().is_none() {
        return url.to_string();
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| {
            let secret = looks_secret(&k) || secrets.query_params.iter().any(|n| n.eq_ignore_ascii_case(&k));
            (k.into_owned(), if secret { mask(&v) } else { v.into_owned() })
        })
        .collect();
    let mut masked = url.clone();
    masked.query_pairs_mut().clear().extend_pairs(pairs);
    masked.to_string()
}

/// How an instance's upstream may be listed (`check-config`, the debug route): command and arguments or URL,
/// environment or headers, each value masked by name (secret-looking or listed) and then by value, so a secret
/// that also sits in an unremarkable field is masked there too.
pub fn masked_upstream(spec: &InstanceSpec) -> serde_json::Value {
    let hider = Hider::new(&secret_values(spec));
    let hide_all = |map: BTreeMap<String, String>| -> BTreeMap<String, String> {
        map.into_iter().map(|(k, v)| (k, hider.hide(&v))).collect()
    };
    match &spec.upstream {
        Upstream::Stdio { command, args, env } => serde_json::json!({
            "command": hider.hide(command),
            "args": mask_arguments(args).iter().map(|arg| hider.hide(arg)).collect::<Vec<_>>(),
            "env": hide_all(mask_map(env, &spec.secrets.env)),
        }),
        Upstream::StreamableHttp { url, headers, timeout } | Upstream::Sse { url, headers, timeout } => {
            serde_json::json!({
                "url": hider.hide(&mask_url(url, &spec.secrets)),
                "headers": hide_all(mask_map(headers, &spec.secrets.headers)),
                "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_reference_is_the_first_eight_bytes_of_the_ids_sha256() {
        // sha256("s-1") starts 6a840baf5d8c3ff2 (Python's hashlib).
        assert_eq!(session_reference("s-1"), "session-6a840baf5d8c3ff2");
        assert_eq!(session_reference("s-1").len(), "session-".len() + 16);
    }

    #[test]
    fn json_is_masked_in_strings_keys_and_numbers_and_copied_unchanged_elsewhere() {
        let values = vec!["sk-live-abcdef".to_owned(), "12345678".to_owned(), "abc".to_owned()];
        let value = serde_json::json!({
            "text": "key sk-live-abcdef here",
            "sk-live-abcdef": 1,
            "nested": [{"n": 9912345678u64, "m": 7, "short": "abc", "quote": "a\"sk-live-abcdef\"b"}],
            "flag": true,
            "none": null
        });
        let hidden = hide_json(&value, &values);
        let text = hidden.to_string();
        assert!(!text.contains("sk-live-abcdef") && !text.contains("12345678"), "{text}");
        assert_eq!(hidden["text"], serde_json::json!(hide("key sk-live-abcdef here", &values)));
        assert_eq!(hidden["nested"][0]["n"], serde_json::json!(hide("9912345678", &values)));
        assert_eq!(hidden["nested"][0]["m"], serde_json::json!(7));
        assert_eq!(hidden["nested"][0]["short"], serde_json::json!("abc"), "values under 4 characters stay");
        assert_eq!(hidden["flag"], serde_json::json!(true));
        assert_eq!(hidden.as_object().map(|o| o.len()), Some(5));
        let plain = serde_json::json!({"a": ["b", 1, {"c": "d"}]});
        assert_eq!(hide_json(&plain, &values), plain);
        assert_eq!(hide_json(&value, &[]), value);
    }

    /// The text path masks what the value path masks: a secret spelled with escapes, in a key, in a number, or
    /// split by an escaped character is found, and a text that holds none comes back as it was written.
    #[test]
    fn json_text_is_masked_like_its_value_and_kept_as_written_when_clear() {
        let values = vec!["sk-live-abcdef".to_owned(), "a/b\"cdef".to_owned()];
        let masked = |text: &str| {
            let raw: Box<RawValue> = serde_json::from_str(text).unwrap();
            let hidden = hide_json_text(&raw, &values).unwrap();
            let value: Value = serde_json::from_str(text).unwrap();
            let expected = hide_json(&value, &values);
            assert_eq!(serde_json::from_str::<Value>(hidden.get()).unwrap(), expected, "{text}");
            hidden.get().to_owned()
        };
        // Clear: the very text, spacing and all, with no tree built.
        let clear = "{\"content\": [ {\"type\":\"text\", \"text\":\"sk-live\"} ], \"n\": 1e3}";
        assert_eq!(masked(clear), clear);
        for hiding in [
            r#"{"text": "key sk-live-abcdef here"}"#,
            r#"{"sk-live-abcdef": 1}"#,
            r#"{"text": "\u0073k-live-abcdef"}"#,
            r#"{"text": "sk-live-\u0061bcdef"}"#,
            r#"{"text": "a\/b\"cdef"}"#,
            r#"{"text": "a/b\"cdef"}"#,
        ] {
            let hidden = masked(hiding);
            assert!(!hidden.contains("sk-live-abcdef") && !hidden.contains("live-\\u0061"), "{hidden}");
            assert!(hidden.contains("*****"), "{hiding} was masked: {hidden}");
        }
        // Numbers are searched as the value path writes them (1e3 is 1000.0 there), so a numeric secret parses.
        let numeric = vec!["1000.0".to_owned()];
        let raw: Box<RawValue> = serde_json::from_str(r#"{"n": 1e3}"#).unwrap();
        assert_eq!(hide_json_text(&raw, &numeric).unwrap().get(), r#"{"n":"100*****"}"#);
        // No secret long enough to hide: the text whatever it holds.
        let raw: Box<RawValue> = serde_json::from_str(r#"{"t": "\u0061bc"}"#).unwrap();
        assert_eq!(hide_json_text(&raw, &["abc".to_owned()]).unwrap().get(), r#"{"t": "\u0061bc"}"#);
        let value = serde_json::json!({"text": "key sk-live-abcdef", "plain": [1, "x"]});
        let written = hide_json_written(&value, &values);
        assert_eq!(serde_json::from_str::<Value>(written.get()).unwrap(), hide_json(&value, &values));
        let plain = serde_json::json!({"plain": [1, "x"]});
        assert_eq!(hide_json_written(&plain, &values).get(), r#"{"plain":[1,"x"]}"#);
    }

    #[test]
    fn secret_flags_are_found_in_both_forms_and_masked() {
        let args: Vec<String> =
            ["server.js", "--api-key", "sk-live-123", "--token=tok-456", "--port", "8080", "--verbose"]
                .iter()
                .map(|a| a.to_string())
                .collect();
        assert_eq!(secret_arguments(&args), ["sk-live-123", "tok-456"]);
        let shown = mask_arguments(&args);
        assert_eq!(shown[2], "sk-*****");
        assert_eq!(shown[3], "--token=tok*****");
        assert_eq!(shown[5], "8080", "ordinary values stay");
        assert_eq!(hide("key sk-live-123 used", &secret_arguments(&args)), "key sk-***** used");
    }

    #[test]
    fn empty_and_overlapping_values_are_hidden_in_one_pass() {
        // `--token=` and `--api-key ""`: empty secrets. Before, each one replaced "" everywhere, again and again.
        let args: Vec<String> =
            ["--token=", "--password=", "--api-key", "", "--secret=", "run"].iter().map(|a| a.to_string()).collect();
        let shown = mask_arguments(&args);
        assert_eq!(shown.last().map(String::as_str), Some("run"));
        assert!(shown.iter().all(|arg| arg.len() < 20), "{shown:?}");
        assert_eq!(hide("nothing to hide", &["".to_owned(), "to".to_owned()]), "nothing to hide");
        // A replacement's output is not searched again: a value that looks like a mask is not masked twice.
        let values = ["abcdefgh".to_owned(), "abc*****".to_owned()];
        assert_eq!(hide("x abcdefgh y", &values), "x abc***** y");
    }

    #[test]
    fn masks_keep_three_characters() {
        assert_eq!(mask("ghp_abcdef"), "ghp*****");
        assert_eq!(mask("ab"), "***");
        assert_eq!(mask("abc"), "***", "a 3-character secret is not shown whole");
        assert_eq!(mask("sP\u{fffd}"), "***", "nor one of 3 characters in 5 bytes");
    }

    #[test]
    fn listed_and_secret_looking_names_are_masked() {
        let values = BTreeMap::from([
            ("GITHUB_TOKEN".to_owned(), "ghp_123456".to_owned()),
            ("WORKSPACE".to_owned(), "acme".to_owned()),
            ("X-Custom".to_owned(), "hidden-value".to_owned()),
        ]);
        let masked = mask_map(&values, &["x-custom".to_owned()]);
        assert_eq!(masked["GITHUB_TOKEN"], "ghp*****");
        assert_eq!(masked["WORKSPACE"], "acme");
        assert_eq!(masked["X-Custom"], "hid*****");
        let url = Url::parse("https://x/mcp?workspace=a&api_key=supersecret").unwrap();
        assert_eq!(mask_url(&url, &SecretNames::default()), "https://x/mcp?workspace=a&api_key=sup*****");
    }

    /// A secret query value that needs percent-encoding is hidden in the form it was sent too: a server that
    /// echoed its request line (`/mcp?api_key=sk%2BAbC%2FdEf%3D%3D`) put it, decodable, into the instance's status
    /// message, the debug route and the events. Before, only the decoded value was searched for.
    #[test]
    fn a_secret_query_value_is_hidden_as_sent_and_as_meant() -> Result<(), url::ParseError> {
        let mut spec = crate::model::sample_spec();
        let mut url = Url::parse("https://api.example/mcp")?;
        url.query_pairs_mut().append_pair("workspace", "a b").append_pair("Api_Key", "sk+AbC/dEf==");
        spec.upstream = Upstream::StreamableHttp { url, headers: BTreeMap::new(), timeout: std::time::Duration::ZERO };
        spec.secrets.query_params = vec!["api_key".into()];
        let values = secret_values(&spec);
        assert_eq!(values, ["sk%2BAbC%2FdEf%3D%3D", "sk+AbC/dEf=="]);
        let echoed = "http status 500: Internal error handling /mcp?workspace=a+b&Api_Key=sk%2BAbC%2FdEf%3D%3D";
        assert_eq!(
            hide(echoed, &values),
            "http status 500: Internal error handling /mcp?workspace=a+b&Api_Key=sk%*****"
        );
        assert_eq!(hide("key sk+AbC/dEf== echoed", &values), "key sk+***** echoed");
        let listed = masked_upstream(&spec);
        assert!(!listed.to_string().contains("AbC"), "{listed}");
        Ok(())
    }
}
