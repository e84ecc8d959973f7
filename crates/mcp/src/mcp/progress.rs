//! Progress tokens: the ones a client may send, and the satellite's own that stands for a client's upstream.

use serde_json::Value;

use crate::mcp::protocol::{codes, RpcError};

/// What the satellite's own tokens start with.
const OURS: &str = "satellite-";

/// A request's `_meta.progressToken`: absent, or a string or a number (`ProgressToken = string | number` in
/// 2025-11-25 and 2026-07-28; any string, any number, floats and integers past 2^53 too, since the upstream only
/// ever sees the satellite's own token). Anything else is -32602: refused, not passed on without it, as the
/// reference server refuses it, and a client that asked for progress would otherwise wait for progress that never
/// comes.
pub fn check_token(params: Option<&Value>) -> Result<(), RpcError> {
    let token = params.and_then(|p| p.get("_meta")).and_then(|meta| meta.get("progressToken"));
    let kind = match token {
        None | Some(Value::String(_) | Value::Number(_)) => return Ok(()),
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Array(_)) => "an array",
        Some(Value::Object(_)) => "an object",
    };
    Err(RpcError::new(
        codes::INVALID_PARAMS,
        format!("Invalid params: _meta.progressToken must be a string or a number, not {kind}"),
    ))
}

/// The token that stands upstream for the client's own on our request `id`: a plain string, which every server
/// reads and sends back as it was (a client's own may be a float or an integer past 2^53, which some servers
/// refuse and others round).
pub(crate) fn ours(id: i64) -> Value {
    Value::String(format!("{OURS}{id}"))
}

/// Whether a server's progress carries one of our tokens. One that no call holds any more (the server told of
/// a request after it ended) goes to no client: it would mean nothing to them.
pub(crate) fn is_ours(token: &Value) -> bool {
    token.as_str().is_some_and(|token| token.strip_prefix(OURS).is_some_and(|id| id.parse::<i64>().is_ok()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strings_and_numbers_are_tokens_and_nothing_else() {
        for token in [json!(""), json!("ü"), json!(0), json!(-1), json!(1.5), json!(u64::MAX), json!(1e300)] {
            assert!(check_token(Some(&json!({"_meta": {"progressToken": token}}))).is_ok(), "{token}");
        }
        assert!(check_token(None).is_ok());
        assert!(check_token(Some(&json!({"_meta": {}}))).is_ok());
        for (token, said) in [(json!(null), "null"), (json!(true), "a boolean"), (json!([1]), "an array")] {
            let err = check_token(Some(&json!({"_meta": {"progressToken": token}}))).unwrap_err();
            assert_eq!(err.code, codes::INVALID_PARAMS);
            assert!(err.message.ends_with(said), "{}", err.message);
        }
        assert!(check_token(Some(&json!({"_meta": {"progressToken": {}}}))).is_err());
    }

    #[test]
    fn ours_are_known_by_their_shape() {
        assert!(is_ours(&ours(42)));
        assert!(!is_ours(&json!("satellite-x")) && !is_ours(&json!(42)) && !is_ours(&json!("42")));
    }
}
