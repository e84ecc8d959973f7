//! The compiled binary: config errors, check-config, the embedded default, SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::common::*;

/// Run `satellite` with a clean environment plus `env`; returns (code, stdout, stderr).
async fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(satellite_exe())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run satellite");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn version_prints_the_crate_version() {
    let (code, out, _) = run(&["version"], &[]).await;
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("satellite {}", env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn bad_configs_exit_64_with_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 8] = [
        ("[satellite]\nprot = 1\n", "unknown field `prot`"),
        (
            "[[teams]]\nid = \"t\"\n[[servers]]\nslug = \"x\"\ntransport = \"http\"\nurl = \"not a url\"\n",
            "servers[0].url",
        ),
        ("[[teams]]\nid = \"t\"\n[[servers]]\nslug = \"x\"\ntransport = \"stdio\"\n", "servers[0].command"),
        ("[[installations]]\nid = \"i\"\nteam = \"nope\"\nserver = \"x\"\n", "installations[0].team"),
        ("[satellite]\nport = \"many\"\n", "invalid type"),
        ("this is not toml", "config file"),
        ("[sandbox]\nisolation = \"nsjail\"\nnsjail_path = \"/nonexistent/nsjail\"\n", "sandbox.nsjail_path"),
        ("[sandbox]\nallowed_commands = [\"bin/server\"]\n", "sandbox.allowed_commands[0]"),
    ];
    for (i, (body, needle)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, body).unwrap();
        for command in ["check-config", "serve"] {
            let (code, out, err) = run(&[command, "--config", path.to_str().unwrap()], &[]).await;
            assert_eq!(code, 64, "{command} {body:?}: {err}");
            assert!(out.is_empty(), "{out}");
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            assert!(err.contains(needle), "{err} should mention {needle}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    let (code, _, err) = run(&["check-config"], &[("PORT", "http")]).await;
    assert_eq!(code, 64);
    assert!(err.contains("PORT/satellite.port"), "{err}");
    let (code, _, err) = run(&["check-config", "--config", "/nonexistent.toml"], &[]).await;
    assert_eq!(code, 64);
    assert!(err.contains("cannot read"), "{err}");
}

#[tokio::test]
async fn check_config_redacts_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(
        &path,
        r#"
[[teams]]
id = "t"
[[users]]
id = "u"
teams = ["t"]
[[servers]]
slug = "gh"
transport = "stdio"
command = "npx"
args = ["-y", "server"]
env = { GITHUB_TOKEN = "ghp_supersecretvalue", LEVEL = "debug" }
[[servers]]
slug = "remote"
transport = "http"
url = "https://example.com/mcp?api_key=querysecretvalue"
headers = { Authorization = "Bearer headersecretvalue" }
[[installations]]
id = "i1"
team = "t"
server = "gh"
[[installations]]
id = "i2"
team = "t"
server = "remote"
"#,
    )
    .unwrap();
    let (code, out, err) = run(&["check-config", "--config", path.to_str().unwrap()], &[]).await;
    assert_eq!(code, 0, "{err}");
    let effective: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(effective["desired_state"]["instances"].as_array().unwrap().len(), 2);
    for secret in ["supersecretvalue", "querysecretvalue", "headersecretvalue"] {
        assert!(!out.contains(secret), "{secret} leaked: {out}");
    }
    assert!(out.contains("\"debug\""), "non-secret values are shown");

    let (code, out, _) = run(&["check-config"], &[("SATELLITE_DEMO_TOKEN", "demo-token-0123456789abcdef")]).await;
    assert_eq!(code, 0);
    assert!(!out.contains("demo-token-0123456789abcdef"));
}

#[tokio::test]
async fn embedded_default_serves_the_demo_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(satellite_exe())
        .arg("serve")
        .current_dir(dir.path())
        .env("PORT", port.to_string())
        .env_remove("SATELLITE_CONFIG")
        .env_remove("DEPLOYSTACK_BACKEND_URL")
        .env_remove("SATELLITE_DEMO_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let banner = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut text = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let base = format!("http://127.0.0.1:{port}");
    let debug: Value = wait_until(Duration::from_secs(60), "demo instance online", || {
        let url = format!("{base}/api/status/debug");
        async move {
            let debug: Value = reqwest::get(url).await.ok()?.json().await.ok()?;
            (debug["server_status"]["stats"]["online"] == 1).then_some(debug)
        }
    })
    .await;
    assert_eq!(debug["tools"]["total_tools"], 7);
    let demo = &debug["servers_by_team"]["demo-team"]["running"][0];
    assert_eq!(demo["instance_path"], "demo");
    let pid = demo["pid"].as_u64().expect("pid") as u32;
    assert!(process_exists(pid));
    assert!(dir.path().join("data/satellite.db").exists(), "data lives in ./data");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("exits in time").unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!process_exists(pid), "the demo server child is gone");
    let banner = banner.await.unwrap();
    assert!(banner.contains("user token (user `demo`)"), "{banner}");
    assert!(banner.contains("ds_inst_"), "{banner}");
    assert!(banner.contains(&format!("{base}/mcp")), "{banner}");
}
