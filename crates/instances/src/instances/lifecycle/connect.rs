//! Reaching an instance's server: spawning a stdio child within the process caps and the sandbox, or
//! connecting to a remote server with its headers and the user's OAuth token, then negotiating.

use std::sync::Arc;

use tracing::{debug, warn};

use crate::events::LimitedResource;
use crate::instances::limits::ProcessSlot;
use crate::instances::sandbox::SandboxError;
use crate::instances::{seat_owner, Inner, STDIO_CLOSE_GRACE};
use crate::mcp::client::McpClient;
use crate::mcp::transport::relay::Asker;
use crate::mcp::transport::stderr::{level_of, StderrSettings};
use crate::mcp::transport::{
    SseTransport, StderrSink, StdioTransport, StreamableHttpTransport, Transport, UpstreamError,
};
use crate::model::{InstanceSpec, InstanceStatus, Upstream};

impl Inner {
    /// Spawn (within the process caps and the sandbox) or connect, then negotiate.
    pub(in crate::instances) async fn connect(
        &self,
        spec: &InstanceSpec,
    ) -> Result<(McpClient, Option<ProcessSlot>), UpstreamError> {
        let label = spec.process_id.0.clone();
        let asker = Some(Asker::new(self.seats.clone(), seat_owner(&spec.team_id, &spec.user_id), label.clone()));
        let (transport, slot) = match &spec.upstream {
            Upstream::Stdio { .. } => {
                let (transport, slot) = self.spawn_stdio(spec, label, asker).await?;
                (transport, Some(slot))
            }
            Upstream::StreamableHttp { url, headers, .. } => {
                let headers = self.remote_headers(spec, headers).await?;
                let transport = StreamableHttpTransport::new(label, self.deps.http.clone(), url.clone(), &headers)?
                    .with_asker(asker);
                (Transport::StreamableHttp(transport), None)
            }
            Upstream::Sse { url, headers, timeout } => {
                let headers = self.remote_headers(spec, headers).await?;
                let transport =
                    SseTransport::connect(label, self.deps.http.clone(), url.clone(), &headers, *timeout, asker)
                        .await?;
                (Transport::Sse(transport), None)
            }
        };
        let client = self.handshake(spec, transport).await?;
        Ok((client, slot))
    }

    /// A stdio server's child, spawned within the user's process cap (the slot it holds) and the sandbox.
    async fn spawn_stdio(
        &self,
        spec: &InstanceSpec,
        label: String,
        asker: Option<Asker>,
    ) -> Result<(Transport, ProcessSlot), UpstreamError> {
        // A GitHub-deployed server runs its deployment's entry point, deployed first when needed.
        let deployed = match &spec.deployment {
            None => None,
            Some(deployment) => Some(self.deployed_launch(spec, deployment).await?),
        };
        let (launch_spec, app) = match &deployed {
            Some((launch, dir)) => (launch, Some(dir.as_path())),
            None => (spec, None),
        };
        let slot = match self.slot_for(spec).await {
            Ok(slot) => slot,
            Err(err) => {
                let limit = err.limit() as u64;
                self.limit_exceeded(spec, LimitedResource::Processes, limit, limit, err.to_string()).await;
                return Err(UpstreamError::AtCapacity(err.to_string()));
            }
        };
        let prepared = self
            .deps
            .sandbox
            .prepare(launch_spec, &self.deps.inherited_env, app)
            .map_err(|err| sandbox_refusal(err, launch_spec, &label))?;
        if !prepared.dropped_env.is_empty() {
            warn!(process_id = %label, dropped = ?prepared.dropped_env, "refused environment variables for mcp server");
        }
        let lifecycle = &self.deps.settings.lifecycle;
        let stderr = StderrSettings {
            per_second: lifecycle.log_rate_limit,
            max_line_bytes: lifecycle.log_max_line_bytes,
            warning_interval: lifecycle.log_rate_warning_interval,
        };
        let mut launch = prepared.into_stdio_launch(label, STDIO_CLOSE_GRACE, stderr);
        launch.secrets = crate::secrets::secret_values(spec);
        launch.asker = asker;
        launch.junk_lines = Some(self.deps.metrics.stdout_junk_lines(&spec.server_slug));
        let (logs, owner) = (self.deps.logs.clone(), spec.clone());
        launch.stderr_sink = Some(StderrSink(Arc::new(move |line: &str| {
            logs.server_line(&owner, level_of(line), line);
        })));
        Ok((Transport::Stdio(StdioTransport::spawn(launch)?), slot))
    }

    /// The spec a GitHub-deployed server launches with (its deployment's entry point) and its app directory,
    /// deployed first when needed; the deployment's log lines go to the server's.
    async fn deployed_launch(
        &self,
        spec: &InstanceSpec,
        deployment: &crate::model::Deployment,
    ) -> Result<(InstanceSpec, std::path::PathBuf), UpstreamError> {
        let deployer = self
            .deps
            .deployer
            .as_ref()
            .ok_or_else(|| UpstreamError::Refused("GitHub-deployed servers need a managed satellite".into()))?;
        let (logs, owner) = (self.deps.logs.clone(), spec.clone());
        let log = move |level: &str, line: &str| logs.server_line(&owner, level, line);
        deployer.launch_spec(spec, deployment, &log).await.map_err(|err| UpstreamError::Deployment {
            step: err.step.as_str(),
            reason: err.reason,
            transient: err.transient,
        })
    }

