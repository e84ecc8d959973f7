//! The one error type of the MCP edge: every way a request to `/mcp`, `/i/{path}/mcp`, `/sse` or `/message`
//! fails, each with exactly one HTTP status and one JSON-RPC error (SB §3, §4, §5.3, §6.1). Handlers return
//! `Result<Response, McpError>`; `into_response` is the only place these errors become responses.

use warp::http::{HeaderValue, StatusCode};
use warp::reply::Response;

use super::json_response;
use super::oauth::{challenge, ResourceUrls};
use crate::auth::{AuthError, InstanceAuthError};
use crate::mcp::protocol::{self, codes, RpcError};
use crate::router::RouteError;

/// Why a request with more than one `Authorization` header is refused, on every route.
pub const TWO_AUTHORIZATIONS: &str = "more than one Authorization header; send one credential";

#[derive(Debug, Clone, PartialEq)]
pub enum McpError {
    /// `Content-Type` is not `application/json`.
    UnsupportedMediaType,
    /// `Accept` lacks `application/json` or `text/event-stream` (POST), or `text/event-stream` (GET).
    NotAcceptable {
        stream_only: bool,
    },
    /// The body is not JSON.
    Parse(String),
    EmptyBatch,
    /// A batch of more messages than it may carry: how many, and the most.
    BatchTooLarge {
        messages: usize,
        max: usize,
    },
    InitializeInBatch,
    AlreadyInitialized,
    /// `MCP-Protocol-Version` names a version this endpoint does not speak.
    UnsupportedVersion(String),
    NoSessionId,
    /// A GET or DELETE without a session id.
    InvalidSession,
    /// A session id that is not 1-128 visible ASCII characters.
    MalformedSession,
    /// A session that does not exist (any more), or is not the caller's: the client initializes again.
    SessionNotFound,
    /// A second GET stream for one session.
    StreamConflict,
    /// GET on a 2026-07-28 endpoint: the revision has no server stream.
    NoServerStream,
    /// Bearer authentication failed (401/403 with `WWW-Authenticate`).
    Auth(AuthError),
    /// More than one `Authorization` header: two credentials, and no telling whose request it is (RFC 9110 §5.3).
    TwoAuthorizations,
    /// Instance-token authentication failed (SB §6.1).
    InstanceAuth(InstanceAuthError),
    /// `/message` without a well-formed `session` parameter.
    MissingSseSession,
    SseSessionNotFound,
    /// A bearer sent to `/message` names another identity than the stream's owner.
    SseSessionOfAnother,
    /// The stream the answer should go to is gone or not keeping up.
    SseStreamClosed,
    /// One request's JSON-RPC error (the router's or the server's own), answered alone.
    Rpc(RpcError),
    // What warp rejects before a handler runs.
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge {
        limit: u64,
    },
    LengthRequired,
    InvalidQuery(String),
    CorsForbidden,
    /// A `Host` or `Origin` this satellite does not answer to (DNS-rebinding protection).
    Forbidden(String),
    BadRequest(String),
    /// The caller holds all of its own places (`max_concurrent_requests_per_caller`).
    CallerBusy {
        limit: usize,
    },
    /// The caller holds all of its own long-lived streams (`max_streams_per_caller`).
    CallerStreams {
        limit: usize,
    },
    // What the tower stack refuses.
    Overloaded,
    GatewayTimeout,
    Internal,
}

impl From<RouteError> for McpError {
    fn from(err: RouteError) -> Self {
        match err {
            RouteError::Rpc(err) => McpError::Rpc(err),
            RouteError::Forbidden(err) => McpError::Auth(err),
        }
    }
}

