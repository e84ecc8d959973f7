//! Shared test harness: waiting on conditions, locating the binaries and
//! servers the tests run, and starting real satellites and MCP servers.

#![allow(dead_code)]

pub mod answer_style;
pub mod fake_backend;
pub mod lifecycle;
mod mcp_http;
#[allow(unused_imports)]
pub use mcp_http::{modern_headers, Caller};

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use satellite::app::Satellite;
use satellite::config::{env, Config, Flags};
use satellite::mcp::client::{ClientOptions, McpClient};
use satellite::mcp::transport::{ResourceLimits, StdioLaunch, StdioTransport, Transport};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Poll `condition` every 20 ms until it yields `Some`, failing the test after `deadline`.
pub async fn wait_until<T, F, Fut>(deadline: Duration, what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(start.elapsed() < deadline, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Log output for failing tests (`RUST_LOG=debug cargo test` for more).
pub fn trace_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

pub fn satellite_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_satellite"))
}

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub fn fixture(name: &str) -> PathBuf {
    repo_path("tests/fixtures").join(name)
}

/// An npm-installed MCP server binary; `scripts/test.sh` installs them.
pub fn node_bin(name: &str) -> PathBuf {
    let path = repo_path("tests/node/node_modules/.bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/test.sh` (it installs the npm test servers)",
        path.display()
    );
    path
}

/// The shared tool-search corpus next to the repository.
pub fn corpus_path() -> PathBuf {
    repo_path("../shared/data/toolsearch/corpus.jsonl")
}

/// The process environment, for children that need PATH and friends.
pub fn process_env() -> BTreeMap<String, String> {
    env::from_process().into_iter().collect()
}

pub fn stdio_launch(command: impl Into<String>, args: &[&str]) -> StdioLaunch {
    StdioLaunch {
        label: "test".into(),
        command: command.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: process_env(),
        cwd: None,
        close_grace: Duration::from_secs(1),
        stderr: Default::default(),
        stderr_sink: None,
        junk: Default::default(),
        junk_lines: None,
        limits: ResourceLimits::default(),
        secrets: Vec::new(),
        asker: None,
    }
}

pub fn fast_options() -> ClientOptions {
    ClientOptions {
        handshake_timeout: Duration::from_secs(20),
        probe_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

/// Spawn a stdio server and negotiate with it.
pub async fn connect_stdio(launch: StdioLaunch) -> McpClient {
    let transport = Transport::Stdio(StdioTransport::spawn(launch).expect("spawn"));
    McpClient::connect(transport, &fast_options()).await.expect("connect")
}

pub async fn connect_demo_stdio(protocol: &str) -> McpClient {
    let exe = satellite_exe();
    connect_stdio(stdio_launch(exe.to_string_lossy(), &["demo-server", "--protocol", protocol])).await
}

/// A child HTTP server, killed (with its process group) when dropped.
pub struct HttpServer {
    pub child: Child,
    pub addr: SocketAddr,
}

impl HttpServer {
    /// `satellite demo-server --http 127.0.0.1:0 <extra>`; the bound address is read from its first stdout line.
    pub async fn demo(extra: &[&str]) -> HttpServer {
        Self::demo_on("127.0.0.1:0", extra).await
    }

    /// The demo server on a given address (to bring one back on the same port).
    pub async fn demo_on(addr: &str, extra: &[&str]) -> HttpServer {
        let mut child = Command::new(satellite_exe())
            .args(["demo-server", "--http", addr])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn demo http server");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("demo server did not start in time")
            .expect("read stdout")
            .expect("demo server closed stdout");
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        HttpServer { child, addr }
    }

    /// `mcp-server-everything <transport>` on a free port, once it accepts connections.
    pub async fn everything(transport: &str) -> HttpServer {
        Self::everything_on(free_port(), transport).await
    }

    /// `mcp-server-everything <transport>` on `port` (to bring one back on the same port).
    pub async fn everything_on(port: u16, transport: &str) -> HttpServer {
        let child = Command::new(node_bin("mcp-server-everything"))
            .arg(transport)
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn server-everything");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_until(Duration::from_secs(30), "server-everything to listen", || async move {
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        })
        .await;
        HttpServer { child, addr }
    }

    /// A Python fixture (`tests/fixtures/{script}`, run by the Python with the official SDK that scripts/test.sh
    /// installs in .venv) serving HTTP on the free port it is given as its argument, once it accepts connections.
    pub async fn python(script: &str) -> HttpServer {
        let port = free_port();
        let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python3");
        let child = Command::new(python)
            .arg(fixture(script))
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the python fixture");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        // Answering HTTP, not only accepting connections: uvicorn accepts before its application has started.
        wait_until(Duration::from_secs(30), script, || async move {
            reqwest::get(format!("http://{addr}/")).await.ok().map(|_| ())
        })
        .await;
        HttpServer { child, addr }
    }

    /// A Node.js fixture (a script taking its port from `PORT`, e.g. `tests/conformance/tasks-server.mjs`) on a free
    /// port, once it accepts connections.
    pub async fn node_script(script: &str) -> HttpServer {
        let port = free_port();
        let child = Command::new("node")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the node fixture");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_until(Duration::from_secs(30), script, || async move {
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        })
        .await;
        HttpServer { child, addr }
    }

    pub fn url(&self, path: &str) -> url::Url {
        url::Url::parse(&format!("http://{}{path}", self.addr)).expect("url")
    }

    /// The demo server on a free port (bring it back with [`HttpServer::demo_on`] at the same address), and the
    /// config lines installing it for team `acme` as server `remote`, installation `i-remote`.
    pub async fn remote_for_acme() -> (HttpServer, String, String) {
        let addr = format!("127.0.0.1:{}", free_port());
        let server = HttpServer::demo_on(&addr, &[]).await;
        let config = format!(
            "[[servers]]\nslug = \"remote\"\ntransport = \"http\"\nurl = \"http://{addr}/mcp\"\n\
             [[installations]]\nid = \"i-remote\"\nteam = \"acme\"\nserver = \"remote\"\n"
        );
        (server, addr, config)
    }
}

