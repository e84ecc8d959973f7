//! Fuzz entry points: the satellite's parsers of untrusted input, each as a function of raw bytes.
//!
//! The cargo-fuzz targets in `fuzz/` call these, and `tests/fuzz_regressions.rs` replays every kept input through
//! them on the stable toolchain (the seed corpus and every crash the fuzzer ever found). Each function drives the
//! same code the satellite runs on that input and checks properties that must hold for any input; a panic is a
//! finding. None of them touches the network, the disk or a clock.

use bytes::BytesMut;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::Value;
use tokio_util::codec::Decoder;

use crate::mcp::transport::stdio::lines::{Line, Lines};

use crate::mcp::protocol::{self, FrameError, Message};
use crate::model::catalog;

/// One fuzz target: a function of the raw input.
pub type Target = fn(&[u8]);

/// The targets, by the name `fuzz/` and the regression directory use.
pub const TARGETS: &[(&str, Target)] = &[
    ("jsonrpc", jsonrpc),
    ("sse", sse),
    ("stdio_lines", stdio_lines),
    ("config", config),
    ("names", names),
    ("query", query),
    ("masking", masking),
];

/// The JSON-RPC decoder of the front door and of a stdio server's stdout: framing, classification, the error
/// answer for a refused body, and a round trip of every message it accepts.
pub fn jsonrpc(data: &[u8]) {
    let messages = match protocol::decode_frame(data) {
        Ok((messages, _)) => {
            let _ = crate::activity::calls_a_tool(&messages);
            messages
        }
        Err(err) => {
            let answer = match err {
                FrameError::Json(err) => crate::http::error::McpError::Parse(err),
                FrameError::EmptyBatch => crate::http::error::McpError::EmptyBatch,
            };
            let _ = answer.rpc();
            return;
        }
    };
    for value in messages {
        let _ = protocol::has_stateless_envelope(value.get("params"));
        if let Ok(message) = Message::from_value(value) {
            let again = Message::from_value(message.into_value());
            assert!(again.is_ok(), "a message the decoder accepted does not decode after encoding: {again:?}");
        }
    }
}

/// The SSE reader of an upstream's replies and GET stream, and the JSON body framer of a Streamable HTTP reply:
/// whatever chunks the bytes arrive in, the same events and values come out.
pub fn sse(data: &[u8]) {
    let (cuts, body) = split_cuts(data);
    let whole = sse_events(vec![body.to_vec()]);
    let chunked = sse_events(chunks(body, &cuts));
    assert_eq!(whole, chunked, "SSE events depend on how the bytes were chunked");
    for (_, data) in &whole {
        if let Ok(value) = serde_json::from_str::<Value>(data) {
            let _ = Message::from_value(value);
        }
    }

    let at_once = crate::mcp::transport::http_wire::complete_values(body, true);
    let mut buffer = Vec::new();
    let mut values = Vec::new();
    let mut failed = false;
    let pieces = chunks(body, &cuts);
    let count = pieces.len();
    for (index, piece) in pieces.into_iter().enumerate() {
        buffer.extend_from_slice(&piece);
        match crate::mcp::transport::http_wire::complete_values(&buffer, index + 1 == count) {
            Some((parsed, consumed)) => {
                values.extend(parsed);
                buffer.drain(..consumed);
            }
            None => {
                failed = true;
                break;
            }
        }
    }
    if let Some((expected, _)) = at_once {
        assert!(!failed, "a body that parses whole fails when chunked");
        assert_eq!(expected, values, "JSON values depend on how the body was chunked");
    }
}

/// The stdio line framer (the same codec and cap as a child's stdout, scaled down) and the line handler's first
/// steps: every line is within the cap, chunking changes nothing, and the log preview of a bad line is bounded.
pub fn stdio_lines(data: &[u8]) {
    const MAX: usize = 64;
    let (cuts, body) = split_cuts(data);
    let whole = frame_lines(vec![body.to_vec()], MAX);
    let chunked = frame_lines(chunks(body, &cuts), MAX);
    assert_eq!(whole, chunked, "stdio lines depend on how the bytes were chunked");
    let texts = whole.iter().filter_map(|line| match line {
        Line::Text(text) => Some(text),
        Line::TooLong { .. } => None,
    });
    for line in texts {
        // Each byte read is at most one character (a byte that is not UTF-8 becomes one U+FFFD).
        assert!(line.chars().count() <= MAX, "a line longer than the cap came through");
        let preview = crate::mcp::transport::preview(line.trim(), 20);
        assert!(preview.chars().count() <= 21 && !preview.contains('\n'), "log preview is not bounded: {preview:?}");
        if let Ok((messages, _)) = protocol::decode_frame(line.trim().as_bytes()) {
            for message in messages {
                let _ = Message::from_value(message);
            }
        }
    }
}

/// The config loader: a TOML file through parsing, validation and expansion into instance specs, and a
/// backend's `mcp_servers` map into the same; every secret the expansion knows is masked in what `check-config`
/// and the debug route list.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(raw) = crate::config::parse_file(text) {
        if let Ok(standalone) = crate::control::standalone::from_file(&raw) {
            check_masked(&standalone.desired_state());
        }
    }
    if let Ok(serde_json::Value::Object(entries)) = serde_json::from_str::<Value>(text) {
        check_masked(&crate::control::snapshot::DesiredState::from_raw_entries(&entries));
    }
}

