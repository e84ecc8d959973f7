//! What the two HTTP transports (Streamable HTTP and legacy SSE) share: request headers from configuration,
//! `Mcp-Name` encoding, the framing of JSON reply bodies, and the classification of reqwest's failures.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::UpstreamError;

/// The complete JSON values at the start of `buffer` and how many bytes they took; a value cut off at the end
/// waits for more unless the body `ended`. `None` when the bytes are not JSON.
pub fn complete_values(buffer: &[u8], ended: bool) -> Option<(Vec<Value>, usize)> {
    let mut values = serde_json::Deserializer::from_slice(buffer).into_iter::<Value>();
    let mut parsed = Vec::new();
    // Where the last parsed value ends, and where the one before it ended.
    let (mut before_last, mut last_end) = (0, 0);
    while let Some(value) = values.next() {
        match value {
            Ok(value) => {
                before_last = last_end;
                last_end = values.byte_offset();
                parsed.push(value);
            }
            Err(err) if err.is_eof() => break,
            Err(_) => return None,
        }
    }
    let mut consumed = values.byte_offset();
    // A number that ends where the bytes so far end may go on in the next chunk (`1` then `11` is `111`): it is
    // complete only once something follows it or the body ends. Found by the `sse` fuzz target.
    if !ended && last_end == buffer.len() && parsed.last().is_some_and(Value::is_number) {
        parsed.pop();
        consumed = before_last;
    }
    if ended && buffer[consumed..].iter().any(|b| !b.is_ascii_whitespace()) {
        return None;
    }
    Some((parsed, consumed))
}

pub(crate) fn header_map(headers: &BTreeMap<String, String>) -> Result<HeaderMap, UpstreamError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| UpstreamError::Protocol(format!("invalid header name {name:?}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| UpstreamError::Protocol(format!("invalid value for header {name}")))?;
        map.insert(name, value);
    }
    Ok(map)
}

pub(crate) fn classify_reqwest(err: &reqwest::Error) -> UpstreamError {
    if err.is_timeout() {
        return UpstreamError::Timeout { method: "http".into(), after: Duration::ZERO };
    }
    let cause = root_cause(err);
    // A pooled connection the server dropped is as unreachable as a refused one (SB §11.1 retries "reset").
    let lower = cause.to_ascii_lowercase();
    let dropped = ["connection reset", "connection closed", "connection aborted", "broken pipe", "incomplete message"]
        .iter()
        .any(|p| lower.contains(p));
    let shown = without_secrets_of_url(err);
    if err.is_connect() || dropped {
        return UpstreamError::Connect(format!("{shown}: {cause}"));
    }
    UpstreamError::Io(format!("{shown}: {cause}"))
}

/// reqwest's text of `err`, whose "for url (…)" would show the URL whole: its query (where a remote server's key
/// may be, `?api_key=…`) and its user info are left out. The error text becomes a status message, an event and a
/// log line (SB §22).
fn without_secrets_of_url(err: &reqwest::Error) -> String {
    let text = err.to_string();
    let Some(url) = err.url() else { return text };
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    // Only fails for URLs that cannot have user info (no host); those have none to hide.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    text.replace(url.as_str(), shown.as_str())
}

fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A remote server's key in its URL's query must not reach the status message, events and logs an
    /// unreachable server's error becomes.
    #[tokio::test]
    async fn an_unreachable_servers_error_does_not_show_its_urls_query_or_user_info() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://user:hunter2-password@127.0.0.1:{port}/mcp?workspace=w1&api_key=SECRET-0123456789");
        let err = reqwest::Client::new().post(&url).send().await.expect_err("nothing listens there");
        assert!(err.to_string().contains("SECRET-0123456789"), "reqwest shows the URL whole: {err}");
        let classified = classify_reqwest(&err).to_string();
        assert!(matches!(classify_reqwest(&err), UpstreamError::Connect(_)), "{classified}");
        assert!(!classified.contains("SECRET") && !classified.contains("hunter2"), "{classified}");
        assert!(classified.contains(&format!("127.0.0.1:{port}/mcp")), "the server is still named: {classified}");
    }

    #[test]
    fn json_replies_may_be_one_document_or_a_stream_of_them() {
        let pretty = b"{\n  \"id\": 1,\n  \"result\": {}\n}\n";
        assert_eq!(complete_values(pretty, true).unwrap().0, vec![json!({"id": 1, "result": {}})]);
        let ndjson = b"{\"method\":\"a\"}\n{\"id\":2,\"result\":{}}\n{\"id\":";
        let (values, consumed) = complete_values(ndjson, false).unwrap();
        assert_eq!(values.len(), 2, "the cut-off third value waits for more bytes");
        assert_eq!(&ndjson[consumed..], b"{\"id\":");
        assert!(complete_values(ndjson, true).is_none(), "cut off for good once the body ended");
        assert!(complete_values(b"<html>", false).is_none());
        // A number at the end of the bytes so far may continue in the next chunk.
        let (values, consumed) = complete_values(b"{} 1", false).unwrap();
        assert_eq!((values.len(), consumed), (1, 2));
        assert_eq!(complete_values(b"{} 1", true).unwrap().0, vec![serde_json::json!({}), serde_json::json!(1)]);
    }

    #[test]
    fn bad_header_names_are_refused() {
        let headers = BTreeMap::from([("bad header".to_owned(), "x".to_owned())]);
        assert!(header_map(&headers).is_err());
    }
}
