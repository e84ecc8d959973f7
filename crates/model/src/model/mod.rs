//! Shared vocabulary: identifiers, the desired state of one instance, and
//! instance statuses. No IO, no serde on internal types except where a value
//! is persisted verbatim.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use url::Url;

pub mod access;
pub mod catalog;
pub mod limits;
pub mod names;
pub mod toolset;

pub use access::ToolAccess;
pub use catalog::{
    catalog_diff, namespace_ui_meta, namespaced_uri, parse_namespaced_uri, parse_shared_uri, parse_tool_path,
    shared_uri, tool_path, Catalog, ChangeKind, ListingBuilder, PreparedTool, ResourceDef, TemplateDef, ToolChange,
    ToolDef,
};
pub use limits::{LimitRule, LimitScope, Period, Quota, Rate};
pub use toolset::{Toolset, ToolsetScope, ToolsetSource};

/// ISO-8601 with milliseconds and `Z`, as the backend writes timestamps.
pub fn iso(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A field that is dropped (read as `None`) rather than failing the whole body when its value has the wrong
/// shape: for hints and informational fields the satellite can do without (BP §0 "Tolerant reader"). A value
/// written another way that means the same is read as meant: a whole number with a fraction (`5.0`, an integer to
/// JSON Schema), and a boolean or a whole number in a string (`"false"`, `"5"`). Before, `5.0` dropped a poll hint,
/// and a `request_logging_enabled: "false"` was dropped and so read as the default, on. Use as
/// `#[serde(default, deserialize_with = "crate::model::lenient")]`.
pub fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::Deserialize;
    let Some(value) = Option::<serde_json::Value>::deserialize(deserializer)? else { return Ok(None) };
    Ok(T::deserialize(&value).ok().or_else(|| loosened(&value).and_then(|v| T::deserialize(&v).ok())))
}

/// [`lenient`]'s second reading of a value a strict reader refused: the same number or boolean in its plain form.
fn loosened(value: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    /// Whole numbers a double holds exactly.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::Number(n) if n.as_i64().is_none() && n.as_u64().is_none() => {
            let f = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() <= EXACT)?;
            Some(if f < 0.0 { Value::from(f as i64) } else { Value::from(f as u64) })
        }
        Value::String(text) => {
            let text = text.trim();
            if text.eq_ignore_ascii_case("true") || text.eq_ignore_ascii_case("false") {
                return Some(Value::Bool(text.eq_ignore_ascii_case("true")));
            }
            text.parse::<u64>().map(Value::from).or_else(|_| text.parse::<i64>().map(Value::from)).ok()
        }
        _ => None,
    }
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
    };
}

string_id!(
    /// A team's id.
    TeamId
);
string_id!(
    /// A user's id.
    UserId
);
string_id!(
    /// A team installation of a catalogue server, shared by the team's members.
    InstallationId
);
string_id!(
    /// The opaque key of one per-user instance: `{server_slug}-{team_slug}-{user_id}-{installation_id}`.
    /// Never parsed: slugs and ids contain `-`.
    ProcessId
);

impl ProcessId {
    pub fn compose(server_slug: &str, team_slug: &str, user_id: &UserId, installation: &InstallationId) -> Self {
        Self(format!("{server_slug}-{team_slug}-{user_id}-{installation}"))
    }
}

/// How the satellite reaches an instance's MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String> },
    StreamableHttp { url: Url, headers: BTreeMap<String, String>, timeout: Duration },
    Sse { url: Url, headers: BTreeMap<String, String>, timeout: Duration },
}

impl Upstream {
    pub fn transport_name(&self) -> &'static str {
        match self {
            Upstream::Stdio { .. } => "stdio",
            Upstream::StreamableHttp { .. } => "http",
            Upstream::Sse { .. } => "sse",
        }
    }
}

/// Names whose values are secrets and must be masked in logs and listings (BP §7.3 `secret_metadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretNames {
    pub env: Vec<String>,
    pub headers: Vec<String>,
    pub query_params: Vec<String>,
}

/// The desired state of one per-user instance, validated from a config entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSpec {
    pub process_id: ProcessId,
    /// The backend's row id of this per-user instance (BP §7.3 `instance_id`), reported in the heartbeat; none
    /// in standalone mode or from a backend that does not send it.
    pub instance_id: Option<String>,
    pub installation_id: InstallationId,
    pub installation_name: String,
    pub team_id: TeamId,
    pub team_slug: String,
    pub user_id: UserId,
    pub server_name: String,
    /// Namespace prefix for tools and resources (`server_slug`, else `server_name`, else the process id).
    pub server_slug: String,
    pub upstream: Upstream,
    pub enabled: bool,
    pub instance_path: Option<String>,
    /// Lowercase hex SHA-256 of the instance token.
    pub instance_token_hash: Option<String>,
    pub requires_oauth: bool,
    pub request_logging_enabled: bool,
    pub secrets: SecretNames,
    /// Tools the team administrator disabled: never listed, searched or run.
    pub disabled_tools: std::collections::BTreeSet<String>,
    /// The access rules that apply to this instance's user: tools they deny are never listed, searched or run.
    pub access: ToolAccess,
    /// A stdio server built from a GitHub repository instead of the entry's own command (SB §9.9).
    pub deployment: Option<Deployment>,
    /// Tools the config declares for a server that cannot list its own (standalone `servers[].tools`): the
    /// catalog when `tools/list` fails or answers none. A JSON array, as text so the spec stays comparable.
    pub declared_tools: Option<String>,
    /// Discover the instance again this often while it is online (standalone `servers[].rediscover_seconds`),
    /// for servers whose tools change without a `list_changed` notification.
    pub rediscover_every: Option<std::time::Duration>,
}