/// Waits (within 60 s) until the instance `id` is online.
pub async fn wait_instance_online(sat: &TestSatellite, id: &str) {
    let pid = satellite::model::ProcessId::from(id);
    wait_until(Duration::from_secs(60), id, || {
        let online = sat
            .satellite
            .manager()
            .get(&pid)
            .is_some_and(|i| i.status().status == satellite::model::InstanceStatus::Online);
        async move { online.then_some(()) }
    })
    .await;
}

/// `satellite check-config` of the file `text`: whether it passed, and what it said.
pub fn check_config(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("satellite.toml");
    std::fs::write(&path, text).expect("write");
    let out = std::process::Command::new(satellite_exe())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .expect("check-config");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// A real satellite, in process, on a free port, with its config file and data in a temporary directory.
pub struct TestSatellite {
    pub satellite: Satellite,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
}

impl TestSatellite {
    pub async fn start(config_toml: &str) -> TestSatellite {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(dir, config_toml).await
    }

    pub async fn start_in(dir: tempfile::TempDir, config_toml: &str) -> TestSatellite {
        Self::start_with(dir, config_toml, |_| {}).await
    }

    /// Start with the loaded config adjusted by `tweak` (settings finer than the file allows, e.g. ms timeouts).
    pub async fn start_with(
        dir: tempfile::TempDir,
        config_toml: &str,
        tweak: impl FnOnce(&mut Config),
    ) -> TestSatellite {
        Self::start_with_env(dir, config_toml, tweak, &[]).await
    }

    /// [`TestSatellite::start_with`], the satellite's environment (the process's) changed by `extra` first.
    pub async fn start_with_env(
        dir: tempfile::TempDir,
        config_toml: &str,
        tweak: impl FnOnce(&mut Config),
        extra: &[(&str, String)],
    ) -> TestSatellite {
        trace_init();
        let config_path = dir.path().join("satellite.toml");
        std::fs::write(&config_path, config_toml).expect("write config");
        let mut env = env::from_process();
        env.insert(env::CONFIG_WATCH_INTERVAL_MS.into(), "50".into());
        env.extend(extra.iter().map(|(name, value)| ((*name).to_owned(), value.clone())));
        let flags = Flags {
            config: Some(config_path.clone()),
            port: Some(0),
            host: None,
            data_dir: Some(dir.path().join("data")),
        };
        let mut config = Config::load(&env, &flags).expect("valid config");
        engine_under_test(&mut config).await;
        tweak(&mut config);
        let satellite = Satellite::start(config, &env).await.expect("satellite starts");
        TestSatellite { satellite, dir, config_path }
    }

    /// A managed satellite (no config file) registered with `backend`, its persistent data in `dir`.
    pub async fn managed(
        backend_url: &str,
        registration_token: &str,
        dir: tempfile::TempDir,
        tweak: impl FnOnce(&mut Config),
    ) -> Result<TestSatellite, satellite::app::StartError> {
        trace_init();
        let mut env = env::from_process();
        env.remove(env::CONFIG);
        env.insert(env::BACKEND_URL.into(), backend_url.into());
        env.insert(env::SATELLITE_NAME.into(), "test-satellite-01".into());
        env.insert(env::REGISTRATION_TOKEN.into(), registration_token.into());
        env.insert(env::PERSISTENT_DATA_DIR.into(), dir.path().join("persistent_data").to_string_lossy().into_owned());
        let flags = Flags { config: None, port: Some(0), host: None, data_dir: Some(dir.path().join("data")) };
        let mut config = Config::load(&env, &flags).expect("valid managed config");
        engine_under_test(&mut config).await;
        tweak(&mut config);
        let satellite = Satellite::start(config, &env).await?;
        let config_path = dir.path().join("none");
        Ok(TestSatellite { satellite, dir, config_path })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.satellite.local_addr())
    }

    pub fn rewrite_config(&self, config_toml: &str) {
        // Write then rename, as editors do, so the watcher never reads half a file.
        let tmp = self.dir.path().join("satellite.toml.tmp");
        std::fs::write(&tmp, config_toml).expect("write config");
        std::fs::rename(&tmp, &self.config_path).expect("replace config");
    }

    pub async fn wait_ready(&self) {
        let mut ready = self.satellite.manager().ready();
        tokio::time::timeout(Duration::from_secs(60), ready.wait_for(|r| *r))
            .await
            .expect("ready in time")
            .expect("ready");
    }
}

