//! The cross-tenant matrix: 2 teams x 2 users, every meta-tool, native
//! resources, the instance router, and sessions reused across users. Every
//! instance is labelled with its owner, so a call that reached anybody else's
//! instance would show the wrong label.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use satellite::config::sha256_hex;
use satellite::model::InstanceStatus;
use serde_json::{json, Value};

use crate::common::*;

const USERS: [(&str, &str); 4] = [("alice", "acme"), ("bob", "acme"), ("carol", "globex"), ("dave", "globex")];
const ACCESS_DENIED: &str =
    "You do not have access to server 'tools'. Please check your team's MCP server installations.";

fn token(user: &str) -> String {
    format!("{user}-bearer-token-0123")
}

fn instance_token(user: &str) -> String {
    format!("ds_inst_{}", sha256_hex(&format!("instance-{user}")))
}

fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let mut file =
        format!("[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"acme\"\n[[teams]]\nid = \"globex\"\n");
    for (user, team) in USERS {
        file += &format!(
            "[[users]]\nid = \"{user}\"\nteams = [\"{team}\"]\ntoken_sha256 = [\"{}\"]\n",
            sha256_hex(&token(user))
        );
    }
    // Both teams install `demo`; only globex installs `tools`.
    file +=
        &format!("[[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n");
    file +=
        &format!("[[servers]]\nslug = \"tools\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n");
    for (id, team, server) in
        [("d-acme", "acme", "demo"), ("d-globex", "globex", "demo"), ("t-globex", "globex", "tools")]
    {
        file += &format!("[[installations]]\nid = \"{id}\"\nteam = \"{team}\"\nserver = \"{server}\"\n");
        for (user, user_team) in USERS.iter().filter(|(_, t)| *t == team) {
            let _ = user_team;
            file += &format!("[installations.users.{user}]\nargs = [\"--label\", \"{user}\"]\n");
            if server == "demo" {
                file += &format!(
                    "instance_path = \"{user}-demo\"\ninstance_token_sha256 = \"{}\"\n",
                    sha256_hex(&instance_token(user))
                );
            }
        }
    }
    file
}

/// The label of the instance that ran `{slug}:with_meta`.
async fn served_by(caller: &Caller, slug: &str) -> Value {
    let reply =
        caller.tool("execute_mcp_tool", json!({"tool_path": format!("{slug}:with_meta"), "arguments": {}})).await;
    reply["result"]["_meta"]["demo/instance"].clone()
}

