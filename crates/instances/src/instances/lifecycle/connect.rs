//! The connector: reaching an instance's server. A stdio child is spawned from its launch (a GitHub deployment's
//! entry point, deployed first when needed) within the sandbox; a remote server is connected with its headers and
//! the user's OAuth token; then the handshake. The process caps are the caller's (`room`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{debug, warn};

use crate::instances::deploy::Deployer;
use crate::instances::sandbox::{SandboxError, SandboxPolicy};
use crate::instances::{seat_owner, OAuthTokens, STDIO_CLOSE_GRACE};
use crate::logcapture::LogCapture;
use crate::mcp::client::{ClientOptions, McpClient};
use crate::mcp::transport::relay::{Asker, Seats};
use crate::mcp::transport::stderr::{level_of, StderrSettings};
use crate::mcp::transport::{
    SseTransport, StderrSink, StdioTransport, StreamableHttpTransport, Transport, UpstreamError,
};
use crate::model::{InstanceSpec, InstanceStatus};

/// A GitHub-deployed server's launch: the spec with its deployment's entry point, and the deployment's directory.
pub(in crate::instances) type Deployed = (InstanceSpec, PathBuf);

/// Everything it takes to reach a server.
pub(in crate::instances) struct Connector {
    /// Allow-list, argument checks, per-team directories, rlimits and isolation of stdio children.
    pub(in crate::instances) sandbox: Arc<SandboxPolicy>,
    /// The environment every stdio child starts from (already stripped of the satellite's own settings).
    pub(in crate::instances) inherited_env: BTreeMap<String, String>,
    /// The limits on a child's stderr.
    pub(in crate::instances) stderr: StderrSettings,
    /// The shared client for remote servers.
    pub(in crate::instances) http: reqwest::Client,
    /// The handshake's options, with the settings' handshake timeout.
    pub(in crate::instances) client_options: ClientOptions,
    /// Managed mode: users' OAuth tokens for remote servers that require them (BP §11).
    pub(in crate::instances) oauth: Option<Arc<dyn OAuthTokens>>,
    /// Managed mode: builds GitHub-deployed servers (SB §9.9).
    pub(in crate::instances) deployer: Option<Arc<Deployer>>,
    /// The client streams a server's requests made outside any call can reach, by owner.
    pub(in crate::instances) seats: Arc<Seats>,
    /// Where a server's stderr and its deployment's steps are logged.
    pub(in crate::instances) logs: LogCapture,
    /// Counts the junk lines a child writes to stdout.
    pub(in crate::instances) metrics: crate::metrics::Metrics,
}

impl Connector {
    /// Managed mode's deployer of GitHub servers.
    pub(in crate::instances) fn deployer(&self) -> Option<&Arc<Deployer>> {
        self.deployer.as_ref()
    }

    /// The client streams a server's requests made outside any call can reach, by owner.
    pub(in crate::instances) fn seats(&self) -> &Arc<Seats> {
        &self.seats
    }

    /// A line of the server's log (lifecycle lines besides its stderr).
    pub(in crate::instances) fn server_line(&self, spec: &InstanceSpec, level: &str, line: &str) {
        self.logs.server_line(spec, level, line);
    }

    /// Who a server's requests outside any call are asked of: the clients of the instance's member.
    pub(in crate::instances) fn asker(&self, spec: &InstanceSpec) -> Asker {
        Asker::new(self.seats.clone(), seat_owner(&spec.team_id, &spec.user_id), spec.process_id.0.clone())
    }

    /// A Streamable HTTP server's transport, with its headers (and the user's OAuth token when it needs one).
    pub(in crate::instances) async fn streamable_http(
        &self,
        spec: &InstanceSpec,
        url: &url::Url,
        headers: &BTreeMap<String, String>,
        asker: Option<Asker>,
    ) -> Result<Transport, UpstreamError> {
        let headers = self.remote_headers(spec, headers).await?;
        let label = spec.process_id.0.clone();
        let transport =
            StreamableHttpTransport::new(label, self.http.clone(), url.clone(), &headers)?.with_asker(asker);
        Ok(Transport::StreamableHttp(transport))
    }

