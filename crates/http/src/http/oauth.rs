//! OAuth resource-server surface: the error answers of SB §5.3 with their
//! `WWW-Authenticate` headers, the `Link` header, and the discovery documents
//! of SB §5.6 (RFC 9728, RFC 8414).

use serde_json::json;
use warp::http::StatusCode;
use warp::reply::Response;
use warp::Filter;

use super::json_response;
use crate::auth::{AuthError, Authenticator, SCOPE_EXECUTE, SCOPE_READ};
use crate::mcp::protocol::{codes, RpcError};

const REALM: &str = "DeployStack MCP Satellite";

/// Where the resource metadata lives, derived from the public URL.
#[derive(Clone, Debug)]
pub struct ResourceUrls {
    pub public_url: String,
}

impl ResourceUrls {
    pub fn metadata(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource", self.public_url)
    }

    pub fn resource(&self) -> String {
        format!("{}/mcp", self.public_url)
    }

    pub fn link_header(&self) -> &'static str {
        "</.well-known/oauth-protected-resource>; rel=\"oauth-protected-resource\""
    }
}

/// What a client refused because its token could not be checked is told to wait (`Retry-After`).
pub const RETRY_AFTER_SECONDS: u64 = 5;

/// The §5.3 answer to a failed bearer authentication: status, `WWW-Authenticate` value, JSON-RPC error.
pub struct Challenge {
    pub status: StatusCode,
    pub www_authenticate: String,
    pub error: RpcError,
}

/// The §5.3 answer to the bearer failure `err`: its challenge header with its status, and its JSON-RPC error.
pub fn challenge(err: &AuthError, urls: &ResourceUrls) -> Challenge {
    let rm = urls.metadata();
    let (status, www_authenticate) = www_authenticate(err, &rm);
    Challenge { status, www_authenticate, error: rpc_error(err, &rm) }
}

/// The status and the `WWW-Authenticate` value (RFC 6750 §3) of a failed bearer authentication; `rm`: the
/// resource metadata URL.
fn www_authenticate(err: &AuthError, rm: &str) -> (StatusCode, String) {
    match err {
        AuthError::Missing => (
            StatusCode::UNAUTHORIZED,
            format!("Bearer realm=\"{REALM}\", resource_metadata=\"{rm}\", scope=\"{SCOPE_READ} {SCOPE_EXECUTE}\", error=\"invalid_token\", error_description=\"Bearer token required\""),
        ),
        AuthError::Invalid(description) => (
            StatusCode::UNAUTHORIZED,
            format!("Bearer realm=\"{REALM}\", resource_metadata=\"{rm}\", error=\"invalid_token\", error_description=\"{}\"", description.replace('"', "'")),
        ),
        AuthError::InsufficientScope(scope) => (
            StatusCode::FORBIDDEN,
            format!("Bearer realm=\"{REALM}\", resource_metadata=\"{rm}\", scope=\"{scope}\", error=\"insufficient_scope\", error_description=\"Token missing required scope: {scope}\""),
        ),
        // BP §10: the control plane could not be asked: `server_error`, never `invalid_token`, which tells an OAuth
        // client to drop its token and sign in again.
        AuthError::Unavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Bearer realm=\"{REALM}\", resource_metadata=\"{rm}\", error=\"server_error\", error_description=\"The token cannot be checked now; retry shortly\""),
        ),
        AuthError::NotAdmin => (
            StatusCode::FORBIDDEN,
            format!("Bearer realm=\"{REALM}\", error=\"insufficient_scope\", error_description=\"{err}\""),
        ),
        AuthError::NotMember => (
            StatusCode::FORBIDDEN,
            format!("Bearer realm=\"{REALM}\", resource_metadata=\"{rm}\", error=\"insufficient_scope\", error_description=\"{err}\""),
        ),
    }
}

