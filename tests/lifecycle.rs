//! Instance lifecycle with real processes: crash and restart policy, idle dormancy and respawn, call and
//! process limits, stderr floods, a soak of spawn/crash/idle cycles, and SIGTERM during calls.

use std::sync::Arc;
use std::time::Duration;

use satellite::instances::InstanceError;
use satellite::model::{InstallationId, InstanceStatus, ProcessId, UserId};
use satellite::store::StoredEvent;
use serde_json::{json, Value};

use crate::common::lifecycle::*;
use crate::common::*;

/// Alice's bearer token, where a test calls through `/mcp`.
const ALICE_TOKEN: &str = "lifecycle-alice-token-0123";

async fn events(sat: &TestSatellite, event_type: &str) -> Vec<StoredEvent> {
    sat.satellite.store().outbox().events(Some(event_type), 0, 100_000).await.expect("read events")
}

async fn wait_events(sat: &TestSatellite, event_type: &str, at_least: usize) -> Vec<StoredEvent> {
    wait_until(DEADLINE, &format!("{at_least} {event_type} events"), || async move {
        let found = events(sat, event_type).await;
        (found.len() >= at_least).then_some(found)
    })
    .await
}

/// Crash alice's demo server through its exit tool and wait until the supervisor brought it back.
async fn crash_and_wait_restart(sat: &TestSatellite, restarts_before: usize) {
    let old_pid = instance(sat, ALICE).pid().expect("running");
    let _ = call(sat, ALICE, "exit_process", json!({"code": 3})).await;
    wait_until(DEADLINE, "old process gone", || async move { (!process_exists(old_pid)).then_some(()) }).await;
    wait_events(sat, "mcp.server.restarted", restarts_before + 1).await;
    wait_status(sat, ALICE, InstanceStatus::Online).await;
}

#[tokio::test]
async fn crashes_restart_until_the_fourth_in_five_minutes_then_a_restart_command_recovers() {
    let sat = TestSatellite::start(&config("")).await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    wait_status(&sat, BOB, InstanceStatus::Online).await;
    let bob_pid = instance(&sat, BOB).pid().expect("bob runs");

    for restarts in 0..3 {
        crash_and_wait_restart(&sat, restarts).await;
        // Every crash is a new process, and the call after it works.
        assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": "hi"})).await.expect("call")), "hi");
    }
    let old_pid = instance(&sat, ALICE).pid().expect("running");
    let _ = call(&sat, ALICE, "exit_process", json!({"code": 3})).await;
    let failed = wait_status(&sat, ALICE, InstanceStatus::PermanentlyFailed).await;
    let message = failed.message.expect("message");
    assert!(message.starts_with("Process crashed 4 times in 5 minutes. Manual restart required."), "{message}");
    assert!(message.contains("exit code 3"), "{message}");
    assert!(!process_exists(old_pid));
    assert_eq!(instance(&sat, ALICE).pid(), None, "no restart after the fourth crash");

    let crashed = wait_events(&sat, "mcp.server.crashed", 4).await;
    let counts: Vec<(i64, bool)> = crashed
        .iter()
        .map(|e| (e.data["crash_count"].as_i64().unwrap(), e.data["will_restart"].as_bool().unwrap()))
        .collect();
    assert_eq!(counts, [(1, true), (2, true), (3, true), (4, false)]);
    assert!(crashed.iter().all(|e| e.data["exit_code"] == 3 && e.data["user_id"] == "alice"));
    let restarted = events(&sat, "mcp.server.restarted").await;
    let attempts: Vec<i64> = restarted.iter().map(|e| e.data["attempt_number"].as_i64().unwrap()).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let failed = wait_events(&sat, "mcp.server.permanently_failed", 1).await;
    assert_eq!(failed[0].data["total_crashes"], 4);
    assert_eq!(failed[0].data["last_error"], "Exit code: 3, signal: none");
    // The status is set before its event is written: wait for the event.
    let statuses = wait_until(DEADLINE, "the permanently_failed status event", || async {
        let statuses = events(&sat, "mcp.server.status_changed").await;
        statuses
            .iter()
            .any(|e| e.data["status"] == "permanently_failed" && e.data["user_id"] == "alice")
            .then_some(statuses)
    })
    .await;
    assert!(statuses.iter().all(|e| e.data["user_id"].is_string() && e.data["team_id"] == "acme"));

    // A blocked call says why and what to do.
    let blocked = call(&sat, ALICE, "echo", json!({"text": "x"})).await;
    assert!(blocked.is_err(), "no process, no call");

    // Bob's instance of the same installation never noticed.
    let bob = instance(&sat, BOB);
    assert_eq!(bob.status().status, InstanceStatus::Online);
    assert_eq!(bob.pid(), Some(bob_pid));
    assert!(!statuses.iter().any(|e| e.data["user_id"] == "bob"
        && e.data["status"] != "connecting"
        && e.data["status"] != "discovering_tools"
        && e.data["status"] != "online"));

    // The restart command clears the failure.
    sat.satellite.manager().restart(&ProcessId::from(ALICE)).await.expect("restart");
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": "back"})).await.expect("call")), "back");
    assert_eq!(instance(&sat, ALICE).recent_crashes(), 0);
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn a_server_that_crashes_at_start_is_permanently_failed_after_four_tries() {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"dies\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"exit-on-initialize\"]\n\
         [[installations]]\nid = \"i-dies\"\nteam = \"acme\"\nserver = \"dies\"\n"
    );
    let sat = TestSatellite::start(&config(&extra)).await;
    sat.wait_ready().await;
    let id = "dies-acme-alice-i-dies";
    let failed = wait_status(&sat, id, InstanceStatus::PermanentlyFailed).await;
    assert!(failed.message.unwrap().contains("missing API key"), "the last stderr line says why");
    let crashed = wait_events(&sat, "mcp.server.crashed", 8).await;
    let alice: Vec<&StoredEvent> = crashed.iter().filter(|e| e.data["user_id"] == "alice").collect();
    assert_eq!(alice.len(), 4);
    assert_eq!(alice[3].data["will_restart"], false);
    assert_eq!(alice[0].data["exit_code"], 2);
    wait_status(&sat, ALICE, InstanceStatus::Online).await;

    // A manual restart forgets the crashes and tries again from the first backoff step.
    sat.satellite.manager().restart(&ProcessId::from(id)).await.expect("restart");
    let history = wait_until(DEADLINE, "a new round of crashes", || async {
        let n = events(&sat, "mcp.server.crashed").await.iter().filter(|e| e.data["user_id"] == "alice").count();
        (n > 4).then_some(n)
    })
    .await;
    assert!(history > 4);
    let statuses = events(&sat, "mcp.server.status_changed").await;
    assert!(statuses.iter().any(|e| e.data["status"] == "restarting" && e.data["user_id"] == "alice"));
    assert!(sat.satellite.shutdown().await);
}

