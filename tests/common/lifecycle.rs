//! Shared by the lifecycle tests and the soak: a team `acme` with alice and bob, each with the demo server.

use std::sync::Arc;
use std::time::Duration;

use satellite::config::Config;
use satellite::instances::{Instance, InstanceError};
use satellite::model::{InstanceStatus, ProcessId};
use serde_json::{json, Value};

use super::*;

pub const DEADLINE: Duration = Duration::from_secs(60);

/// A team `acme` with users alice and bob, the demo server installed for both, plus `extra`.
pub fn config(extra: &str) -> String {
    let exe = toml_str(&satellite_exe().to_string_lossy());
    format!(
        r#"
[satellite]
handshake_timeout_seconds = 5
discovery_timeout_seconds = 5
restart_backoff_ms = [10, 10, 10]

[sandbox]
allowed_commands = [{exe}]

[[teams]]
id = "acme"

[[users]]
id = "alice"
teams = ["acme"]

[[users]]
id = "bob"
teams = ["acme"]

[[servers]]
slug = "demo"
transport = "stdio"
command = {exe}
args = ["demo-server"]

[[installations]]
id = "i-demo"
team = "acme"
server = "demo"

{extra}
"#
    )
}

pub const ALICE: &str = "demo-acme-alice-i-demo";
pub const BOB: &str = "demo-acme-bob-i-demo";

pub fn instance(sat: &TestSatellite, id: &str) -> Arc<Instance> {
    sat.satellite.manager().get(&ProcessId::from(id)).unwrap_or_else(|| panic!("no instance {id}"))
}

pub async fn wait_status(sat: &TestSatellite, id: &str, status: InstanceStatus) -> satellite::instances::StatusEntry {
    let pid = ProcessId::from(id);
    wait_until(DEADLINE, &format!("{id} to be {status}"), || {
        let found = sat.satellite.manager().get(&pid).map(|i| i.status()).filter(|s| s.status == status);
        async move { found }
    })
    .await
}

pub async fn call(sat: &TestSatellite, id: &str, tool: &str, arguments: Value) -> Result<Value, InstanceError> {
    let instance = instance(sat, id);
    sat.satellite
        .manager()
        .call(&instance, "tools/call", Some(json!({"name": tool, "arguments": arguments})), Duration::from_secs(20))
        .await
}

pub fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Settings too fine for the file: idle after 1 ms, checked by hand or every 50 ms.
pub fn fast_idle(config: &mut Config) {
    let lifecycle = &mut config.upstream.lifecycle;
    lifecycle.idle_timeout = Some(Duration::from_millis(1));
    lifecycle.spawn_grace = Duration::ZERO;
    lifecycle.idle_check_interval = Duration::from_millis(50);
}