impl McpError {
    /// The response: the status, `{"jsonrpc":"2.0","error":…,"id":null}`, and for bearer failures the
    /// `WWW-Authenticate` challenge naming the resource metadata.
    pub fn into_response(self, urls: &ResourceUrls) -> Response {
        let (status, error, www_authenticate) = match &self {
            McpError::Auth(err) => {
                let challenge = challenge(err, urls);
                (challenge.status, challenge.error, Some(challenge.www_authenticate))
            }
            _ => (self.status(), self.rpc(), None),
        };
        let mut response = json_response(status, &protocol::error_response(None, error));
        if let Some(value) = www_authenticate.and_then(|v| HeaderValue::from_str(&v).ok()) {
            response.headers_mut().insert("www-authenticate", value);
        }
        if matches!(self, McpError::CallerBusy { .. }) {
            response.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
        }
        if matches!(self, McpError::Auth(AuthError::Unavailable(_))) {
            response.headers_mut().insert("retry-after", HeaderValue::from(super::oauth::RETRY_AFTER_SECONDS));
        }
        response
    }

    /// The HTTP status of this error.
    fn status(&self) -> StatusCode {
        match self {
            McpError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            McpError::NotAcceptable { .. } => StatusCode::NOT_ACCEPTABLE,
            McpError::Parse(_)
            | McpError::EmptyBatch
            | McpError::BatchTooLarge { .. }
            | McpError::InitializeInBatch
            | McpError::AlreadyInitialized
            | McpError::UnsupportedVersion(_)
            | McpError::NoSessionId
            | McpError::InvalidSession
            | McpError::MalformedSession
            | McpError::MissingSseSession
            | McpError::InvalidQuery(_)
            | McpError::TwoAuthorizations
            | McpError::BadRequest(_) => StatusCode::BAD_REQUEST,
            McpError::StreamConflict => StatusCode::CONFLICT,
            McpError::NoServerStream | McpError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            McpError::Auth(AuthError::Missing | AuthError::Invalid(_)) => StatusCode::UNAUTHORIZED,
            McpError::Auth(AuthError::InsufficientScope(_) | AuthError::NotAdmin | AuthError::NotMember) => {
                StatusCode::FORBIDDEN
            }
            McpError::Auth(AuthError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            McpError::InstanceAuth(err) => match err {
                InstanceAuthError::NotFound => StatusCode::NOT_FOUND,
                InstanceAuthError::BadFormat | InstanceAuthError::Invalid => StatusCode::UNAUTHORIZED,
                InstanceAuthError::NotConfigured => StatusCode::INTERNAL_SERVER_ERROR,
            },
            McpError::SseSessionNotFound | McpError::SessionNotFound | McpError::NotFound => StatusCode::NOT_FOUND,
            McpError::SseSessionOfAnother | McpError::CorsForbidden | McpError::Forbidden(_) => StatusCode::FORBIDDEN,
            McpError::SseStreamClosed => StatusCode::GONE,
            McpError::Rpc(err) => rpc_status(err.code),
            McpError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            McpError::LengthRequired => StatusCode::LENGTH_REQUIRED,
            McpError::CallerBusy { .. } | McpError::CallerStreams { .. } => StatusCode::TOO_MANY_REQUESTS,
            McpError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            McpError::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            McpError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON-RPC error object of this error (a bearer failure's is the challenge's, with its data).
    pub fn rpc(&self) -> RpcError {
        let (code, message) = match self {
            McpError::UnsupportedMediaType => {
                (codes::TRANSPORT_ERROR, "Unsupported Media Type: Content-Type must be application/json".to_owned())
            }
            McpError::NotAcceptable { stream_only: false } => (
                codes::TRANSPORT_ERROR,
                "Not Acceptable: Client must accept both application/json and text/event-stream".to_owned(),
            ),
            McpError::NotAcceptable { stream_only: true } => {
                (codes::TRANSPORT_ERROR, "Not Acceptable: Client must accept text/event-stream".to_owned())
            }
            McpError::Parse(err) => (codes::PARSE_ERROR, format!("Parse error: {err}")),
            McpError::EmptyBatch => (codes::INVALID_REQUEST, "Invalid Request: empty batch".to_owned()),
            McpError::BatchTooLarge { messages, max } => (
                codes::INVALID_REQUEST,
                format!("Invalid Request: a batch of {messages} messages; at most {max} are answered in one"),
            ),
            McpError::InitializeInBatch => (
                codes::INVALID_REQUEST,
                "Invalid Request: initialize must not be batched with other messages".to_owned(),
            ),
            McpError::AlreadyInitialized => {
                (codes::INVALID_REQUEST, "Invalid Request: Server already initialized".to_owned())
            }
            McpError::UnsupportedVersion(version) => {
                (codes::TRANSPORT_ERROR, format!("Bad Request: Unsupported protocol version: {version}"))
            }
            McpError::NoSessionId => (codes::TRANSPORT_ERROR, "Bad Request: No session ID provided".to_owned()),
            McpError::InvalidSession => (codes::TRANSPORT_ERROR, "Invalid or missing session ID".to_owned()),
            McpError::MalformedSession => {
                (codes::TRANSPORT_ERROR, "Bad Request: session ID must be 1-128 visible ASCII characters".to_owned())
            }
            McpError::SessionNotFound => (codes::UNAUTHORIZED, "Session not found".to_owned()),
            McpError::StreamConflict => {
                (codes::TRANSPORT_ERROR, "Conflict: Only one SSE stream is allowed per session".to_owned())
            }
            McpError::NoServerStream => (codes::TRANSPORT_ERROR, "2026-07-28 has no server stream".to_owned()),
            McpError::Auth(err) => return challenge(err, &ResourceUrls { public_url: String::new() }).error,
            McpError::TwoAuthorizations => (codes::INVALID_REQUEST, format!("Bad Request: {TWO_AUTHORIZATIONS}")),
            McpError::InstanceAuth(err) => {
                let code = match err {
                    InstanceAuthError::NotFound => codes::FORBIDDEN,
                    InstanceAuthError::BadFormat | InstanceAuthError::Invalid => codes::UNAUTHORIZED,
                    InstanceAuthError::NotConfigured => codes::TRANSPORT_ERROR,
                };
                (code, err.to_string())
            }
            McpError::MissingSseSession => (codes::INVALID_REQUEST, "Missing session parameter".to_owned()),
            McpError::SseSessionNotFound => (codes::UNAUTHORIZED, "Session not found".to_owned()),
            McpError::SseSessionOfAnother => (codes::UNAUTHORIZED, "Session belongs to another identity".to_owned()),
            McpError::SseStreamClosed => (codes::UNAUTHORIZED, "Session stream closed".to_owned()),
            McpError::Rpc(err) => return err.clone(),
            McpError::NotFound => (codes::TRANSPORT_ERROR, "Not Found".to_owned()),
            McpError::MethodNotAllowed => (codes::TRANSPORT_ERROR, "Method Not Allowed".to_owned()),
            McpError::PayloadTooLarge { limit } => {
                (codes::INVALID_REQUEST, format!("Request body larger than {limit} bytes"))
            }
            McpError::LengthRequired => (codes::INVALID_REQUEST, "Content-Length required".to_owned()),
            McpError::InvalidQuery(err) => (codes::INVALID_REQUEST, format!("Invalid query: {err}")),
            McpError::CorsForbidden => (codes::TRANSPORT_ERROR, "CORS request forbidden".to_owned()),
            McpError::Forbidden(reason) => (codes::TRANSPORT_ERROR, format!("Forbidden: {reason}")),
            McpError::BadRequest(err) => (codes::INVALID_REQUEST, format!("Bad Request: {err}")),
            McpError::CallerBusy { limit } => (
                codes::TRANSPORT_ERROR,
                format!(
                    "Too Many Requests: {limit} requests of this caller are in flight already; retry when one ends"
                ),
            ),
            McpError::CallerStreams { limit } => (
                codes::TRANSPORT_ERROR,
                format!(
                    "Too Many Requests: {limit} streams of this caller are open already; close one to open another"
                ),
            ),
            McpError::Overloaded => {
                (codes::TRANSPORT_ERROR, "Service Unavailable: too many concurrent requests, retry shortly".to_owned())
            }
            McpError::GatewayTimeout => {
                (codes::TRANSPORT_ERROR, "Gateway Timeout: the request took too long".to_owned())
            }
            McpError::Internal => (codes::TRANSPORT_ERROR, "Internal server error".to_owned()),
        };
        RpcError::new(code, message)
    }
}

/// The HTTP status that goes with one request's JSON-RPC error when it is answered alone (2026-07-28): the
/// request's own fault is 400, an unknown method 404; an error the server or tool reported about the work
/// itself travels in a successful HTTP exchange.
pub fn rpc_status(code: i64) -> StatusCode {
    match code {
        codes::PARSE_ERROR
        | codes::INVALID_REQUEST
        | codes::INVALID_PARAMS
        | codes::HEADER_MISMATCH
        | codes::MISSING_CLIENT_CAPABILITY
        | codes::UNSUPPORTED_PROTOCOL_VERSION => StatusCode::BAD_REQUEST,
        codes::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        codes::INTERNAL_ERROR => StatusCode::OK,
        // Any other code is the server's or the tool's own: the HTTP exchange itself succeeded.
        _server_defined => StatusCode::OK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error the edge produces has a non-2xx status except a JSON-RPC error of the work itself.
    #[test]
    fn every_edge_error_is_an_http_error() {
        let all = [
            McpError::UnsupportedMediaType,
            McpError::NotAcceptable { stream_only: false },
            McpError::NotAcceptable { stream_only: true },
            McpError::Parse("x".into()),
            McpError::EmptyBatch,
            McpError::BatchTooLarge { messages: 101, max: 100 },
            McpError::InitializeInBatch,
            McpError::AlreadyInitialized,
            McpError::UnsupportedVersion("1999".into()),
            McpError::NoSessionId,
            McpError::InvalidSession,
            McpError::MalformedSession,
            McpError::SessionNotFound,
            McpError::StreamConflict,
            McpError::NoServerStream,
            McpError::Auth(AuthError::Missing),
            McpError::Auth(AuthError::Invalid("expired".into())),
            McpError::Auth(AuthError::InsufficientScope("mcp:read".into())),
            McpError::Auth(AuthError::NotMember),
            McpError::TwoAuthorizations,
            McpError::InstanceAuth(InstanceAuthError::NotFound),
            McpError::InstanceAuth(InstanceAuthError::BadFormat),
            McpError::InstanceAuth(InstanceAuthError::NotConfigured),
            McpError::InstanceAuth(InstanceAuthError::Invalid),
            McpError::MissingSseSession,
            McpError::SseSessionNotFound,
            McpError::SseSessionOfAnother,
            McpError::SseStreamClosed,
            McpError::Rpc(RpcError::new(codes::METHOD_NOT_FOUND, "no")),
            McpError::Rpc(RpcError::new(codes::INVALID_PARAMS, "no")),
            McpError::NotFound,
            McpError::MethodNotAllowed,
            McpError::PayloadTooLarge { limit: 1 },
            McpError::LengthRequired,
            McpError::InvalidQuery("x".into()),
            McpError::CorsForbidden,
            McpError::Forbidden("Invalid Host: evil".into()),
            McpError::BadRequest("x".into()),
            McpError::CallerBusy { limit: 1 },
            McpError::CallerStreams { limit: 1 },
            McpError::Overloaded,
            McpError::GatewayTimeout,
            McpError::Internal,
        ];
        for err in all {
            assert!(!err.status().is_success(), "{err:?} answers {}", err.status());
            assert!(err.rpc().code < 0, "{err:?}");
        }
    }

    #[test]
    fn spec_statuses_and_codes() {
        assert_eq!(McpError::NoSessionId.status(), StatusCode::BAD_REQUEST);
        assert_eq!(McpError::NoSessionId.rpc().code, -32000);
        assert_eq!(McpError::InstanceAuth(InstanceAuthError::NotFound).rpc().code, -32004);
        assert_eq!(McpError::Auth(AuthError::Invalid("x".into())).rpc().code, -32002);
        assert_eq!(McpError::Auth(AuthError::InsufficientScope("s".into())).status(), StatusCode::FORBIDDEN);
        assert_eq!(McpError::SseSessionNotFound.rpc().code, -32001);
        assert_eq!(rpc_status(-32601), StatusCode::NOT_FOUND);
        assert_eq!(rpc_status(-32602), StatusCode::BAD_REQUEST);
        assert_eq!(rpc_status(-31999), StatusCode::OK, "a server's own code");
    }
}
