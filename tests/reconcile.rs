//! A real satellite running from a standalone file: instances per user,
//! live edits, broken servers next to good ones, and what survives a restart.

use std::time::Duration;

use satellite::model::{InstanceStatus, ProcessId};
use serde_json::{json, Value};

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn base(extra: &str) -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    // python3 is on the built-in allow-list; absolute paths must be listed (SB §9.2 widened by the file).
    let memory = toml_str(&repo_path("tests/node/node_modules/.bin/mcp-server-memory").to_string_lossy());
    format!(
        r#"
[satellite]
handshake_timeout_seconds = 3
discovery_timeout_seconds = 5

[sandbox]
allowed_commands = [{exe}, {memory}, "/nonexistent/mcp-server"]

[[teams]]
id = "acme"

[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["{alice}"]

[[users]]
id = "bob"
teams = ["acme"]

[[servers]]
slug = "demo"
transport = "stdio"
command = {exe}
args = ["demo-server"]

{extra}
"#,
        alice = satellite::config::sha256_hex(ALICE_TOKEN)
    )
}

const ALICE_TOKEN: &str = "alice-reconcile-token-0123456789";

const DEMO_INSTALL: &str = r#"
[[installations]]
id = "i-demo"
team = "acme"
server = "demo"
"#;

async fn wait_status(sat: &TestSatellite, id: &str, status: InstanceStatus) -> satellite::instances::StatusEntry {
    let pid = ProcessId::from(id);
    wait_until(DEADLINE, &format!("{id} to be {status}"), || {
        let found = sat.satellite.manager().get(&pid).map(|i| i.status()).filter(|s| s.status == status);
        async move { found }
    })
    .await
}

fn pid_of(sat: &TestSatellite, id: &str) -> Option<u32> {
    sat.satellite.manager().get(&ProcessId::from(id)).and_then(|i| i.pid())
}

#[tokio::test]
async fn each_member_gets_an_instance_and_edits_touch_only_what_changed() {
    let http = HttpServer::demo(&["--protocol", "legacy"]).await;
    let http_server = format!(
        "[[servers]]\nslug = \"remote\"\ntransport = \"http\"\nurl = {}\n",
        toml_str(http.url("/mcp").as_str())
    );
    let remote_install = "[[installations]]\nid = \"i-remote\"\nteam = \"acme\"\nserver = \"remote\"\n";
    let first = base(&format!("{http_server}{DEMO_INSTALL}{remote_install}"));
    let sat = TestSatellite::start(&first).await;
    sat.wait_ready().await;
    for id in
        ["demo-acme-alice-i-demo", "demo-acme-bob-i-demo", "remote-acme-alice-i-remote", "remote-acme-bob-i-remote"]
    {
        wait_status(&sat, id, InstanceStatus::Online).await;
    }
    let alice = pid_of(&sat, "demo-acme-alice-i-demo").expect("alice has a process");
    let bob = pid_of(&sat, "demo-acme-bob-i-demo").expect("bob has a process");
    assert_ne!(alice, bob, "one process per user");
    let alice_tools =
        sat.satellite.manager().get(&ProcessId::from("demo-acme-alice-i-demo")).unwrap().catalog().unwrap();
    assert_eq!(alice_tools.tools.len(), 7);

    // Bob's instance changes (a user tier appears), the remote installation goes, a new one comes.
    let memory = format!(
        "[[servers]]\nslug = \"memory\"\ntransport = \"stdio\"\ncommand = {}\n",
        toml_str(&node_bin("mcp-server-memory").to_string_lossy())
    );
    let memory_install = "[[installations]]\nid = \"i-mem\"\nteam = \"acme\"\nserver = \"memory\"\n";
    let bob_tier = "[installations.users.bob]\nargs = [\"--page-size\", \"3\"]\n";
    let second = base(&format!("{http_server}{memory}{DEMO_INSTALL}{bob_tier}{memory_install}"));
    sat.rewrite_config(&second);

    wait_status(&sat, "memory-acme-alice-i-mem", InstanceStatus::Online).await;
    wait_status(&sat, "memory-acme-bob-i-mem", InstanceStatus::Online).await;
    let new_bob = wait_until(DEADLINE, "bob's demo restarted", || {
        let pid = pid_of(&sat, "demo-acme-bob-i-demo").filter(|p| *p != bob);
        async move { pid }
    })
    .await;
    assert!(!process_exists(bob), "bob's old process is gone");
    assert_ne!(new_bob, bob);
    wait_status(&sat, "demo-acme-bob-i-demo", InstanceStatus::Online).await;
    assert_eq!(pid_of(&sat, "demo-acme-alice-i-demo"), Some(alice), "alice's instance was not touched");
    assert!(sat.satellite.manager().get(&ProcessId::from("remote-acme-alice-i-remote")).is_none());
    let specs: Vec<String> = sat.satellite.manager().desired().iter().map(|s| s.process_id.0.clone()).collect();
    assert_eq!(specs.len(), 4, "{specs:?}");

    // A broken edit is refused and the last good config stays.
    // Empty (an editor or `cat >` caught mid-write) and cut off mid-line count as broken too.
    let broken = [
        "this is [not toml".to_owned(),
        second.replace("[[teams]]", "[[teams]]\nunknown = 1"),
        String::new(),
        "\n  \n".to_owned(),
        second[..second.find("[[installations]]").unwrap() + 10].to_owned(),
    ];
    for (n, text) in broken.iter().enumerate() {
        sat.rewrite_config(text);
        wait_until(DEADLINE, "the broken edit to be refused", || {
            let refused = sat.satellite.config_refusals() == n as u64 + 1;
            async move { refused.then_some(()) }
        })
        .await;
    }
    assert_eq!(pid_of(&sat, "demo-acme-alice-i-demo"), Some(alice));
    assert_eq!(sat.satellite.manager().desired().len(), 4);

    assert!(sat.satellite.shutdown().await, "clean shutdown");
    assert!(!process_exists(alice) && !process_exists(new_bob), "no child survives shutdown");
}

