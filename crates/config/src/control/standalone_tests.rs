//! Unit tests of `standalone`.

use super::*;
use crate::config::parse_file;
use crate::model::{ProcessId, Upstream};

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

/// An instance token opens one instance of one user: a hash given to two members' instances (in another letter
/// case), or equal to a user's token (the user's own) or an admin token, is refused, naming the file, the line and
/// both owners, and never the hash. Before, the file was accepted and the one `ds_inst_` token opened every
/// instance that had it, each with its own member's secrets.
#[test]
fn an_instance_token_hash_names_one_instance_of_one_user() {
    let token = |hash: &str| format!("instance_token_sha256 = \"{hash}\"\n");
    let shared = "bb".repeat(32);
    let twice = FILE
        .replace("instance_path = \"alice-files\"\n", &format!("instance_path = \"alice-files\"\n{}", token(&shared)))
        .replace(
            "query = { user = \"bob\" }\n",
            &format!("query = {{ user = \"bob\" }}\n{}", token(&shared.to_uppercase())),
        );
    let line_of = |text: &str, needle: &str| text[..text.find(needle).unwrap()].matches('\n').count() + 1;
    let (alice_line, bob_line) = (line_of(&twice, &shared), line_of(&twice, &shared.to_uppercase()));
    let path = std::path::Path::new("/etc/satellite/satellite.toml");
    let err = from_file(&crate::config::parse_file_at(&twice, path).unwrap()).unwrap_err();
    assert_eq!(err.key, "installations[1].users.bob.instance_token_sha256");
    let expected = format!(
        "/etc/satellite/satellite.toml line {bob_line}: the instance token of user \"bob\" in installation \
         \"i-notion\" has the same hash as the instance token of user \"alice\" in installation \"i-files\" \
         (/etc/satellite/satellite.toml line {alice_line})"
    );
    assert!(err.message.starts_with(&expected), "{err}");
    assert!(!err.to_string().to_ascii_lowercase().contains("bbbbbbbb"), "no hash in the message: {err}");
    // Alice's instance token is her own user token; or a satellite admin token.
    let alice_user = "aa00000000000000000000000000000000000000000000000000000000000000";
    let own = FILE.replace(
        "instance_path = \"alice-files\"\n",
        &format!("instance_path = \"alice-files\"\n{}", token(alice_user)),
    );
    let err = from_file(&parse_file(&own).unwrap()).unwrap_err();
    assert_eq!(err.key, "installations[0].users.alice.instance_token_sha256");
    let line = line_of(&own, &format!("instance_token_sha256 = \"{alice_user}"));
    assert!(err.message.starts_with(&format!("line {line}: the instance token of user \"alice\"")), "{err}");
    assert!(err.message.contains("same hash as a token of users[0] (user \"alice\")"), "{err}");
    let admin = format!("[auth]\nadmin_token_sha256 = [\"{shared}\"]\n") + &twice;
    let err = from_file(&parse_file(&admin).unwrap()).unwrap_err();
    assert_eq!(err.key, "installations[0].users.alice.instance_token_sha256");
    assert!(err.message.contains("same hash as the admin token auth.admin_token_sha256[0]"), "{err}");
    // The examples' placeholder (all zeros) on both is no token; a token of each one's own is what is wanted.
    let zero = "0".repeat(64);
    let placeholders = twice.replace(&shared, &zero).replace(&shared.to_uppercase(), &zero);
    assert!(from_file(&parse_file(&placeholders).unwrap()).is_ok());
    let distinct = twice.replace(&shared.to_uppercase(), &"cc".repeat(32));
    assert!(from_file(&parse_file(&distinct).unwrap()).is_ok());
}
