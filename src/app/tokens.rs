//! `satellite tokens`: connect to MCP servers (a stdio command, a URL, or every installation of a config file),
//! list their tools, and print each tool's token count and what the hierarchical router would save, counted
//! exactly as the satellite counts them (SB §15) and against the same measured meta-tools.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use url::Url;

use crate::analytics::report::CONTEXT_WINDOW;
use crate::config::env::Env;
use crate::config::Config;
use crate::mcp::client::{ClientOptions, McpClient};
use crate::mcp::transport::{
    ResourceLimits, SseTransport, StdioLaunch, StdioTransport, StreamableHttpTransport, Transport,
};
use crate::model::{InstanceSpec, Upstream};

/// One server to measure.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub how: How,
}

#[derive(Debug, Clone)]
pub enum How {
    /// A command run directly (the operator's own), with the inherited environment.
    Command {
        program: String,
        args: Vec<String>,
    },
    Http {
        url: Url,
        headers: BTreeMap<String, String>,
        sse: bool,
    },
    /// An instance of a config file, started as `serve` would start it (sandbox included).
    Spec(Box<InstanceSpec>),
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCount {
    pub name: String,
    pub tokens: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerCount {
    pub server: String,
    /// Set when the server could not be reached or listed; its tools are then empty.
    pub error: Option<String>,
    pub tools: Vec<ToolCount>,
    pub tokens: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenReport {
    pub servers: Vec<ServerCount>,
    pub tools: u64,
    /// What listing every tool costs a client's context.
    pub tokens: u64,
    /// What the four meta-tools cost instead, counted the same way.
    pub meta_tool_tokens: u64,
    pub saved_tokens: i64,
    pub saved_ratio: Option<f64>,
    pub context_window: u64,
    /// Share of a 200k context the full listing takes.
    pub context_share: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("{0}")]
    Config(String),
    #[error("token counting failed: {0}")]
    Count(#[from] crate::tokens::TokenError),
}

/// Every enabled installation of a standalone config, once each (its first user's instance: tools are the
/// server's, whoever runs it).
pub fn targets_of_config(
    config: &Config,
    env: &Env,
) -> Result<(Vec<Target>, crate::instances::sandbox::SandboxPolicy), TokensError> {
    let sandbox = crate::instances::sandbox::SandboxPolicy::for_config(config, env)
        .map_err(|e| TokensError::Config(e.to_string()))?;
    let standalone = super::initial_standalone(config).map_err(|e| TokensError::Config(e.to_string()))?;
    let mut seen = std::collections::BTreeSet::new();
    let mut targets = Vec::new();
    for spec in standalone.desired_state().instances.into_values() {
        if spec.enabled && seen.insert(spec.installation_id.clone()) {
            targets.push(Target { name: spec.server_slug.clone(), how: How::Spec(Box::new(spec)) });
        }
    }
    Ok((targets, sandbox))
}

async fn connect(
    target: &Target,
    env: &Env,
    sandbox: Option<&crate::instances::sandbox::SandboxPolicy>,
    timeout: Duration,
) -> Result<McpClient, String> {
    let inherited = crate::instances::sandbox::inherited_env(env);
    let http = || reqwest::Client::builder().timeout(timeout).build().map_err(|e| e.to_string());
    let name = target.name.clone();
    let transport = match &target.how {
        How::Command { program, args } => command_transport(name, program, args, inherited)?,
        How::Http { url, headers, sse: false } => Transport::StreamableHttp(
            StreamableHttpTransport::new(name, http()?, url.clone(), headers).map_err(|e| e.to_string())?,
        ),
        How::Http { url, headers, sse: true } => Transport::Sse(
            SseTransport::connect(name, http()?, url.clone(), headers, timeout, None)
                .await
                .map_err(|e| e.to_string())?,
        ),
        How::Spec(spec) => match &spec.upstream {
            Upstream::Stdio { .. } => {
                let sandbox = sandbox.ok_or("no sandbox policy for a config's stdio server")?;
                let prepared = sandbox.prepare(spec, &inherited, None).map_err(|e| e.to_string())?;
                let mut launch =
                    prepared.into_stdio_launch(spec.process_id.0.clone(), Duration::from_secs(1), Default::default());
                launch.secrets = crate::secrets::secret_values(spec);
                Transport::Stdio(StdioTransport::spawn(launch).map_err(|e| e.to_string())?)
            }
            Upstream::StreamableHttp { url, headers, .. } => Transport::StreamableHttp(
                StreamableHttpTransport::new(name, http()?, url.clone(), headers).map_err(|e| e.to_string())?,
            ),
            Upstream::Sse { url, headers, timeout } => Transport::Sse(
                SseTransport::connect(name, http()?, url.clone(), headers, *timeout, None)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        },
    };
    let options = ClientOptions { handshake_timeout: timeout, ..ClientOptions::default() };
    McpClient::connect(transport, &options).await.map_err(|e| e.to_string())
}

/// A command given on the command line, spawned as it is (outside the sandbox, as its user would run it).
fn command_transport(
    label: String,
    program: &str,
    args: &[String],
    env: BTreeMap<String, String>,
) -> Result<Transport, String> {
    let launch = StdioLaunch {
        label,
        command: program.to_owned(),
        args: args.to_vec(),
        env,
        cwd: None,
        close_grace: Duration::from_secs(1),
        stderr: Default::default(),
        stderr_sink: None,
        junk: Default::default(),
        junk_lines: None,
        limits: ResourceLimits::default(),
        secrets: Vec::new(),
        asker: None,
    };
    Ok(Transport::Stdio(StdioTransport::spawn(launch).map_err(|e| e.to_string())?))
}

/// Connect to each target in turn, list and count its tools. A server that fails is reported with its error;
/// the others are still counted.
pub async fn measure(
    targets: &[Target],
    env: &Env,
    sandbox: Option<&crate::instances::sandbox::SandboxPolicy>,
    timeout: Duration,
) -> Result<TokenReport, TokensError> {
    let mut servers = Vec::new();
    for target in targets {
        let listed = match connect(target, env, sandbox, timeout).await {
            Ok(client) => {
                let found = crate::discovery::discover(&client, timeout).await.map_err(|e| e.to_string());
                client.close().await;
                found
            }
            Err(err) => Err(err),
        };
        servers.push(match listed {
            Ok(catalog) => {
                let counts = crate::tokens::count_tools(catalog.tools.clone()).await?;
                let tools: Vec<ToolCount> = catalog
                    .tools
                    .iter()
                    .zip(counts)
                    .map(|(t, n)| ToolCount { name: t.name().to_owned(), tokens: n as u64 })
                    .collect();
                ServerCount {
                    server: target.name.clone(),
                    error: None,
                    tokens: tools.iter().map(|t| t.tokens).sum(),
                    tools,
                }
            }
            Err(err) => ServerCount { server: target.name.clone(), error: Some(err), tools: Vec::new(), tokens: 0 },
        });
    }
    let meta = crate::router::meta::cost().await?;
    let tokens: u64 = servers.iter().map(|s| s.tokens).sum();
    let saved = tokens as i64 - meta.tokens as i64;
    Ok(TokenReport {
        tools: servers.iter().map(|s| s.tools.len() as u64).sum(),
        tokens,
        meta_tool_tokens: meta.tokens,
        saved_tokens: saved,
        saved_ratio: (tokens > 0).then(|| saved as f64 / tokens as f64),
        context_window: CONTEXT_WINDOW,
        context_share: tokens as f64 / CONTEXT_WINDOW as f64,
        servers,
    })
}

/// The report as a table: one line per tool, a total per server, then the comparison.
pub fn table(report: &TokenReport) -> String {
    let width = report
        .servers
        .iter()
        .flat_map(|s| s.tools.iter().map(|t| t.name.len()))
        .chain(report.servers.iter().map(|s| s.server.len()))
        .max()
        .unwrap_or(10)
        .clamp(10, 60);
    let mut out = String::new();
    let _ = writeln!(out, "{:<w$}  {:>8}", "TOOL", "TOKENS", w = width);
    for server in &report.servers {
        let _ = writeln!(out, "{}", server.server);
        if let Some(err) = &server.error {
            let _ = writeln!(out, "  error: {err}");
            continue;
        }
        for tool in &server.tools {
            let _ = writeln!(out, "  {:<w$}{:>8}", tool.name, tool.tokens, w = width);
        }
        let _ = writeln!(out, "  {:<w$}{:>8}  ({} tools)", "total", server.tokens, server.tools.len(), w = width);
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Listing every tool: {} tools, {} tokens ({:.1}% of a {}k context).",
        report.tools,
        report.tokens,
        report.context_share * 100.0,
        report.context_window / 1000
    );
    let _ = writeln!(out, "Through the hierarchical router: the four meta-tools, {} tokens.", report.meta_tool_tokens);
    match report.saved_ratio {
        Some(ratio) if report.saved_tokens >= 0 => {
            let _ = writeln!(out, "Saved per listing: {} tokens ({:.1}%).", report.saved_tokens, ratio * 100.0);
        }
        _ => {
            let _ = writeln!(
                out,
                "Saved per listing: none; the meta-tools cost {} tokens more than these tools.",
                -report.saved_tokens
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_every_tool_each_total_and_a_failed_server() {
        let report = TokenReport {
            servers: vec![
                ServerCount {
                    server: "demo".into(),
                    error: None,
                    tools: vec![ToolCount { name: "echo".into(), tokens: 60 }],
                    tokens: 60,
                },
                ServerCount {
                    server: "gone".into(),
                    error: Some("connection refused".into()),
                    tools: vec![],
                    tokens: 0,
                },
            ],
            tools: 1,
            tokens: 60,
            meta_tool_tokens: 500,
            saved_tokens: -440,
            saved_ratio: Some(-440.0 / 60.0),
            context_window: 200_000,
            context_share: 0.0003,
        };
        let text = table(&report);
        assert!(text.contains("  echo") && text.contains("60"), "{text}");
        assert!(text.contains("error: connection refused"), "{text}");
        assert!(text.contains("none; the meta-tools cost 440 tokens more"), "{text}");
    }
}
