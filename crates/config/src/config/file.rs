//! The standalone config file as written on disk (TOML), mirrored by serde
//! with `deny_unknown_fields`. Validation into typed values happens in
//! `config::standalone` and `config::mod`; nothing here checks meaning.

use std::collections::BTreeMap;

use schemars::JsonSchema;

pub use super::file_rules::{RawAccessRule, RawLimit, RawQuota, RawRate};
use serde::Deserialize;

use super::{env, ConfigError};

/// Read and parse a standalone file; a TOML error becomes one line with its position.
pub fn read_file(path: &std::path::Path) -> Result<RawFile, ConfigError> {
    parse_file_at(&read_text(path)?, path)
}

/// The standalone file's text.
/// An empty one is refused, as on a reload: caught half-written (truncated, not yet filled), it would start the
/// satellite with no servers and delete every stored catalog as an orphan.
pub fn read_text(path: &std::path::Path) -> Result<String, ConfigError> {
    let bytes = read_bounded(path).map_err(|err| file_error(format!("cannot read {}: {err}", path.display())))?;
    let text = String::from_utf8(bytes).map_err(|_| file_error(format!("{} is not UTF-8 text", path.display())))?;
    if text.trim().is_empty() {
        return Err(file_error(format!("{} {EMPTY}", path.display())));
    }
    Ok(text)
}

/// What is wrong with the configuration file as a whole (it cannot be read, or is not TOML).
fn file_error(message: String) -> ConfigError {
    ConfigError::new("config file", Some(env::CONFIG), message)
}

/// The largest configuration file read (a file of thousands of users and installations is a few MiB).
pub const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;

/// The file's bytes, refused past `MAX_FILE_BYTES`: a path pointed at a device or a runaway log must not fill
/// memory. A blocking read: on the runtime, call it on the blocking pool.
pub fn read_bounded(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        let message = format!("larger than {} MiB", MAX_FILE_BYTES / (1024 * 1024));
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message));
    }
    Ok(bytes)
}

/// Why an empty configuration file is refused.
pub const EMPTY: &str = "is empty (a file being written, or truncated); write the whole configuration";

/// The sections of the standalone file read once at start (`[satellite]`, `[sandbox]`), flattened to
/// `section.key` → value; the rest (teams, users, auth, servers, installations) is applied while running.
/// A file that is not TOML has none.
pub fn start_only_settings(text: &str) -> BTreeMap<String, toml::Value> {
    start_only_settings_of(text).unwrap_or_default()
}

/// `start_only_settings`, or `None` when the text is not TOML (nothing can be said of its settings).
pub fn start_only_settings_of(text: &str) -> Option<BTreeMap<String, toml::Value>> {
    let table = text.parse::<toml::Table>().ok()?;
    let mut settings = BTreeMap::new();
    for section in START_ONLY_SECTIONS {
        if let Some(toml::Value::Table(values)) = table.get(section) {
            for (key, value) in values {
                settings.insert(format!("{section}.{key}"), value.clone());
            }
        }
    }
    Some(settings)
}

/// The file's sections that take effect only when `serve` starts.
pub const START_ONLY_SECTIONS: [&str; 2] = ["satellite", "sandbox"];

/// The start-only settings whose value differs between two files (added, removed or changed), sorted.
pub fn changed_start_only_settings(
    running: &BTreeMap<String, toml::Value>,
    edited: &BTreeMap<String, toml::Value>,
) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = running.keys().chain(edited.keys()).collect();
    keys.into_iter().filter(|key| running.get(*key) != edited.get(*key)).cloned().collect()
}

/// [`parse_file`] of the text of the file at `path`: what validation says of a place in it names the file too.
pub fn parse_file_at(text: &str, path: &std::path::Path) -> Result<RawFile, ConfigError> {
    let mut raw = parse_file(text)?;
    raw.origin.path = Some(path.to_owned());
    Ok(raw)
}

