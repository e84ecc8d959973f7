//! GitHub-deployed servers end to end (SB §9.9, BP §6.1.3, §12): the FakeBackend hands out installation tokens
//! and serves repository tarballs of a small Node server and a small Python server (tests/fixtures/github); the
//! satellite downloads, extracts, installs, builds, resolves the entry point and runs them; a redeploy replaces
//! the deployment; a failure at a step is the instance's `error` status with the step named in its server log,
//! and a token or tarball that cannot be had for the moment (a 503) is asked for again until it comes.

use std::path::Path;
use std::time::Duration;

use satellite::backend::wire::{
    Command, CommandKind, CommonPayload, ConfigResponse, ConfigurePayload, PollingMode, Priority, ResultStatus,
};
use satellite::control::McpServerEntry;
use satellite::events::EventKind;
use satellite::model::InstanceStatus;
use serde_json::json;

use crate::common::fake_backend::{Endpoint, FakeBackend};
use crate::common::lifecycle::{call, text_of, wait_status, DEADLINE};
use crate::common::*;

const NODE: &str = "ghnode-acme-alice-gh1";
const PYTHON: &str = "ghpy-acme-alice-gh2";
const MISSING: &str = "ghgone-acme-alice-gh3";
const SHA1: &str = "1111111111111111111111111111111111111111";
const SHA2: &str = "2222222222222222222222222222222222222222";

