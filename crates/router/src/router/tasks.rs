//! Tasks through the routers (`mcp::task_ids` seals the ids). A client's `tasks/get`, `tasks/update`,
//! `tasks/cancel` or `tasks/result` goes to the instance its id was sealed to, as the server's own id; an id the
//! satellite did not make, or made for another instance (another user's above all), is refused as an unknown task
//! (-32602), whatever the server would say. So a task can be neither guessed nor carried to another user, even on
//! a server that serves every user alike.

use serde_json::{json, Value};

use super::{invalid, RouteError};
use crate::mcp::payload::{Payload, ResultType};
use crate::mcp::protocol::{codes, meta_keys, RpcError};
use crate::mcp::task_ids::{self, EXTENSION};

/// Whether a request names a task by its id (`params.taskId`): the extension's `tasks/get`, `tasks/update` and
/// `tasks/cancel`, and 2025-11-25's `tasks/result`, which the extension removed (a 2026-07-28 request for it goes
/// on as any unknown method does, and is refused by the server as one).
pub fn names_task(method: &str, params: Option<&Value>) -> bool {
    match method {
        "tasks/get" | "tasks/update" | "tasks/cancel" => true,
        "tasks/result" => {
            params.and_then(|p| p.get("_meta")).and_then(|m| m.get(meta_keys::PROTOCOL_VERSION)).is_none()
        }
        _ => false,
    }
}

/// The refusal of a task id that is not the caller's to use, as a server refuses one it does not know.
pub fn unknown(id: &str) -> RouteError {
    invalid(format!("Unknown taskId: {id}"))
}

/// Whether a 2026-07-28 request's client declares the extension.
pub fn declared(params: Option<&Value>) -> bool {
    let capabilities = params.and_then(|p| p.get("_meta")).and_then(|m| m.get(meta_keys::CLIENT_CAPABILITIES));
    capabilities.and_then(|c| c.pointer("/extensions")).and_then(|e| e.get(EXTENSION)).is_some()
}

/// Lists the extension among the `extensions` of server `capabilities` (made when missing): `/mcp` offers it to a
/// client that declares it, since `execute_mcp_tool` passes on the tasks its servers make.
pub fn advertise(capabilities: &mut Value) {
    let Value::Object(capabilities) = capabilities else { return };
    if let Value::Object(extensions) = capabilities.entry("extensions").or_insert_with(|| json!({})) {
        extensions.insert(EXTENSION.into(), json!({}));
    }
}

/// A 2026-07-28 task request from a client that did not declare the extension is refused as a server offering it
/// refuses one (-32021), before its id is looked at; `None` for any other request.
pub fn undeclared(params: &Value) -> Option<RouteError> {
    params.get("_meta")?.get(meta_keys::CLIENT_CAPABILITIES)?;
    if declared(Some(params)) {
        return None;
    }
    let required = json!({"requiredCapabilities": {"extensions": {EXTENSION: {}}}});
    let message = format!("Missing required client capability: the extension {EXTENSION}");
    Some(RouteError::Rpc(RpcError::new(codes::MISSING_CLIENT_CAPABILITY, message).with_data(required)))
}

/// The instance a task request's `params.taskId` names, with the id replaced by the server's own; `Err` when the
/// id is missing or not one the satellite made.
pub fn unseal_request(params: &mut Value) -> Result<String, RouteError> {
    let Some(id) = params.get("taskId").and_then(Value::as_str) else {
        return Err(invalid("Invalid params: taskId must be a string"));
    };
    let (instance, task) = task_ids::open(id).ok_or_else(|| unknown(id))?;
    params["taskId"] = Value::String(task);
    Ok(instance)
}

/// A `subscriptions/listen` for task status on `instance`: the ids it names (`notifications.tasksStatus`) as the
/// server's own; an id not sealed to this instance is left out, as a task the server does not know.
pub fn unseal_listen(params: &mut Value, instance: &str) {
    let Some(ids) = params.pointer_mut("/notifications/tasksStatus").and_then(Value::as_array_mut) else { return };
    ids.retain_mut(|id| match id.as_str().and_then(task_ids::open) {
        Some((owner, task)) if owner == instance => {
            *id = Value::String(task);
            true
        }
        _ => false,
    });
}