/// The config lines of server `slug`: tests/fixtures/misbehaving_server.py in `mode` with `--marker marker`, installed
/// for `team` as installation `i-{slug}`.
fn misbehaving(slug: &str, mode: &str, marker: &std::path::Path, team: &str) -> String {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    format!(
        "[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = \"python3\"\n\
         args = [{script}, \"{mode}\", \"--marker\", {}]\n\
         [[installations]]\nid = \"i-{slug}\"\nteam = \"{team}\"\nserver = \"{slug}\"\n",
        toml_str(&marker.to_string_lossy())
    )
}

/// A server that says nothing within the handshake timeout the first time (an `npx` still fetching its package)
/// is stopped and started again under the restart policy; the second start answers and the instance comes
/// online. Before, the timeout left it offline until someone restarted it by hand.
#[tokio::test]
async fn a_server_silent_past_the_handshake_timeout_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let extra = misbehaving("slow", "silent-first", &dir.path().join("fetched"), "acme");
    let config = config(&extra).replace("handshake_timeout_seconds = 5", "handshake_timeout_seconds = 1");
    let sat = TestSatellite::start_with(dir, &config, |_| {}).await;
    sat.wait_ready().await;
    // alice and bob each run it; whichever starts first finds no marker and stays silent.
    for id in ["slow-acme-alice-i-slow", "slow-acme-bob-i-slow"] {
        wait_status(&sat, id, InstanceStatus::Online).await;
        assert_eq!(text_of(&call(&sat, id, "ok", json!({})).await.expect("call")), "ok");
    }
    let crashed = events(&sat, "mcp.server.crashed").await;
    let timed_out = crashed.iter().find(|e| e.data["server_id"] == "i-slow");
    assert!(timed_out.is_some_and(|e| e.data["will_restart"] == true), "the silent start is a crash: {crashed:?}");
    assert!(sat.satellite.shutdown().await);
}

/// A stdio server that answers its handshake but cannot list its tools yet (still loading, or its listing fails
/// for a while) is asked again, with backoff, while its process runs, and comes online once it lists them. Before,
/// it stayed in error, hidden from every client, until a restart or a config edit.
#[tokio::test]
async fn a_server_that_lists_its_tools_late_comes_online_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let sat = TestSatellite::start_with(dir, &config(&misbehaving("late", "lists-late", &ready, "acme")), |_| {}).await;
    sat.wait_ready().await;
    let id = "late-acme-alice-i-late";
    wait_status(&sat, id, InstanceStatus::Error).await;
    let pid = instance(&sat, id).pid().expect("its process runs");
    std::fs::write(&ready, b"").unwrap();
    wait_status(&sat, id, InstanceStatus::Online).await;
    assert_eq!(instance(&sat, id).pid(), Some(pid), "the same process, not a restart");
    assert_eq!(text_of(&call(&sat, id, "ok", json!({})).await.expect("call")), "ok");
    assert!(sat.satellite.shutdown().await);
}

/// Calls that come together to a dormant instance whose respawn hangs share one attempt and its failure: one
/// process started, every caller answered once its handshake timed out. Before, the callers queued behind the
/// failed attempt each tried again in turn, one handshake timeout after another, a process each.
#[tokio::test]
async fn callers_of_a_dormant_server_whose_respawn_hangs_share_one_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    // In a team of one: one instance, so every start counted is its own.
    let solo = "[[teams]]\nid = \"solo\"\n[[users]]\nid = \"carol\"\nteams = [\"solo\"]\n";
    let config = config(&(solo.to_owned() + &misbehaving("later", "silent-later", &starts, "solo")))
        .replace("handshake_timeout_seconds = 5", "handshake_timeout_seconds = 2");
    let sat = TestSatellite::start_with(dir, &config, fast_idle).await;
    sat.wait_ready().await;
    let id = "later-solo-carol-i-later";
    wait_status(&sat, id, InstanceStatus::Online).await;
    wait_until(DEADLINE, "asleep", || {
        let asleep = instance(&sat, id).is_dormant();
        async move { asleep.then_some(()) }
    })
    .await;
    let outcomes = futures::future::join_all((0..4).map(|_| call(&sat, id, "ok", json!({})))).await;
    assert!(outcomes.iter().all(Result::is_err), "{outcomes:?}");
    let started = std::fs::read_to_string(&starts).unwrap().lines().count();
    assert_eq!(started, 2, "the first start and one respawn for all four callers");
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn idle_instances_go_dormant_keep_their_tools_and_fifty_calls_respawn_one_process() {
    // The idle job runs every 50 ms; a process younger than the 1 s grace is left alone, so the respawned one
    // cannot fall asleep again between the 50 calls.
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &config(""), |c| {
        fast_idle(c);
        c.upstream.lifecycle.spawn_grace = Duration::from_secs(1);
    })
    .await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let first_pid = wait_until(DEADLINE, "alice asleep", || {
        let i = instance(&sat, ALICE);
        let pid = i.pid();
        async move { i.is_dormant().then_some(()).map(|_| pid) }
    })
    .await;
    assert_eq!(first_pid, None, "no process while dormant");
    let dormant = wait_events(&sat, "mcp.server.dormant", 1).await;
    assert!(dormant.iter().any(|e| e.data["server_slug"] == ALICE && e.data["process_id"].as_u64() > Some(0)));
    let alice = instance(&sat, ALICE);
    assert_eq!(alice.status().status, InstanceStatus::Online, "dormancy is not a status");
    assert_eq!(alice.catalog().expect("tools stay cached").tools.len(), 7);

    // 50 calls at once to a dormant instance start one process and all succeed.
    let respawns_before =
        events(&sat, "mcp.server.respawned").await.iter().filter(|e| e.data["server_slug"] == ALICE).count();
    let calls = (0..50).map(|i| {
        let sat = &sat;
        async move { call(sat, ALICE, "echo", json!({"text": format!("n{i}")})).await }
    });
    let results = futures::future::join_all(calls).await;
    for (i, result) in results.iter().enumerate() {
        assert_eq!(text_of(result.as_ref().expect("call succeeds")), format!("n{i}"));
    }
    let respawned: Vec<StoredEvent> =
        events(&sat, "mcp.server.respawned").await.into_iter().filter(|e| e.data["server_slug"] == ALICE).collect();
    assert_eq!(respawned.len(), respawns_before + 1, "one respawn for 50 concurrent calls");
    assert!(respawned.last().unwrap().data["respawn_duration_ms"].is_u64());
    assert!(sat.satellite.shutdown().await);
}

