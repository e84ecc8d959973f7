//! The sandbox of stdio children, on real processes: rlimits, environment, working directory, refusals next to a
//! healthy instance, bubblewrap, and children that die with a satellite killed by SIGKILL.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use satellite::instances::sandbox::team_dir_name;
use satellite::model::{InstanceStatus, ProcessId};
use tokio::process::Command;

use crate::common::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn config(sandbox: &str, servers: &str) -> String {
    format!(
        r#"
[satellite]
handshake_timeout_seconds = 20

[sandbox]
{sandbox}

[[teams]]
id = "acme"

[[users]]
id = "alice"
teams = ["acme"]

{servers}
"#
    )
}

/// A stdio server entry plus its installation for team `acme`; its process id is `{slug}-acme-alice-i-{slug}`.
fn server(slug: &str, command: &str, args: &[&str], env: &str) -> String {
    let args: Vec<String> = args.iter().map(|a| toml_str(a)).collect();
    format!(
        "[[servers]]\nslug = \"{slug}\"\ntransport = \"stdio\"\ncommand = {}\nargs = [{}]\nenv = {{ {env} }}\n\n\
         [[installations]]\nid = \"i-{slug}\"\nteam = \"acme\"\nserver = \"{slug}\"\n\n",
        toml_str(command),
        args.join(", ")
    )
}

async fn wait_status(sat: &TestSatellite, slug: &str, status: InstanceStatus) -> satellite::instances::StatusEntry {
    let pid = ProcessId::from(format!("{slug}-acme-alice-i-{slug}").as_str());
    wait_until(DEADLINE, &format!("{slug} to be {status}"), || {
        let found = sat.satellite.manager().get(&pid).map(|i| i.status()).filter(|s| s.status == status);
        async move { found }
    })
    .await
}

fn child_pid(sat: &TestSatellite, slug: &str) -> u32 {
    let pid = ProcessId::from(format!("{slug}-acme-alice-i-{slug}").as_str());
    sat.satellite.manager().get(&pid).and_then(|i| i.pid()).expect("a live child")
}

/// The soft and hard value of one line of /proc/<pid>/limits, e.g. "Max open files".
fn limit(pid: u32, name: &str) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} not in {text}"));
    let mut fields = line[name.len()..].split_whitespace();
    (fields.next().unwrap_or_default().to_owned(), fields.next().unwrap_or_default().to_owned())
}