/// A server's answer with the task ids the client is given in place of its own: a `CreateTaskResult` (the flat
/// `resultType: "task"`, or 2025-11-25's nested `task`) of any request, the task a `tasks/get` returns, and the
/// tasks a 2025-11-25 `tasks/list` lists. Anything else goes on untouched, unread.
pub fn seal_result(method: &str, instance: &str, result: Payload) -> Payload {
    let shape = result.shape();
    let created = shape.result_type == Some(ResultType::Task) || shape.is_task;
    if !created && method != "tasks/get" && method != "tasks/list" {
        return result;
    }
    let Ok(mut value) = result.to_value() else { return result };
    task_ids::seal_in(&mut value, instance);
    if let Some(listed) = value.get_mut("tasks").and_then(Value::as_array_mut).filter(|_| method == "tasks/list") {
        listed.iter_mut().for_each(|task| task_ids::seal_in(task, instance));
    }
    Payload::Value(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_request_goes_out_with_the_servers_id_or_not_at_all() {
        let mut params = json!({"taskId": task_ids::seal("i-1", "srv-7"), "inputResponses": {}});
        assert_eq!(unseal_request(&mut params).ok(), Some("i-1".into()));
        assert_eq!(params["taskId"], "srv-7");
        let mut forged = json!({"taskId": "srv-7"});
        let refused = unseal_request(&mut forged).err();
        assert!(matches!(refused, Some(RouteError::Rpc(ref e)) if e.code == -32602), "{refused:?}");
        assert!(unseal_request(&mut json!({})).is_err());
    }

    #[test]
    fn only_task_answers_are_rewritten() {
        let opened = |v: &Value, p: &str| task_ids::open(v.pointer(p).and_then(Value::as_str).unwrap_or_default());
        let created = Payload::from(json!({"resultType": "task", "taskId": "srv-1", "status": "working"}));
        let sealed = seal_result("tools/call", "i-1", created).into_value().unwrap_or_default();
        assert_eq!(opened(&sealed, "/taskId"), Some(("i-1".into(), "srv-1".into())));
        let got = seal_result("tasks/get", "i-1", json!({"resultType": "complete", "taskId": "srv-1"}).into());
        assert!(opened(&got.into_value().unwrap_or_default(), "/taskId").is_some());
        let listed = seal_result("tasks/list", "i-1", json!({"tasks": [{"taskId": "a"}, {"taskId": "b"}]}).into());
        assert!(opened(&listed.into_value().unwrap_or_default(), "/tasks/1/taskId").is_some());
        let plain = json!({"content": [], "taskId": "not-a-task"});
        let kept = seal_result("tools/call", "i-1", plain.clone().into()).into_value().ok();
        assert_eq!(kept, Some(plain));
    }

    #[test]
    fn tasks_result_names_a_task_only_in_the_era_that_has_it() {
        assert!(names_task("tasks/get", None) && names_task("tasks/result", Some(&json!({"taskId": "x"}))));
        let modern = json!({"taskId": "x", "_meta": {meta_keys::PROTOCOL_VERSION: "2026-07-28"}});
        assert!(!names_task("tasks/result", Some(&modern)) && names_task("tasks/cancel", Some(&modern)));
        assert!(!names_task("tasks/list", None) && !names_task("tools/call", None));
    }

    #[test]
    fn a_listen_names_only_this_instances_tasks() {
        let (mine, theirs) = (task_ids::seal("i-1", "a"), task_ids::seal("i-2", "b"));
        let mut params = json!({"notifications": {"tasksStatus": [mine, theirs, "made-up"], "toolsListChanged": true}});
        unseal_listen(&mut params, "i-1");
        assert_eq!(params, json!({"notifications": {"tasksStatus": ["a"], "toolsListChanged": true}}));
    }

    #[test]
    fn a_client_that_did_not_declare_the_extension_is_refused_as_the_server_would() {
        let modern = |caps: Value| json!({"taskId": "x", "_meta": {meta_keys::CLIENT_CAPABILITIES: caps}});
        let refused = undeclared(&modern(json!({}))).and_then(|e| match e {
            RouteError::Rpc(e) => Some(e.code),
            RouteError::Forbidden(_) => None,
        });
        assert_eq!(refused, Some(codes::MISSING_CLIENT_CAPABILITY));
        assert!(undeclared(&modern(json!({"extensions": {EXTENSION: {}}}))).is_none());
        assert!(undeclared(&json!({"taskId": "x"})).is_none(), "a handshake-era request has no envelope to judge");
    }
}