    /// An SSE server's transport, connected, with its headers (and the user's OAuth token when it needs one).
    pub(in crate::instances) async fn sse(
        &self,
        spec: &InstanceSpec,
        url: &url::Url,
        headers: &BTreeMap<String, String>,
        timeout: std::time::Duration,
        asker: Option<Asker>,
    ) -> Result<Transport, UpstreamError> {
        let headers = self.remote_headers(spec, headers).await?;
        let label = spec.process_id.0.clone();
        let transport = SseTransport::connect(label, self.http.clone(), url.clone(), &headers, timeout, asker).await?;
        Ok(Transport::Sse(transport))
    }

    /// The spec a GitHub-deployed server launches with (its deployment's entry point) and its app directory,
    /// deployed first when needed; the deployment's log lines go to the server's. `None` for any other server.
    pub(in crate::instances) async fn deployed_launch(
        &self,
        spec: &InstanceSpec,
    ) -> Result<Option<Deployed>, UpstreamError> {
        let Some(deployment) = &spec.deployment else { return Ok(None) };
        let deployer = self
            .deployer
            .as_ref()
            .ok_or_else(|| UpstreamError::Refused("GitHub-deployed servers need a managed satellite".into()))?;
        let (logs, owner) = (self.logs.clone(), spec.clone());
        let log = move |level: &str, line: &str| logs.server_line(&owner, level, line);
        let launched = deployer.launch_spec(spec, deployment, &log).await.map_err(|err| UpstreamError::Deployment {
            step: err.step.as_str(),
            reason: err.reason,
            transient: err.transient,
        })?;
        Ok(Some(launched))
    }

    /// A stdio server's child, launched as `deployed` says when it is a GitHub deployment, within the sandbox.
    pub(in crate::instances) fn spawn_stdio(
        &self,
        spec: &InstanceSpec,
        deployed: Option<&Deployed>,
        asker: Option<Asker>,
    ) -> Result<Transport, UpstreamError> {
        let label = spec.process_id.0.clone();
        let (launch_spec, app) = match deployed {
            Some((launch, dir)) => (launch, Some(dir.as_path())),
            None => (spec, None),
        };
        let prepared = self
            .sandbox
            .prepare(launch_spec, &self.inherited_env, app)
            .map_err(|err| sandbox_refusal(err, launch_spec, &label))?;
        if !prepared.dropped_env.is_empty() {
            warn!(process_id = %label, dropped = ?prepared.dropped_env, "refused environment variables for mcp server");
        }
        let mut launch = prepared.into_stdio_launch(label, STDIO_CLOSE_GRACE, self.stderr.clone());
        launch.secrets = crate::secrets::secret_values(spec);
        launch.asker = asker;
        launch.junk_lines = Some(self.metrics.stdout_junk_lines(&spec.server_slug));
        let (logs, owner) = (self.logs.clone(), spec.clone());
        launch.stderr_sink = Some(StderrSink(Arc::new(move |line: &str| {
            logs.server_line(&owner, level_of(line), line);
        })));
        Ok(Transport::Stdio(StdioTransport::spawn(launch)?))
    }

    /// Negotiate over `transport`: the server's answer to `initialize`, or why there was none.
    pub(in crate::instances) async fn handshake(
        &self,
        spec: &InstanceSpec,
        transport: Transport,
    ) -> Result<McpClient, UpstreamError> {
        let stderr = match &transport {
            Transport::Stdio(stdio) => Some(stdio.stderr_handle()),
            _ => None,
        };
        let client = McpClient::connect(transport, &self.client_options).await.map_err(|err| {
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
        headers: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, UpstreamError> {
        let (true, Some(oauth)) = (spec.requires_oauth, self.oauth.as_ref()) else { return Ok(headers.clone()) };
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
        match (err, self.oauth.as_ref()) {
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