/// A dormant instance is up with no process: killed, or removed from the config, it reports
/// `mcp.server.stopped` as a running one does. Before, it stopped silently, and the backend of a kill that
/// landed while the server slept never heard of it (a flaky `compat` test found it).
#[tokio::test]
async fn a_dormant_instance_killed_or_removed_reports_its_stop() {
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &config(""), fast_idle).await;
    sat.wait_ready().await;
    for id in [ALICE, BOB] {
        wait_status(&sat, id, InstanceStatus::Online).await;
        wait_until(DEADLINE, &format!("{id} asleep"), || async { instance(&sat, id).is_dormant().then_some(()) }).await;
    }
    let stops_of = |events: &[StoredEvent], id: &str| -> Vec<Value> {
        events.iter().filter(|e| e.data["server_name"] == id).map(|e| e.data["reason"].clone()).collect()
    };
    assert!(stops_of(&events(&sat, "mcp.server.stopped").await, ALICE).is_empty(), "asleep is not stopped");

    let alice = UserId::from("alice");
    let killed = sat.satellite.manager().stop_installation(&InstallationId::from("i-demo"), Some(&alice)).await;
    assert_eq!(killed.expect("kill"), 1);
    let stopped = wait_events(&sat, "mcp.server.stopped", 1).await;
    assert_eq!(stops_of(&stopped, ALICE), [json!("killed")], "{stopped:?}");
    let status = instance(&sat, ALICE).status();
    assert_eq!((status.status, instance(&sat, ALICE).is_dormant()), (InstanceStatus::Offline, false));

    // The installation goes from the file: bob's sleeping instance is removed, and says so; alice's, stopped
    // already, is not stopped twice.
    let without = config("").replace("[[installations]]\nid = \"i-demo\"\nteam = \"acme\"\nserver = \"demo\"\n", "");
    assert_ne!(without, config(""), "the installation is in the config");
    sat.rewrite_config(&without);
    let stopped = wait_events(&sat, "mcp.server.stopped", 2).await;
    assert_eq!(stops_of(&stopped, BOB), [json!("removed")], "{stopped:?}");
    assert_eq!(stops_of(&stopped, ALICE), [json!("killed")], "{stopped:?}");
    assert!(sat.satellite.shutdown().await);
}

/// A periodic re-discovery holds the connections it found and discovers four instances at a time; the fifth
/// waits its turn. An idle sweep meanwhile puts that one to sleep, closing the connection the re-discovery holds.
/// Discovered on the closed connection, it failed, and the sleeping instance went `offline` (hidden, never swept
/// again). Now a discovery whose connection is no longer the instance's does nothing.
#[tokio::test]
async fn a_rediscovery_waiting_its_turn_leaves_an_instance_put_to_sleep_meanwhile_alone() {
    let members: String = ["carol", "dave", "erin"]
        .iter()
        .map(|user| format!("[[users]]\nid = \"{user}\"\nteams = [\"acme\"]\n"))
        .collect();
    let toml =
        config(&members).replace("args = [\"demo-server\"]\n", "args = [\"demo-server\"]\nrediscover_seconds = 1\n");
    assert!(toml.contains("rediscover_seconds = 1"), "the demo server is re-discovered every second");
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &toml, |c| {
        // Idle at once, but swept only when the test asks (the job's first round runs before anything is up).
        let lifecycle = &mut c.upstream.lifecycle;
        lifecycle.idle_timeout = Some(Duration::from_millis(1));
        lifecycle.spawn_grace = Duration::ZERO;
        lifecycle.idle_check_interval = Duration::from_secs(3600);
    })
    .await;
    sat.wait_ready().await;
    let ids: Vec<String> =
        ["alice", "bob", "carol", "dave", "erin"].iter().map(|user| format!("demo-acme-{user}-i-demo")).collect();
    for id in &ids {
        wait_status(&sat, id, InstanceStatus::Online).await;
    }
    wait_until(DEADLINE, "every catalog due for re-discovery", || async {
        let due = |id: &String| {
            instance(&sat, id)
                .catalog()
                .is_some_and(|c| chrono::Utc::now() - c.discovered_at > chrono::Duration::seconds(1))
        };
        ids.iter().all(due).then_some(())
    })
    .await;
    let manager = sat.satellite.manager();
    // The sweep runs while the first four discoveries hold their instances' locks: it puts the fifth to sleep.
    let (rediscovered, slept) = tokio::join!(manager.rediscover_stale(), manager.sweep_idle(|_| false));
    assert_eq!(rediscovered, 5);
    assert!(slept >= 1, "the instance waiting its turn was swept");
    for id in &ids {
        let (status, dormant) = (instance(&sat, id).status(), instance(&sat, id).is_dormant());
        assert_eq!(status.status, InstanceStatus::Online, "{id} (dormant: {dormant}): {status:?}");
    }
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn calls_past_the_per_instance_limit_wait_then_get_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let sat = TestSatellite::start_with(dir, &config(""), |c| {
        c.upstream.lifecycle.max_calls_per_instance = 2;
        c.upstream.lifecycle.call_queue_timeout = Duration::from_millis(200);
    })
    .await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let slow = || call(&sat, ALICE, "slow", json!({"ms": 1500}));
    let (a, b, c) = tokio::join!(slow(), slow(), async {
        wait_until(DEADLINE, "two calls running", || async { (instance(&sat, ALICE).in_flight() == 2).then_some(()) })
            .await;
        call(&sat, ALICE, "echo", json!({"text": "third"})).await
    });
    assert!(a.is_ok() && b.is_ok());
    let err = c.expect_err("the third call is refused");
    assert!(matches!(err, InstanceError::Busy { limit: 2, .. }), "{err}");
    assert!(err.to_string().contains("busy") && err.to_string().contains("retry"), "{err}");
    // Once the slots are free, calls go through again.
    assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": "after"})).await.expect("call")), "after");
    assert!(sat.satellite.shutdown().await);
}

