//! `satellite import`: a client's MCP server list (Claude Desktop, Claude Code `.mcp.json`, Cursor
//! `mcp.json`: `{"mcpServers": {…}}`; VS Code `.vscode/mcp.json`: `{"servers": {…}}`, or its settings.json:
//! `{"mcp": {"servers": {…}}}`) as a standalone config: one team, one user with a fresh token, each server
//! in the catalogue and installed for the team. The result is validated as `serve` would read it.
//!
//! Read leniently: unknown keys of an entry are ignored with a warning when they change behaviour (`cwd`,
//! `envFile`, VS Code `${input:…}` placeholders); an entry that cannot be a server is skipped with a warning.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::config::{self, ConfigError};
use crate::control::standalone;

/// Words that make an environment variable or header a secret (masked in logs and listings).
const SECRET_WORDS: [&str; 7] = ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"];

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no MCP servers found: expected an object with \"mcpServers\", \"servers\" or \"mcp\": {{\"servers\"}}")]
    NoServers,
    #[error("the imported config does not validate: {0}")]
    Invalid(#[from] ConfigError),
    #[error("cannot write TOML: {0}")]
    Toml(#[from] toml::ser::Error),
}

/// Who the imported servers are installed for.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub team: String,
    pub user: String,
    /// The user's bearer token; only its SHA-256 goes into the file.
    pub token: String,
}

