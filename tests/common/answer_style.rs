//! How the FakeBackend words its answers. The real DeployStack backend promises few fields, other versions add
//! more, and a future one may add fields nobody knows yet; a drop-in satellite must behave the same against
//! each (BP §0 "Tolerant reader"). The fake builds every answer in full and then shapes it:
//!
//! - `Real` (the default): what the real backend sends, e.g. registration `{success, satellite: {id, name,
//!   api_key}, message}` and config entries without the standalone file's own extensions;
//! - `Minimal`: only what BP marks required, or nothing where nothing is (acks, event answers);
//! - `Full`: every field of BP §2-§11, optional ones filled in;
//! - `Extra`: `Full` plus fields no backend sends today, at every object level that is not a map of ids.

use serde_json::{json, Map, Value};

use super::fake_backend::Endpoint;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnswerStyle {
    #[default]
    Real,
    Minimal,
    Full,
    Extra,
}

/// Shape a 2xx answer of `endpoint` (built in full) for `style`.
pub fn shape(style: AnswerStyle, endpoint: Endpoint, body: Value) -> Value {
    match style {
        AnswerStyle::Real => real(endpoint, body),
        AnswerStyle::Minimal => minimal(endpoint, body),
        AnswerStyle::Full => full(endpoint, body),
        AnswerStyle::Extra => extra(endpoint, full(endpoint, body)),
    }
}

fn keep(value: &Value, keys: &[&str]) -> Value {
    let Value::Object(map) = value else { return value.clone() };
    Value::Object(map.iter().filter(|(k, _)| keys.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn entries_mut(body: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    body.get_mut("mcp_servers")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|m| m.values_mut())
        .filter_map(Value::as_object_mut)
}

fn real(endpoint: Endpoint, mut body: Value) -> Value {
    match endpoint {
        Endpoint::Register => {
            let satellite = keep(&body["satellite"], &["id", "name", "api_key"]);
            json!({"success": true, "satellite": satellite, "message": body["message"]})
        }
        Endpoint::Config => {
            for entry in entries_mut(&mut body) {
                // The standalone file's own extension; the backend never sends it.
                entry.remove("disabled_tools");
            }
            body
        }
        _ => body,
    }
}

/// Config entry fields BP §7.3 marks required for every entry.
const ENTRY_REQUIRED: [&str; 9] = [
    "installation_id",
    "team_id",
    "team_slug",
    "server_name",
    "server_slug",
    "installation_name",
    "transport_type",
    "enabled",
    "user_id",
];
/// …and those required for one transport or source.
const STDIO_REQUIRED: [&str; 3] = ["command", "args", "env"];
const REMOTE_REQUIRED: [&str; 2] = ["url", "headers"];
const GITHUB_REQUIRED: [&str; 5] = ["source", "git_commit_sha", "repository_url", "git_branch", "runtime"];

/// A minimal config entry: the required fields, and an optional one only where its value turns a feature on
/// that its absence would leave off (an OAuth server, the instance router); every other optional field is
/// dropped, so its documented default applies.
fn minimal_entry(entry: &Value) -> Value {
    let mut fields: Vec<&str> = ENTRY_REQUIRED.to_vec();
    match entry["transport_type"].as_str() {
        Some("stdio") => fields.extend(STDIO_REQUIRED),
        _ => fields.extend(REMOTE_REQUIRED),
    }
    if entry["source"] == "github" {
        fields.extend(GITHUB_REQUIRED);
    }
    if entry["requires_oauth"] == true {
        fields.push("requires_oauth");
    }
    fields.extend(["instance_path", "instance_token_hash"]);
    keep(entry, &fields)
}

fn minimal(endpoint: Endpoint, body: Value) -> Value {
    match endpoint {
        Endpoint::Health | Endpoint::Heartbeat | Endpoint::CommandResult | Endpoint::Events => json!({}),
        Endpoint::Register => json!({"satellite": keep(&body["satellite"], &["id", "api_key"])}),
        Endpoint::Commands => {
            let commands: Vec<Value> = body["commands"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| keep(c, &["id", "command_type", "payload"]))
                .collect();
            json!({"commands": commands})
        }
        Endpoint::Config => {
            let mut servers = Map::new();
            for (key, entry) in body["mcp_servers"].as_object().into_iter().flatten() {
                servers.insert(key.clone(), minimal_entry(entry));
            }
            json!({"mcp_servers": servers})
        }
        // `aud` stays when the token has one: whether it is present is what the audience check is about.
        Endpoint::Introspect if body["active"] == true => keep(&body, &["active", "sub", "team_id", "aud"]),
        Endpoint::Introspect => json!({"active": false}),
        Endpoint::TokenStatus => keep(&body, &["exists"]),
        Endpoint::TokenRetrieve => keep(&body, &["access_token"]),
        Endpoint::GithubToken => keep(&body, &["token"]),
        _ => body,
    }
}

fn full(endpoint: Endpoint, mut body: Value) -> Value {
    if endpoint == Endpoint::Config {
        for entry in entries_mut(&mut body) {
            let user = entry.get("user_id").cloned().unwrap_or(Value::Null);
            for (key, value) in [
                ("instance_id", json!("inst_fake")),
                ("user_slug", user),
                ("instance_status", json!("provisioning")),
                ("settings", json!({"request_logging_enabled": true})),
                ("secret_metadata", json!({"env": [], "headers": [], "query_params": []})),
                ("source", json!("official_registry")),
                ("language", json!("typescript")),
                ("runtime", json!("node")),
                ("requires_oauth", json!(false)),
            ] {
                entry.entry(key).or_insert(value);
            }
        }
        if let Value::Object(map) = &mut body {
            map.entry("satellite_config").or_insert(json!({
                "polling_intervals": {"normal": 30, "immediate": 2, "error_backoff_max": 300},
                "resource_limits": {"max_processes": 100, "max_memory_per_process": "1GB", "max_cpu_percent": 80},
                "team_settings": {"allowed_servers": ["*"], "security_policies": [], "isolation_level": "process"},
                "logging": {"level": "info", "enable_audit": true, "retention_days": 30},
                "network": {"timeout_seconds": 30, "retry_attempts": 3},
            }));
        }
    }
    body
}

/// Unknown fields: a scalar, an object and an array, so no reader can count on a field's kind.
fn unknown(map: &mut Map<String, Value>) {
    map.insert("x_future_flag".into(), json!(true));
    map.insert("x_future_block".into(), json!({"nested": {"deeper": [1, "two", null]}}));
    map.insert("x_future_list".into(), json!([{"kind": "unknown"}]));
}

fn extra(endpoint: Endpoint, mut body: Value) -> Value {
    if let Value::Object(map) = &mut body {
        unknown(map);
    }
    match endpoint {
        Endpoint::Register => {
            if let Some(satellite) = body.get_mut("satellite").and_then(Value::as_object_mut) {
                unknown(satellite);
            }
        }
        Endpoint::Commands => {
            for command in body.get_mut("commands").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(command) = command.as_object_mut() {
                    unknown(command);
                    if let Some(payload) = command.get_mut("payload").and_then(Value::as_object_mut) {
                        unknown(payload);
                    }
                }
            }
        }
        Endpoint::Config => {
            for entry in entries_mut(&mut body) {
                unknown(entry);
            }
            if let Some(block) = body.get_mut("satellite_config").and_then(Value::as_object_mut) {
                unknown(block);
            }
        }
        _ => {}
    }
    body
}
