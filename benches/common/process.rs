//! A satellite as operators run it, for the storm, session and cycle benchmarks: the release binary on its
//! embedded default (standalone, SQLite, the bundled demo server) in a scratch directory, with a chosen
//! descriptor limit, and what it holds (RSS, descriptors, threads, child processes) read from /proc.

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

pub const USER_TOKEN: &str = "bench-demo-token-0123456789abcdef";
pub const INSTANCE_TOKEN: &str = "ds_inst_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

pub struct Served {
    pub child: Child,
    pub base: String,
    pub pid: u32,
    /// The demo instance's path and `ds_inst_` token, for the instance router.
    pub instance_path: String,
    pub instance_token: String,
    pub dir: tempfile::TempDir,
}

/// What a process holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: usize,
    pub children: usize,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, {} descriptors, {} threads, {} child processes",
            self.rss_kib as f64 / 1024.0,
            self.fds,
            self.threads,
            self.children
        )
    }
}

pub fn held(pid: u32) -> Held {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // The database's files aside: the SQLite pool opens connections on demand and keeps them.
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).map_or(true, |t| !t.to_string_lossy().contains("satellite.db")))
        .count();
    let children = processes().iter().filter(|p| p.parent == pid && !p.zombie).count();
    Held { rss_kib: field("VmRSS:"), fds, threads: field("Threads:") as usize, children }
}

/// One line of `/proc/{pid}/stat`, the fields the benchmarks read.
#[derive(Debug, Clone, Copy)]
pub struct Process {
    pub pid: u32,
    pub parent: u32,
    pub zombie: bool,
    /// User plus system time so far.
    pub cpu: Duration,
}

fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1) as u64
}

/// `pid`'s line of `/proc/{pid}/stat`, if it still runs.
pub fn process(pid: u32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields are what follows its last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // After the name: state (3 in proc(5)'s 1-based numbering), ppid (4), utime (14), stime (15).
    let ticks = number(11) + number(12);
    Some(Process {
        pid,
        parent: number(1) as u32,
        zombie: fields.first() == Some(&"Z"),
        cpu: Duration::from_micros(ticks * 1_000_000 / clock_ticks()),
    })
}

/// Every process this host shows.
pub fn processes() -> Vec<Process> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(process)
        .collect()
}

/// CPU time (user + system) `pid` and every process below it have used so far: a server started through a
/// wrapper (a sandbox, `npx`, a shell) is counted whole.
pub fn tree_cpu(pid: u32) -> Duration {
    let all = processes();
    let mut total = Duration::ZERO;
    let mut frontier = vec![pid];
    while let Some(next) = frontier.pop() {
        if let Some(p) = all.iter().find(|p| p.pid == next) {
            total += p.cpu;
        }
        frontier.extend(all.iter().filter(|p| p.parent == next).map(|p| p.pid));
    }
    total
}

/// What `pid` holds once it stops changing (three equal readings 200 ms apart), or the last reading after 30 s.
pub async fn settled(pid: u32) -> Held {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = held(pid);
    let mut same = 0;
    while same < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = held(pid);
        // RSS moves by pages as allocators settle; descriptors and children are what must come back.
        same = if (now.fds, now.children) == (last.fds, last.children) { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// Raise this process's own descriptor limit to its hard limit (a load generator needs many sockets).
pub fn raise_own_nofile() -> u64 {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    hard
}

/// Start the release binary on its embedded default with at most `nofile` descriptors, and wait until the demo
/// instance is online. Its log (JSON lines) goes to `dir/satellite.log`.
pub async fn serve(nofile: u64, extra_env: &[(&str, &str)]) -> Served {
    let dir = tempfile::tempdir().expect("scratch directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let log = std::fs::File::create(dir.path().join("satellite.log")).expect("log file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_satellite"));
    command
        .arg("serve")
        .current_dir(dir.path())
        .env("PORT", port.to_string())
        .env("SATELLITE_DEMO_TOKEN", USER_TOKEN)
        .env("SATELLITE_DEMO_INSTANCE_TOKEN", INSTANCE_TOKEN)
        .env("SATELLITE_LOG_FORMAT", "json")
        .env_remove("SATELLITE_CONFIG")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true);
    for (key, value) in extra_env {
        command.env(key, value);
    }
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, nofile, nofile)
                .map_err(std::io::Error::from)
        });
    }
    let child = command.spawn().expect("satellite starts");
    let pid = child.id().expect("pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    let base = format!("http://127.0.0.1:{port}");
    let debug = format!("{base}/api/status/debug");
    let mut instance_path = String::new();
    while Instant::now() < deadline {
        if let Ok(answer) = reqwest::get(&debug).await {
            if let Ok(debug) = answer.json::<Value>().await {
                if debug["server_status"]["stats"]["online"] == 1 {
                    let demo = &debug["servers_by_team"]["demo-team"]["running"][0];
                    instance_path = demo["instance_path"].as_str().unwrap_or("demo").to_owned();
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!instance_path.is_empty(), "the demo instance came online");
    Served { child, base, pid, instance_path, instance_token: INSTANCE_TOKEN.to_owned(), dir }
}

impl Served {
    /// Log lines at `level` whose message contains `needle`.
    pub fn log_lines(&self, level: &str, needle: &str) -> usize {
        let text = std::fs::read_to_string(self.dir.path().join("satellite.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["level"].as_str().is_some_and(|v| v.eq_ignore_ascii_case(level)))
            .filter(|l| l.to_string().contains(needle))
            .count()
    }

    pub fn log_path(&self) -> &Path {
        self.dir.path()
    }
}
