//! Issue 76, item 4: access rules filter lists and calls alike. Over random rule sets (seeded, so a failure names
//! its seed), for a member and an admin of one team with the demo server: what the instance router's `tools/list`
//! shows, what `discover_mcp_tools` finds on `/mcp`, and what a call may run are the same set on both routers, and
//! that set is what the rules say (an oracle written here, apart from the satellite's globs).

use std::collections::BTreeSet;

use satellite::config::sha256_hex;
use serde_json::{json, Value};

use crate::common::*;

/// The demo's tools a test may call whatever the rules (`exit_process` and `slow` are listed, never called).
const CALLABLE: [&str; 5] = ["echo", "add", "fail", "with_meta", "show_ui"];
const TOOLS: [&str; 7] = ["echo", "add", "slow", "fail", "exit_process", "with_meta", "show_ui"];
const PATTERNS: [&str; 9] =
    ["demo", "demo:*", "demo:e*", "demo:add", "demo:f*", "demo:*_*", "demo:with_meta", "demo:s*", "other:*"];
const USERS: [(&str, bool); 2] = [("alice", false), ("bob", true)];

fn token(user: &str) -> String {
    format!("access-{user}-token-0123456789abcdef")
}

fn instance_token(user: &str) -> String {
    format!("ds_inst_access_{user}_0123456789abcdef0123456789abcdef")
}

/// A small deterministic generator (xorshift64*): the seed names the rule set.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
    fn patterns(&mut self, most: usize) -> Vec<&'static str> {
        (0..self.below(most + 1)).map(|_| PATTERNS[self.below(PATTERNS.len())]).collect()
    }
}

struct Rule {
    role: Option<&'static str>,
    user: Option<&'static str>,
    allow: Option<Vec<&'static str>>,
    deny: Vec<&'static str>,
}

fn rules(rng: &mut Rng) -> Vec<Rule> {
    (0..1 + rng.below(3))
        .map(|_| {
            let (role, user) = match rng.below(4) {
                0 => (None, None),
                1 => (Some(["member", "admin"][rng.below(2)]), None),
                _ => (None, Some(USERS[rng.below(2)].0)),
            };
            let allow = (rng.below(2) == 0).then(|| rng.patterns(2)).filter(|a| !a.is_empty());
            let mut deny = rng.patterns(2);
            if allow.is_none() && deny.is_empty() {
                deny.push(PATTERNS[rng.below(PATTERNS.len())]);
            }
            Rule { role, user, allow, deny }
        })
        .collect()
}

/// `*` as any run of characters, the rest literal; a bare server name is the whole server.
fn glob(pattern: &str, path: &str) -> bool {
    let pattern = if pattern.contains(':') { pattern.to_owned() } else { format!("{pattern}:*") };
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return path == pattern;
    }
    if !path.starts_with(first) || !path[first.len()..].ends_with(last) || path.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &path[first.len()..path.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The oracle: the tools the rules naming `user` allow.
fn expected(rules: &[Rule], user: &str, admin: bool) -> BTreeSet<String> {
    let role = if admin { "admin" } else { "member" };
    let naming: Vec<&Rule> =
        rules.iter().filter(|r| r.role.is_none_or(|x| x == role) && r.user.is_none_or(|u| u == user)).collect();
    TOOLS
        .iter()
        .filter(|tool| {
            let path = format!("demo:{tool}");
            naming.iter().all(|r| r.allow.as_ref().is_none_or(|a| a.iter().any(|p| glob(p, &path))))
                && !naming.iter().any(|r| r.deny.iter().any(|p| glob(p, &path)))
        })
        .map(|t| (*t).to_owned())
        .collect()
}

fn config(rules: &[Rule]) -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let mut config = format!(
        "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"acme\"\n[[servers]]\nslug = \"demo\"\n\
         transport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n[[installations]]\nid = \"d\"\n\
         team = \"acme\"\nserver = \"demo\"\n"
    );
    for (user, admin) in USERS {
        config += &format!(
            "[installations.users.{user}]\ninstance_path = \"{user}-demo\"\ninstance_token_sha256 = \"{}\"\n",
            sha256_hex(&instance_token(user))
        );
        let _ = admin;
    }
    for (user, admin) in USERS {
        let role = if admin { "admin" } else { "member" };
        config += &format!(
            "[[users]]\nid = \"{user}\"\nteams = [\"acme\"]\nrole = \"{role}\"\ntoken_sha256 = [\"{}\"]\n",
            sha256_hex(&token(user))
        );
    }
    let list = |patterns: &[&str]| patterns.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", ");
    for rule in rules {
        config += "[[access]]\n";
        if let Some(role) = rule.role {
            config += &format!("role = \"{role}\"\n");
        }
        if let Some(user) = rule.user {
            config += &format!("user = \"{user}\"\n");
        }
        if let Some(allow) = &rule.allow {
            config += &format!("allow = [{}]\n", list(allow));
        }
        config += &format!("deny = [{}]\n", list(&rule.deny));
    }
    config
}

