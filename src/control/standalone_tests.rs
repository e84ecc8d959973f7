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

/// A token hash given to two users (here in two teams, and in another letter case) is refused: before, the first
/// user in order took it, so the second user's token signed in as the first, in the first's team.
#[test]
fn a_token_hash_given_twice_is_refused() {
    let twice = FILE.replace(
        "id = \"bob\"\nteams = [\"acme\", \"globex\"]\n",
        "id = \"bob\"\nteams = [\"acme\", \"globex\"]\n[[users.tokens]]\nteam = \"globex\"\n\
         sha256 = \"AA00000000000000000000000000000000000000000000000000000000000000\"\n",
    );
    assert_ne!(twice, FILE);
    let err = from_file(&parse_file(&twice).unwrap()).unwrap_err();
    assert_eq!(err.key, "users[1].tokens");
    assert!(err.to_string().contains("same hash as a token of users[0] (user \"alice\")"), "{err}");
    assert!(!err.to_string().to_ascii_lowercase().contains("aa00000000"), "no hash in the message: {err}");
    // The examples' placeholder (deploy/satellite.example.toml gives it to two users) is no token.
    let zero = "0".repeat(64);
    let placeholders = FILE.replace("aa00000000000000000000000000000000000000000000000000000000000000", &zero)
        + &format!("[[users]]\nid = \"carol\"\nteams = [\"acme\"]\ntoken_sha256 = [\"{zero}\"]\n");
    let loaded = from_file(&parse_file(&placeholders).unwrap());
    assert!(loaded.is_ok(), "{:?}", loaded.err());
}

/// Process ids join their parts with '-', which ids may hold: two instances named alike are refused rather than
/// one silently replacing the other (and its instance path with it). An installation id the snapshot would skip
/// is refused too, not applied without its instances.
#[test]
fn instances_named_alike_and_odd_installation_ids_are_refused() {
    // Alice's instance of installation "i-files" and user "alice-i"'s of installation "files" are both
    // "files-acme-alice-i-files".
    let alike = FILE.to_owned()
        + r#"
[[users]]
id = "alice-i"
teams = ["acme"]
[[installations]]
id = "files"
team = "acme"
server = "files"
"#;
    let err = from_file(&parse_file(&alike).unwrap()).unwrap_err();
    assert!(err.to_string().contains("\"files-acme-alice-i-files\", like another instance"), "{err}");
    for id in ["", "a b", "a/b"] {
        let odd = FILE.replace("id = \"i-notion\"", &format!("id = {id:?}"));
        let err = from_file(&parse_file(&odd).unwrap()).unwrap_err();
        assert_eq!(err.key, "installations[1].id", "{id:?}");
    }
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