#[tokio::test]
async fn broken_servers_never_block_the_others() {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let mut extra = String::new();
    for mode in ["garbage", "silent", "exit-on-initialize", "endless-pages"] {
        extra += &format!("[[servers]]\nslug = \"{mode}\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"{mode}\"]\n");
        extra += &format!("[[installations]]\nid = \"i-{mode}\"\nteam = \"acme\"\nserver = \"{mode}\"\n\n");
    }
    extra += "[[servers]]\nslug = \"missing\"\ntransport = \"stdio\"\ncommand = \"/nonexistent/mcp-server\"\n";
    extra += "[[installations]]\nid = \"i-missing\"\nteam = \"acme\"\nserver = \"missing\"\n";
    extra += &format!(
        "[[servers]]\nslug = \"nowhere\"\ntransport = \"http\"\nurl = \"http://127.0.0.1:{}/mcp\"\n",
        free_port()
    );
    extra += "[[installations]]\nid = \"i-nowhere\"\nteam = \"acme\"\nserver = \"nowhere\"\n";
    let config = base(&format!("{extra}{DEMO_INSTALL}")).replace("[satellite]", "[satellite]\ndebug_route = true");
    let sat = TestSatellite::start(&config).await;
    sat.wait_ready().await;

    wait_status(&sat, "demo-acme-alice-i-demo", InstanceStatus::Online).await;
    wait_status(&sat, "garbage-acme-alice-i-garbage", InstanceStatus::Online).await;
    let silent = wait_status(&sat, "silent-acme-alice-i-silent", InstanceStatus::Offline).await;
    assert!(silent.message.unwrap().contains("timeout"));
    let exited = wait_status(&sat, "exit-on-initialize-acme-alice-i-exit-on-initialize", InstanceStatus::Offline).await;
    let message = exited.message.unwrap();
    assert!(message.contains("exit code 2") && message.contains("missing API key"), "{message}");
    let pages = wait_status(&sat, "endless-pages-acme-alice-i-endless-pages", InstanceStatus::Error).await;
    assert!(pages.message.unwrap().contains("10 pages"));
    // A binary that is not there is retried under the restart policy (it may be back in a moment), saying why.
    let missing = wait_status(&sat, "missing-acme-alice-i-missing", InstanceStatus::Offline).await;
    let message = missing.message.unwrap();
    assert!(message.contains("Failed to spawn MCP server") && message.contains("restart"), "{message}");
    // Its tools were never listed: a call says why it cannot run, not "Tool not found".
    let alice = Caller::connect(&sat, "/mcp", Some(ALICE_TOKEN)).await;
    let blocked = alice.execute("missing:anything", json!({})).await;
    let text = blocked["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.contains("MCP server 'missing' is unavailable") && text.contains("Failed to spawn"), "{blocked}");
    let nowhere = wait_status(&sat, "nowhere-acme-bob-i-nowhere", InstanceStatus::Offline).await;
    assert_eq!(nowhere.message.as_deref(), Some("Server unreachable"));

    // The debug route lists every instance and the tools of the healthy ones.
    let debug: Value =
        reqwest::get(format!("{}/api/status/debug", sat.base_url())).await.unwrap().json().await.unwrap();
    assert_eq!(debug["server_status"]["stats"]["total"], 14, "7 installations x 2 members");
    assert_eq!(debug["tools"]["tools_by_server"]["demo-acme-bob-i-demo"], 7);
    let names: Vec<&str> =
        debug["tools"]["all_tools"].as_array().unwrap().iter().filter_map(|t| t["namespaced_name"].as_str()).collect();
    assert!(names.contains(&"demo:echo") && names.contains(&"garbage:ok"), "{names:?}");
    let ready = reqwest::get(format!("{}/readyz", sat.base_url())).await.unwrap();
    assert_eq!(ready.status(), 200);
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn catalogs_and_status_history_outlive_a_restart() {
    let config = base(DEMO_INSTALL);
    let sat = TestSatellite::start(&config).await;
    wait_status(&sat, "demo-acme-alice-i-demo", InstanceStatus::Online).await;
    wait_status(&sat, "demo-acme-bob-i-demo", InstanceStatus::Online).await;
    // Off unless configured, with the reference's body.
    let denied = reqwest::get(format!("{}/api/status/debug", sat.base_url())).await.unwrap();
    assert_eq!(denied.status(), 403);
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"], "Access Denied");
    let dir = sat.dir;
    assert!(sat.satellite.shutdown().await);

    let store = open_store(&dir.path().join("data")).await;
    let catalogs = store.catalogs().load_catalogs().await.unwrap();
    let alice = &catalogs[&ProcessId::from("demo-acme-alice-i-demo")];
    assert_eq!(alice.tools.len(), 7);
    assert!(alice.tools.iter().all(|t| t.content_hash().len() == 64));
    assert_eq!(alice.resources.len(), 2);
    let history: Vec<String> = store
        .statuses()
        .status_history(&ProcessId::from("demo-acme-alice-i-demo"))
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(history, ["connecting", "discovering_tools", "online"]);
    store.close().await;

    // Restarted with bob gone: his catalog is dropped once it stayed away for the grace (here at once), alice's is
    // there before rediscovery.
    let without_bob = config.replace("[[users]]\nid = \"bob\"\nteams = [\"acme\"]\n", "");
    let sat = TestSatellite::start_in(dir, &without_bob).await;
    sat.wait_ready().await;
    assert!(sat.satellite.manager().get(&ProcessId::from("demo-acme-bob-i-demo")).is_none());
    let kept = sat.satellite.store().catalogs().load_catalogs().await.unwrap();
    assert!(kept.contains_key(&ProcessId::from("demo-acme-bob-i-demo")), "kept for the grace after a restart too");
    assert_eq!(sat.satellite.manager().purge_removed(Duration::ZERO).await, 1);
    let dir = sat.dir;
    assert!(sat.satellite.shutdown().await);
    let store = open_store(&dir.path().join("data")).await;
    let catalogs = store.catalogs().load_catalogs().await.unwrap();
    assert_eq!(catalogs.keys().map(|k| k.0.as_str()).collect::<Vec<_>>(), ["demo-acme-alice-i-demo"]);
    store.close().await;
}

/// A configuration cut short for a moment (a file that lost its installations and still parses, or a backend that
/// answered with part of the team's servers) stops the instances it no longer names, but what they leave is kept
/// for `REMOVAL_GRACE`: their stored catalogs and the installation's drift holds. Back within it, an instance
/// starts with its tools and no hold an administrator set is lost. Past it, `purge_removed` deletes them. Before,
/// both were deleted at once.
#[tokio::test]
async fn a_configuration_cut_short_for_a_moment_costs_no_catalog_and_no_hold() {
    let config = base(DEMO_INSTALL);
    let sat = TestSatellite::start(&config).await;
    let alice = "demo-acme-alice-i-demo";
    wait_status(&sat, alice, InstanceStatus::Online).await;
    let store = sat.satellite.store().clone();
    store.catalogs().hold_tools("i-demo", alice, &["echo"]).await.expect("a hold");
    let held = || async { store.catalogs().held_tools().await.unwrap().iter().any(|h| h.installation_id == "i-demo") };
    let stored = || async { store.catalogs().load_catalogs().await.unwrap().contains_key(&ProcessId::from(alice)) };
    let gone = |present: bool| {
        let instance = sat.satellite.manager().get(&ProcessId::from(alice));
        async move { (instance.is_some() == present).then_some(()) }
    };

    sat.rewrite_config(&base(""));
    wait_until(DEADLINE, "alice's instance removed", || gone(false)).await;
    assert!(stored().await, "the removed instance's catalog is kept for the grace");
    assert!(held().await, "the uninstalled installation's holds are kept for the grace");
    assert_eq!(sat.satellite.manager().purge_removed(satellite::instances::REMOVAL_GRACE).await, 0, "not yet due");

    sat.rewrite_config(&config);
    wait_until(DEADLINE, "alice's instance back", || gone(true)).await;
    let instance = sat.satellite.manager().get(&ProcessId::from(alice)).expect("alice's instance");
    assert!(instance.catalog().is_some(), "it starts with its tools, before it is discovered again");
    assert_eq!(sat.satellite.manager().purge_removed(Duration::ZERO).await, 0, "back: nothing of it is due");
    assert!(stored().await && held().await);

    sat.rewrite_config(&base(""));
    wait_until(DEADLINE, "alice's instance removed again", || gone(false)).await;
    assert!(sat.satellite.manager().purge_removed(Duration::ZERO).await >= 2, "bob's and alice's catalogs, the holds");
    assert!(!stored().await, "deleted past the grace");
    assert!(!held().await, "released past the grace");
    assert!(sat.satellite.shutdown().await);
}

/// A server that takes its whole handshake timeout to start holds up no later edit of the configuration: with one
/// that never answers still `connecting`, a server added after it comes online, and once it is removed its start
/// ends at once. Before, every apply waited for each start it began, under the lock the next apply takes, so the
/// next edit (a new member's server, a token removed) waited out the handshake timeout of every slow start.
#[tokio::test]
async fn a_server_slow_to_start_holds_up_no_later_edit() {
    let config = base(DEMO_INSTALL).replace("handshake_timeout_seconds = 3", "handshake_timeout_seconds = 600");
    let sat = TestSatellite::start(&config).await;
    sat.wait_ready().await;
    // A process that reads nothing and answers nothing: its start lasts the handshake timeout. Its command line
    // is this test run's own, to find it among the processes.
    let marker = format!("sleep(900.{})", std::process::id());
    let stuck = format!(
        "\n[[servers]]\nslug = \"stuck\"\ntransport = \"stdio\"\ncommand = \"python3\"\n\
         args = [\"-c\", \"__import__('time').{marker}\"]\n\
         [[installations]]\nid = \"i-stuck\"\nteam = \"acme\"\nserver = \"stuck\"\n"
    );
    let running = |marker: &str| {
        std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
        })
    };
    sat.rewrite_config(&format!("{config}{stuck}"));
    wait_status(&sat, "stuck-acme-alice-i-stuck", InstanceStatus::Connecting).await;
    let late = "\n[[installations]]\nid = \"i-late\"\nteam = \"acme\"\nserver = \"demo\"\n";
    sat.rewrite_config(&format!("{config}{stuck}{late}"));
    wait_status(&sat, "demo-acme-alice-i-late", InstanceStatus::Online).await;
    let stuck_now =
        sat.satellite.manager().get(&ProcessId::from("stuck-acme-alice-i-stuck")).map(|i| i.status().status);
    assert_eq!(stuck_now, Some(InstanceStatus::Connecting), "the slow one is still starting");
    assert!(running(&marker), "the slow one's process runs");
    sat.rewrite_config(&format!("{config}{late}"));
    // Its start ends at once: its process is stopped, not left to its handshake timeout.
    wait_until(DEADLINE, "the slow one's process stopped", || {
        let still = running(&marker);
        async move { (!still).then_some(()) }
    })
    .await;
    assert!(sat.satellite.shutdown().await);
}
