//! Task ids (the Tasks extension, `io.modelcontextprotocol/tasks`, and 2025-11-25's tasks) as a client of the
//! satellite sees them: the server's own id sealed to the instance that made it, `t1.<instance>.<server's
//! id>.<mac>`, each part base64url, the MAC an HMAC-SHA256 under a key of this satellite's process. The routers
//! open a client's id to send a task request to that instance only (`router::tasks`); a relay seals the ids of the
//! task status notifications it carries ([`crate::mcp::transport::Relay::sealing_tasks_of`]).

use std::sync::LazyLock;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// The extension's name, as servers declare it under `capabilities.extensions`.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

const PREFIX: &str = "t1";
/// Bytes of the MAC kept in an id: 128 bits, past guessing.
const MAC_BYTES: usize = 16;

/// The key task ids are sealed with: random, one per process. An id outlives neither a restart of the satellite
/// nor a trip to another replica (as a parked call does not): the client is told the task is unknown.
static KEY: LazyLock<[u8; 32]> = LazyLock::new(rand::random);

fn mac(instance: &str, task: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&*KEY).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(instance.as_bytes());
    mac.update(&[0]);
    mac.update(task.as_bytes());
    mac
}

/// Whether a server's declared capabilities offer tasks (the extension, or 2025-11-25's `tasks`).
pub fn offered(capabilities: &Value) -> bool {
    capabilities.get("tasks").is_some() || capabilities.pointer("/extensions").and_then(|e| e.get(EXTENSION)).is_some()
}

/// The id a client is given for the server's task `task` on the instance `instance` (its process id).
pub fn seal(instance: &str, task: &str) -> String {
    let tag = mac(instance, task).finalize().into_bytes();
    format!(
        "{PREFIX}.{}.{}.{}",
        URL_SAFE_NO_PAD.encode(instance),
        URL_SAFE_NO_PAD.encode(task),
        URL_SAFE_NO_PAD.encode(&tag[..MAC_BYTES])
    )
}

/// The instance (process id) and the server's task id a client's id stands for; `None` when the satellite did not
/// make it (or it was changed).
pub fn open(id: &str) -> Option<(String, String)> {
    let mut parts = id.split('.');
    let (Some(PREFIX), Some(instance), Some(task), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let text = |part: &str| String::from_utf8(URL_SAFE_NO_PAD.decode(part).ok()?).ok();
    let (instance, task, tag) = (text(instance)?, text(task)?, URL_SAFE_NO_PAD.decode(tag).ok()?);
    if tag.len() != MAC_BYTES {
        return None;
    }
    mac(&instance, &task).verify_truncated_left(&tag).ok()?;
    Some((instance, task))
}

/// Seal the server's task id where a task's id stands in `value`: `taskId`, or a 2025-11-25 `task.taskId`.
pub fn seal_in(value: &mut Value, instance: &str) {
    for pointer in ["/taskId", "/task/taskId"] {
        if let Some(id) = value.pointer_mut(pointer) {
            if let Some(task) = id.as_str() {
                *id = Value::String(seal(instance, task));
            }
        }
    }
}

/// Seal the ids of what a server says of tasks on a relay (`instance` its process id): the task of a
/// `notifications/tasks/status`, and the ids a listen's acknowledgement echoes (`notifications.tasksStatus`).
pub fn seal_notification(method: &str, params: &mut Value, instance: &str) {
    match method {
        "notifications/tasks/status" => seal_in(params, instance),
        "notifications/subscriptions/acknowledged" => {
            let Some(ids) = params.pointer_mut("/notifications/tasksStatus").and_then(Value::as_array_mut) else {
                return;
            };
            for id in ids.iter_mut() {
                if let Some(task) = id.as_str() {
                    *id = Value::String(seal(instance, task));
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_id_opens_to_what_was_sealed_in_it_and_only_then() {
        let id = seal("demo-acme-alice-d", "task.42/ü");
        assert_eq!(open(&id), Some(("demo-acme-alice-d".into(), "task.42/ü".into())));
        // Another instance's id cannot be made from this one: the MAC covers both.
        let parts: Vec<&str> = id.split('.').collect();
        let moved = format!("t1.{}.{}.{}", URL_SAFE_NO_PAD.encode("demo-acme-bob-d"), parts[2], parts[3]);
        assert_eq!(open(&moved), None);
        let guessed = format!("t1.{}.{}.{}", parts[1], URL_SAFE_NO_PAD.encode("task.43"), parts[3]);
        assert_eq!(open(&guessed), None);
        let short = format!("t1.{}.{}.{}", parts[1], parts[2], &parts[3][..4]);
        assert_eq!(open(&short), None, "a truncated MAC is not one");
        for junk in ["", "t1", "t1...", "task-1", "t2.a.b.c", "t1.a.b.c.d", "t1.%%.b.c"] {
            assert_eq!(open(junk), None, "{junk}");
        }
    }

    #[test]
    fn both_eras_task_ids_are_sealed_where_they_stand() {
        let mut flat = json!({"resultType": "task", "taskId": "a", "status": "working"});
        seal_in(&mut flat, "i");
        assert_eq!(open(flat["taskId"].as_str().unwrap_or_default()), Some(("i".into(), "a".into())));
        let mut nested = json!({"task": {"taskId": "b", "status": "working"}});
        seal_in(&mut nested, "i");
        assert_eq!(open(nested["task"]["taskId"].as_str().unwrap_or_default()), Some(("i".into(), "b".into())));
        let mut none = json!({"content": []});
        seal_in(&mut none, "i");
        assert_eq!(none, json!({"content": []}));
    }

    #[test]
    fn what_a_server_says_of_tasks_names_them_as_the_client_knows_them() {
        let mut status = json!({"taskId": "a", "status": "completed"});
        seal_notification("notifications/tasks/status", &mut status, "i");
        assert_eq!(open(status["taskId"].as_str().unwrap_or_default()), Some(("i".into(), "a".into())));
        let mut ack = json!({"notifications": {"tasksStatus": ["a", 7], "toolsListChanged": true}});
        seal_notification("notifications/subscriptions/acknowledged", &mut ack, "i");
        assert_eq!(
            open(ack["notifications"]["tasksStatus"][0].as_str().unwrap_or_default()),
            Some(("i".into(), "a".into()))
        );
        assert_eq!(ack["notifications"]["tasksStatus"][1], 7, "not an id: left as it is");
        let mut other = json!({"taskId": "a"});
        seal_notification("notifications/message", &mut other, "i");
        assert_eq!(other, json!({"taskId": "a"}));
    }

    #[test]
    fn servers_offer_tasks_in_either_era() {
        assert!(offered(&json!({"extensions": {EXTENSION: {}}})));
        assert!(offered(&json!({"tasks": {"requests": {"tools": {"call": {}}}}})));
        assert!(!offered(&json!({"tools": {}, "extensions": {"other": {}}})));
    }
}
