//! From a failure to the status an instance takes (SB §10.4, §11.3).

use crate::discovery::DiscoveryError;
use crate::mcp::transport::UpstreamError;
use crate::model::{InstanceStatus, Upstream};

/// What happened, for the status mapping.
#[derive(Debug)]
pub enum Failure<'a> {
    /// Spawn or handshake.
    Connect(&'a UpstreamError),
    Discovery(&'a DiscoveryError),
    /// A forwarded call failed at the transport (not a tool's own JSON-RPC error).
    Call(&'a UpstreamError),
}

/// The status and message an instance takes after a failure.
pub fn status_for(upstream: &Upstream, failure: &Failure<'_>) -> (InstanceStatus, String) {
    let (err, context): (Option<&UpstreamError>, String) = match failure {
        Failure::Connect(err) | Failure::Call(err) => (Some(err), err.to_string()),
        Failure::Discovery(err) => (err.upstream(), err.to_string()),
    };
    if let Some(mapped) = err.and_then(status_on_any_transport) {
        return mapped;
    }
    match upstream {
        Upstream::Stdio { .. } => match err {
            Some(UpstreamError::Exited { .. } | UpstreamError::Closed(_) | UpstreamError::Timeout { .. }) => {
                (InstanceStatus::Offline, format!("Process error: {context}"))
            }
            _ => (InstanceStatus::Error, context),
        },
        Upstream::StreamableHttp { .. } | Upstream::Sse { .. } => match err {
            Some(UpstreamError::HttpStatus { status: 401, .. }) => {
                (InstanceStatus::RequiresReauth, "Authentication failed (HTTP 401)".into())
            }
            Some(UpstreamError::HttpStatus { status: 403, .. }) => {
                (InstanceStatus::RequiresReauth, "Access forbidden (HTTP 403)".into())
            }
            Some(UpstreamError::Connect(_) | UpstreamError::Timeout { .. }) => {
                (InstanceStatus::Offline, "Server unreachable".into())
            }
            _ => (InstanceStatus::Error, context),
        },
    }
}

/// The failures whose status is the same on every transport: a spawn that failed or was refused, the process caps,
/// no OAuth token, a GitHub deployment that failed.
fn status_on_any_transport(err: &UpstreamError) -> Option<(InstanceStatus, String)> {
    match err {
        UpstreamError::Spawn { program, kind, message, detail } => {
            let what = if *kind == std::io::ErrorKind::PermissionDenied {
                "Permission error"
            } else {
                "Failed to spawn MCP server"
            };
            let detail = detail.as_deref().map(|d| format!("; {d}")).unwrap_or_default();
            Some((InstanceStatus::Error, format!("{what}: {program}: {message}{detail}")))
        }
        UpstreamError::Refused(reason) => {
            Some((InstanceStatus::Error, format!("Failed to spawn MCP server: {reason}")))
        }
        UpstreamError::AtCapacity(reason) => {
            let message = format!(
                "Failed to spawn MCP server: {reason}, each busy; it starts as soon as one of them stops or falls idle"
            );
            Some((InstanceStatus::Error, message))
        }
        UpstreamError::OAuth(reason) => Some((InstanceStatus::RequiresReauth, reason.clone())),
        UpstreamError::Deployment { transient, .. } => {
            let again = if *transient { "; it is tried again shortly" } else { "" };
            Some((InstanceStatus::Error, format!("{err}{again}")))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn http() -> Upstream {
        Upstream::StreamableHttp {
            url: "http://x/mcp".parse().unwrap(),
            headers: BTreeMap::new(),
            timeout: Duration::from_secs(1),
        }
    }

    fn stdio() -> Upstream {
        Upstream::Stdio { command: "x".into(), args: vec![], env: BTreeMap::new() }
    }

    #[test]
    fn remote_failures_map_as_specified() {
        let cases = [
            (UpstreamError::HttpStatus { status: 401, body: String::new() }, InstanceStatus::RequiresReauth),
            (UpstreamError::HttpStatus { status: 403, body: String::new() }, InstanceStatus::RequiresReauth),
            (UpstreamError::Connect("refused".into()), InstanceStatus::Offline),
            (UpstreamError::Timeout { method: "initialize".into(), after: Duration::ZERO }, InstanceStatus::Offline),
            (UpstreamError::HttpStatus { status: 500, body: String::new() }, InstanceStatus::Error),
            (UpstreamError::Protocol("bad".into()), InstanceStatus::Error),
        ];
        for (err, expected) in cases {
            assert_eq!(status_for(&http(), &Failure::Connect(&err)).0, expected, "{err}");
        }
    }

    fn spawn_error(kind: std::io::ErrorKind, message: &str) -> UpstreamError {
        UpstreamError::Spawn { program: "npx".into(), kind, message: message.into(), detail: None }
    }

    #[test]
    fn stdio_failures_map_as_specified() {
        let spawn = spawn_error(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let (status, message) = status_for(&stdio(), &Failure::Connect(&spawn));
        assert_eq!(status, InstanceStatus::Error);
        assert_eq!(message, "Failed to spawn MCP server: npx: No such file or directory (os error 2)");
        let died = UpstreamError::Exited {
            label: "p".into(),
            exit: crate::mcp::transport::ExitInfo::Exited { code: Some(1), signal: None },
            detail: None,
        };
        assert_eq!(status_for(&stdio(), &Failure::Connect(&died)).0, InstanceStatus::Offline);
        let closed = UpstreamError::Closed("stdout closed".into());
        assert_eq!(status_for(&stdio(), &Failure::Call(&closed)).0, InstanceStatus::Offline);
        let garbage = UpstreamError::Protocol("invalid initialization response".into());
        assert_eq!(status_for(&stdio(), &Failure::Connect(&garbage)).0, InstanceStatus::Error);
        let refused = UpstreamError::Refused("SECURITY: command not allowed".into());
        assert!(status_for(&stdio(), &Failure::Connect(&refused))
            .1
            .starts_with("Failed to spawn MCP server: SECURITY"));
    }

    /// The permission case is decided by the error kind the OS gave, whatever the message says.
    #[test]
    fn permission_errors_are_recognised_by_kind_not_wording() {
        let denied = spawn_error(std::io::ErrorKind::PermissionDenied, "Zugriff verweigert");
        assert!(status_for(&stdio(), &Failure::Connect(&denied)).1.starts_with("Permission error"));
        let worded = spawn_error(std::io::ErrorKind::NotFound, "Permission denied, supposedly");
        assert!(status_for(&stdio(), &Failure::Connect(&worded)).1.starts_with("Failed to spawn"));
    }

    /// A missing OAuth token is `requires_reauth` with the backend's reason, whatever the reason's wording.
    #[test]
    fn oauth_refusals_require_reauth_whatever_the_text() {
        let refused = UpstreamError::OAuth("no token: ask an admin".into());
        assert_eq!(
            status_for(&http(), &Failure::Connect(&refused)),
            (InstanceStatus::RequiresReauth, "no token: ask an admin".to_owned())
        );
        let body_says_oauth = UpstreamError::HttpStatus { status: 500, body: "OAuth token expired".into() };
        assert_eq!(status_for(&http(), &Failure::Connect(&body_says_oauth)).0, InstanceStatus::Error);
    }
}