/// The JSON-RPC error of a failed bearer authentication, its data saying the same as the challenge (the OAuth
/// error, and where the resource metadata is) for a client that reads only the body.
fn rpc_error(err: &AuthError, rm: &str) -> RpcError {
    match err {
        AuthError::Missing => RpcError::new(codes::UNAUTHORIZED, "Authentication required").with_data(json!({
            "message": "Bearer token required", "oauth_error": "invalid_token",
            "resource_metadata_uri": rm, "scopes_required": [SCOPE_READ],
        })),
        AuthError::Invalid(description) => RpcError::new(codes::INVALID_TOKEN, "Invalid token").with_data(json!({
            "message": description, "oauth_error": "invalid_token", "resource_metadata_uri": rm,
        })),
        AuthError::InsufficientScope(scope) => RpcError::new(codes::FORBIDDEN, "Insufficient scope").with_data(json!({
            "message": format!("Token missing required scope: {scope}"), "oauth_error": "insufficient_scope",
            "required_scopes": [scope], "resource_metadata_uri": rm,
        })),
        AuthError::Unavailable(_) => {
            RpcError::new(codes::INTERNAL_ERROR, "The token cannot be checked now; retry shortly").with_data(json!({
                "message": "The control plane that checks tokens is unreachable", "oauth_error": "server_error",
                "retry_after_seconds": RETRY_AFTER_SECONDS,
            }))
        }
        AuthError::NotAdmin => {
            RpcError::new(codes::FORBIDDEN, "Admin role required").with_data(json!({"message": err.to_string()}))
        }
        AuthError::NotMember => RpcError::new(codes::FORBIDDEN, "Not a member of the team").with_data(json!({
            "message": err.to_string(), "oauth_error": "insufficient_scope", "resource_metadata_uri": rm,
        })),
    }
}

/// `/.well-known/oauth-protected-resource` and the authorization-server metadata.
pub fn routes(
    urls: ResourceUrls,
    auth: Authenticator,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    // One pointer each: warp clones a route's filters (and so what they capture) for every request it tries.
    let (urls, auth) = (std::sync::Arc::new(urls), std::sync::Arc::new(auth));
    let resource = {
        let auth = auth.clone();
        warp::path!(".well-known" / "oauth-protected-resource" / ..).and(super::allow::cors_get()).map(move || {
            let servers: Vec<String> = auth.directory().authorization_server.clone().into_iter().collect();
            json_response(
                StatusCode::OK,
                &json!({
                    "resource": urls.resource(),
                    "authorization_servers": servers,
                    "scopes_supported": [SCOPE_READ, SCOPE_EXECUTE],
                    "bearer_methods_supported": ["header"],
                    "resource_documentation": "https://docs.deploystack.io/",
                }),
            )
        })
    };
    let metadata = move || {
        let auth = auth.clone();
        move || match auth.directory().authorization_server.clone() {
            Some(bp) => json_response(
                StatusCode::OK,
                &json!({
                    "issuer": bp,
                    "authorization_endpoint": format!("{bp}/api/oauth2/auth"),
                    "token_endpoint": format!("{bp}/api/oauth2/token"),
                    "introspection_endpoint": format!("{bp}/api/oauth2/introspect"),
                    "registration_endpoint": format!("{bp}/api/oauth2/register"),
                    "response_types_supported": ["code"],
                    "grant_types_supported": ["authorization_code", "refresh_token"],
                    "code_challenge_methods_supported": ["S256"],
                    "scopes_supported": [SCOPE_READ, SCOPE_EXECUTE, "offline_access"],
                }),
            ),
            None => json_response(
                StatusCode::NOT_FOUND,
                &json!({"error": "not_found", "message": "no authorization server is configured (auth.authorization_server)"}),
            ),
        }
    };
    let oauth_as =
        warp::path!(".well-known" / "oauth-authorization-server" / ..).and(super::allow::cors_get()).map(metadata());
    let openid = warp::path!(".well-known" / "openid-configuration" / ..).and(super::allow::cors_get()).map(metadata());
    resource.or(oauth_as).unify().or(openid).unify()
}