/// A GitHub-style tarball of `dir`: gzipped, everything under `owner-repo-sha/`.
pub(crate) fn tarball(dir: &Path, top: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    builder.append_dir_all(top, dir).expect("fixture directory");
    for (path, content) in extra {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, format!("{top}/{path}"), content.as_bytes()).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

fn entry(installation: &str, slug: &str, repo: &str, sha: &str, runtime: &str) -> McpServerEntry {
    McpServerEntry {
        installation_id: installation.into(),
        team_id: "acme".into(),
        team_slug: "acme".into(),
        server_name: slug.into(),
        server_slug: Some(slug.into()),
        installation_name: slug.into(),
        transport_type: Some("stdio".into()),
        // What the backend sends for a GitHub server; the satellite runs the deployment's entry instead.
        command: Some("npx".into()),
        args: Some(vec!["-y".into(), format!("github:{repo}")]),
        enabled: Some(true),
        user_id: "alice".into(),
        source: Some("github".into()),
        repository_url: Some(format!("https://github.com/{repo}")),
        git_commit_sha: Some(sha.into()),
        git_branch: Some("main".into()),
        runtime: Some(runtime.into()),
        ..Default::default()
    }
}

fn config(node_sha: &str) -> ConfigResponse {
    ConfigResponse::from_entries([
        (NODE, entry("gh1", "ghnode", "acme/gh-node-echo", node_sha, "node")),
        (PYTHON, entry("gh2", "ghpy", "acme/gh-py-echo", SHA1, "python")),
        (MISSING, entry("gh3", "ghgone", "acme/not-published", SHA1, "node")),
    ])
}

/// Whether the instance exists yet and is online (the first config is applied in the background).
fn online(sat: &TestSatellite, id: &str) -> bool {
    let id = satellite::model::ProcessId::from(id);
    sat.satellite.manager().get(&id).is_some_and(|i| i.status().status == InstanceStatus::Online)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_servers_are_downloaded_built_run_and_redeployed() {
    let fixtures = repo_path("tests/fixtures/github");
    let backend = FakeBackend::start().await;
    backend.set_poll_hint(Some((PollingMode::Normal, 2)));
    for installation in ["gh1", "gh2", "gh3"] {
        backend.add_github_installation(installation);
    }
    backend.add_tarball(
        "acme/gh-node-echo",
        SHA1,
        tarball(&fixtures.join("node-server"), "acme-gh-node-echo-1111111", &[]),
    );
    backend.add_tarball(
        "acme/gh-py-echo",
        SHA1,
        tarball(&fixtures.join("python-server"), "acme-gh-py-echo-1111111", &[]),
    );
    // GitHub and the backend fail for a moment: every first download, and one token request. The deployments
    // that met them are tried again; before, each stayed in `error` until someone restarted it.
    backend.fail_next(Endpoint::Tarball, 503, 3);
    backend.fail_next(Endpoint::GithubToken, 503, 1);
    backend.set_config(&config(SHA1));
    let tarballs = backend.tarball_base();
    let dir = tempfile::tempdir().unwrap();
    let deployments = dir.path().join("data/deployments");
    let sat = TestSatellite::managed(&backend.url(), FakeBackend::REGISTRATION_TOKEN, dir, move |c| {
        c.upstream.discovery_timeout = Duration::from_secs(240);
        if let satellite::config::Mode::Managed(m) = &mut c.mode {
            m.github_tarball_base = url::Url::parse(&tarballs).unwrap();
            m.event_interval = Duration::from_millis(100);
            m.poll_idle = Duration::from_secs(1);
        }
    })
    .await
    .expect("managed satellite starts");

    // The Node server was built (its build step stamped the marker) and runs from its deployment.
    let long = Duration::from_secs(60);
    wait_until(long, "the node deployment online", || async { online(&sat, NODE).then_some(()) }).await;
    let built = call(&sat, NODE, "node_build_info", json!({})).await.expect("build info");
    assert!(text_of(&built).starts_with("GH_NODE_ECHO_BUILD_OK"), "the build ran: {built}");
    let echoed = call(&sat, NODE, "node_echo", json!({"text": "from github"})).await.expect("echo");
    assert_eq!(text_of(&echoed), "from github");
    let node_dir = deployments.join("acme/gh1");
    assert!(node_dir.join("dist/index.js").is_file(), "extracted and built in the installation's directory");

    // The Python server runs in its own virtual environment.
    wait_until(long, "the python deployment online", || async { online(&sat, PYTHON).then_some(()) }).await;
    let version = call(&sat, PYTHON, "py_version", json!({})).await.expect("py_version");
    assert!(text_of(&version).contains("in_venv true"), "runs in the deployment's venv: {version}");
    assert!(text_of(&version).contains("acme/gh2/.venv"), "{version}");

    // A repository that cannot be downloaded: error, with the step in the status and the server log.
    // (Its first try may have met a 503 and be waiting for the next.)
    let message = wait_until(DEADLINE, "the missing repository's 404", || async {
        let status = wait_status(&sat, MISSING, InstanceStatus::Error).await;
        status.message.filter(|m| m.contains("404"))
    })
    .await;
    assert!(message.contains("GitHub deployment failed at download"), "{message}");
    assert!(!message.contains("tried again"), "a repository that is not there is not asked for again: {message}");
    wait_until(DEADLINE, "the failure in the server log", || async {
        backend
            .events()
            .iter()
            .any(|e| {
                e.kind == EventKind::ServerLogs
                    && e.data["installation_id"] == "gh3"
                    && serde_json::Value::Object(e.data.clone()).to_string().contains("failed at download")
            })
            .then_some(())
    })
    .await;

    // A redeploy at a new commit replaces the deployment whole.
    backend.add_tarball(
        "acme/gh-node-echo",
        SHA2,
        tarball(&fixtures.join("node-server"), "acme-gh-node-echo-2222222", &[("REDEPLOYED", "yes")]),
    );
    backend.set_config(&config(SHA2));
    backend.push_command(Command::new(
        "c-redeploy",
        Priority::Immediate,
        CommandKind::Configure(ConfigurePayload {
            common: CommonPayload {
                event: Some("mcp_redeploy".into()),
                installation_id: Some("gh1".into()),
                ..Default::default()
            },
            commit_sha: Some(SHA2.into()),
            ..Default::default()
        }),
    ));
    let result =
        wait_until(long, "the redeploy result", || async { backend.results_for("c-redeploy").into_iter().next() })
            .await;
    assert_eq!(result.status, ResultStatus::Completed, "{result:?}");
    wait_until(long, "the node server online again", || async { online(&sat, NODE).then_some(()) }).await;
    assert!(node_dir.join("REDEPLOYED").is_file(), "the new commit's files");
    let marker = std::fs::read_to_string(node_dir.join(".satellite-deployment.json")).unwrap();
    assert!(marker.contains(SHA2), "{marker}");
    let echoed = call(&sat, NODE, "node_echo", json!({"text": "again"})).await.expect("echo after redeploy");
    assert_eq!(text_of(&echoed), "again");
    backend.assert_no_violations();
    assert!(sat.satellite.shutdown().await);
}