/// A stdio server built from a GitHub repository at a pinned commit (SB §9.9, BP §6.1.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// `owner/repo`.
    pub repository: String,
    pub commit_sha: String,
    pub branch: Option<String>,
    /// From the entry's `runtime` or `language`; detected from the checkout when neither says.
    pub runtime: Option<Runtime>,
}

/// What a deployment is installed, built and run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Node,
    Python,
}

impl Deployment {
    /// `owner/repo` from the forms the backend sends: `https://github.com/owner/repo(.git)`,
    /// `git+https://github.com/owner/repo.git`, `github:owner/repo`, or `owner/repo` itself.
    pub fn repository_of(url: &str) -> Option<String> {
        let url = url.trim();
        let rest = url.strip_prefix("github:").or_else(|| url.strip_prefix("git+")).unwrap_or(url);
        let rest = rest
            .strip_prefix("https://github.com/")
            .or_else(|| rest.strip_prefix("http://github.com/"))
            .or_else(|| rest.strip_prefix("ssh://git@github.com/"))
            .or_else(|| rest.strip_prefix("git@github.com:"))
            .unwrap_or(rest);
        let rest = rest.split(['#', '@', '?']).next()?.trim_end_matches('/').trim_end_matches(".git");
        let (owner, repo) = rest.split_once('/')?;
        let part = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        (part(owner) && part(repo) && !repo.contains('/') && owner != ".." && repo != "..")
            .then(|| format!("{owner}/{repo}"))
    }
}

/// Status of one instance as the satellite sees it (SB §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceStatus {
    AwaitingUserConfig,
    Provisioning,
    CommandReceived,
    Connecting,
    DiscoveringTools,
    SyncingTools,
    Online,
    Restarting,
    Offline,
    Error,
    RequiresReauth,
    PermanentlyFailed,
}

impl InstanceStatus {
    pub const ALL: [InstanceStatus; 12] = [
        InstanceStatus::AwaitingUserConfig,
        InstanceStatus::Provisioning,
        InstanceStatus::CommandReceived,
        InstanceStatus::Connecting,
        InstanceStatus::DiscoveringTools,
        InstanceStatus::SyncingTools,
        InstanceStatus::Online,
        InstanceStatus::Restarting,
        InstanceStatus::Offline,
        InstanceStatus::Error,
        InstanceStatus::RequiresReauth,
        InstanceStatus::PermanentlyFailed,
    ];

    /// The wire spelling, used by events and the debug route.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStatus::AwaitingUserConfig => "awaiting_user_config",
            InstanceStatus::Provisioning => "provisioning",
            InstanceStatus::CommandReceived => "command_received",
            InstanceStatus::Connecting => "connecting",
            InstanceStatus::DiscoveringTools => "discovering_tools",
            InstanceStatus::SyncingTools => "syncing_tools",
            InstanceStatus::Online => "online",
            InstanceStatus::Restarting => "restarting",
            InstanceStatus::Offline => "offline",
            InstanceStatus::Error => "error",
            InstanceStatus::RequiresReauth => "requires_reauth",
            InstanceStatus::PermanentlyFailed => "permanently_failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// Tools of an instance are listed and searchable only when it is online (SB §10.2).
    pub fn tools_visible(self) -> bool {
        self == InstanceStatus::Online
    }

    /// Whether the satellite may move an instance from `self` to `next` (SB §10.3). The only moves are the
    /// paths of install, update, failure, recovery, re-authorisation, crash loop and manual restart; a
    /// failure status may be set again with a new message. `awaiting_user_config` and `provisioning` belong
    /// to the backend and are never entered; `online` is reached only through discovery; `permanently_failed`
    /// is left only by a restart.
    pub fn can_move_to(self, next: InstanceStatus) -> bool {
        use InstanceStatus::*;
        match (self, next) {
            (_, AwaitingUserConfig | Provisioning) => false,
            (PermanentlyFailed, Restarting) => true,
            (PermanentlyFailed, _) => false,
            (AwaitingUserConfig, _) => false,
            (Provisioning | CommandReceived, CommandReceived) => self == Provisioning,
            (_, CommandReceived) => false,
            (Provisioning | CommandReceived | Restarting, Connecting) => true,
            (Provisioning | CommandReceived, Restarting) => true,
            (Provisioning | CommandReceived, _) => false,
            // Restarting was asked for: from any state the satellite manages (and again, for a repeated command).
            (_, Restarting) => true,
            (Restarting, Offline | Error | PermanentlyFailed) => true,
            (Restarting, _) => false,
            (Connecting, DiscoveringTools | Offline | Error | RequiresReauth | PermanentlyFailed) => true,
            (Connecting, _) => false,
            (DiscoveringTools, SyncingTools | Online | Offline | Error | RequiresReauth | PermanentlyFailed) => true,
            (DiscoveringTools, _) => false,
            (SyncingTools, Online | Offline | Error | RequiresReauth | PermanentlyFailed) => true,
            (SyncingTools, _) => false,
            // A crash restarts through connecting; a list change rediscovers while serving.
            (Online, Connecting | DiscoveringTools | Offline | Error | RequiresReauth | PermanentlyFailed) => true,
            (Online, _) => false,
            (Offline | Error, Connecting | Offline | Error | RequiresReauth | PermanentlyFailed) => true,
            (Offline | Error, _) => false,
            // A `kill` stops an instance waiting for its user's authorisation too.
            (RequiresReauth, Connecting | RequiresReauth | Offline) => true,
            (RequiresReauth, _) => false,
        }
    }
}

impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stdio instance (`demo-acme-u1-i1`: user `u1` of team `t1`, installation `i1`), for unit tests (of the
/// crates above too: their dev-dependency turns on `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub fn sample_spec() -> InstanceSpec {
    InstanceSpec {
        process_id: ProcessId("demo-acme-u1-i1".into()),
        instance_id: None,
        installation_id: InstallationId::from("i1"),
        installation_name: "Demo".into(),
        team_id: TeamId::from("t1"),
        team_slug: "acme".into(),
        user_id: UserId::from("u1"),
        server_name: "demo".into(),
        server_slug: "demo".into(),
        upstream: Upstream::Stdio { command: "x".into(), args: vec![], env: Default::default() },
        enabled: true,
        instance_path: None,
        instance_token_hash: None,
        requires_oauth: false,
        request_logging_enabled: true,
        secrets: Default::default(),
        disabled_tools: Default::default(),
        access: ToolAccess::open(),
        deployment: None,
        declared_tools: None,
        rediscover_every: None,
    }
}

/// The key of a member (a user of a team): whose places a request takes (`http::callers`), and whose sessions and
/// connections it counts against.
pub fn member_key(user: &str, team: &str) -> String {
    format!("{user}\u{0}{team}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_spelling_round_trips() {
        for status in InstanceStatus::ALL {
            assert_eq!(InstanceStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(InstanceStatus::parse("running"), None);
    }

    /// Every pair is decided; the documented paths are allowed and the rules hold over all pairs.
    #[test]
    fn transitions_allow_the_documented_paths_and_refuse_impossible_moves() {
        use InstanceStatus::*;
        let paths: [&[InstanceStatus]; 9] = [
            &[Provisioning, Connecting, DiscoveringTools, SyncingTools, Online],
            &[Provisioning, Connecting, DiscoveringTools, Online],
            &[Online, Restarting, Connecting, DiscoveringTools, Online],
            &[Online, Offline, Connecting, DiscoveringTools, Online],
            &[Online, Error, Error, Connecting, DiscoveringTools, Online],
            &[Online, RequiresReauth, Connecting, DiscoveringTools, Online],
            // A kill while the user's authorisation is awaited.
            &[Online, RequiresReauth, Offline],
            &[Online, Connecting, DiscoveringTools, Online, Connecting, PermanentlyFailed, Restarting, Connecting],
            &[Provisioning, CommandReceived, Connecting, Error, Connecting, Offline],
        ];
        for path in paths {
            for pair in path.windows(2) {
                assert!(pair[0].can_move_to(pair[1]), "{} -> {} must be allowed", pair[0], pair[1]);
            }
        }
        let mut allowed = 0;
        for from in InstanceStatus::ALL {
            for to in InstanceStatus::ALL {
                let ok = from.can_move_to(to);
                allowed += usize::from(ok);
                if matches!(to, AwaitingUserConfig | Provisioning) {
                    assert!(!ok, "{from} -> {to}: backend-only statuses are never entered");
                }
                if from == PermanentlyFailed {
                    assert_eq!(ok, to == Restarting, "{from} -> {to}: only a restart leaves permanently_failed");
                }
                if to == Online {
                    assert_eq!(ok, matches!(from, DiscoveringTools | SyncingTools), "{from} -> {to}");
                }
                if from == AwaitingUserConfig {
                    assert!(!ok, "{from} -> {to}");
                }
                if from == to {
                    assert_eq!(ok, matches!(from, Offline | Error | RequiresReauth | Restarting), "{from} -> {to}");
                }
            }
        }
        assert!(allowed < 144 / 2, "the transition relation is a sparse graph, not everything-goes ({allowed})");
    }

    #[test]
    fn process_id_is_composed_verbatim() {
        let id = ProcessId::compose("brightdata-mcp-1", "acme", &UserId::from("u-1"), &InstallationId::from("i_2"));
        assert_eq!(id.as_str(), "brightdata-mcp-1-acme-u-1-i_2");
    }
}
