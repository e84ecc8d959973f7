//! `mcp_servers` entries (BP §7.3): wire shape, validation (BP §7.6), diff.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;
use url::Url;

use crate::model::{
    lenient, Deployment, InstallationId, InstanceSpec, ProcessId, Runtime, SecretNames, TeamId, ToolAccess, Upstream,
    UserId,
};

/// Default request timeout for HTTP/SSE instances without one.
pub const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(30);

/// One per-user instance as the backend sends it (BP §7.3), read as a tolerant reader (BP §0): unknown fields are
/// ignored; the satellite requires only `installation_id`, `team_id`, `user_id`, the transport and what it
/// needs to reach the server (`command` and `args`, or `url`). Names missing from an older backend fall back
/// (`team_slug` → `team_id`, `server_name` → `server_slug` → the key, `installation_name` → `server_name`);
/// informational fields of the wrong shape read as absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct McpServerEntry {
    pub installation_id: String,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    pub team_id: String,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "String::is_empty")]
    pub team_slug: String,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "String::is_empty")]
    pub server_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_slug: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "String::is_empty")]
    pub installation_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_type: Option<String>,
    /// The older payloads' name of `transport_type` (BP §7.3), used when `transport_type` is absent. A field of its
    /// own, not a serde alias: an entry carrying both (a backend during the rename) would be refused as having a
    /// duplicate field.
    #[serde(default, rename = "type", deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub legacy_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_query_params: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    pub user_id: String,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub user_slug: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub instance_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_token_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_oauth: Option<bool>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub settings: Option<EntrySettings>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub secret_metadata: Option<SecretMetadata>,
    /// `github` selects the deployment pipeline (SB §9.9); anything else is a plain command.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `node`, `python`, …: which install and build steps a GitHub deployment takes.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub repository_url: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub git_commit_sha: Option<String>,
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub git_branch: Option<String>,
    /// Tools disabled by the team administrator: the standalone file's extension (OQ-7), never sent by the
    /// backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_tools: Option<Vec<String>>,
    /// Tools for a server that cannot list its own: the standalone file's `servers[].tools`, never sent by
    /// the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_tools: Option<Vec<Value>>,
    /// How often to discover the instance again (the standalone file's `servers[].rediscover_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rediscover_seconds: Option<u64>,
    /// The access rules that apply to the entry's user: the standalone file's `[[access]]` (issue 76), never sent
    /// by the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<EntryAccess>,
}