fn environ(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    raw.split(|b| *b == 0).filter(|v| !v.is_empty()).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

/// Running (not a zombie, not gone): a process killed by its parent-death signal may linger as a zombie until
/// init reaps it, and `kill(pid, 0)` still succeeds on a zombie.
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Every process whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

fn descendants_of(root: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for child in children_of(pid) {
            found.push(child);
            queue.push(child);
        }
    }
    found
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

#[tokio::test]
async fn children_get_limits_a_clean_env_and_the_team_dir_and_refusals_leave_the_rest_running() {
    let exe = satellite_exe().to_string_lossy().into_owned();
    let sandbox = format!(
        "allowed_commands = [{}]\nrlimit_nofile = 512\nrlimit_fsize_mb = 7\nmax_processes = 333\n",
        toml_str(&exe)
    );
    let servers = [
        server("demo", &exe, &["demo-server"], r#"LD_PRELOAD = "/nonexistent/evil.so", GREETING = "hi""#),
        server("shell", "bash", &["-c", "true"], ""),
        server("inject", &exe, &["demo-server", "x;rm -rf /"], ""),
    ]
    .concat();
    let sat = TestSatellite::start(&config(&sandbox, &servers)).await;
    sat.wait_ready().await;

    wait_status(&sat, "demo", InstanceStatus::Online).await;
    let shell = wait_status(&sat, "shell", InstanceStatus::Error).await.message.unwrap_or_default();
    assert!(shell.contains(r#"SECURITY: Rejected command "bash": not in the allow-list (npx, node, uvx"#), "{shell}");
    let inject = wait_status(&sat, "inject", InstanceStatus::Error).await.message.unwrap_or_default();
    assert!(inject.contains(r#"SECURITY: Rejected argument 2 ("x;rm -rf /"): contains ';'"#), "{inject}");
    // The refusals changed nothing for the healthy instance.
    assert_eq!(wait_status(&sat, "demo", InstanceStatus::Online).await.status, InstanceStatus::Online);

    let pid = child_pid(&sat, "demo");
    assert_eq!(limit(pid, "Max open files"), ("512".into(), "512".into()));
    let fsize = (7 * 1024 * 1024).to_string();
    assert_eq!(limit(pid, "Max file size"), (fsize.clone(), fsize));
    assert_eq!(limit(pid, "Max processes"), ("333".into(), "333".into()));
    // No lifetime CPU budget by default: a busy long-lived server is not killed after 60 CPU-seconds.
    assert_eq!(limit(pid, "Max cpu time").0, "unlimited");

    let env = environ(pid);
    assert!(!env.iter().any(|v| v.starts_with("LD_PRELOAD=")), "LD_PRELOAD reached the child: {env:?}");
    assert!(env.iter().any(|v| v == "GREETING=hi"), "{env:?}");
    assert!(!env.iter().any(|v| v.starts_with("SATELLITE_") || v.starts_with("NSJAIL_")), "{env:?}");

    let team = sat.dir.path().join("data/sandbox").join(team_dir_name("acme"));
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd");
    assert_eq!(cwd, canonical(&team.join("work")));
    let cache = canonical(&team.join("cache"));
    assert!(env.contains(&format!("XDG_CACHE_HOME={}", cache.display())), "{env:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&team).map(|m| m.permissions().mode() & 0o777).ok(), Some(0o700));
    sat.satellite.shutdown().await;
}

/// Whether this machine offers a CPU cgroup controller this process may write: cgroup v1's `cpu` hierarchy, or a
/// cgroup v2 group with the `cpu` controller; probed by making and removing a group.
fn cpu_cgroup_writable() -> Option<(std::path::PathBuf, &'static str)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v1 = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "cpu").then(|| format!("/sys/fs/cgroup/cpu{path}"))
    });
    let (base, file) = match v1 {
        Some(dir) => (std::path::PathBuf::from(dir), "cpu.cfs_quota_us"),
        None => {
            let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup{path}"));
            let controllers = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
            controllers.split_whitespace().any(|c| c == "cpu").then_some(())?;
            (dir, "cpu.max")
        }
    };
    let probe = base.join(format!("probe-{}", std::process::id()));
    std::fs::create_dir(&probe).ok()?;
    let _ = std::fs::remove_dir(&probe);
    Some((base, file))
}

/// A CPU rate, not a lifetime budget: each stdio server runs in its own cgroup with a CFS quota of
/// `cpu_limit_percent` of one core, joined between fork and exec (so whatever it starts is limited too), and the
/// group goes when the server stops. Where no CPU controller is writable the server runs without one.
#[tokio::test]
async fn each_server_gets_a_cpu_rate_limit_in_its_own_cgroup() {
    let exe = satellite_exe().to_string_lossy().into_owned();
    let sandbox = format!("allowed_commands = [{}]\ncpu_limit_percent = 30\n", toml_str(&exe));
    let sat = TestSatellite::start(&config(&sandbox, &server("demo", &exe, &["demo-server"], ""))).await;
    sat.wait_ready().await;
    wait_status(&sat, "demo", InstanceStatus::Online).await;
    let pid = child_pid(&sat, "demo");
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("the child's cgroups");
    let ours = format!("/satellite-{}/", std::process::id());
    let Some((base, quota_file)) = cpu_cgroup_writable() else {
        assert!(!membership.contains(&ours), "no controller, yet a group: {membership}");
        assert!(limit(pid, "Max cpu time").0 == "unlimited");
        sat.satellite.shutdown().await;
        return;
    };
    let line = membership.lines().find(|l| l.contains(&ours)).unwrap_or_else(|| panic!("not in a group: {membership}"));
    let group = line.rsplit_once(&ours).map(|(_, n)| n).expect("the child's group");
    let dir = base.join(ours.trim_matches('/')).join(group);
    let quota = std::fs::read_to_string(dir.join(quota_file)).expect("the group's quota");
    let expected = if quota_file == "cpu.max" { "30000 100000" } else { "30000" };
    assert_eq!(quota.trim(), expected, "30% of one core");
    assert_eq!(limit(pid, "Max cpu time").0, "unlimited", "no lifetime budget on top");
    sat.satellite.shutdown().await;
    wait_until(DEADLINE, "the group removed once the server stopped", || async { (!dir.exists()).then_some(()) }).await;
}

#[tokio::test]
async fn a_node_server_starts_under_the_default_limits() {
    let everything = node_bin("mcp-server-everything").to_string_lossy().into_owned();
    let servers = server("everything", &everything, &["stdio"], "");
    let sat = TestSatellite::start(&config(&format!("allowed_commands = [{}]", toml_str(&everything)), &servers)).await;
    sat.wait_ready().await;
    wait_status(&sat, "everything", InstanceStatus::Online).await;
    let pid = child_pid(&sat, "everything");
    let bytes = (satellite::config::sandbox::DEFAULT_MEMORY_LIMIT_MB * 1024 * 1024).to_string();
    assert_eq!(limit(pid, "Max address space").0, bytes);
    sat.satellite.shutdown().await;

    // A lifetime budget only where the operator asks for it.
    let budget = format!("allowed_commands = [{}]\ncpu_time_limit_seconds = 600", toml_str(&everything));
    let sat = TestSatellite::start(&config(&budget, &servers)).await;
    sat.wait_ready().await;
    wait_status(&sat, "everything", InstanceStatus::Online).await;
    assert_eq!(limit(child_pid(&sat, "everything"), "Max cpu time").0, "600");
    sat.satellite.shutdown().await;
}

#[tokio::test]
async fn bubblewrap_runs_the_demo_server_in_its_own_namespaces() {
    assert!(
        Path::new("/usr/bin/bwrap").exists(),
        "bubblewrap is missing: run `bash scripts/test.sh` (it installs it with apt-get)"
    );
    let exe = satellite_exe().to_string_lossy().into_owned();
    let sandbox = format!("isolation = \"bubblewrap\"\nallowed_commands = [{}]\nrlimit_nofile = 256\n", toml_str(&exe));
    let sat = TestSatellite::start(&config(&sandbox, &server("demo", &exe, &["demo-server"], ""))).await;
    sat.wait_ready().await;
    wait_status(&sat, "demo", InstanceStatus::Online).await;
    let wrapper = child_pid(&sat, "demo");
    let comm = std::fs::read_to_string(format!("/proc/{wrapper}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "bwrap");
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("own mount namespace");
    let server = descendants_of(wrapper)
        .into_iter()
        .find(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.ends_with("satellite")))
        .expect("the demo server runs under bwrap");
    assert_ne!(std::fs::read_link(format!("/proc/{server}/ns/mnt")).expect("mnt ns"), ours);
    assert_eq!(std::fs::read_link(format!("/proc/{server}/cwd")).expect("cwd"), PathBuf::from("/workspace"));
    assert_eq!(limit(server, "Max open files").0, "256", "rlimits set on bwrap reach the server");
    sat.satellite.shutdown().await;
}

#[tokio::test]
async fn children_die_with_a_satellite_killed_by_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // A child that ignores EOF on stdin and never answers: only the parent-death signal can end it. It starts a
    // grandchild of its own (as npx starts node), which nothing but the satellite's watchdog can end.
    let script = dir.path().join("sleeper.py");
    std::fs::write(
        &script,
        "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n\
         while True:\n    time.sleep(1)\n",
    )
    .unwrap();
    let path = dir.path().join("satellite.toml");
    let servers = server("sleeper", "python3", &[&script.to_string_lossy()], "");
    std::fs::write(
        &path,
        config("", &servers).replace("handshake_timeout_seconds = 20", "handshake_timeout_seconds = 300"),
    )
    .unwrap();
    let mut satellite = Command::new(satellite_exe())
        .args(["serve", "--config"])
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("PORT", free_port().to_string())
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let satellite_pid = satellite.id().expect("satellite pid");
    let child = wait_until(DEADLINE, "the satellite to spawn the sleeper", || async move {
        children_of(satellite_pid).into_iter().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("sleeper.py"))
        })
    })
    .await;
    assert!(running(child));
    let grandchild =
        wait_until(
            DEADLINE,
            "the sleeper to start its own child",
            || async move { children_of(child).into_iter().next() },
        )
        .await;

    satellite.start_kill().unwrap();
    satellite.wait().await.unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while running(child) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if gone.is_err() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), nix::sys::signal::Signal::SIGKILL);
        panic!("the child {child} outlived its satellite killed by SIGKILL");
    }
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while running(grandchild) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if gone.is_err() {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(grandchild as i32), nix::sys::signal::Signal::SIGKILL);
        panic!("the grandchild {grandchild} outlived its satellite killed by SIGKILL");
    }
}

