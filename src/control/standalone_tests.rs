//! Unit tests of `standalone`.

use super::*;
use crate::config::parse_file;
use crate::model::Upstream;

const FILE: &str = r#"
[[teams]]
id = "acme"
[[teams]]
id = "globex"
slug = "gx"

[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["aa00000000000000000000000000000000000000000000000000000000000000"]
[[users]]
id = "bob"
teams = ["acme", "globex"]

[[servers]]
slug = "files"
transport = "stdio"
command = "npx"
args = ["-y", "server-files"]
env = { LEVEL = "template", ONLY_T = "1" }

[[servers]]
slug = "notion"
transport = "http"
url = "https://mcp.example.com/mcp?workspace=tmpl"
headers = { "X-Tier" = "template" }
secret_headers = ["X-Api-Key"]

[[installations]]
id = "i-files"
team = "acme"
server = "files"
args = ["--root", "/team"]
env = { LEVEL = "team" }
[installations.users.alice]
args = ["--verbose"]
env = { LEVEL = "user" }
instance_path = "alice-files"

[[installations]]
id = "i-notion"
team = "globex"
server = "notion"
query = { workspace = "team" }
headers = { "X-Api-Key" = "k" }
[installations.users.bob]
query = { user = "bob" }
headers = { "X-Tier" = "user" }
"#;

#[test]
fn expands_one_instance_per_member_with_three_tier_merge() {
    let cfg = from_file(&parse_file(FILE).unwrap()).unwrap();
    let keys: Vec<&str> = cfg.entries.keys().map(String::as_str).collect();
    assert_eq!(keys, ["files-acme-alice-i-files", "files-acme-bob-i-files", "notion-gx-bob-i-notion"]);
    let state = cfg.desired_state();
    assert!(state.rejected.is_empty());
    let alice = &state.instances[&ProcessId::from("files-acme-alice-i-files")];
    let Upstream::Stdio { args, env, .. } = &alice.upstream else { panic!() };
    assert_eq!(args, &["-y", "server-files", "--root", "/team", "--verbose"]);
    assert_eq!(env["LEVEL"], "user");
    assert_eq!(env["ONLY_T"], "1");
    assert_eq!(alice.instance_path.as_deref(), Some("alice-files"));
    let bob = &state.instances[&ProcessId::from("files-acme-bob-i-files")];
    let Upstream::Stdio { args, env, .. } = &bob.upstream else { panic!() };
    assert_eq!(args, &["-y", "server-files", "--root", "/team"]);
    assert_eq!(env["LEVEL"], "team");
    assert!(bob.instance_path.as_deref().unwrap().starts_with("files-"));
    let notion = &state.instances[&ProcessId::from("notion-gx-bob-i-notion")];
    let Upstream::StreamableHttp { url, headers, .. } = &notion.upstream else { panic!() };
    assert_eq!(url.query(), Some("workspace=team&user=bob"));
    assert_eq!(headers["X-Tier"], "user");
    assert_eq!(headers["X-Api-Key"], "k");
    assert_eq!(notion.secrets.headers, ["X-Api-Key"]);
}

#[test]
fn merge_args_drops_empty_and_orders_by_tier() {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(merge_args(&s(&["a", ""]), &s(&["b"]), &s(&["", "c"])), s(&["a", "b", "c"]));
}

#[test]
fn bad_references_name_their_key() {
    let bad = FILE.replace("server = \"notion\"", "server = \"nope\"");
    let err = from_file(&parse_file(&bad).unwrap()).unwrap_err();
    assert_eq!(err.key, "installations[1].server");
    let bad = FILE.replace("[installations.users.bob]", "[installations.users.carol]");
    let err = from_file(&parse_file(&bad).unwrap()).unwrap_err();
    assert_eq!(err.key, "installations[1].users.carol");
    let bad = FILE.replace("url = \"https://mcp.example.com/mcp?workspace=tmpl\"", "url = \"not a url\"");
    let err = from_file(&parse_file(&bad).unwrap()).unwrap_err();
    assert_eq!(err.key, "servers[1].url");
    let bad = FILE.replace("instance_path = \"alice-files\"", "instance_path = \"a/b\"");
    assert!(from_file(&parse_file(&bad).unwrap()).is_err());
}
