//! The handshake's `initialize`: the session it makes, and the result it answers with.

use super::*;

/// What an `initialize` made: its answer already, or a session and the result its answer carries.
pub(super) enum Initialized {
    Answered(Response),
    Session(String, Value),
}

/// An `initialize`: a session made, unless the client already holds one or its request is refused.
pub(super) async fn initialize_session(
    routing: &Routing,
    endpoint: &Endpoint,
    supplied: Option<&str>,
    message: &Value,
    batch: bool,
) -> Result<Initialized, McpError> {
    if let Some(id) = supplied {
        if endpoint.sessions.touch(id, &endpoint.owner) == Lookup::Known {
            return Err(McpError::AlreadyInitialized);
        }
    }
    let capabilities = message.pointer("/params/capabilities").cloned().unwrap_or_default();
    if let Some(refused) = refused_initialize(endpoint, message, &capabilities) {
        return Ok(Initialized::Answered(refused));
    }
    let requested = message.pointer("/params/protocolVersion").and_then(Value::as_str);
    let quota = endpoint.target.session_quota();
    // The commonest: a lone `initialize` on `/mcp` with no toolset, answered with the text made once per version.
    if let Some((id, version, result)) = kept_initialize(endpoint, message, requested, batch) {
        let session = endpoint.sessions.create_in(&endpoint.owner, &quota, version, capabilities);
        let response = json_response(StatusCode::OK, &protocol::ResultResponse::new(&id, result));
        return Ok(Initialized::Answered(with_session(response, &session)));
    }
    let (version, result) = initialize_result(requested, &Identity::of(&routing.manager, &endpoint.target).await);
    let id = endpoint.sessions.create_in(&endpoint.owner, &quota, &version, capabilities);
    Ok(Initialized::Session(id, result))
}

/// The answer to an `initialize` that makes no session: capabilities past the bound, a toolset that cannot be
/// used, or no valid request.
fn refused_initialize(endpoint: &Endpoint, message: &Value, capabilities: &Value) -> Option<Response> {
    // The declared capabilities are kept for the session's life: bounded like everything a client can make
    // the satellite keep.
    let oversized = (crate::mcp::payload::json_len(capabilities) > session::MAX_CAPABILITIES_BYTES).then(|| {
        RpcError::new(
            codes::INVALID_PARAMS,
            format!("capabilities larger than {} KiB", session::MAX_CAPABILITIES_BYTES / 1024),
        )
    });
    // No session for a connection whose toolset cannot be used: the client shows why it failed.
    if let Some(err) = oversized.as_ref().or(endpoint.target.refused_selection()) {
        let id = message.get("id").cloned().and_then(|id| serde_json::from_value(id).ok());
        return Some(json_response(StatusCode::OK, &protocol::error_response(id, err.clone())));
    }
    // An `initialize` that is no valid request (no id, or a null or fractional one) makes no session: a session
    // id belongs only on the answer that carries an `InitializeResult`. Before, a session was made first and
    // worked, though the client was told 202 or an error.
    let why = match Message::from_value(message.clone()) {
        Ok(Message::Request { .. }) => return None,
        Err(err) => err.to_string(),
        Ok(_) => "initialize is a request: it needs an id".to_owned(),
    };
    let err = RpcError::new(codes::INVALID_REQUEST, format!("Invalid Request: {why}"));
    Some(json_response(StatusCode::BAD_REQUEST, &protocol::error_response(None, err)))
}

/// The id of a lone `initialize` on `/mcp` with no toolset, and the result kept for the version it asks.
fn kept_initialize(
    endpoint: &Endpoint,
    message: &Value,
    requested: Option<&str>,
    batch: bool,
) -> Option<(protocol::RequestId, &'static str, &'static Payload)> {
    if batch || !matches!(endpoint.target, Target::Hierarchical(..)) || endpoint.target.toolset().is_some() {
        return None;
    }
    let id = message.get("id").filter(|id| !id.is_null()).cloned();
    let id = id.and_then(|id| serde_json::from_value::<protocol::RequestId>(id).ok());
    let (version, result) = hierarchical_initialize_result(requested)?;
    Some((id?, version, result))
}

/// [`initialize_result`] of `/mcp` with no toolset, for the version asked: the same for every caller, so made once
/// per version and kept as its text (issue 19: building and writing it out again was a seventh of an `initialize`).
fn hierarchical_initialize_result(requested: Option<&str>) -> Option<(&'static str, &'static Payload)> {
    static RESULTS: std::sync::LazyLock<Vec<(&'static str, Payload)>> = std::sync::LazyLock::new(|| {
        let identity = Identity::hierarchical();
        HANDSHAKE_VERSIONS
            .iter()
            .map(|version| {
                let (_, result) = initialize_result(Some(version), &identity);
                let text =
                    serde_json::value::to_raw_value(&result).map(Payload::text).unwrap_or(Payload::Value(result));
                (*version, text)
            })
            .collect()
    });
    let version = handshake_version(requested);
    RESULTS.iter().find(|(known, _)| *known == version).map(|(version, result)| (*version, result))
}

/// The handshake version answered to one asked: the same when the satellite speaks it, else the newest.
fn handshake_version(requested: Option<&str>) -> &'static str {
    HANDSHAKE_VERSIONS.iter().copied().find(|v| requested == Some(*v)).unwrap_or(LEGACY_VERSIONS[2])
}

pub(super) fn initialize_result(requested: Option<&str>, identity: &Identity) -> (String, Value) {
    let version = handshake_version(requested).to_owned();
    let mut result = protocol::object([
        ("protocolVersion", Value::from(version.as_str())),
        ("capabilities", identity.capabilities.clone()),
        ("serverInfo", identity.server_info.clone()),
    ]);
    if let Some(instructions) = &identity.instructions {
        result["instructions"] = Value::from(instructions.as_str());
    }
    (version, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `initialize` result `/mcp` answers from text made once per version is, for every version a client may
    /// ask (and one it may not), what it would build anew.
    #[test]
    fn the_kept_initialize_results_are_those_built_anew() {
        for requested in HANDSHAKE_VERSIONS.iter().copied().chain(["1999-01-01"]) {
            let (version, kept) = hierarchical_initialize_result(Some(requested)).expect("a kept result");
            let (built_version, built) = initialize_result(Some(requested), &Identity::hierarchical());
            assert_eq!(version, built_version);
            assert_eq!(kept.to_value().expect("a value"), built, "{requested}");
        }
    }

    #[test]
    fn initialize_echoes_supported_versions_only() {
        let own = Identity::hierarchical();
        assert_eq!(initialize_result(Some("2025-03-26"), &own).0, "2025-03-26");
        assert_eq!(initialize_result(Some("2024-11-05"), &own).0, "2024-11-05");
        assert_eq!(initialize_result(Some("1999-01-01"), &own).0, "2025-11-25");
        assert_eq!(initialize_result(None, &own).0, "2025-11-25");
    }
}