/// A server that prints its own secrets (an env key, and the value after `--api-key`) to stderr, in an invalid
/// stdout line, in a tool answer and as its last words before it crashes: none of it reaches the debug route,
/// the status history, the stored events (status changes, crash, server and request logs). Before, the crash
/// detail, the stderr tail, the request log and the listed arguments all showed them.
#[tokio::test]
async fn secrets_a_server_prints_never_reach_a_sink() {
    const ENV_SECRET: &str = "sk-env-1f2e3d4c5b6a";
    const ARG_SECRET: &str = "sk-arg-9a8b7c6d5e4f";
    let script = fixture("misbehaving_server.py").to_string_lossy().into_owned();
    let servers = server(
        "leaky",
        "python3",
        &[&script, "leaky", "--api-key", ARG_SECRET],
        &format!("API_KEY = \"{ENV_SECRET}\""),
    );
    let config = config("", &servers)
        .replace("[satellite]", "[satellite]\ndebug_route = true\nrestart_backoff_ms = [10, 10, 10]");
    let sat = TestSatellite::start(&config).await;
    sat.wait_ready().await;
    wait_status(&sat, "leaky", InstanceStatus::Online).await;
    let id = "leaky-acme-alice-i-leaky";
    let pid = ProcessId::from(id);
    let instance = sat.satellite.manager().get(&pid).unwrap();
    let answer = sat
        .satellite
        .manager()
        .call(&instance, "tools/call", Some(serde_json::json!({"name": "ok", "arguments": {}})), DEADLINE)
        .await
        .unwrap();
    assert!(answer.to_string().contains(ENV_SECRET), "the client gets the server's answer unchanged");
    let _ = sat
        .satellite
        .manager()
        .call(&instance, "tools/call", Some(serde_json::json!({"name": "exit", "arguments": {}})), DEADLINE)
        .await;
    let store = sat.satellite.store();
    wait_until(DEADLINE, "the crash recorded, the server back, the logs flushed", || async {
        let crashed = !store.outbox().events(Some("mcp.server.crashed"), 0, 100).await.ok()?.is_empty();
        let logs = !store.outbox().events(Some("mcp.request.logs"), 0, 100).await.ok()?.is_empty();
        let online = sat.satellite.manager().get(&pid)?.status().status == InstanceStatus::Online;
        (crashed && logs && online).then_some(())
    })
    .await;
    let debug = reqwest::get(format!("{}/api/status/debug", sat.base_url())).await.unwrap().text().await.unwrap();
    let events = store.outbox().events(None, 0, 100_000).await.unwrap();
    let history = store.statuses().status_history(&pid).await.unwrap();
    let everything = format!(
        "{debug}\n{}\n{}",
        events.iter().map(|e| e.data.to_string()).collect::<Vec<_>>().join("\n"),
        history.iter().map(|h| h.message.clone().unwrap_or_default()).collect::<Vec<_>>().join("\n")
    );
    assert!(everything.contains("dying with") || everything.contains("starting with"), "the lines are kept, masked");
    for secret in [ENV_SECRET, ARG_SECRET] {
        assert!(!everything.contains(secret), "{secret} leaked: {everything}");
    }
    sat.satellite.shutdown().await;
}
