//! The Tasks extension on `/mcp`: a task `execute_mcp_tool` started is fetched, answered and cancelled with
//! `tasks/get`, `tasks/update` and `tasks/cancel`, on the caller's own instance that made it (`router::tasks`).

use super::*;
use crate::router::tasks;

impl HierarchicalRouter {
    /// A task request: sent to the instance its id was sealed to, when that instance is the caller's; an id of
    /// anyone else's instance is refused as an unknown task, as a made-up one is.
    pub(super) async fn task_request(
        &self,
        caller: &Principal,
        method: &str,
        mut params: Value,
        relay: Option<&Relay>,
    ) -> Result<Payload, RouteError> {
        if let Some(refused) = tasks::undeclared(&params) {
            return Err(refused);
        }
        let id = params.get("taskId").and_then(Value::as_str).unwrap_or_default().to_owned();
        let owner = tasks::unseal_request(&mut params)?;
        let instance = self
            .manager
            .get(&crate::model::ProcessId::from(owner.as_str()))
            .filter(|i| i.spec().team_id == caller.team && i.spec().user_id == caller.user)
            .ok_or_else(|| tasks::unknown(&id))?;
        if !callable(instance.state()) {
            let slug = &instance.spec().server_slug;
            return Err(internal(format!("MCP server '{slug}' is unavailable (status: {})", instance.state())));
        }
        let result = forward(&self.manager, &instance, method, params, self.call_timeout, relay).await?;
        Ok(tasks::seal_result(method, &owner, result))
    }
}