/// The access rules of an entry's user: one allow list per applying rule that has one, and every applying rule's
/// denials together (`model::ToolAccess`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryAccess {
    #[serde(default)]
    pub allow: Vec<Vec<String>>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A field whose `null` means what its absence means: empty (BP §0; serde reads `null` as a value otherwise).
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EntrySettings {
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub request_logging_enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecretMetadata {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

/// A validated config: the instances to run, in the order they were given,
/// and the entries that were refused with the reason.
#[derive(Debug, Clone, Default)]
pub struct DesiredState {
    pub instances: BTreeMap<ProcessId, InstanceSpec>,
    pub rejected: Vec<(String, String)>,
}

impl DesiredState {
    /// Validate raw entries (keyed by process id); invalid ones are skipped with a warning, the rest kept.
    pub fn from_raw_entries(entries: &serde_json::Map<String, Value>) -> Self {
        let mut state = DesiredState::default();
        for (key, raw) in entries {
            let entry = serde_json::from_value::<McpServerEntry>(raw.clone())
                .map_err(|err| format!("malformed entry: {err}"))
                .and_then(|entry| validate(key, &entry));
            state.push(key, entry);
        }
        state
    }

    pub fn from_entries(entries: &BTreeMap<String, McpServerEntry>) -> Self {
        let mut state = DesiredState::default();
        for (key, entry) in entries {
            state.push(key, validate(key, entry));
        }
        state
    }

    /// How many distinct teams the instances belong to.
    pub fn teams_count(&self) -> usize {
        self.instances.values().map(|s| s.team_id.as_str()).collect::<std::collections::BTreeSet<_>>().len()
    }

    fn push(&mut self, key: &str, result: Result<InstanceSpec, String>) {
        match result {
            Ok(spec) => {
                self.instances.insert(spec.process_id.clone(), spec);
            }
            Err(reason) => {
                warn!(process_id = %key, reason = %reason, "config entry skipped");
                self.rejected.push((key.to_owned(), reason));
            }
        }
    }
}

/// Validate one entry (BP §7.6) into an instance spec.
pub fn validate(key: &str, entry: &McpServerEntry) -> Result<InstanceSpec, String> {
    let enabled = entry.enabled != Some(false);
    let upstream = upstream(entry, enabled)?;
    if entry.installation_id.is_empty() || entry.team_id.is_empty() || entry.user_id.is_empty() {
        return Err("entry needs installation_id, team_id and user_id".into());
    }
    let (server_slug, server_name) = server_names(key, entry)?;
    let deployment = match entry.source.as_deref() {
        Some("github") if enabled => Some(github_deployment(entry)?),
        _ => None,
    };
    let secrets = entry.secret_metadata.clone().unwrap_or_default();
    Ok(InstanceSpec {
        process_id: ProcessId(key.to_owned()),
        instance_id: entry.instance_id.clone().filter(|id| !id.is_empty()),
        installation_id: InstallationId(entry.installation_id.clone()),
        installation_name: non_empty_or(&entry.installation_name, || server_name.clone()),
        team_id: TeamId(entry.team_id.clone()),
        team_slug: non_empty_or(&entry.team_slug, || entry.team_id.clone()),
        user_id: UserId(entry.user_id.clone()),
        server_name,
        server_slug,
        upstream,
        enabled,
        instance_path: entry.instance_path.clone().filter(|p| !p.is_empty()),
        instance_token_hash: entry.instance_token_hash.as_ref().map(|h| h.to_ascii_lowercase()),
        requires_oauth: entry.requires_oauth.unwrap_or(false),
        request_logging_enabled: entry.settings.as_ref().and_then(|s| s.request_logging_enabled).unwrap_or(true),
        secrets: SecretNames { env: secrets.env, headers: secrets.headers, query_params: secrets.query_params },
        disabled_tools: entry.disabled_tools.iter().flatten().cloned().collect(),
        access: match &entry.access {
            Some(rules) => ToolAccess::new(rules.allow.clone(), rules.deny.clone())
                .map_err(|err| format!("{key}: access rules: {err}"))?,
            None => ToolAccess::open(),
        },
        deployment,
        rediscover_every: entry.rediscover_seconds.filter(|s| *s > 0).map(Duration::from_secs),
        declared_tools: entry
            .declared_tools
            .as_ref()
            .filter(|tools| !tools.is_empty())
            .map(|tools| Value::Array(tools.clone()).to_string()),
    })
}

/// How the server is reached: the timeout is checked first, whatever the transport, then the transport's fields.
fn upstream(entry: &McpServerEntry, enabled: bool) -> Result<Upstream, String> {
    let timeout = match entry.timeout {
        None => DEFAULT_REMOTE_TIMEOUT,
        Some(ms) if ms.is_finite() && ms > 0.0 => Duration::from_millis(ms as u64),
        Some(_) => return Err("timeout must be a positive number of milliseconds".into()),
    };
    let transport = entry.transport_type.as_deref().or(entry.legacy_type.as_deref()).unwrap_or("");
    match transport {
        // A disabled entry may come without command or url (BP §7.5); it is kept as disabled, never started.
        _ if !enabled => Ok(Upstream::Stdio { command: String::new(), args: Vec::new(), env: BTreeMap::new() }),
        "stdio" => stdio_upstream(entry),
        "http" | "sse" => remote_upstream(entry, transport, timeout),
        "" => Err("missing transport_type".into()),
        other => Err(format!("unsupported transport {other:?}")),
    }
}

/// A stdio server: a non-empty command and an args array.
fn stdio_upstream(entry: &McpServerEntry) -> Result<Upstream, String> {
    let command = entry.command.as_deref().map(str::trim).unwrap_or("");
    if command.is_empty() {
        return Err("stdio entry needs a non-empty command".into());
    }
    let Some(args) = &entry.args else {
        return Err("stdio entry needs an args array".into());
    };
    Ok(Upstream::Stdio { command: command.to_owned(), args: args.clone(), env: entry.env.clone() })
}

/// An `http` or `sse` server: an http(s) url, with the entry's query parameters set on it.
fn remote_upstream(entry: &McpServerEntry, transport: &str, timeout: Duration) -> Result<Upstream, String> {
    let raw = entry.url.as_deref().map(str::trim).unwrap_or("");
    if raw.is_empty() {
        return Err(format!("{transport} entry needs a url"));
    }
    let mut url = Url::parse(raw).map_err(|err| format!("invalid url: {err}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("unsupported url scheme {:?}", url.scheme()));
    }
    if let Some(extra) = &entry.url_query_params {
        set_query(&mut url, extra);
    }
    let headers = entry.headers.clone();
    if transport == "http" {
        Ok(Upstream::StreamableHttp { url, headers, timeout })
    } else {
        Ok(Upstream::Sse { url, headers, timeout })
    }
}

/// The server's slug (else its name, else the entry's key) and name (else the slug). The slug names the server in
/// tool paths and resource URIs, so it must hold neither of their separators.
fn server_names(key: &str, entry: &McpServerEntry) -> Result<(String, String), String> {
    let slug = entry.server_slug.as_deref().unwrap_or("");
    let server_slug = non_empty_or(slug, || non_empty_or(&entry.server_name, || key.to_owned()));
    let server_name = non_empty_or(&entry.server_name, || server_slug.clone());
    if server_slug.contains(':') || server_slug.contains('|') {
        return Err(format!("server slug {server_slug:?} must not contain ':' or '|'"));
    }
    Ok((server_slug, server_name))
}

/// `value`, or what `fallback` gives when it is empty: a name an older backend leaves out falls back to another.
fn non_empty_or(value: &str, fallback: impl FnOnce() -> String) -> String {
    if value.is_empty() {
        fallback()
    } else {
        value.to_owned()
    }
}

/// A `source: github` entry's deployment (SB §9.9): the repository and the pinned commit are required.
fn github_deployment(entry: &McpServerEntry) -> Result<Deployment, String> {
    let url = entry.repository_url.as_deref().ok_or("GitHub-deployed entry needs repository_url")?;
    let repository =
        Deployment::repository_of(url).ok_or_else(|| format!("repository_url {url:?} is not a GitHub repository"))?;
    let sha = entry.git_commit_sha.as_deref().map(str::trim).unwrap_or("");
    if !(7..=64).contains(&sha.len()) || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("GitHub-deployed entry needs git_commit_sha (hex)".into());
    }
    // `runtime` selects (BP §7.3); `language` is only a hint for an entry without a runtime the satellite knows.
    let by_name = |name: Option<&str>| match name {
        Some("node" | "typescript" | "javascript") => Some(Runtime::Node),
        Some("python") => Some(Runtime::Python),
        _ => None,
    };
    let runtime = by_name(entry.runtime.as_deref()).or_else(|| by_name(entry.language.as_deref()));
    Ok(Deployment { repository, commit_sha: sha.to_ascii_lowercase(), branch: entry.git_branch.clone(), runtime })
}

/// Set each parameter on the URL, replacing an existing one of the same name (`searchParams.set`).
pub fn set_query(url: &mut Url, params: &BTreeMap<String, String>) {
    if params.is_empty() {
        return;
    }
    let mut pairs: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !params.contains_key(k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    pairs.extend(params.iter().map(|(k, v)| (k.clone(), v.clone())));
    url.query_pairs_mut().clear().extend_pairs(pairs);
}

/// How a new desired state differs from the current one, by process id.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SnapshotDiff {
    pub added: Vec<ProcessId>,
    pub removed: Vec<ProcessId>,
    pub modified: Vec<ProcessId>,
    pub unchanged: Vec<ProcessId>,
}

impl SnapshotDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.modified.is_empty()
    }
}