pub fn parse_file(text: &str) -> Result<RawFile, ConfigError> {
    let mut raw = toml::from_str::<RawFile>(text).map_err(|err| {
        let position = err
            .span()
            .map(|span| {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!(" (line {line})")
            })
            .unwrap_or_default();
        let message = without_values(&err.message().replace('\n', " "));
        file_error(format!("{message}{position}"))
    })?;
    raw.origin.line_starts = std::iter::once(0).chain(text.match_indices('\n').map(|(at, _)| at + 1)).collect();
    Ok(raw)
}

/// Where a file's text came from, to name a place in it: the file's path (when it was read from one) and where
/// each of its lines starts. Not part of the file.
#[derive(Default, Clone)]
pub struct Origin {
    pub path: Option<std::path::PathBuf>,
    line_starts: Vec<usize>,
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Origin").field("path", &self.path).field("lines", &self.line_starts.len()).finish()
    }
}

impl Origin {
    /// The 1-based line of a byte offset of the text.
    pub fn line(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|start| *start <= offset).max(1)
    }

    /// `path line N` (`line N` for text from no file) of a byte offset of the text; `None` for a `RawFile` made
    /// in code, which has no text.
    pub fn place(&self, offset: usize) -> Option<String> {
        if self.line_starts.is_empty() {
            return None;
        }
        Some(match &self.path {
            Some(path) => format!("{} line {}", path.display(), self.line(offset)),
            None => format!("line {}", self.line(offset)),
        })
    }
}

/// A parse error's message without the values it quotes: "invalid type: integer `123456`, expected a string"
/// says where and what kind, and the value may be a secret written in the wrong place (`env = { KEY = 123456 }`),
/// which would end in a log. Field names (`unknown field …`) stay: they are the file's own keys.
fn without_values(message: &str) -> String {
    const KINDS: [&str; 5] = ["boolean ", "integer ", "floating point ", "character ", "string "];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) =
        ["invalid type: ", "invalid value: "].iter().filter_map(|m| rest.find(m).map(|i| (i, m.len()))).min()
    {
        let (start, marker) = at;
        out.push_str(&rest[..start + marker]);
        rest = &rest[start + marker..];
        let Some(kind) = KINDS.iter().find(|kind| rest.starts_with(**kind)) else { continue };
        // The last one: a string value may itself contain ", expected".
        let Some(end) = rest.rfind(", expected") else { continue };
        out.push_str(kind.trim_end());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    #[serde(default)]
    pub satellite: RawSatellite,
    #[serde(default)]
    pub auth: RawAuth,
    /// How stdio children are confined; read at start like `[satellite]`.
    #[serde(default)]
    pub sandbox: RawSandbox,
    #[serde(default)]
    pub teams: Vec<RawTeam>,
    #[serde(default)]
    pub users: Vec<RawUser>,
    /// Catalogue entries: the template tier of the three-tier merge.
    #[serde(default)]
    pub servers: Vec<RawServer>,
    #[serde(default)]
    pub installations: Vec<RawInstallation>,
    /// Named subsets of tools a session can select (`/mcp?toolset=NAME`) or a user can make their default.
    #[serde(default)]
    pub toolsets: Vec<RawToolset>,
    /// Which tools members may see and run, by team, role or user (docs/governance.md).
    #[serde(default)]
    pub access: Vec<RawAccessRule>,
    /// Rate limits and quotas on tool calls (docs/governance.md).
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    /// Where the text came from, to name the file and line of a value validation refuses.
    #[serde(skip)]
    pub origin: Origin,
}

/// A toolset: patterns over `server:tool` (`github`, `github:create_issue`, `*:read_*`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToolset {
    pub name: String,
    pub description: Option<String>,
    /// Patterns over tool paths: a server slug (all its tools), `server:tool`, or a glob in either part.
    pub tools: Vec<String>,
    /// The team it belongs to; unset: every team.
    pub team: Option<String>,
    /// A member's own toolset; unset: the whole team's.
    pub user: Option<String>,
}

