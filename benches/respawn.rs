//! What waking a dormant instance adds over the MCP server's own start, in one run.
//! Run with `cargo bench --bench respawn`.
//!
//! Baseline: spawn the demo server, negotiate, make one `echo` call, close — the least any client pays for a
//! cold call. Measured: the same `echo` through `InstanceManager::call` on a dormant instance of a real
//! standalone satellite, which respawns the process (sandbox, process slot, handshake, watcher, events)
//! and then calls. Both run the same number of times, alternating, so machine noise hits both alike.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use satellite::app::Satellite;
use satellite::config::{env, Config, Flags};
use satellite::mcp::client::{ClientOptions, McpClient};
use satellite::mcp::transport::{ResourceLimits, StdioLaunch, StdioTransport, Transport};
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::json;

const ROUNDS: usize = 200;
const WARMUP: usize = 20;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_satellite"))
}

async fn cold_call_direct() -> Duration {
    let started = Instant::now();
    let launch = StdioLaunch {
        label: "bench".into(),
        command: exe().to_string_lossy().into_owned(),
        args: vec!["demo-server".into()],
        env: env::from_process().into_iter().collect(),
        cwd: None,
        close_grace: Duration::from_secs(1),
        stderr: Default::default(),
        stderr_sink: None,
        junk: Default::default(),
        junk_lines: None,
        limits: ResourceLimits::default(),
        secrets: Vec::new(),
        asker: None,
    };
    let transport = Transport::Stdio(StdioTransport::spawn(launch).expect("spawn"));
    let client = McpClient::connect(transport, &ClientOptions::default()).await.expect("connect");
    client
        .request("tools/call", Some(json!({"name": "echo", "arguments": {"text": "x"}})), Duration::from_secs(10))
        .await
        .expect("echo");
    let took = started.elapsed();
    client.close().await;
    took
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("satellite.toml");
        let exe = format!("{:?}", exe().to_string_lossy());
        std::fs::write(
            &config_path,
            format!(
                "[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n[[users]]\nid = \"u\"\nteams = [\"t\"]\n\
                 [[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
                 [[installations]]\nid = \"i\"\nteam = \"t\"\nserver = \"demo\"\n"
            ),
        )
        .expect("config");
        let environment = env::from_process();
        let flags =
            Flags { config: Some(config_path), port: Some(0), host: None, data_dir: Some(dir.path().join("data")) };
        let mut config = Config::load(&environment, &flags).expect("config");
        config.upstream.lifecycle.idle_timeout = Some(Duration::from_millis(1));
        config.upstream.lifecycle.spawn_grace = Duration::ZERO;
        config.upstream.lifecycle.idle_check_interval = Duration::from_secs(3600);
        let satellite = Satellite::start(config, &environment).await.expect("start");
        let manager = satellite.manager().clone();
        let id = ProcessId::from("demo-t-u-i");
        let instance = loop {
            if let Some(i) = manager.get(&id).filter(|i| i.status().status == InstanceStatus::Online) {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };

        let mut direct = Vec::with_capacity(ROUNDS);
        let mut respawn = Vec::with_capacity(ROUNDS);
        for round in 0..WARMUP + ROUNDS {
            let cold = cold_call_direct().await;
            while manager.sweep_idle(|_| false).await == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert!(instance.is_dormant());
            let started = Instant::now();
            manager
                .call(
                    &instance,
                    "tools/call",
                    Some(json!({"name": "echo", "arguments": {"text": "x"}})),
                    Duration::from_secs(10),
                )
                .await
                .expect("echo after respawn");
            let woke = started.elapsed();
            if round >= WARMUP {
                direct.push(cold);
                respawn.push(woke);
            }
        }
        direct.sort();
        respawn.sort();
        println!("cold echo on the demo server, {ROUNDS} rounds each, same run");
        println!("{:<44} {:>9} {:>9}", "", "p50 ms", "p90 ms");
        println!(
            "{:<44} {:>9.2} {:>9.2}",
            "spawn + handshake + echo (bare client)",
            percentile(&direct, 0.5),
            percentile(&direct, 0.9)
        );
        println!(
            "{:<44} {:>9.2} {:>9.2}",
            "dormant instance: respawn + echo (satellite)",
            percentile(&respawn, 0.5),
            percentile(&respawn, 0.9)
        );
        println!(
            "added by the satellite: p50 {:+.2} ms, p90 {:+.2} ms (aim: under 20 ms); ratio p50 {:.2}x",
            percentile(&respawn, 0.5) - percentile(&direct, 0.5),
            percentile(&respawn, 0.9) - percentile(&direct, 0.9),
            percentile(&respawn, 0.5) / percentile(&direct, 0.5)
        );
        satellite.shutdown().await;
    });
}