/// Every `tool_path` in a discover answer's text, as the tool's name.
fn discovered(answer: &Value) -> BTreeSet<String> {
    let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_default();
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("demo:") {
        let tail = &rest[at + 5..];
        let name: String = tail.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        found.insert(name);
        rest = tail;
    }
    found
}

fn refused_by_rules(reply: &Value) -> bool {
    reply["error"]["code"] == -32602
        && reply["error"]["message"].as_str().is_some_and(|m| m.contains("access rules do not allow it"))
}

#[tokio::test]
async fn what_is_listed_is_exactly_what_is_callable_on_both_routers() {
    // How many tools each user was allowed, over the seeds: the rule sets must not all say the same.
    let mut sizes = BTreeSet::new();
    for seed in 1..=10u64 {
        let rules = rules(&mut Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let sat = TestSatellite::start(&config(&rules)).await;
        sat.wait_ready().await;
        for (user, admin) in USERS {
            wait_instance_online(&sat, format!("demo-acme-{user}-d").as_str()).await;
            let want = expected(&rules, user, admin);
            sizes.insert(want.len());
            let direct =
                Caller::connect(&sat, &format!("/i/{user}-demo/mcp?token={}", instance_token(user)), None).await;
            let (_, listing) = direct.call("tools/list", json!({})).await;
            let listed: BTreeSet<String> = listing["result"]["tools"]
                .as_array()
                .map(|tools| tools.iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            assert_eq!(listed, want, "seed {seed}, {user}: the instance router's tools/list");
            let mcp = Caller::connect(&sat, "/mcp", Some(&token(user))).await;
            let found = discovered(&mcp.tool("discover_mcp_tools", json!({"query": "*"})).await);
            assert_eq!(found, want, "seed {seed}, {user}: discover on /mcp");
            for tool in CALLABLE {
                let args = json!({"text": "x", "a": 1, "b": 2});
                let on_instance = direct.call("tools/call", json!({"name": tool, "arguments": args})).await.1;
                let on_mcp = mcp.execute(&format!("demo:{tool}"), args).await;
                let allowed = want.contains(tool);
                assert_eq!(
                    !refused_by_rules(&on_instance),
                    allowed,
                    "seed {seed}, {user}, {tool} on /i/: {on_instance}"
                );
                assert_eq!(!refused_by_rules(&on_mcp), allowed, "seed {seed}, {user}, {tool} on /mcp: {on_mcp}");
            }
        }
        assert!(sat.satellite.shutdown().await, "seed {seed}");
    }
    assert!(sizes.len() >= 3 && sizes.iter().any(|n| *n > 0 && *n < TOOLS.len()), "too alike: {sizes:?}");
}

#[tokio::test]
async fn a_rule_naming_nobody_known_or_a_bad_pattern_is_refused_at_load() {
    let base = config(&[]);
    for (rule, says) in [
        ("[[access]]\nuser = \"mallory\"\ndeny = [\"demo\"]\n", "no user"),
        ("[[access]]\nrole = \"owner\"\ndeny = [\"demo\"]\n", "not a role"),
        ("[[access]]\ndeny = [\":echo\"]\n", "not valid"),
        ("[[access]]\nteam = \"acme\"\n", "allows and denies nothing"),
    ] {
        let (passed, said) = check_config(&format!("{base}{rule}"));
        assert!(!passed && said.contains("access[0]") && said.contains(says), "{rule}: {said}");
    }
}
