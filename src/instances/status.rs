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
    if let (Some(UpstreamError::Spawn(detail)), Upstream::Stdio { .. }) = (err, upstream) {
        let lower = detail.to_ascii_lowercase();
        if lower.contains("permission denied") {
            return (InstanceStatus::Error, format!("Permission error: {detail}"));
        }
        return (InstanceStatus::Error, format!("Failed to spawn MCP server: {detail}"));
    }
    match upstream {
        Upstream::Stdio { .. } => match err {
            Some(UpstreamError::Closed(_) | UpstreamError::Timeout { .. }) => {
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

    #[test]
    fn stdio_failures_map_as_specified() {
        let spawn = UpstreamError::Spawn("nope: No such file or directory".into());
        let (status, message) = status_for(&stdio(), &Failure::Connect(&spawn));
        assert_eq!(status, InstanceStatus::Error);
        assert!(message.starts_with("Failed to spawn MCP server: "));
        let denied = UpstreamError::Spawn("x: Permission denied".into());
        assert!(status_for(&stdio(), &Failure::Connect(&denied)).1.starts_with("Permission error"));
        let died = UpstreamError::Closed("child process has died".into());
        assert_eq!(status_for(&stdio(), &Failure::Connect(&died)).0, InstanceStatus::Offline);
        let garbage = UpstreamError::Protocol("invalid initialization response".into());
        assert_eq!(status_for(&stdio(), &Failure::Connect(&garbage)).0, InstanceStatus::Error);
    }
}