/// Process settings; each also has an environment variable that overrides it.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSatellite {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub data_dir: Option<String>,
    pub debug_route: Option<bool>,
    /// Meta-tool answers as 2-space indented JSON instead of compact JSON (default false).
    pub pretty_results: Option<bool>,
    /// Hold a called tool whose description or schema changed out of discover and calls until an admin
    /// accepts the change (default false: a warning and an event only).
    pub hold_drifted_tools: Option<bool>,
    /// Days: a tool called within this long before its description or schema changes has drifted (default 30).
    pub drift_window_days: Option<u64>,
    pub log_level: Option<String>,
    pub log_format: Option<String>,
    pub handshake_timeout_seconds: Option<u64>,
    pub discovery_timeout_seconds: Option<u64>,
    pub call_timeout_seconds: Option<u64>,
    pub reconcile_concurrency: Option<usize>,
    pub max_concurrent_requests: Option<usize>,
    /// Of those, how many one caller (a user of a team) may hold at once; default an eighth of them.
    pub max_concurrent_requests_per_caller: Option<usize>,
    pub max_connections: Option<usize>,
    /// Long-lived streams (session GET streams, legacy SSE streams, `subscriptions/listen`) one caller may hold
    /// open at once; default an eighth of `max_connections`.
    pub max_streams_per_caller: Option<usize>,
    pub http_timeout_seconds: Option<u64>,
    /// How long one write of an answer may wait for a client that stopped reading before its connection is cut
    /// (default 30).
    pub write_timeout_seconds: Option<u64>,
    /// How long a request body may take to arrive once the satellite waits for it before the request is answered
    /// 408 (default 30).
    pub body_read_timeout_seconds: Option<u64>,
    /// How long a stop waits for requests in flight (calls to slow tools) before stopping the servers.
    pub drain_seconds: Option<u64>,
    /// Days analytics rows are kept (default 90).
    pub analytics_retention_days: Option<u64>,
    /// Standalone: days events are kept in the local history (default 7).
    pub event_retention_days: Option<u64>,
    /// Standalone: most events kept in the local history (default 100,000).
    pub event_retention_max: Option<u64>,
    /// Standalone: most MiB the local history may take on disk (default 256).
    pub event_retention_max_mib: Option<u64>,
    /// A directory with a sentence-embedding model (`config.json`, `tokenizer.json`, `model.safetensors`) that
    /// switches the semantic search stage on (needs the `semantic` cargo feature).
    pub semantic_model: Option<String>,
    pub config_watch_interval_ms: Option<u64>,
    /// Public base URL clients use (no `/mcp`); default `http://localhost:{port}`.
    pub public_url: Option<String>,
    /// Host names (without port) requests may name; `*` for any (DNS-rebinding protection).
    pub allowed_hosts: Option<Vec<String>>,
    /// Origins (`scheme://host[:port]`) browsers may send; `*` for any.
    pub allowed_origins: Option<Vec<String>>,
    pub idle_timeout_seconds: Option<u64>,
    pub spawn_grace_seconds: Option<u64>,
    pub idle_check_interval_ms: Option<u64>,
    pub restart_backoff_ms: Option<Vec<u64>>,
    pub max_calls_per_instance: Option<usize>,
    pub call_queue_timeout_ms: Option<u64>,
    pub max_processes_per_user: Option<usize>,
    pub max_processes: Option<usize>,
    pub log_rate_limit_per_second: Option<u32>,
    pub log_max_line_length_bytes: Option<usize>,
    pub log_rate_limit_warning_interval_ms: Option<u64>,
}

