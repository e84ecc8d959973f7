//! Issue 73: what the satellite records survives a database that refuses writes for a while. A real SQLite file,
//! locked by a second connection for longer than the satellite's busy timeout (5 s) while members make calls: the
//! analytics rows the database refused are kept and written once it takes them again, none lost, none doubled.

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::Connection;

use crate::common::*;

const ADMIN: &str = "storage-admin-token-0123456789";
const MEMBER: &str = "storage-member-token-0123456789";
const DEADLINE: Duration = Duration::from_secs(60);

fn config() -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    format!(
        "[auth]\nadmin_token_sha256 = [\"{}\"]\n[sandbox]\nallowed_commands = [{exe}]\n[[teams]]\nid = \"t\"\n\
         [[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n\
         [[servers]]\nslug = \"demo\"\ntransport = \"stdio\"\ncommand = {exe}\nargs = [\"demo-server\"]\n\
         [[installations]]\nid = \"demo-t\"\nteam = \"t\"\nserver = \"demo\"\n",
        satellite::config::sha256_hex(ADMIN),
        satellite::config::sha256_hex(MEMBER),
    )
}

async fn calls_recorded(sat: &TestSatellite) -> u64 {
    let response = reqwest::Client::new()
        .get(format!("{}/api/analytics/summary", sat.base_url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("analytics answers");
    let summary: Value = response.json().await.unwrap_or(Value::Null);
    summary["calls"]["total"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn analytics_rows_the_database_refused_are_written_once_it_takes_them() {
    // SQLite on purpose (the lock below is SQLite's), whichever engine the suite runs on.
    let sat = TestSatellite::start_with(tempfile::tempdir().expect("dir"), &config(), |config| {
        config.database = satellite::config::Database { url: None, max_connections: None };
    })
    .await;
    let member = Caller::connect(&sat, "/mcp", Some(MEMBER)).await;
    wait_until(DEADLINE, "the demo server callable", || async {
        let reply = member.execute("demo:echo", json!({"text": "up"})).await;
        (reply["result"]["content"][0]["text"] == "up").then_some(())
    })
    .await;
    wait_until(DEADLINE, "the first call recorded", || async { (calls_recorded(&sat).await >= 1).then_some(()) }).await;
    let before = calls_recorded(&sat).await;

    // A second connection takes the write lock and keeps it past the busy timeout.
    let file = sat.dir.path().join("data").join("satellite.db");
    let mut locker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display())).await.expect("open");
    sqlx::query("BEGIN IMMEDIATE").execute(&mut locker).await.expect("take the write lock");
    for n in 0..10 {
        let reply = member.execute("demo:echo", json!({"text": format!("call {n}")})).await;
        assert_eq!(reply["result"]["content"][0]["text"], format!("call {n}"), "calls are served meanwhile");
    }
    // Past the 5 s busy timeout at least once: the writer's attempt in this window was refused.
    let held = std::time::Instant::now();
    wait_until(DEADLINE, "the lock held past the busy timeout", || async {
        (held.elapsed() > Duration::from_secs(7)).then_some(())
    })
    .await;
    sqlx::query("ROLLBACK").execute(&mut locker).await.expect("release the lock");
    drop(locker);

    let recorded = wait_until(DEADLINE, "the kept rows written", || async {
        let now = calls_recorded(&sat).await;
        (now >= before + 10).then_some(now)
    })
    .await;
    assert_eq!(recorded, before + 10, "every call once, none lost, none doubled");
    assert!(sat.satellite.shutdown().await);
}

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted when dropped.
pub(crate) struct SmallVolume {
    dir: Option<tempfile::TempDir>,
    path: std::path::PathBuf,
}

impl SmallVolume {
    fn mount(mib: u32) -> SmallVolume {
        let dir = tempfile::tempdir().expect("dir");
        let mut volume = SmallVolume::mount_at(dir.path(), mib, "rw");
        volume.dir = Some(dir);
        volume
    }

    /// A tmpfs mounted on `path` (an existing directory) with `mode` (`rw` or `ro`).
    pub(crate) fn mount_at(path: &std::path::Path, mib: u32, mode: &str) -> SmallVolume {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m,{mode}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mounting a tmpfs needs root (the tests run as root in CI, as scripts/test.sh does)");
        SmallVolume { dir: None, path: path.to_path_buf() }
    }

    fn fill(&self) {
        // Written until the volume refuses more: the error ends it.
        let mut file = std::fs::File::create(self.path.join("filler")).expect("filler");
        let chunk = vec![0u8; 1 << 16];
        while std::io::Write::write_all(&mut file, &chunk).is_ok() {}
    }
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
        drop(self.dir.take());
    }
}

async fn ready_body(sat: &TestSatellite) -> Value {
    let response = reqwest::get(format!("{}/readyz", sat.base_url())).await.expect("readyz answers");
    response.json().await.unwrap_or(Value::Null)
}

/// A restart on a full data volume starts (the disk reserve made by the run before is given back), says so in
/// `/readyz`, serves calls and records them; when space returns the reserve is made again; nothing recorded is
/// lost across the stop. Before, the restart exited 1: "cannot open the database".
#[tokio::test]
async fn a_satellite_restarted_on_a_full_data_volume_starts_and_loses_nothing() {
    let volume = SmallVolume::mount(32);
    let sqlite = |config: &mut satellite::config::Config| {
        config.database = satellite::config::Database { url: None, max_connections: None };
    };
    let dir = tempfile::TempDir::new_in(&volume.path).expect("dir on the volume");
    let sat = TestSatellite::start_with(dir, &config(), sqlite).await;
    let reserve = sat.dir.path().join("data").join(satellite::store::reserve::RESERVE_FILE);
    assert!(reserve.exists(), "the first run makes the reserve");
    let TestSatellite { satellite, dir, .. } = sat;
    assert!(satellite.shutdown().await);
    volume.fill();

    let sat = TestSatellite::start_with(dir, &config(), sqlite).await;
    sat.wait_ready().await;
    let ready = ready_body(&sat).await;
    assert_eq!(ready["degraded"]["storage"]["state"], "volume_full", "{ready}");
    let member = Caller::connect(&sat, "/mcp", Some(MEMBER)).await;
    wait_until(DEADLINE, "calls served on the full volume", || async {
        let reply = member.execute("demo:echo", json!({"text": "full"})).await;
        (reply["result"]["content"][0]["text"] == "full").then_some(())
    })
    .await;
    for n in 0..5 {
        let reply = member.execute("demo:echo", json!({"text": format!("full {n}")})).await;
        assert_eq!(reply["result"]["content"][0]["text"], format!("full {n}"));
    }
    std::fs::remove_file(volume.path.join("filler")).expect("space returns");
    wait_until(DEADLINE, "the reserve made again", || async {
        (ready_body(&sat).await.get("degraded").is_none() && reserve.exists()).then_some(())
    })
    .await;
    let recorded = calls_recorded(&sat).await;
    assert!(recorded >= 6, "{recorded}");
    let TestSatellite { satellite, dir, .. } = sat;
    assert!(satellite.shutdown().await);
    let sat = TestSatellite::start_with(dir, &config(), sqlite).await;
    assert_eq!(calls_recorded(&sat).await, recorded, "nothing recorded was lost across the stop");
    assert!(sat.satellite.shutdown().await);
}

/// A data volume that refuses the database file (read-only here) does not stop the satellite: it runs on an
/// in-memory database, says so in `/readyz`, and serves its remote servers. Before, it exited 1.
#[tokio::test]
async fn a_read_only_data_volume_runs_in_memory_and_serves() {
    let demo = HttpServer::demo(&[]).await;
    let config = format!(
        "[[teams]]\nid = \"t\"\n[[users]]\nid = \"u\"\nteams = [\"t\"]\ntoken_sha256 = [\"{}\"]\n\
         [[servers]]\nslug = \"remote\"\ntransport = \"http\"\nurl = \"{}\"\n\
         [[installations]]\nid = \"remote-t\"\nteam = \"t\"\nserver = \"remote\"\n",
        satellite::config::sha256_hex(MEMBER),
        demo.url("/mcp"),
    );
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
    // The data directory alone is the read-only volume.
    let _volume = SmallVolume::mount_at(&dir.path().join("data"), 16, "ro");
    let sat = TestSatellite::start_with(dir, &config, |config| {
        config.database = satellite::config::Database { url: None, max_connections: None };
    })
    .await;
    sat.wait_ready().await;
    let ready = ready_body(&sat).await;
    assert_eq!(ready["degraded"]["storage"]["state"], "memory", "{ready}");
    let member = Caller::connect(&sat, "/mcp", Some(MEMBER)).await;
    wait_until(DEADLINE, "the remote server served", || async {
        let reply = member.execute("remote:echo", json!({"text": "read only"})).await;
        (reply["result"]["content"][0]["text"] == "read only").then_some(())
    })
    .await;
    assert!(sat.satellite.shutdown().await);
}
