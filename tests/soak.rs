//! A soak of 1,000 spawn, crash and idle cycles, in its own test binary: descriptors and child processes are
//! counted for the whole process, so nothing else may run beside it.

mod common;

use std::time::Duration;

use satellite::model::{InstanceStatus, ProcessId};
use serde_json::json;

use common::lifecycle::*;
use common::*;

/// Open file descriptors (what each points at, sorted) and live child processes of this test process.
/// The database's own files are left out: the SQLite pool opens up to four connections on demand, each holding
/// the database and its WAL, and keeps them; a leak from children would be pipes.
fn fds_and_children() -> (Vec<String>, usize) {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| !target.contains("satellite.db"))
        // The directory listing itself.
        .filter(|target| !target.starts_with("/proc/"))
        .map(|target| {
            if target.starts_with("pipe:") {
                "pipe".into()
            } else if target.starts_with("socket:") {
                "socket".into()
            } else {
                target
            }
        })
        .collect();
    fds.sort();
    let me = std::process::id().to_string();
    let children = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // Fields after the command (which may hold spaces) start after the last ')': state, ppid, ...
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            fields.next() == Some(me.as_str()) && state != Some("Z")
        })
        .count();
    (fds, children)
}

/// The descriptors and children once they stop changing: a process made dormant a moment ago may still be
/// closing its pipes, which would count as open in a snapshot taken at once.
async fn quiescent() -> (Vec<String>, usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = fds_and_children();
    let mut stable = 0;
    while stable < 5 {
        assert!(std::time::Instant::now() < deadline, "descriptors never settled: {last:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = fds_and_children();
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_spawn_crash_and_idle_cycles_leak_no_descriptor_or_process() {
    let dir = tempfile::tempdir().unwrap();
    let sat = TestSatellite::start_with(dir, &config(""), |c| {
        fast_idle(c);
        // The soak drives dormancy itself.
        c.upstream.lifecycle.idle_check_interval = Duration::from_secs(3600);
        c.upstream.lifecycle.restart_backoff = vec![Duration::ZERO];
    })
    .await;
    sat.wait_ready().await;
    wait_status(&sat, ALICE, InstanceStatus::Online).await;
    wait_status(&sat, BOB, InstanceStatus::Online).await;
    let manager = sat.satellite.manager().clone();
    let alice_id = ProcessId::from(ALICE);

    let cycle = |i: usize| {
        let sat = &sat;
        let manager = manager.clone();
        let alice_id = alice_id.clone();
        async move {
            // Spawn (respawn from dormancy when asleep) and use it.
            let text = format!("c{i}");
            let answer = call(sat, ALICE, "echo", json!({"text": text})).await.expect("call");
            assert_eq!(text_of(&answer), text);
            if i % 2 == 0 {
                // Crash, then restart by command (the crash window would otherwise end in permanent failure).
                let _ = call(sat, ALICE, "exit_process", json!({"code": 1})).await;
                manager.restart(&alice_id).await.expect("restart");
                wait_status(sat, ALICE, InstanceStatus::Online).await;
            } else {
                // Idle: put it to sleep.
                wait_until(DEADLINE, "alice dormant", || {
                    let manager = manager.clone();
                    async move {
                        (manager.sweep_idle(|_| false).await > 0 || instance(sat, ALICE).is_dormant()).then_some(())
                    }
                })
                .await;
            }
        }
    };
    // Warm up the pools (database connections, runtime threads) before counting.
    for i in 0..20 {
        cycle(i).await;
    }
    let settle = || async {
        let alice = instance(&sat, ALICE);
        if alice.pid().is_none() && !alice.is_dormant() {
            let _ = call(&sat, ALICE, "echo", json!({"text": "wake"})).await;
        }
    };
    settle().await;
    let before = quiescent().await;
    for i in 20..1020 {
        cycle(i).await;
    }
    settle().await;
    // Closing is asynchronous: give the last children and pipes a moment, then compare in full.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut after = fds_and_children();
    while after != before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = fds_and_children();
    }
    assert_eq!(after.1, before.1, "child processes before and after");
    assert_eq!(after.0, before.0, "open descriptors before and after (database files aside)");
    assert_eq!(instance(&sat, BOB).status().status, InstanceStatus::Online);
    assert!(sat.satellite.shutdown().await);
}