/// Two dormant instances of alice's with room for one process: called at once, one respawns and the other waits
/// for the slot the first gives back when it falls asleep again, then respawns; both calls succeed. Before, the
/// second call failed at once with "process limit reached".
#[tokio::test]
async fn a_respawn_the_process_cap_refuses_waits_for_a_slot() {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"second\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
         [[installations]]\nid = \"i-second\"\nteam = \"acme\"\nserver = \"second\"\n"
    );
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &config(&extra), |c| {
        fast_idle(c);
        c.upstream.lifecycle.max_processes_per_user = 1;
    })
    .await;
    sat.wait_ready().await;
    let second = "second-acme-alice-i-second";
    // With room for one, the two start in turn, each falling asleep to let the other start.
    for id in [ALICE, second] {
        wait_until(DEADLINE, &format!("{id} started and asleep"), || {
            let i = instance(&sat, id);
            async move { (i.status().status == InstanceStatus::Online && i.is_dormant()).then_some(()) }
        })
        .await;
    }
    let (first, other) = tokio::join!(
        call(&sat, ALICE, "echo", json!({"text": "one"})),
        call(&sat, second, "echo", json!({"text": "two"}))
    );
    assert_eq!(text_of(&first.expect("the first call")), "one");
    assert_eq!(text_of(&other.expect("the second call waits for the slot")), "two");
    assert!(sat.satellite.shutdown().await);
}