/// The tool, resource and session-id name parsers, and that each parser inverts its formatter.
pub fn names(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = catalog::parse_tool_path(&text);
    let _ = catalog::parse_shared_uri(&text);
    let _ = catalog::parse_namespaced_uri(&text);
    let _ = crate::model::InstanceStatus::parse(&text);
    let _ = crate::events::EventKind::parse(&text);
    if crate::http::session::well_formed(&text) {
        assert!(text.len() <= 128 && !text.contains(char::is_whitespace), "a session id that is not well formed");
    }
    let (slug, rest) = text.split_once('\u{0}').unwrap_or((&text, "x"));
    if !slug.is_empty() && !rest.is_empty() {
        if !slug.contains(':') {
            let path = catalog::tool_path(slug, rest);
            assert_eq!(catalog::parse_tool_path(&path), Some((slug, rest)), "tool path does not round-trip");
        }
        if !slug.contains('|') {
            let uri = catalog::namespaced_uri(slug, rest);
            assert_eq!(catalog::parse_namespaced_uri(&uri), Some((slug, rest)), "namespaced uri does not round-trip");
        }
        if !slug.contains('/') {
            let uri = catalog::shared_uri(slug, rest);
            assert_eq!(
                catalog::parse_shared_uri(&uri),
                Some((slug, rest.to_owned())),
                "shared uri does not round-trip"
            );
        }
    }
}

/// The search query normaliser and query builder `discover_mcp_tools` runs on a caller's text.
pub fn query(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    crate::search::fuzz_query(&text);
}

/// The masking step every sink goes through: after `hide`, no configured secret value is left in the text.
/// Input: NUL-separated; the first part is the text, the others are secret values.
pub fn masking(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\u{0}');
    let body = parts.next().unwrap_or_default();
    // As `secrets::secret_values` keeps them: 4 characters or more (shorter ones would mangle ordinary text).
    let mut values: Vec<String> = parts.filter(|v| v.chars().count() >= 4).map(str::to_owned).collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values.dedup();
    // A JSON body: its text, masked without parsing when no value can be in it, says what its parsed value masked
    // says.
    if let Ok(raw) = serde_json::from_str::<Box<serde_json::value::RawValue>>(body) {
        if let (Ok(value), Some(text)) =
            (serde_json::from_str::<Value>(body), crate::secrets::hide_json_text(&raw, &values))
        {
            let read: Option<Value> = serde_json::from_str(text.get()).ok();
            assert_eq!(
                read,
                Some(crate::secrets::hide_json(&value, &values)),
                "the text path masked {body:?} differently"
            );
        }
    }
    let hidden = crate::secrets::hide(body, &values);
    for value in &values {
        // A value made of mask characters can be spelled by a mask; every other one must be gone.
        if !value.contains('*') {
            assert!(!hidden.contains(value.as_str()), "secret {value:?} survived masking: {hidden:?}");
        }
    }
    let args: Vec<String> = body.split(' ').map(str::to_owned).collect();
    let secret_args = crate::secrets::secret_arguments(&args);
    let masked = crate::secrets::mask_arguments(&args).join(" ");
    // A value of 3 characters or fewer is masked whole where it stands, but may also be spelled by the 3 characters
    // a mask keeps of a longer secret: only longer ones are checked everywhere (found by this target).
    for value in secret_args.iter().filter(|v| v.chars().count() >= 4 && !v.contains('*')) {
        assert!(!masked.contains(value.as_str()), "argument secret {value:?} survived: {masked:?}");
    }
}

fn check_masked(state: &crate::control::snapshot::DesiredState) {
    for spec in state.instances.values() {
        let secrets = crate::secrets::secret_values(spec);
        let listed = crate::secrets::masked_upstream(spec);
        let listed: Vec<&str> = match &listed {
            Value::Object(map) => map.values().flat_map(strings).collect(),
            _ => Vec::new(),
        };
        for value in secrets.iter().filter(|v| !v.contains('*')) {
            assert!(!listed.iter().any(|text| text.contains(value.as_str())), "secret {value:?} listed: {listed:?}");
        }
    }
}

/// Every string inside a listed value.
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(text) => vec![text.as_str()],
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::Object(map) => map.values().flat_map(strings).collect(),
        _ => Vec::new(),
    }
}

/// The first byte says how many cut points follow (at most 8, two bytes each); the rest is the payload.
fn split_cuts(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let Some((&count, rest)) = data.split_first() else { return (Vec::new(), data) };
    let count = usize::from(count % 9).min(rest.len() / 2);
    let (cut_bytes, body) = rest.split_at(count * 2);
    let cuts = cut_bytes.chunks(2).map(|pair| usize::from(u16::from_le_bytes([pair[0], pair[1]]))).collect();
    (cuts, body)
}

fn chunks(body: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|cut| cut % (body.len() + 1)).collect();
    at.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for cut in at {
        out.push(body[start..cut].to_vec());
        start = cut;
    }
    out.push(body[start..].to_vec());
    out
}

fn sse_events(pieces: Vec<Vec<u8>>) -> Vec<(String, String)> {
    let stream =
        futures::stream::iter(pieces.into_iter().map(|piece| Ok::<_, std::io::Error>(bytes::Bytes::from(piece))));
    futures::executor::block_on(async {
        let mut events = stream.eventsource();
        let mut out = Vec::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => out.push((event.event, event.data)),
                Err(err) => out.push(("error".to_owned(), err.to_string())),
            }
        }
        out
    })
}

/// Lines as the stdout reader sees them.
fn frame_lines(pieces: Vec<Vec<u8>>, max: usize) -> Vec<Line> {
    let mut codec = Lines::new(max);
    let mut buffer = BytesMut::new();
    let mut out = Vec::new();
    for piece in pieces {
        buffer.extend_from_slice(&piece);
        while let Ok(Some(line)) = codec.decode(&mut buffer) {
            out.push(line);
        }
    }
    while let Ok(Some(line)) = codec.decode_eof(&mut buffer) {
        out.push(line);
    }
    out
}
