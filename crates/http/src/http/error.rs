//! The one error type of the MCP edge: every way a request to `/mcp`, `/i/{path}/mcp`, `/sse` or `/message`
//! fails, each with exactly one HTTP status and one JSON-RPC error (SB §3, §4, §5.3, §6.1). Handlers return
//! `Result<Response, McpError>`; `into_response` is the only place these errors become responses.

use warp::http::{HeaderValue, StatusCode};
use warp::reply::Response;

use super::allow::Methods;
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
    /// DELETE from a 2026-07-28 client: the revision has no sessions to end.
    NoSessions,
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
    /// A method no route of the path takes; `allow`: what they take (RFC 9110 §15.5.6: named in `Allow`).
    MethodNotAllowed {
        allow: Methods,
    },
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
    /// The request's body did not arrive whole within the body-read timeout (`seconds`).
    RequestTimeout {
        seconds: u64,
    },
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
        if let Some(allow) = self.allow() {
            response.headers_mut().insert(warp::http::header::ALLOW, allow.header());
        }
        if matches!(self, McpError::CallerBusy { .. }) {
            response.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
        }
        if matches!(self, McpError::Auth(AuthError::Unavailable(_))) {
            response.headers_mut().insert("retry-after", HeaderValue::from(super::oauth::RETRY_AFTER_SECONDS));
        }
        response
    }

    /// What a 405 names in `Allow`: what the route takes, or for a GET of a 2026-07-28 client (which has no server
    /// stream) what that era takes: POST, and the CORS preflight.
    fn allow(&self) -> Option<Methods> {
        match self {
            McpError::MethodNotAllowed { allow } => Some(*allow),
            McpError::NoServerStream | McpError::NoSessions => Some(Methods::POST.and(Methods::OPTIONS)),
            _ => None,
        }
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
            McpError::NoServerStream | McpError::NoSessions | McpError::MethodNotAllowed { .. } => {
                StatusCode::METHOD_NOT_ALLOWED
            }
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
            McpError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            McpError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            McpError::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            McpError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON-RPC error object of this error (a bearer failure's is the challenge's, with its data).
    pub fn rpc(&self) -> RpcError {
        match self {
            McpError::Auth(err) => challenge(err, &ResourceUrls { public_url: String::new() }).error,
            McpError::Rpc(err) => err.clone(),
            _ => RpcError::new(self.code(), self.message()),
        }
    }

    /// The JSON-RPC error code of this error.
    fn code(&self) -> i64 {
        match self {
            McpError::Parse(_) => codes::PARSE_ERROR,
            McpError::EmptyBatch
            | McpError::BatchTooLarge { .. }
            | McpError::InitializeInBatch
            | McpError::AlreadyInitialized
            | McpError::TwoAuthorizations
            | McpError::MissingSseSession
            | McpError::PayloadTooLarge { .. }
            | McpError::LengthRequired
            | McpError::InvalidQuery(_)
            | McpError::BadRequest(_) => codes::INVALID_REQUEST,
            McpError::SessionNotFound
            | McpError::SseSessionNotFound
            | McpError::SseSessionOfAnother
            | McpError::SseStreamClosed => codes::UNAUTHORIZED,
            McpError::InstanceAuth(err) => match err {
                InstanceAuthError::NotFound => codes::FORBIDDEN,
                InstanceAuthError::BadFormat | InstanceAuthError::Invalid => codes::UNAUTHORIZED,
                InstanceAuthError::NotConfigured => codes::TRANSPORT_ERROR,
            },
            McpError::UnsupportedMediaType
            | McpError::NotAcceptable { .. }
            | McpError::UnsupportedVersion(_)
            | McpError::NoSessionId
            | McpError::InvalidSession
            | McpError::MalformedSession
            | McpError::StreamConflict
            | McpError::NoServerStream
            | McpError::NoSessions
            | McpError::NotFound
            | McpError::MethodNotAllowed { .. }
            | McpError::CorsForbidden
            | McpError::Forbidden(_)
            | McpError::CallerBusy { .. }
            | McpError::CallerStreams { .. }
            | McpError::RequestTimeout { .. }
            | McpError::Overloaded
            | McpError::GatewayTimeout
            | McpError::Internal => codes::TRANSPORT_ERROR,
            McpError::Auth(_) | McpError::Rpc(_) => self.rpc().code,
        }
    }

    /// What the JSON-RPC error of this error says.
    fn message(&self) -> String {
        match self {
            McpError::UnsupportedMediaType => "Unsupported Media Type: Content-Type must be application/json".into(),
            McpError::NotAcceptable { stream_only: false } => {
                "Not Acceptable: Client must accept both application/json and text/event-stream".into()
            }
            McpError::NotAcceptable { stream_only: true } => {
                "Not Acceptable: Client must accept text/event-stream".into()
            }
            McpError::Parse(err) => format!("Parse error: {err}"),
            McpError::EmptyBatch => "Invalid Request: empty batch".into(),
            McpError::BatchTooLarge { messages, max } => {
                format!("Invalid Request: a batch of {messages} messages; at most {max} are answered in one")
            }
            McpError::InitializeInBatch => "Invalid Request: initialize must not be batched with other messages".into(),
            McpError::AlreadyInitialized => "Invalid Request: Server already initialized".into(),
            McpError::UnsupportedVersion(version) => format!("Bad Request: Unsupported protocol version: {version}"),
            McpError::NoSessionId => "Bad Request: No session ID provided".into(),
            McpError::InvalidSession => "Invalid or missing session ID".into(),
            McpError::MalformedSession => "Bad Request: session ID must be 1-128 visible ASCII characters".into(),
            McpError::SessionNotFound | McpError::SseSessionNotFound => "Session not found".into(),
            McpError::StreamConflict => "Conflict: Only one SSE stream is allowed per session".into(),
            McpError::NoServerStream => "2026-07-28 has no server stream".into(),
            McpError::NoSessions => "2026-07-28 has no sessions to end".into(),
            McpError::TwoAuthorizations => format!("Bad Request: {TWO_AUTHORIZATIONS}"),
            McpError::InstanceAuth(err) => err.to_string(),
            McpError::MissingSseSession => "Missing session parameter".into(),
            McpError::SseSessionOfAnother => "Session belongs to another identity".into(),
            McpError::SseStreamClosed => "Session stream closed".into(),
            McpError::NotFound => "Not Found".into(),
            McpError::MethodNotAllowed { .. } => "Method Not Allowed".into(),
            McpError::PayloadTooLarge { limit } => format!("Request body larger than {limit} bytes"),
            McpError::LengthRequired => "Content-Length required".into(),
            McpError::InvalidQuery(err) => format!("Invalid query: {err}"),
            McpError::CorsForbidden => "CORS request forbidden".into(),
            McpError::Forbidden(reason) => format!("Forbidden: {reason}"),
            McpError::BadRequest(err) => format!("Bad Request: {err}"),
            McpError::CallerBusy { .. }
            | McpError::CallerStreams { .. }
            | McpError::RequestTimeout { .. }
            | McpError::Overloaded
            | McpError::GatewayTimeout => self.limit_message(),
            McpError::Internal => "Internal server error".into(),
            McpError::Auth(_) | McpError::Rpc(_) => self.rpc().message,
        }
    }

    /// What the JSON-RPC error of a limit reached says: which limit, and what to do.
    fn limit_message(&self) -> String {
        match self {
            McpError::CallerBusy { limit } => {
                format!("Too Many Requests: {limit} requests of this caller are in flight already; retry when one ends")
            }
            McpError::CallerStreams { limit } => {
                format!("Too Many Requests: {limit} streams of this caller are open already; close one to open another")
            }
            McpError::RequestTimeout { seconds } => {
                format!("Request Timeout: the request body did not arrive whole within {seconds} s")
            }
            McpError::Overloaded => "Service Unavailable: too many concurrent requests, retry shortly".into(),
            McpError::GatewayTimeout => "Gateway Timeout: the request took too long".into(),
            _ => self.status().to_string(),
        }
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
            McpError::NoSessions,
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
            McpError::MethodNotAllowed { allow: Methods::GET },
            McpError::PayloadTooLarge { limit: 1 },
            McpError::LengthRequired,
            McpError::InvalidQuery("x".into()),
            McpError::CorsForbidden,
            McpError::Forbidden("Invalid Host: evil".into()),
            McpError::BadRequest("x".into()),
            McpError::CallerBusy { limit: 1 },
            McpError::CallerStreams { limit: 1 },
            McpError::RequestTimeout { seconds: 30 },
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

    /// A 405 names what may be asked instead (RFC 9110 §15.5.6); no other error carries `Allow`.
    #[test]
    fn a_405_carries_allow() {
        let urls = ResourceUrls { public_url: String::new() };
        let allow = |err: McpError| err.into_response(&urls).headers().get("allow").cloned();
        assert_eq!(allow(McpError::NoServerStream), Some(HeaderValue::from_static("POST, OPTIONS")));
        let refused = McpError::MethodNotAllowed { allow: Methods::GET.and(Methods::POST) };
        assert_eq!(allow(refused), Some(HeaderValue::from_static("GET, POST")));
        assert_eq!(allow(McpError::NotFound), None);
    }
}