/// What moves from `current` to `next`: either side may hold its specs shared (`Arc`) or owned.
pub fn diff<A, B>(current: &BTreeMap<ProcessId, A>, next: &BTreeMap<ProcessId, B>) -> SnapshotDiff
where
    A: std::borrow::Borrow<InstanceSpec>,
    B: std::borrow::Borrow<InstanceSpec>,
{
    let mut out = SnapshotDiff::default();
    for (id, spec) in next {
        match current.get(id) {
            None => out.added.push(id.clone()),
            Some(old) if old.borrow() != spec.borrow() => out.modified.push(id.clone()),
            Some(_) => out.unchanged.push(id.clone()),
        }
    }
    out.removed = current.keys().filter(|id| !next.contains_key(*id)).cloned().collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stdio_entry() -> Value {
        json!({
            "installation_id": "inst1", "team_id": "t1", "team_slug": "acme", "server_name": "GitHub",
            "server_slug": "github", "installation_name": "GitHub (Acme)", "transport_type": "stdio",
            "command": "npx", "args": ["-y", "x"], "env": {"K": "v"}, "enabled": true, "user_id": "u1",
            "instance_path": "bold-penguin", "instance_token_hash": "ABC", "language": "typescript"
        })
    }

    /// BP §0 and §7.3: an entry of a backend in the middle of renaming `type` to `transport_type` (both keys), or
    /// one writing absent names and maps as `null`, is the same entry. Before, serde refused the first as a
    /// duplicate field and the second as "invalid type: null", and the instance was stopped as removed.
    #[test]
    fn both_transport_keys_and_null_names_and_maps_are_read() {
        let mut both = stdio_entry();
        both["type"] = json!("stdio");
        let mut legacy = stdio_entry();
        legacy.as_object_mut().map(|e| e.remove("transport_type"));
        legacy["type"] = json!("stdio");
        let mut nulls = stdio_entry();
        for key in ["team_slug", "server_name", "installation_name", "env"] {
            nulls[key] = Value::Null;
        }
        for (what, raw) in [("both keys", both), ("legacy type", legacy), ("nulls", nulls)] {
            let entry = serde_json::from_value::<McpServerEntry>(raw).unwrap_or_else(|err| panic!("{what}: {err}"));
            let spec = validate("github-acme-u1-inst1", &entry).unwrap_or_else(|err| panic!("{what}: {err}"));
            assert!(matches!(spec.upstream, Upstream::Stdio { .. }), "{what}");
        }
    }

    #[test]
    fn a_github_entry_runs_on_its_runtime_whatever_its_language_says() {
        let entry = |runtime: Option<&str>, language: Option<&str>| McpServerEntry {
            repository_url: Some("https://github.com/acme/gh-py-echo".into()),
            git_commit_sha: Some("1111111111111111111111111111111111111111".into()),
            runtime: runtime.map(str::to_owned),
            language: language.map(str::to_owned),
            ..Default::default()
        };
        let runtime = |r, l| github_deployment(&entry(r, l)).map(|d| d.runtime);
        assert_eq!(runtime(Some("python"), Some("typescript")), Ok(Some(Runtime::Python)), "found by the Full backend");
        assert_eq!(runtime(Some("node"), Some("python")), Ok(Some(Runtime::Node)));
        assert_eq!(runtime(None, Some("typescript")), Ok(Some(Runtime::Node)), "the language when no runtime");
        assert_eq!(runtime(Some("cobol"), Some("python")), Ok(Some(Runtime::Python)), "an unknown runtime");
        assert_eq!(runtime(None, None), Ok(None));
    }

    #[test]
    fn validates_the_backend_example_shape() {
        let mut entries = serde_json::Map::new();
        entries.insert("github-acme-u1-inst1".into(), stdio_entry());
        entries.insert(
            "notion-acme-u1-i2".into(),
            json!({"installation_id":"i2","team_id":"t1","team_slug":"acme","server_name":"Notion","server_slug":"notion",
                   "installation_name":"Notion","type":"http","url":"https://mcp.notion.com/mcp?workspace=a",
                   "url_query_params":{"workspace":"b","x":"1"},"headers":{"X-Api-Key":"k"},"timeout":45000,"user_id":"u1"}),
        );
        let state = DesiredState::from_raw_entries(&entries);
        assert!(state.rejected.is_empty(), "{:?}", state.rejected);
        let github = &state.instances[&ProcessId::from("github-acme-u1-inst1")];
        assert_eq!(github.instance_token_hash.as_deref(), Some("abc"));
        assert!(matches!(&github.upstream, Upstream::Stdio { command, .. } if command == "npx"));
        let notion = &state.instances[&ProcessId::from("notion-acme-u1-i2")];
        match &notion.upstream {
            Upstream::StreamableHttp { url, timeout, .. } => {
                assert_eq!(url.as_str(), "https://mcp.notion.com/mcp?workspace=b&x=1");
                assert_eq!(*timeout, Duration::from_millis(45000));
            }
            other => panic!("unexpected upstream {other:?}"),
        }
    }

    #[test]
    fn invalid_entries_are_skipped_and_the_rest_kept() {
        let mut entries = serde_json::Map::new();
        entries.insert("good".into(), stdio_entry());
        let mut no_args = stdio_entry();
        no_args.as_object_mut().unwrap().remove("args");
        entries.insert("no-args".into(), no_args);
        let mut bad_url = stdio_entry();
        bad_url["transport_type"] = json!("http");
        bad_url["url"] = json!("not a url");
        entries.insert("bad-url".into(), bad_url);
        let mut ftp = stdio_entry();
        ftp["transport_type"] = json!("sse");
        ftp["url"] = json!("ftp://x/y");
        entries.insert("ftp".into(), ftp);
        let mut weird = stdio_entry();
        weird["transport_type"] = json!("websocket");
        entries.insert("weird".into(), weird);
        let mut zero_timeout = stdio_entry();
        zero_timeout["timeout"] = json!(0);
        entries.insert("zero-timeout".into(), zero_timeout);
        entries.insert("garbage".into(), json!("nope"));
        let state = DesiredState::from_raw_entries(&entries);
        assert_eq!(state.instances.len(), 1);
        let mut rejected: Vec<&str> = state.rejected.iter().map(|(k, _)| k.as_str()).collect();
        rejected.sort();
        assert_eq!(rejected, ["bad-url", "ftp", "garbage", "no-args", "weird", "zero-timeout"]);
    }

    #[test]
    fn disabled_entries_need_no_command() {
        let entry: McpServerEntry = serde_json::from_value(json!({
            "installation_id":"i","team_id":"t","team_slug":"s","server_name":"n","installation_name":"n",
            "transport_type":"stdio","enabled":false,"user_id":"u"}))
        .unwrap();
        let spec = validate("k", &entry).unwrap();
        assert!(!spec.enabled);
    }

    #[test]
    fn diff_classifies_by_process_id() {
        let mut entries = serde_json::Map::new();
        entries.insert("a".into(), stdio_entry());
        entries.insert("b".into(), stdio_entry());
        entries.insert("c".into(), stdio_entry());
        let before = DesiredState::from_raw_entries(&entries).instances;
        entries.remove("a");
        entries["b"]["args"] = json!(["changed"]);
        entries.insert("d".into(), stdio_entry());
        let after = DesiredState::from_raw_entries(&entries).instances;
        let d = diff(&before, &after);
        assert_eq!(d.added, vec![ProcessId::from("d")]);
        assert_eq!(d.removed, vec![ProcessId::from("a")]);
        assert_eq!(d.modified, vec![ProcessId::from("b")]);
        assert_eq!(d.unchanged, vec![ProcessId::from("c")]);
    }

    /// Request logging switched off as `"false"` stays off: read strictly, the string was dropped and the
    /// installation logged every call's arguments and answer, the default, against the backend's setting.
    #[test]
    fn request_logging_switched_off_in_a_string_stays_off() -> Result<(), serde_json::Error> {
        let settings: EntrySettings = serde_json::from_value(json!({"request_logging_enabled": "false"}))?;
        assert_eq!(settings.request_logging_enabled, Some(false));
        let settings: EntrySettings = serde_json::from_value(json!({"request_logging_enabled": " TRUE "}))?;
        assert_eq!(settings.request_logging_enabled, Some(true));
        let settings: EntrySettings = serde_json::from_value(json!({"request_logging_enabled": "maybe"}))?;
        assert_eq!(settings.request_logging_enabled, None);
        Ok(())
    }
}
