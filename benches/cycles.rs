//! Cycles: `CYCLES` (10,000) spawn, crash and idle cycles of one stdio instance in a standalone satellite (in
//! this process, on the library), alternating: call `echo` (spawning the process when it sleeps), then either crash
//! it (`exit_process`) and restart it, or put it to sleep as the idle sweep does.
//!
//! Prints errors by kind, cycles per second, and this process's RSS, descriptors (database files aside: the pool
//! opens them on demand) and live child processes before and after. Run with `cargo bench --bench cycles`.
//! tests/soak.rs asserts the same shape (1,000 cycles, nothing leaked) in the test suite.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "common/process.rs"]
mod process;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::lifecycle::*;
use common::TestSatellite;
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::json;

/// Polls `check` every 10 ms for up to 30 s.
async fn within<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Cycles `from..to`, counting what went wrong into `errors`.
async fn run(
    sat: &TestSatellite,
    manager: &satellite::instances::InstanceManager,
    alice: &ProcessId,
    from: usize,
    to: usize,
    errors: &mut BTreeMap<&'static str, usize>,
) {
    for i in from..to {
        let text = format!("c{i}");
        match call(sat, ALICE, "echo", json!({"text": text})).await {
            Ok(answer) if text_of(&answer) == text => {}
            Ok(_) => *errors.entry("echo answered wrong").or_insert(0) += 1,
            Err(_) => *errors.entry("echo failed").or_insert(0) += 1,
        }
        if i % 2 == 0 {
            let _ = call(sat, ALICE, "exit_process", json!({"code": 1})).await;
            if manager.restart(alice).await.is_err() {
                *errors.entry("restart refused").or_insert(0) += 1;
            }
            if !within(|| async { instance(sat, ALICE).status().status == InstanceStatus::Online }).await {
                *errors.entry("not online after restart").or_insert(0) += 1;
            }
        } else {
            let slept =
                within(|| async { manager.sweep_idle(|_| false).await > 0 || instance(sat, ALICE).is_dormant() }).await;
            if !slept {
                *errors.entry("never went dormant").or_insert(0) += 1;
            }
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let cycles: usize = std::env::var("CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
        let dir = tempfile::tempdir().expect("scratch directory");
        let sat = TestSatellite::start_with(dir, &config(""), |c| {
            fast_idle(c);
            c.upstream.lifecycle.idle_check_interval = Duration::from_secs(3600);
            c.upstream.lifecycle.restart_backoff = vec![Duration::ZERO];
        })
        .await;
        sat.wait_ready().await;
        wait_status(&sat, ALICE, InstanceStatus::Online).await;
        let manager = sat.satellite.manager().clone();
        let alice = ProcessId::from(ALICE);
        let mut errors: BTreeMap<&'static str, usize> = BTreeMap::new();
        let manager = &manager;

        // Warm-up: database connections and runtime threads exist before the first reading.
        run(&sat, manager, &alice, 0, 20, &mut errors).await;
        let _ = call(&sat, ALICE, "echo", json!({"text": "wake"})).await;
        let before = process::settled(std::process::id()).await;
        let started = Instant::now();
        run(&sat, manager, &alice, 20, 20 + cycles, &mut errors).await;
        let elapsed = started.elapsed().as_secs_f64();
        let _ = call(&sat, ALICE, "echo", json!({"text": "wake"})).await;
        let after = process::settled(std::process::id()).await;
        println!("{cycles} spawn/crash/idle cycles in {elapsed:.1} s ({:.1} cycles/s)", cycles as f64 / elapsed);
        println!("errors: {}", errors.values().sum::<usize>());
        for (kind, n) in &errors {
            println!("  {kind:<28} {n}");
        }
        println!("before   {before}\nafter    {after}");
        println!(
            "descriptors after/before: {:.2}, RSS after/before: {:.2}",
            after.fds as f64 / before.fds.max(1) as f64,
            after.rss_kib as f64 / before.rss_kib.max(1) as f64
        );
        sat.satellite.shutdown().await;
    });
}