/// Issue 73: more instances than the process cap. The one refused at start makes room within seconds by stopping
/// the least recently used idle process (dormant: its tools stay, the next call wakes it), not when idle processes
/// time out minutes later; a call of the dormant one makes room in turn, and a call that finds every process busy
/// gets a clear "process limit reached" it can retry.
#[tokio::test]
async fn instances_over_the_process_cap_make_room_by_stopping_idle_ones() {
    let sat = TestSatellite::start_with(tempfile::tempdir().unwrap(), &config(""), |c| {
        c.upstream.lifecycle.max_processes = 1;
        c.upstream.lifecycle.idle_timeout = None;
    })
    .await;
    sat.wait_ready().await;
    let manager = sat.satellite.manager().clone();
    wait_until(DEADLINE, "both instances started, one asleep to make room for the other", || {
        let (a, b) = (instance(&sat, ALICE), instance(&sat, BOB));
        let started = [&a, &b].iter().all(|i| i.status().status == InstanceStatus::Online);
        async move { (started && (a.is_dormant() || b.is_dormant())).then_some(()) }
    })
    .await;
    assert_eq!(manager.processes(), 1);
    for (id, text) in [(ALICE, "a1"), (BOB, "b1"), (ALICE, "a2")] {
        let answer = wait_until(DEADLINE, &format!("{id} answers, room made"), || async {
            match call(&sat, id, "echo", json!({"text": text})).await {
                Ok(result) => Some(result),
                Err(err) => {
                    assert!(err.to_string().contains("process limit reached"), "a clear, retryable refusal: {err}");
                    None
                }
            }
        })
        .await;
        assert_eq!(text_of(&answer), text);
        assert_eq!(manager.processes(), 1, "never over the cap");
    }
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn the_process_cap_per_user_refuses_more_children_with_a_clear_status() {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"second\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
         [[installations]]\nid = \"i-second\"\nteam = \"acme\"\nserver = \"second\"\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let sat =
        TestSatellite::start_with(dir, &config(&extra), |c| c.upstream.lifecycle.max_processes_per_user = 1).await;
    sat.wait_ready().await;
    for user in ["alice", "bob"] {
        let ids = [format!("demo-acme-{user}-i-demo"), format!("second-acme-{user}-i-second")];
        let statuses = wait_until(DEADLINE, "both instances settled", || {
            let s: Vec<InstanceStatus> = ids.iter().map(|id| instance(&sat, id).status().status).collect();
            async move { s.iter().all(|s| matches!(s, InstanceStatus::Online | InstanceStatus::Error)).then_some(s) }
        })
        .await;
        let refused: Vec<_> =
            ids.iter().filter(|id| instance(&sat, id).status().status == InstanceStatus::Error).collect();
        assert_eq!(refused.len(), 1, "{user}: one runs, one is refused ({statuses:?})");
        let message = instance(&sat, refused[0]).status().message.unwrap();
        assert!(message.contains("process limit reached") && message.contains(user), "{message}");
    }
    assert_eq!(sat.satellite.manager().processes(), 2);

    // When alice's running process stops (a kill here), her refused instance takes its slot and starts; bob's
    // stays refused, his cap still full.
    let alice = UserId::from("alice");
    let (running, waiting) = match instance(&sat, ALICE).status().status {
        InstanceStatus::Online => ("i-demo", "second-acme-alice-i-second"),
        _ => ("i-second", ALICE),
    };
    let manager = sat.satellite.manager();
    assert_eq!(manager.stop_installation(&InstallationId::from(running), Some(&alice)).await.expect("kill"), 1);
    wait_status(&sat, waiting, InstanceStatus::Online).await;
    assert_eq!(text_of(&call(&sat, waiting, "echo", json!({"text": "in"})).await.expect("call")), "in");
    assert_eq!(sat.satellite.manager().processes(), 2);
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn a_child_flooding_stderr_is_rate_limited_and_the_satellite_stays_responsive() {
    let script = toml_str(&fixture("misbehaving_server.py").to_string_lossy());
    let extra = format!(
        "[[servers]]\nslug = \"noisy\"\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [{script}, \"flood-stderr\"]\n\
         [[installations]]\nid = \"i-noisy\"\nteam = \"acme\"\nserver = \"noisy\"\n"
    );
    let sat = TestSatellite::start(&config(&extra)).await;
    sat.wait_ready().await;
    let noisy = "noisy-acme-alice-i-noisy";
    wait_status(&sat, noisy, InstanceStatus::Online).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    // While the flood runs, calls to both servers answer.
    for i in 0..20 {
        assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": format!("{i}")})).await.unwrap()), format!("{i}"));
        assert_eq!(text_of(&call(&sat, noisy, "ok", json!({})).await.unwrap()), "ok");
    }
    let event = wait_until(DEADLINE, "a rate-limit event for alice's noisy instance", || async {
        events(&sat, "mcp.server.log_rate_limit_exceeded")
            .await
            .into_iter()
            .find(|e| e.data["installation_name"] == noisy)
    })
    .await;
    assert_eq!(event.data["rate_limit"], 20);
    assert_eq!(event.data["installation_id"], "i-noisy");
    assert!(event.data["dropped_count"].as_u64().unwrap() > 0);
    assert!(instance(&sat, noisy).stderr_tail().len() <= 200, "the kept tail is bounded");
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish_then_exits_zero_with_no_child_left() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let token = "sigterm-token-0123456789abcdef";
    let mut child = tokio::process::Command::new(satellite_exe())
        .arg("serve")
        .current_dir(dir.path())
        .env("PORT", port.to_string())
        .env("SATELLITE_DEMO_TOKEN", token)
        // A slow tool's call outlasts the default 10 s drain; the operator gave it room.
        .env("SATELLITE_DRAIN_SECONDS", "20")
        .env_remove("SATELLITE_CONFIG")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let debug_url = format!("{base}/api/status/debug");
    let debug = || {
        let url = debug_url.clone();
        async move { reqwest::get(url).await.ok()?.json::<Value>().await.ok() }
    };
    let demo_pid = wait_until(DEADLINE, "demo instance online", || async {
        let d = debug().await?;
        (d["server_status"]["stats"]["online"] == 1).then_some(())?;
        d["servers_by_team"]["demo-team"]["running"][0]["pid"].as_u64()
    })
    .await as u32;

    let mut caller = Caller::for_url(format!("{base}/mcp"), Some(token));
    caller.initialize().await;
    let caller = Arc::new(caller);
    // Three short calls and one longer than the default drain (before, it was cut with "process stopped").
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let caller = caller.clone();
            let ms = if i == 3 { 11_000 } else { 1500 + i };
            tokio::spawn(async move { caller.execute("demo:slow", json!({"ms": ms})).await })
        })
        .collect();
    wait_until(DEADLINE, "four calls in flight", || async {
        let d = debug().await?;
        (d["servers_by_team"]["demo-team"]["running"][0]["in_flight_calls"] == 4).then_some(())
    })
    .await;
    // Open streams (a GET stream on /mcp, a legacy SSE stream) must not hold the drain: before, either made
    // SIGTERM take the whole 10 s drain and exit 1.
    let http = reqwest::Client::new();
    let session = caller.session.clone().expect("session");
    let get_stream = http
        .get(format!("{base}/mcp"))
        .bearer_auth(token)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .send()
        .await
        .unwrap();
    assert!(get_stream.status().is_success());
    let sse_stream = http.get(format!("{base}/sse")).bearer_auth(token).send().await.unwrap();
    assert!(sse_stream.status().is_success());
    let streams = [get_stream, sse_stream].map(|stream| {
        tokio::spawn(async move {
            let mut body = stream.bytes_stream();
            while let Some(Ok(_)) = futures::StreamExt::next(&mut body).await {}
        })
    });
    // The debug route shows the jobs and their counters.
    let jobs = debug().await.expect("debug")["jobs"].clone();
    assert!(jobs["idle-process-cleanup"]["execution_count"].as_u64() >= Some(1), "{jobs}");
    assert_eq!(jobs["idle-process-cleanup"]["error_count"], 0);
    assert!(jobs["session-expiry"]["period"] == 60_000 && jobs["event-retention"].is_object(), "{jobs}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    for call in calls {
        let reply = call.await.unwrap();
        assert!(reply["result"]["content"][0]["text"].as_str().is_some_and(|t| t.contains("slept")), "{reply}");
    }
    for stream in streams {
        tokio::time::timeout(Duration::from_secs(5), stream).await.expect("open streams end with the drain").unwrap();
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("exits in time").unwrap();
    assert_eq!(status.code(), Some(0), "a clean shutdown exits 0");
    assert!(!process_exists(demo_pid), "no child remains");
}

/// The demo server over HTTP for acme, and a satellite with alice's instance of it online.
async fn remote_online() -> (HttpServer, String, TestSatellite, &'static str) {
    let (server, addr, extra) = HttpServer::remote_for_acme().await;
    let sat = TestSatellite::start(&config(&extra)).await;
    sat.wait_ready().await;
    let id = "remote-acme-alice-i-remote";
    wait_status(&sat, id, InstanceStatus::Online).await;
    (server, addr, sat, id)
}

/// BP §6.3: nothing restarts a killed instance on its own. A probe already running for an unreachable server
/// (it reconnects as soon as the server answers) stops at the kill instead of bringing the instance back.
#[tokio::test]
async fn a_kill_stops_the_probe_of_an_unreachable_remote_server() {
    let (mut server, addr, sat, id) = remote_online().await;
    server.child.kill().await.expect("stop the remote server");
    call(&sat, id, "echo", json!({"text": "down"})).await.expect_err("the server is gone");
    wait_status(&sat, id, InstanceStatus::Offline).await;
    let alice = instance(&sat, id);
    wait_until(DEADLINE, "the probe running", || async { alice.recovering().then_some(()) }).await;

    let user = satellite::model::UserId::from("alice");
    let stopped = sat.satellite.manager().stop_installation(&InstallationId::from("i-remote"), Some(&user)).await;
    assert_eq!(stopped.expect("stopped"), 1);
    wait_until(DEADLINE, "the probe ended by the kill", || async { (!alice.recovering()).then_some(()) }).await;
    let _server = HttpServer::demo_on(&addr, &["--without-tool", "slow"]).await;
    let status = alice.status();
    assert_eq!((status.status, status.message.as_deref()), (InstanceStatus::Offline, Some("Stopped by command")));
    // A restart is what brings it back.
    sat.satellite.manager().restart(&ProcessId::from(id)).await.expect("restart");
    wait_status(&sat, id, InstanceStatus::Online).await;
}

#[tokio::test]
async fn an_unreachable_remote_server_goes_offline_and_a_probe_brings_it_back() {
    let (mut server, addr, sat, id) = remote_online().await;
    assert_eq!(text_of(&call(&sat, id, "echo", json!({"text": "up"})).await.expect("call")), "up");

    server.child.kill().await.expect("stop the remote server");
    let err = call(&sat, id, "echo", json!({"text": "down"})).await.expect_err("the server is gone");
    assert!(err.to_string().contains("connection failed"), "{err}");
    let offline = wait_status(&sat, id, InstanceStatus::Offline).await;
    assert_eq!(offline.message.as_deref(), Some("Server unreachable"));
    assert_eq!(instance(&sat, "remote-acme-bob-i-remote").status().status, InstanceStatus::Online, "bob never called");
    let tools = instance(&sat, id).catalog().expect("tools are kept while offline").tools.len();

    // Back on the same port, one tool fewer: the background probe reconnects and rediscovers without any call.
    let _server = HttpServer::demo_on(&addr, &["--without-tool", "slow"]).await;
    wait_status(&sat, id, InstanceStatus::Online).await;
    assert_eq!(instance(&sat, id).catalog().unwrap().tools.len(), tools - 1);
    let updated = events(&sat, "mcp.tools.updated").await;
    let mine = updated.iter().find(|e| e.process_id.as_deref() == Some(id)).expect("a tools.updated event");
    assert_eq!(mine.data["removed_tools"], json!(["slow"]));
    assert_eq!(mine.data["added_tools"], json!([]));
    assert_eq!(mine.data["total_tools"], tools - 1);
    let schema = crate::common::fake_backend::proto_validator("event.mcp.tools.updated");
    assert_eq!(crate::common::fake_backend::schema_errors(&schema, &mine.data), Vec::<String>::new());
    assert_eq!(text_of(&call(&sat, id, "echo", json!({"text": "again"})).await.expect("call")), "again");
    // The status is set in memory before its event is written: the last event may land just after.
    let statuses = || async {
        let statuses: Vec<(String, String)> = events(&sat, "mcp.server.status_changed")
            .await
            .into_iter()
            .filter(|e| e.process_id.as_deref() == Some(id))
            .map(|e| {
                let message = e.data["status_message"].as_str().unwrap_or("").to_owned();
                (e.data["status"].as_str().unwrap_or("").to_owned(), message)
            })
            .collect();
        statuses
    };
    let online_again = "the status_changed event of the instance online again";
    let statuses = wait_until(DEADLINE, online_again, || async {
        let statuses = statuses().await;
        statuses.last().is_some_and(|(s, _)| s == "online").then_some(statuses)
    })
    .await;
    let tail: Vec<&str> = statuses.iter().rev().take(4).rev().map(|(s, _)| s.as_str()).collect();
    assert_eq!(tail, ["offline", "connecting", "discovering_tools", "online"], "{statuses:?}");
    assert!(statuses.iter().any(|(_, m)| m == "Server recovered, re-discovering tools"));
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn a_remote_server_answering_401_requires_reauthorisation() {
    use warp::Filter;
    let refuse = warp::any().map(|| {
        warp::reply::with_status(
            warp::reply::json(&json!({"error": "invalid_token"})),
            warp::http::StatusCode::UNAUTHORIZED,
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(warp::serve(refuse).incoming(listener).run());
    let extra = format!(
        "[[servers]]\nslug = \"locked\"\ntransport = \"http\"\nurl = \"http://{addr}/mcp\"\n\
         [[installations]]\nid = \"i-locked\"\nteam = \"acme\"\nserver = \"locked\"\n"
    );
    let sat = TestSatellite::start(&config(&extra)).await;
    sat.wait_ready().await;
    let status = wait_status(&sat, "locked-acme-alice-i-locked", InstanceStatus::RequiresReauth).await;
    assert_eq!(status.message.as_deref(), Some("Authentication failed (HTTP 401)"));
    assert_eq!(instance(&sat, ALICE).status().status, InstanceStatus::Online);

    // A kill stops it as it stops any other, and a credential check afterwards does not bring it back. Before,
    // the move to `offline` was refused (the instance stayed `requires_reauth`), so the credential check's
    // conditional restart started the killed instance again.
    let locked = "locked-acme-alice-i-locked";
    let user = UserId::from("alice");
    let killed = sat.satellite.manager().stop_installation(&InstallationId::from("i-locked"), Some(&user)).await;
    assert_eq!(killed.expect("kill"), 1);
    let stopped = |status: satellite::instances::StatusEntry| {
        (status.status, status.message) == (InstanceStatus::Offline, Some("Stopped by command".to_owned()))
    };
    assert!(stopped(instance(&sat, locked).status()), "{:?}", instance(&sat, locked).status());
    sat.satellite.manager().reconnect_waiting_for_reauth(&ProcessId::from(locked)).await.expect("credential check");
    assert!(stopped(instance(&sat, locked).status()), "{:?}", instance(&sat, locked).status());
    // A credential check that finds the killed instance's credentials refused marks it so; one that finds them
    // valid again does not start it (its conditional restart skips a halted instance).
    let refused = "Credentials refused by a check".to_owned();
    sat.satellite.manager().require_reauth(&instance(&sat, locked), refused.clone()).await;
    sat.satellite.manager().reconnect_waiting_for_reauth(&ProcessId::from(locked)).await.expect("credential check");
    let status = instance(&sat, locked).status();
    assert_eq!((status.status, status.message), (InstanceStatus::RequiresReauth, Some(refused)), "not restarted");
    assert!(sat.satellite.shutdown().await);
}

#[tokio::test]
async fn standalone_keeps_server_and_request_logs_as_events() {
    let sat = TestSatellite::start(&config("")).await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": "logged"})).await.unwrap()), "logged");
    let failed = call(&sat, ALICE, "fail", json!({"message": "nope"})).await.unwrap();
    assert_eq!(failed["isError"], true);

    let requests = wait_until(DEADLINE, "request logs of alice's calls", || async {
        let found: Vec<Value> = events(&sat, "mcp.request.logs")
            .await
            .into_iter()
            .flat_map(|e| e.data["requests"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["user_id"] == "alice")
            .collect();
        (found.len() >= 2).then_some(found)
    })
    .await;
    assert_eq!(requests[0]["tool_name"], "demo:echo");
    assert_eq!(requests[0]["tool_params"], json!({"text": "logged"}));
    assert_eq!(requests[0]["success"], true);
    assert_eq!(requests[0]["tool_response"]["content"][0]["text"], "logged");
    assert_eq!(requests[1]["tool_name"], "demo:fail");
    assert_eq!(requests[1]["success"], false);
    assert_eq!(requests[1]["error_message"], "nope");

    let server_logs = wait_events(&sat, "mcp.server.logs", 1).await;
    let alice = server_logs
        .iter()
        .filter(|e| e.data["user_id"] == "alice")
        .flat_map(|e| e.data["logs"].as_array().cloned().unwrap_or_default())
        .collect::<Vec<_>>();
    assert!(
        alice.iter().any(|l| l["message"] == "MCP Server started successfully" && l["level"] == "info"),
        "{alice:?}"
    );
    assert!(sat.satellite.shutdown().await);
}

/// The binary is missing for a few seconds (a package upgrade) just as the server crashes: the failed spawn is
/// a crash under the restart policy, so the next attempt finds the binary back and the instance is online
/// again. Before, one failed spawn left the instance in `error` for good.
#[tokio::test]
async fn a_binary_missing_for_a_moment_is_retried_under_the_restart_policy() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("mcp-demo");
    std::fs::copy(satellite_exe(), &copy).unwrap();
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let config = config("")
        .replace(&exe, &toml_str(&copy.to_string_lossy()))
        .replace("restart_backoff_ms = [10, 10, 10]", "restart_backoff_ms = [10, 2000, 2000]")
        .replace(
            "id = \"alice\"\nteams = [\"acme\"]\n",
            &format!(
                "id = \"alice\"\nteams = [\"acme\"]\ntoken_sha256 = [\"{}\"]\n",
                satellite::config::sha256_hex(ALICE_TOKEN)
            ),
        );
    assert!(config.contains("token_sha256"));
    let sat = TestSatellite::start(&config).await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let caller = Caller::connect(&sat, "/mcp", Some(ALICE_TOKEN)).await;

    let away = dir.path().join("mcp-demo.upgrading");
    std::fs::rename(&copy, &away).unwrap();
    let _ = call(&sat, ALICE, "exit_process", json!({"code": 3})).await;
    let waiting = wait_until(DEADLINE, "the failed spawn waiting for a restart", || async {
        let status = instance(&sat, ALICE).status();
        let message = status.message.clone().unwrap_or_default();
        (status.status == InstanceStatus::Offline && message.contains("Failed to spawn")).then_some(message)
    })
    .await;
    assert!(waiting.contains("restart 2 of 3"), "{waiting}");
    // A call meanwhile says why the server is down and that it comes back, not only its status.
    let answer = caller.execute("demo:echo", json!({"text": "now?"})).await.to_string();
    assert!(answer.contains("Failed to spawn") && answer.contains("restart 2 of 3"), "{answer}");
    assert!(answer.contains("retry in a few seconds"), "{answer}");
    std::fs::rename(&away, &copy).unwrap();
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": "back"})).await.expect("call")), "back");
    assert!(sat.satellite.shutdown().await);
}

/// The same for a command allowed by name and looked up on the host: missing when the satellite starts (a runtime
/// still being installed), then put in place. Before, "not installed" was remembered from the start and refused
/// every spawn for good: the instance stayed in `error` until the satellite itself was restarted.
#[tokio::test]
async fn a_command_installed_after_the_start_is_found_under_the_restart_policy() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let exe = toml_str(&satellite_exe().to_string_lossy());
    let config = config("")
        .replace(&exe, "\"mcp-demo-later\"")
        .replace("restart_backoff_ms = [10, 10, 10]", "restart_backoff_ms = [10, 2000, 2000]");
    assert!(config.contains("command = \"mcp-demo-later\""), "{config}");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let sat = TestSatellite::start_with_env(tempfile::tempdir().unwrap(), &config, |_| {}, &[("PATH", path)]).await;
    sat.wait_ready().await;
    let waiting = wait_until(DEADLINE, "the missing command waiting for a restart", || async {
        let status = instance(&sat, ALICE).status();
        let message = status.message.clone().unwrap_or_default();
        (status.status == InstanceStatus::Offline && message.contains("restart 2 of 3")).then_some(message)
    })
    .await;
    assert!(waiting.contains("not installed"), "{waiting}");
    // Put in place whole, as a package manager does: copied aside, then renamed.
    std::fs::copy(satellite_exe(), bin.join(".mcp-demo-later.partial")).unwrap();
    std::fs::rename(bin.join(".mcp-demo-later.partial"), bin.join("mcp-demo-later")).unwrap();
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert_eq!(text_of(&call(&sat, ALICE, "echo", json!({"text": "found"})).await.expect("call")), "found");
    assert!(sat.satellite.shutdown().await);
}

/// A request log carries a call's arguments and answer, so a few big answers outweigh thousands of small events:
/// the standalone history is held to `event_retention_max_mib` on disk as well, the newest kept, and the pages
/// pruning frees go back to the disk rather than staying in the file.
#[tokio::test]
async fn big_answers_leave_the_standalone_history_within_its_size() {
    const MAX: u64 = 1024 * 1024;
    let file = config("").replace("[satellite]\n", "[satellite]\nevent_retention_max_mib = 1\n");
    let sat = TestSatellite::start(&file).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let big = "z".repeat(60_000);
    for i in 0..40 {
        let text = format!("call-{i}-{big}");
        let answer = call(&sat, ALICE, "echo", json!({ "text": text })).await.expect("call");
        assert_eq!(text_of(&answer).len(), text.len());
    }
    let store = sat.satellite.store();
    wait_until(
        DEADLINE,
        "the history within 1 MiB on disk, the freed pages given back, the last call kept",
        || async {
            let (usage, outbox) = (store.outbox().disk_usage().await.ok()?, store.outbox().outbox_bytes().await.ok()?);
            let events = store.outbox().events(Some("mcp.request.logs"), 0, 100_000).await.ok()?;
            let last_call = events.iter().any(|e| e.data.to_string().contains("call-39-"));
            (outbox <= MAX && usage.free.saturating_mul(3) < usage.used && last_call).then_some(())
        },
    )
    .await;
    assert!(sat.satellite.shutdown().await);
}

/// A standalone satellite keeps `event_retention_max` events. Every call writes one, so a burst must not leave
/// the history far past its bound until the hourly age check: it is held to its count within seconds, and what
/// stays is the newest.
#[tokio::test]
async fn a_burst_of_calls_leaves_the_standalone_history_at_its_bound() {
    let file = config("").replace("[satellite]\n", "[satellite]\nevent_retention_max = 20\n");
    let sat = TestSatellite::start(&file).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    for i in 0..150 {
        let answer = call(&sat, ALICE, "echo", json!({"text": format!("call-{i}")})).await.expect("call");
        assert_eq!(text_of(&answer), format!("call-{i}"));
    }
    let store = sat.satellite.store();
    // Held to 20, and the newest kept: the last call's request log (written with the last flush) is among them.
    wait_until(DEADLINE, "the history held to 20 events, the last call's request log among them", || async {
        let events = store.outbox().events(None, 0, 100_000).await.ok()?;
        let last_call = |e: &StoredEvent| e.event_type == "mcp.request.logs" && e.data.to_string().contains("call-149");
        (events.len() <= 20 && events.iter().any(last_call)).then_some(())
    })
    .await;
    assert!(sat.satellite.shutdown().await);
}

/// The credential check's reconnect (BP §6.2, OQ-8) is for an instance waiting for re-authorisation only. One
/// that is online by the time the check holds its lifecycle lock (a configuration brought it back meanwhile) keeps
/// its connection: no restart, the same process, no status change.
#[tokio::test]
async fn a_credential_checks_reconnect_leaves_an_online_instance_alone() {
    let sat = TestSatellite::start(&config("")).await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    let before = instance(&sat, ALICE);
    // Alice's only: bob's instance may still be starting.
    let alices = || async {
        let changes = events(&sat, "mcp.server.status_changed").await;
        changes.iter().filter(|e| e.data["user_id"] == "alice").count()
    };
    // Counted once alice's change to online is written (the status is set before its event is).
    wait_until(DEADLINE, "alice's online event", || async {
        let changes = events(&sat, "mcp.server.status_changed").await;
        changes.iter().any(|e| e.data["user_id"] == "alice" && e.data["status"] == "online").then_some(())
    })
    .await;
    let (pid, changes) = (before.pid().expect("a process"), alices().await);
    let process = ProcessId::from(ALICE);
    sat.satellite.manager().reconnect_waiting_for_reauth(&process).await.expect("a known instance");
    let after = instance(&sat, ALICE);
    assert_eq!(after.status().status, InstanceStatus::Online);
    assert_eq!(after.pid(), Some(pid), "the same process");
    assert_eq!(alices().await, changes, "no status change");
    let echoed = call(&sat, ALICE, "echo", json!({"text": "still"})).await.expect("the connection works");
    assert_eq!(text_of(&echoed), "still");
    assert!(sat.satellite.shutdown().await);
}

/// An instance's private directory that cannot be made for a moment (a full disk, a file system remounted
/// read-only; here a file stands where the sandbox directories go) fails the start like a missing binary: retried
/// under the restart policy, so the instance comes up once the directory can be made. Before, it was refused as
/// if the sandbox forbade the server, and stayed in error until its configuration changed.
#[tokio::test]
async fn a_sandbox_directory_that_cannot_be_made_for_a_moment_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let blocker = data.join("sandbox");
    std::fs::write(&blocker, "not a directory").unwrap();
    let config = config("").replace("restart_backoff_ms = [10, 10, 10]", "restart_backoff_ms = [10, 2000, 2000]");
    let sat = TestSatellite::start_in(dir, &config).await;
    wait_until(DEADLINE, "alice's start failed on the sandbox directory", || {
        let message = sat.satellite.manager().get(&ProcessId::from(ALICE)).and_then(|i| i.status().message);
        async move { message.is_some_and(|m| m.contains("sandbox directory")).then_some(()) }
    })
    .await;
    std::fs::remove_file(&blocker).unwrap();
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    assert!(sat.satellite.shutdown().await);
}