/// `SATELLITE_TEST_ENGINE=postgres`: each test satellite on a PostgreSQL database instead of SQLite, one per data
/// directory, so a restart in the same directory finds what it stored (scripts/test.sh runs the modules that
/// store state a second time so); a tweak may still choose its own.
async fn engine_under_test(config: &mut Config) {
    config.database = database_for(&config.data_dir).await;
}

/// The database a test satellite with this data directory uses (see `engine_under_test`).
async fn database_for(data_dir: &Path) -> satellite::config::Database {
    static DATABASES: std::sync::LazyLock<parking_lot::Mutex<std::collections::HashMap<PathBuf, String>>> =
        std::sync::LazyLock::new(Default::default);
    if std::env::var("SATELLITE_TEST_ENGINE").as_deref() != Ok("postgres") {
        return satellite::config::Database { url: None, max_connections: None };
    }
    let known = DATABASES.lock().get(data_dir).cloned();
    let url = match known {
        Some(url) => url,
        None => {
            let url = satellite::store::testing::fresh_postgres_url().await.expect("a test PostgreSQL server");
            DATABASES.lock().insert(data_dir.to_owned(), url.clone());
            url
        }
    };
    satellite::config::Database { url: Some(url.into()), max_connections: None }
}

/// The store a test satellite with this data directory wrote to, opened again (SQLite or PostgreSQL).
pub async fn open_store(data_dir: &Path) -> satellite::store::Store {
    satellite::store::Store::connect(data_dir, &database_for(data_dir).await).await.expect("open the test store")
}

/// TOML quoting for paths and strings.
pub fn toml_str(value: &str) -> String {
    format!("{value:?}")
}

/// Whether a process id exists.
pub fn process_exists(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}