    /// Negotiate over `transport`: the server's answer to `initialize`, or why there was none.
    async fn handshake(&self, spec: &InstanceSpec, transport: Transport) -> Result<McpClient, UpstreamError> {
        let mut options = self.deps.client_options.clone();
        options.handshake_timeout = self.deps.settings.handshake_timeout;
        let stderr = match &transport {
            Transport::Stdio(stdio) => Some(stdio.stderr_handle()),
            _ => None,
        };
        let client = McpClient::connect(transport, &options).await.map_err(|err| {
            // The child's stderr usually says why a handshake failed.
            match stderr.and_then(|tail| tail.lines().pop()) {
                Some(last) => err.with_detail(&format!("last stderr line: {last}")),
                None => err,
            }
        })?;
        // A server's `serverInfo` is its own text and may hold what its configuration gave it (an echoed key).
        debug!(
            process_id = %spec.process_id,
            protocol = client.era().version(),
            server = %crate::secrets::hide(&client.server_info().to_string(), &crate::secrets::secret_values(spec)),
            "mcp server connected"
        );
        Ok(client)
    }

    /// The configured headers, plus the user's OAuth bearer token when the server requires one (BP §11: it
    /// overrides any configured `Authorization`). No token is `UpstreamError::OAuth`: `requires_reauth`; a backend
    /// that cannot say now is an error the recovery probe retries.
    pub(in crate::instances) async fn remote_headers(
        &self,
        spec: &InstanceSpec,
        headers: &std::collections::BTreeMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, String>, UpstreamError> {
        let (true, Some(oauth)) = (spec.requires_oauth, self.deps.oauth.as_ref()) else { return Ok(headers.clone()) };
        let token = oauth.bearer(spec).await.map_err(|missing| match missing {
            crate::instances::NoToken::Required(reason) => UpstreamError::OAuth(reason),
            // An error, so the recovery probe tries again (`maybe_probe`); not `requires_reauth`.
            crate::instances::NoToken::Unavailable(reason) => UpstreamError::Io(reason),
        })?;
        Ok(with_bearer(headers, &token))
    }

    /// A 401 from a server that needs the user's OAuth token: forget the token and say what to do (BP §11 rule 5).
    pub(in crate::instances) fn oauth_aware(
        &self,
        spec: &InstanceSpec,
        err: &UpstreamError,
        mapped: (InstanceStatus, String),
    ) -> (InstanceStatus, String) {
        match (err, self.deps.oauth.as_ref()) {
            (UpstreamError::HttpStatus { status: 401, .. }, Some(oauth)) if spec.requires_oauth => {
                oauth.invalidate(spec);
                let message = format!(
                    "OAuth token expired or invalid for {}. Please re-authorize this MCP server in the dashboard.",
                    spec.server_name
                );
                (InstanceStatus::RequiresReauth, message)
            }
            _ => mapped,
        }
    }
}

/// What the sandbox's refusal to prepare a launch is to the instance: a passing failure is a spawn that failed,
/// retried under the restart policy; anything else is refused for good.
fn sandbox_refusal(err: SandboxError, launch_spec: &InstanceSpec, label: &str) -> UpstreamError {
    match err {
        // Allowed but not on the host now (a runtime being installed or upgraded): a spawn that
        // failed, retried under the restart policy like a missing absolute path, not refused for good.
        SandboxError::NotInstalled { command } => UpstreamError::Spawn {
            message: format!("command {command:?} is allowed but not installed"),
            program: command,
            kind: std::io::ErrorKind::NotFound,
            detail: None,
        },
        // The instance's private directory could not be made (a full disk, a file system remounted
        // read-only for a moment): passing too, so retried under the restart policy. Refused, it
        // left the instance in error until its configuration changed.
        SandboxError::Directory { ref path, ref source } => UpstreamError::Spawn {
            message: format!("cannot prepare sandbox directory {}: {source}", path.display()),
            program: match &launch_spec.upstream {
                crate::model::Upstream::Stdio { command, .. } => command.clone(),
                _ => String::new(),
            },
            kind: source.kind(),
            detail: None,
        },
        err => {
            warn!(process_id = %label, error = %err, "mcp server refused by the sandbox");
            UpstreamError::Refused(err.to_string())
        }
    }
}

/// `headers` with `Authorization: Bearer <token>`, replacing any configured authorization header.
pub(in crate::instances) fn with_bearer(
    headers: &std::collections::BTreeMap<String, String>,
    token: &str,
) -> std::collections::BTreeMap<String, String> {
    let mut out: std::collections::BTreeMap<String, String> = headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert("Authorization".into(), format!("Bearer {token}"));
    out
}

pub(in crate::instances) fn process_pid(client: &McpClient) -> Option<u32> {
    match client.transport() {
        Transport::Stdio(stdio) => stdio.pid(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oauth_token_replaces_any_configured_authorization() {
        let configured: std::collections::BTreeMap<String, String> =
            [("authorization".to_owned(), "Bearer team".to_owned()), ("X-Api-Key".to_owned(), "k".to_owned())]
                .into_iter()
                .collect();
        let headers = with_bearer(&configured, "ya29.user");
        assert_eq!(headers.len(), 2);
        assert_eq!(headers["Authorization"], "Bearer ya29.user");
        assert_eq!(headers["X-Api-Key"], "k");
    }
}
