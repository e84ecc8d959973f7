//! Dormancy: idle stdio children are put to sleep (their tools stay listed), and a dormant instance is respawned
//! by the next call that needs it, once however many calls arrive.

use std::sync::Arc;
use std::time::Instant;

use tracing::info;

use crate::events::Event;
use crate::instances::instance::{Instance, InstanceError};
use crate::instances::Inner;
use crate::mcp::client::McpClient;

use super::connect::process_pid;

impl Inner {
    /// Stop stdio instances that are online, past the spawn grace, with no call or listen running, idle too long
    /// and not kept awake by `keep_awake`.
    pub(in crate::instances) async fn sweep_idle(&self, keep_awake: &(dyn Fn(&Instance) -> bool + Sync)) -> usize {
        let lifecycle = &self.settings.lifecycle;
        let Some(timeout) = lifecycle.idle_timeout else { return 0 };
        let mut slept = 0;
        for instance in self.roster.running_stdio() {
            if self.room.put_to_sleep(&instance, timeout, lifecycle.spawn_grace, keep_awake).await {
                slept += 1;
            }
        }
        slept
    }

    /// The live client, respawning a dormant instance first. Concurrent callers wait on the lifecycle lock,
    /// so a dormant instance starts one process however many calls arrive.
    pub(in crate::instances) async fn ensure_connected(
        self: &Arc<Self>,
        instance: &Arc<Instance>,
    ) -> Result<Arc<McpClient>, InstanceError> {
        if let Some(client) = instance.client() {
            return Ok(client);
        }
        if !instance.is_dormant() {
            return Err(InstanceError::NotConnected(instance.spec().process_id.0.clone()));
        }
        // Boxed: respawning is a ~6 KB future, and every call's future (boxed per call) carried it inline.
        Box::pin(self.respawn(instance)).await
    }

    /// [`Self::ensure_connected`] for a dormant instance: start its process again.
    async fn respawn(self: &Arc<Self>, instance: &Arc<Instance>) -> Result<Arc<McpClient>, InstanceError> {
        let slug = || instance.spec().server_slug.clone();
        // Before the lifecycle lock: the calls queued behind it wait for the same slot at once, not one after
        // another, and a stop, kill or restart is not held up by the wait.
        let queue = self.settings.lifecycle.call_queue_timeout;
        self.room.wait_for_slot(instance, queue, &self.shutdown).await;
        // Single flight: an attempt that began while this caller waited for the lock answers for it too. Before, the
        // callers queued behind a respawn that failed (a server hanging at its handshake) each tried again in
        // turn, one handshake timeout after another, spawning a process each.
        let tried_before = instance.respawns.lock().0;
        let _lifecycle = instance.lifecycle.lock().await;
        if let Some(client) = instance.client() {
            return Ok(client);
        }
        if !instance.is_dormant() || instance.retired.is_cancelled() || self.shutdown.is_cancelled() {
            return Err(InstanceError::NotConnected(instance.spec().process_id.0.clone()));
        }
        if let (tried, Some(failed)) = &*instance.respawns.lock() {
            if *tried != tried_before {
                return Err(InstanceError::Respawn { slug: slug(), source: failed.clone() });
            }
        }
        let began = Instant::now();
        let connected = self.connect(instance.spec()).await;
        {
            let mut respawns = instance.respawns.lock();
            *respawns = (respawns.0 + 1, connected.as_ref().err().cloned());
        }
        let (client, slot) = connected.map_err(|source| InstanceError::Respawn { slug: slug(), source })?;
        let client = Arc::new(client);
        instance.set_connection(client.clone(), slot);
        instance.touch();
        let generation = instance.next_generation();
        let dormant_for = instance.clear_dormant().unwrap_or_default();
        let pid = process_pid(&client);
        info!(process_id = %instance.spec().process_id, pid, respawn_ms = began.elapsed().as_millis() as u64, "dormant instance respawned");
        self.reporter
            .emit(Event::respawned(instance.spec(), pid, dormant_for.as_secs(), began.elapsed().as_millis() as u64))
            .await;
        self.watch(instance.clone(), client.clone(), generation);
        self.restore_client_state(instance, &client);
        Ok(client)
    }
}