/// `[sandbox]`: each value but `allowed_commands` also has an environment variable that overrides it.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSandbox {
    /// `none` (default), `nsjail` or `bubblewrap`.
    pub isolation: Option<String>,
    pub nsjail_path: Option<String>,
    pub bwrap_path: Option<String>,
    /// Widens the built-in allow-list: bare names, absolute paths, or `"*"` for any command.
    #[serde(default)]
    pub allowed_commands: Vec<String>,
    pub memory_limit_mb: Option<u64>,
    pub cpu_time_limit_seconds: Option<u64>,
    /// CPU rate limit per stdio server, percent of one core (cgroups); 0 disables.
    pub cpu_limit_percent: Option<u64>,
    pub max_processes: Option<u64>,
    pub rlimit_nofile: Option<u64>,
    pub rlimit_fsize_mb: Option<u64>,
    pub tmpfs_size: Option<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub jwt: Option<RawJwt>,
    /// Authorization server advertised in the protected-resource metadata (RFC 9728).
    pub authorization_server: Option<String>,
    /// Hex SHA-256 of tokens that open the analytics API and `/admin` for every team (and nothing else).
    #[serde(default)]
    pub admin_token_sha256: Vec<String>,
}

/// Local JWT verification (used by the client-facing front door).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    pub algorithm: String,
    pub secret: Option<String>,
    pub public_key_pem: Option<String>,
    pub audience: Option<String>,
    pub issuer: Option<String>,
    pub team_claim: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTeam {
    pub id: String,
    pub slug: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUser {
    pub id: String,
    pub teams: Vec<String>,
    /// Hex SHA-256 of bearer tokens; shorthand for `tokens` when the user has exactly one team.
    #[serde(default)]
    pub token_sha256: Vec<String>,
    /// Bearer tokens, each issued for one team (a token never reaches another team).
    #[serde(default)]
    pub tokens: Vec<RawToken>,
    /// `member` (the default) or `admin`: an admin also reads the analytics of the teams their tokens are for.
    pub role: Option<String>,
    /// The toolset this user's sessions use when they select none (`?toolset=all` still selects every tool).
    pub default_toolset: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawToken {
    pub sha256: String,
    /// Required when the user belongs to several teams.
    pub team: Option<String>,
    /// Defaults to every scope (`mcp:read mcp:tools:execute`).
    pub scopes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub slug: String,
    pub name: Option<String>,
    pub transport: String,
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub requires_oauth: bool,
    #[serde(default)]
    pub secret_env: Vec<String>,
    #[serde(default)]
    pub secret_headers: Vec<String>,
    #[serde(default)]
    pub secret_query: Vec<String>,
    /// Tools to use when the server cannot list its own (`tools/list` fails or answers none), each as
    /// `tools/list` would give it: `{name, description, inputSchema}`. The catalog is then marked as from the
    /// config on the debug route.
    #[serde(default)]
    pub tools: Vec<serde_json::Value>,
    /// Discover the server again this often while it is online, for servers whose tools change without
    /// announcing it (`notifications/tools/list_changed` is followed anyway). Unset or 0: never.
    pub rediscover_seconds: Option<u64>,
}

/// The overrides one tier (team or user) adds to the template.
#[derive(Debug, Default, Clone)]
pub struct RawTier {
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub headers: BTreeMap<String, String>,
    pub query: BTreeMap<String, String>,
}

macro_rules! tier_of {
    ($t:ty) => {
        impl $t {
            pub fn tier(&self) -> RawTier {
                RawTier {
                    args: self.args.clone(),
                    env: self.env.clone(),
                    headers: self.headers.clone(),
                    query: self.query.clone(),
                }
            }
        }
    };
}
tier_of!(RawInstallation);
tier_of!(RawUserInstance);

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawInstallation {
    pub id: String,
    pub team: String,
    pub server: String,
    pub name: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "yes")]
    pub request_logging: bool,
    /// Tools of this installation nobody in the team may see or run.
    #[serde(default)]
    pub disabled_tools: Vec<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// The user tier, by user id. Team members without an entry get the team tier only.
    #[serde(default)]
    pub users: BTreeMap<String, RawUserInstance>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUserInstance {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    pub instance_path: Option<String>,
    /// Hex SHA-256 of the instance token (`ds_inst_…`) that opens this instance, and no other.
    #[schemars(with = "Option<String>")]
    pub instance_token_sha256: Option<toml::Spanned<String>>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}