fn document(reply: &Value) -> Value {
    serde_json::from_str(reply["result"]["content"][0]["text"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

#[tokio::test]
async fn every_cross_tenant_access_is_denied() {
    let sat = TestSatellite::start(&config()).await;
    sat.wait_ready().await;
    wait_until(Duration::from_secs(60), "all instances online", || {
        let all = sat.satellite.manager().instances();
        let done = all.len() == 6 && all.iter().all(|i| i.status().status == InstanceStatus::Online);
        async move { done.then_some(()) }
    })
    .await;
    let base = sat.base_url();

    for (user, team) in USERS {
        let session = Caller::connect(&sat, "/mcp", Some(&token(user))).await;
        let globex = team == "globex";
        // Meta-tools: discovery lists only the caller's servers; execution runs on the caller's instance.
        let listed = document(&session.tool("discover_mcp_tools", json!({"query": "*"})).await);
        let slugs: std::collections::BTreeSet<&str> =
            listed["tools"].as_array().unwrap().iter().map(|t| t["server_name"].as_str().unwrap()).collect();
        let expected: std::collections::BTreeSet<&str> =
            if globex { ["demo", "tools"].into() } else { ["demo"].into() };
        assert_eq!(slugs, expected, "{user}");
        assert_eq!(served_by(&session, "demo").await, json!(user), "{user}: demo ran on the caller's own instance");
        if globex {
            assert_eq!(served_by(&session, "tools").await, json!(user));
        } else {
            let denied =
                session.tool("execute_mcp_tool", json!({"tool_path": "tools:echo", "arguments": {"text": "x"}})).await;
            assert_eq!(denied["error"]["message"], ACCESS_DENIED, "{user}");
            let denied = session.tool("read_mcp_resource", json!({"uri": "tools|demo://readme"})).await;
            assert_eq!(denied["error"]["message"], ACCESS_DENIED, "{user}");
            let denied = session.call("resources/read", json!({"uri": "tools|demo://readme"})).await.1;
            assert_eq!(denied["error"]["message"], ACCESS_DENIED, "{user}");
        }
        let resources = document(&session.tool("list_mcp_resources", json!({})).await);
        for resource in resources["resources"].as_array().unwrap() {
            assert!(expected.contains(resource["server"].as_str().unwrap()), "{user}: {resource}");
        }
        let native = session.call("resources/list", json!({})).await.1;
        let native_uris: Vec<&str> =
            native["result"]["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap()).collect();
        assert_eq!(native_uris.len(), if globex { 4 } else { 2 }, "{user}: {native_uris:?}");
        let templates = session.call("resources/templates/list", json!({})).await.1;
        assert_eq!(
            templates["result"]["resourceTemplates"].as_array().unwrap().len(),
            if globex { 2 } else { 1 },
            "{user}"
        );

        // Instance router: the caller's token opens the caller's path only.
        for (other, _) in USERS {
            let url = format!("{base}/i/{other}-demo/mcp?token={}", instance_token(user));
            let response = Client::new()
                .post(url)
                .header("accept", "application/json, text/event-stream")
                .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}))
                .send()
                .await
                .unwrap();
            let expected = if other == user { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
            assert_eq!(response.status(), expected, "{user} on {other}'s instance");
        }
    }

    // Sessions reused across users: presenting someone else's session id gets nothing, and serves no one else.
    let alice = Caller::connect(&sat, "/mcp", Some(&token("alice"))).await;
    for (user, _) in USERS.iter().filter(|(u, _)| *u != "alice") {
        let mut borrowed = Caller::new(&sat, "/mcp", Some(&token(user)));
        borrowed.session = alice.session.clone();
        let (status, reply) = borrowed.call("tools/list", json!({})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{user} with alice's session id: {reply}");
        assert_eq!(reply["error"]["message"], "Session not found");
        assert!(reply.get("result").is_none());
        // With a session of their own, they are themselves.
        let own = Caller::connect(&sat, "/mcp", Some(&token(user))).await;
        assert_eq!(served_by(&own, "demo").await, json!(user), "{user} with their own session");
    }
    assert_eq!(served_by(&alice, "demo").await, json!("alice"), "alice's own session still serves alice");
    assert!(sat.satellite.shutdown().await);
}

/// Property over random installations and statuses: `discover_mcp_tools` returns exactly the tools the
/// caller can execute. Every returned tool runs on the caller's own instance; every tool of the caller's
/// instances that are down is absent.
#[tokio::test]
async fn discover_returns_exactly_what_the_caller_can_execute() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let exe = toml_str(&satellite_exe().to_string_lossy());
    let (mut crashed_total, mut up_total) = (0, 0);
    for seed in 0..3u64 {
        let mut rng = StdRng::seed_from_u64(0xd15c_0000 + seed);
        let users: Vec<String> = (0..rng.gen_range(2..4)).map(|u| format!("u{u}")).collect();
        let slugs: Vec<String> = (0..rng.gen_range(2..5)).map(|s| format!("s{s}")).collect();
        let mut file = format!("[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n");
        for user in &users {
            file += &format!(
                "[[users]]\nid = \"{user}\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n",
                sha256_hex(&token(user))
            );
        }
        let mut installed = Vec::new();
        for slug in &slugs {
            file += &format!(
                "[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n"
            );
            if rng.gen_bool(0.75) {
                installed.push(slug.clone());
                file += &format!("[[installations]]\nid = \"i-{slug}\"\nteam = \"t\"\nserver = \"{slug}\"\n");
                for user in &users {
                    file += &format!("[installations.users.{user}]\nargs = [\"--label\", \"{user}\"]\n");
                }
            }
        }
        let sat = TestSatellite::start(&file).await;
        sat.wait_ready().await;
        let expected_instances = users.len() * installed.len();
        wait_until(Duration::from_secs(60), "instances online", || {
            let all = sat.satellite.manager().instances();
            let done =
                all.len() == expected_instances && all.iter().all(|i| i.status().status == InstanceStatus::Online);
            async move { done.then_some(()) }
        })
        .await;
        // Crash a random subset of instances through their owners.
        let mut down = std::collections::BTreeSet::new();
        for user in &users {
            let session = Caller::connect(&sat, "/mcp", Some(&token(user))).await;
            for slug in &installed {
                if rng.gen_bool(0.4) {
                    session
                        .tool("execute_mcp_tool", json!({"tool_path": format!("{slug}:exit_process"), "arguments": {}}))
                        .await;
                    down.insert((user.clone(), slug.clone()));
                }
            }
        }
        crashed_total += down.len();
        up_total += expected_instances - down.len();
        wait_until(Duration::from_secs(30), "crashed instances offline", || {
            let offline = sat
                .satellite
                .manager()
                .instances()
                .iter()
                .filter(|i| i.status().status == InstanceStatus::Offline)
                .count();
            let want = down.len();
            async move { (offline == want).then_some(()) }
        })
        .await;
        for user in &users {
            let session = Caller::connect(&sat, "/mcp", Some(&token(user))).await;
            let found = document(&session.tool("discover_mcp_tools", json!({"query": "with_meta", "limit": 50})).await);
            let returned: std::collections::BTreeSet<String> = found["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["tool_path"].as_str().unwrap().ends_with(":with_meta"))
                .map(|t| t["server_name"].as_str().unwrap().to_owned())
                .collect();
            let executable: std::collections::BTreeSet<String> =
                installed.iter().filter(|s| !down.contains(&(user.clone(), (*s).clone()))).cloned().collect();
            assert_eq!(returned, executable, "seed {seed}, {user}: discover must list exactly the callable servers");
            for slug in &returned {
                assert_eq!(served_by(&session, slug).await, json!(user), "seed {seed}: {user} on {slug}");
            }
            for slug in installed.iter().filter(|s| !executable.contains(*s)) {
                let reply = session
                    .tool("execute_mcp_tool", json!({"tool_path": format!("{slug}:with_meta"), "arguments": {}}))
                    .await;
                assert!(
                    reply["result"].get("_meta").is_none(),
                    "seed {seed}: {user} reached a down instance of {slug}: {reply}"
                );
            }
        }
        assert!(sat.satellite.shutdown().await);
    }
    assert!(
        crashed_total > 0 && up_total > 0,
        "the seeds must mix live and crashed instances ({crashed_total} down, {up_total} up)"
    );
}