/// The standalone config (TOML text) and what the operator should know about it.
#[derive(Debug)]
pub struct Imported {
    pub toml: String,
    pub servers: usize,
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
struct File {
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<Sandbox>,
    teams: Vec<Team>,
    users: Vec<User>,
    servers: Vec<Server>,
    installations: Vec<Installation>,
}

#[derive(Serialize)]
struct Sandbox {
    allowed_commands: Vec<String>,
}

#[derive(Serialize)]
struct Team {
    id: String,
}

#[derive(Serialize)]
struct User {
    id: String,
    teams: Vec<String>,
    role: &'static str,
    token_sha256: Vec<String>,
}

#[derive(Serialize, Default)]
struct Server {
    slug: String,
    name: String,
    transport: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    args: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    secret_env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    secret_headers: Vec<String>,
}

#[derive(Serialize)]
struct Installation {
    id: String,
    team: String,
    server: String,
    enabled: bool,
}

/// Convert a client's server list into a standalone config.
pub fn import(json: &str, options: &ImportOptions) -> Result<Imported, ImportError> {
    let document: Value = serde_json::from_str(json)?;
    let servers = document
        .get("mcpServers")
        .or_else(|| document.get("servers"))
        .or_else(|| document.pointer("/mcp/servers"))
        .and_then(Value::as_object)
        .ok_or(ImportError::NoServers)?;
    let mut warnings = Vec::new();
    let mut file = skeleton(options);
    let mut allowed: Vec<String> = Vec::new();
    for (name, entry) in servers {
        let Some(entry) = entry.as_object() else {
            warnings.push(format!("{name}: not an object, skipped"));
            continue;
        };
        let slug = unique_slug(&slug_of(name), &file.servers);
        let Some(server) = server_of(name, &slug, entry, &mut warnings) else { continue };
        if let Some(command) = &server.command {
            allow(name, command, &mut allowed, &mut warnings);
        }
        let disabled = entry.get("disabled").and_then(Value::as_bool).unwrap_or(false);
        file.installations.push(Installation {
            id: slug.clone(),
            team: options.team.clone(),
            server: slug,
            enabled: !disabled,
        });
        file.servers.push(server);
    }
    if file.servers.is_empty() {
        return Err(ImportError::NoServers);
    }
    if !allowed.is_empty() {
        file.sandbox = Some(Sandbox { allowed_commands: allowed });
    }
    let toml = render(&file, options)?;
    // What `serve` would refuse, refused here.
    standalone::from_file(&config::parse_file(&toml)?)?;
    Ok(Imported { toml, servers: file.servers.len(), warnings })
}

/// One team, its one admin (the token's SHA-256 only), and no servers yet.
fn skeleton(options: &ImportOptions) -> File {
    File {
        sandbox: None,
        teams: vec![Team { id: options.team.clone() }],
        users: vec![User {
            id: options.user.clone(),
            teams: vec![options.team.clone()],
            role: "admin",
            token_sha256: vec![config::sha256_hex(&options.token)],
        }],
        servers: Vec::new(),
        installations: Vec::new(),
    }
}

/// A command off the sandbox's default allow-list is added to the file's own, once, with a warning saying so.
fn allow(name: &str, command: &str, allowed: &mut Vec<String>, warnings: &mut Vec<String>) {
    if crate::instances::sandbox::DEFAULT_ALLOWED_COMMANDS.contains(&command) || allowed.iter().any(|c| c == command) {
        return;
    }
    warnings.push(format!(
        "{name}: `{command}` is not on the sandbox's default allow-list; added to [sandbox] allowed_commands"
    ));
    allowed.push(command.to_owned());
}

/// The file's text: a header saying where it came from, then the settings.
fn render(file: &File, options: &ImportOptions) -> Result<String, ImportError> {
    let body = toml::to_string(file)?;
    Ok(format!(
        "# Imported by `satellite import`: {} server(s) for team `{}`, user `{}`.\n\
         # The user's token is not in this file, only its SHA-256; `satellite token new` makes more.\n\
         # Check it with `satellite check-config --config FILE`.\n\n{body}",
        file.servers.len(),
        options.team,
        options.user
    ))
}

fn server_of(
    name: &str,
    slug: &str,
    entry: &serde_json::Map<String, Value>,
    warnings: &mut Vec<String>,
) -> Option<Server> {
    for ignored in ["cwd", "envFile"] {
        if entry.contains_key(ignored) {
            warnings.push(format!("{name}: `{ignored}` is not supported by the satellite and was left out"));
        }
    }
    let mut server = Server { slug: slug.to_owned(), name: name.to_owned(), ..Server::default() };
    if !set_transport(&mut server, entry) {
        warnings.push(format!("{name}: neither a command nor a url, skipped"));
        return None;
    }
    server.headers = string_map(entry, "headers");
    let placeholders =
        server.env.values().chain(server.headers.values()).chain(server.args.iter()).any(|v| v.contains("${"));
    if placeholders {
        warnings.push(format!(
            "{name}: has ${{…}} placeholders the client would fill in; replace them with real values before serving"
        ));
    }
    server.secret_env = server.env.keys().filter(|k| is_secret(k)).cloned().collect();
    server.secret_headers = server.headers.keys().filter(|k| is_secret(k)).cloned().collect();
    Some(server)
}

/// The transport of a client's entry and what it reaches (a url, or a command with its args and env) set on
/// `server`; `false` for an entry with neither a command nor a url.
fn set_transport(server: &mut Server, entry: &serde_json::Map<String, Value>) -> bool {
    let kind = entry.get("type").or_else(|| entry.get("transport")).and_then(Value::as_str).unwrap_or("");
    let url = entry.get("url").or_else(|| entry.get("serverUrl")).and_then(Value::as_str);
    let command = entry.get("command").and_then(Value::as_str);
    match (kind.to_ascii_lowercase().as_str(), url, command) {
        ("sse", Some(url), _) => {
            server.transport = "sse";
            server.url = Some(url.to_owned());
        }
        ("stdio", _, Some(command)) | ("", None, Some(command)) => {
            server.transport = "stdio";
            server.command = Some(command.to_owned());
            server.args = strings(entry, "args");
            server.env = string_map(entry, "env");
        }
        (_, Some(url), _) => {
            server.transport = "http";
            server.url = Some(url.to_owned());
        }
        _ => return false,
    }
    true
}

/// The entry's array `key` as strings (other values as JSON text); empty when it has none.
fn strings(entry: &serde_json::Map<String, Value>, key: &str) -> Vec<String> {
    entry.get(key).and_then(Value::as_array).map_or_else(Vec::new, |items| {
        items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect()
    })
}

/// The entry's object `key` as a map of strings (other values as JSON text); empty when it has none.
fn string_map(entry: &serde_json::Map<String, Value>, key: &str) -> BTreeMap<String, String> {
    entry.get(key).and_then(Value::as_object).map_or_else(BTreeMap::new, |items| {
        items.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned))).collect()
    })
}

fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_WORDS.iter().any(|word| upper.contains(word))
}

/// A server name as a slug: lowercase letters, digits, `-` and `_`, at most 64 characters.
fn slug_of(name: &str) -> String {
    let mut slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .split('-')
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    slug.truncate(56);
    if slug.is_empty() {
        "server".into()
    } else {
        slug
    }
}

fn unique_slug(base: &str, taken: &[Server]) -> String {
    let mut slug = base.to_owned();
    let mut n = 2;
    while taken.iter().any(|s| s.slug == slug) {
        slug = format!("{base}-{n}");
        n += 1;
    }
    slug
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ImportOptions {
        ImportOptions { team: "team".into(), user: "me".into(), token: "a-token-of-at-least-16".into() }
    }

    #[test]
    fn claude_desktop_cursor_and_vscode_lists_import_alike() -> Result<(), ImportError> {
        let claude = r#"{"mcpServers": {
            "GitHub Server": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                              "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_x", "LOG": "info"}},
            "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer x"}},
            "legacy": {"type": "sse", "url": "https://old.example.com/sse"},
            "docker": {"command": "docker", "args": ["run", "-i", "image"], "disabled": true},
            "broken": {"args": []}
        }}"#;
        let imported = import(claude, &options())?;
        assert_eq!(imported.servers, 4, "{:?}", imported.warnings);
        let raw = config::parse_file(&imported.toml)?;
        let slugs: Vec<&str> = raw.servers.iter().map(|s| s.slug.as_str()).collect();
        assert_eq!(slugs, ["github-server", "remote", "legacy", "docker"]);
        assert_eq!(raw.servers[0].secret_env, ["GITHUB_PERSONAL_ACCESS_TOKEN"]);
        assert_eq!(raw.servers[1].transport, "http");
        assert_eq!(raw.servers[1].secret_headers, ["Authorization"]);
        assert_eq!(raw.servers[2].transport, "sse");
        assert_eq!(raw.sandbox.allowed_commands, ["docker"]);
        assert!(!raw.installations[3].enabled, "disabled in the client, disabled here");
        assert!(imported.warnings.iter().any(|w| w.starts_with("broken:")), "{:?}", imported.warnings);
        assert!(!imported.toml.contains("a-token-of-at-least-16"), "only the hash is written");
        assert_eq!(raw.users[0].token_sha256, [config::sha256_hex("a-token-of-at-least-16")]);

        let vscode =
            r#"{"inputs": [], "servers": {"fs": {"type": "stdio", "command": "npx", "args": ["${input:dir}"]}}}"#;
        let imported = import(vscode, &options())?;
        assert_eq!(imported.servers, 1);
        assert!(imported.warnings.iter().any(|w| w.contains("placeholders")), "{:?}", imported.warnings);
        let settings = r#"{"editor.fontSize": 12, "mcp": {"servers": {"x": {"url": "http://localhost:9/mcp"}}}}"#;
        assert_eq!(import(settings, &options())?.servers, 1);
        Ok(())
    }

    #[test]
    fn what_is_not_a_server_list_is_a_clear_error() {
        assert!(matches!(import("{\"other\": 1}", &options()), Err(ImportError::NoServers)));
        assert!(matches!(import("{\"mcpServers\": {}}", &options()), Err(ImportError::NoServers)));
        assert!(matches!(import("not json", &options()), Err(ImportError::Json(_))));
        // Two names that make the same slug stay two servers.
        let twins = r#"{"mcpServers": {"a b": {"command": "npx"}, "a-b": {"command": "npx"}}}"#;
        let imported = import(twins, &options());
        assert!(imported.is_ok_and(|i| i.toml.contains("slug = \"a-b-2\"")));
    }
}
