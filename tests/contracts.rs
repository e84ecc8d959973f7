//! Payloads checked against the JSON Schemas in proto/.

use serde_json::{json, Value};

use crate::common::*;

fn validator(name: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(repo_path("proto").join(name)).expect("schema file");
    let schema: Value = serde_json::from_str(&text).expect("schema is json");
    jsonschema::validator_for(&schema).expect("schema compiles")
}

fn errors(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator.iter_errors(value).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

#[test]
fn the_standalone_file_expands_to_the_backend_config_shape() {
    let file = r#"
[[teams]]
id = "acme"
[[users]]
id = "alice"
teams = ["acme"]
[[users]]
id = "bob"
teams = ["acme"]
[[servers]]
slug = "files"
transport = "stdio"
command = "npx"
args = ["-y", "files"]
secret_env = ["TOKEN"]
[[servers]]
slug = "notion"
transport = "http"
url = "https://mcp.example.com/mcp"
[[installations]]
id = "i1"
team = "acme"
server = "files"
[installations.users.alice]
env = { TOKEN = "x" }
instance_token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
[[installations]]
id = "i2"
team = "acme"
server = "notion"
enabled = false
"#;
    let raw = satellite::config::parse_file(file).unwrap();
    let standalone = satellite::control::standalone::from_file(&raw).unwrap();
    let response = json!({"mcp_servers": standalone.entries});
    let validator = validator("config-response.schema.json");
    assert_eq!(errors(&validator, &response), Vec::<String>::new());
    assert_eq!(response["mcp_servers"].as_object().unwrap().len(), 4);
    // And the embedded default too.
    let demo = satellite::config::EmbeddedDefault {
        demo_token: "t".repeat(20).into(),
        demo_token_generated: false,
        instance_token: format!("ds_inst_{}", "a".repeat(64)).into(),
        instance_token_generated: false,
    };
    let embedded =
        satellite::control::standalone::embedded(&demo, satellite_exe()).expect("the embedded default is valid");
    assert_eq!(errors(&validator, &json!({"mcp_servers": embedded.entries})), Vec::<String>::new());
}

#[test]
fn the_backend_example_validates_and_bad_entries_do_not() {
    let validator = validator("config-response.schema.json");
    let example = json!({"mcp_servers": {"github-acme-u-i": {
        "installation_id": "i", "instance_id": "inst_8f2kA1", "team_id": "t", "team_slug": "acme", "server_name": "GitHub",
        "server_slug": "github", "installation_name": "GitHub (Acme)", "transport_type": "stdio", "command": "npx",
        "args": ["-y", "@modelcontextprotocol/server-github"], "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_x"},
        "enabled": true, "user_id": "u", "user_slug": "u", "instance_status": "provisioning", "instance_path": "bold-penguin-42a3",
        "instance_token_hash": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "requires_oauth": false,
        "source": "official_registry", "language": "typescript", "runtime": "node",
        "settings": {"request_logging_enabled": true}, "secret_metadata": {"env": ["GITHUB_PERSONAL_ACCESS_TOKEN"]}}},
        "satellite_config": {"polling_intervals": {"normal": 30}}});
    assert_eq!(errors(&validator, &example), Vec::<String>::new());
    let mut no_args = example.clone();
    no_args["mcp_servers"]["github-acme-u-i"].as_object_mut().unwrap().remove("args");
    assert!(!errors(&validator, &no_args).is_empty());
    let mut bad_transport = example;
    bad_transport["mcp_servers"]["github-acme-u-i"]["transport_type"] = json!("websocket");
    assert!(!errors(&validator, &bad_transport).is_empty());
}
