//! Discovering running instances again on request (the refresh command) or when their catalog is older than their
//! server asks (`rediscover_every`), a few at a time, each serving its current tools meanwhile.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;

use crate::instances::instance::Instance;
use crate::instances::Inner;
use crate::model::InstanceStatus;

/// What a tool refresh did: the instances discovered again (and the tools they have now), and those left as
/// they were because they were not running.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RefreshReport {
    pub refreshed: Vec<String>,
    pub tools: usize,
    pub skipped: Vec<(String, InstanceStatus)>,
}

impl RefreshReport {
    pub fn to_json(&self) -> Value {
        let skipped: Vec<Value> = self
            .skipped
            .iter()
            .map(|(id, status)| serde_json::json!({"process_id": id, "status": status.as_str()}))
            .collect();
        serde_json::json!({"refreshed": self.refreshed, "tools": self.tools, "skipped": skipped})
    }
}

impl Inner {
    /// Online instances whose server asks for periodic discovery (`rediscover_every`) and whose catalog is
    /// older than that: discovered again, a few at a time. Returns how many.
    pub(in crate::instances) async fn rediscover_stale(self: &Arc<Self>) -> usize {
        let now = chrono::Utc::now();
        let due = self.roster.due_for_rediscovery(now);
        let count = due.len();
        futures::stream::iter(due)
            .for_each_concurrent(4, |(instance, client)| async move {
                tracing::debug!(process_id = %instance.spec().process_id, "periodic re-discovery");
                self.refresh_catalog(&instance, &client).await;
            })
            .await;
        count
    }

    /// Discover `instances` again now (the refresh command, `POST /api/tools/refresh`), a few at a time: each
    /// online one keeps serving its current tools meanwhile; one that is not running (dormant, offline, in
    /// error) is left as it is and reported with its status, since its catalog is discovered when it starts; one
    /// whose discovery fails is reported with the status that failure gave it.
    pub(in crate::instances) async fn refresh_tools(self: &Arc<Self>, instances: Vec<Arc<Instance>>) -> RefreshReport {
        let outcomes: Vec<(Arc<Instance>, bool)> = futures::stream::iter(instances)
            .map(|instance| async move {
                let client = instance.client().filter(|_| instance.state() == InstanceStatus::Online);
                let refreshed = match client {
                    Some(client) => self.refresh_catalog(&instance, &client).await == Some(true),
                    None => false,
                };
                (instance, refreshed)
            })
            .buffer_unordered(4)
            .collect()
            .await;
        let mut report = RefreshReport::default();
        for (instance, refreshed) in outcomes {
            let id = instance.spec().process_id.0.clone();
            if refreshed {
                report.tools += instance.catalog().map_or(0, |c| c.tools.len());
                report.refreshed.push(id);
            } else {
                report.skipped.push((id, instance.state()));
            }
        }
        report.refreshed.sort();
        report.skipped.sort_by(|a, b| a.0.cmp(&b.0));
        report
    }
}
