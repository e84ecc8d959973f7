//! Process slots and dormancy: the caps on stdio children, an idle child put to sleep (dormant: its tools stay
//! listed, the next call wakes it), and room on demand (issue 73): a spawn the process cap refuses first puts the
//! least recently used idle stdio process to sleep and takes the slot it gave back. Only when no process is idle
//! does the spawn fail as "at capacity", a retryable answer; the instance then starts by itself as soon as a slot
//! is given back (`Retry::Slot`). Before, instances over the cap stayed `error` until idle processes timed out
//! (about 3.5 minutes with the defaults).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::events::{Emitter, Event};
use crate::instances::limits::{LimitError, ProcessSlot, ProcessSlots};
use crate::instances::{Instance, KeepAwake};
use crate::model::{InstanceSpec, InstanceStatus, UserId};

/// A process stopped to make room has been idle at least this long (not between two calls of a burst).
const ROOM_MIN_IDLE: Duration = Duration::from_secs(1);

/// How often a start waiting for a slot looks for an idle process to stop, besides every slot given back.
pub(in crate::instances) const ROOM_CHECK: Duration = Duration::from_secs(2);

/// The process caps, and what may put a process to sleep.
pub(in crate::instances) struct Room {
    slots: Arc<ProcessSlots>,
    /// What keeps an idle instance awake (a client subscribed to its resources): the idle sweep is told it each
    /// round; room made on demand asks this one (`InstanceManager::keep_awake`).
    keep_awake: RwLock<Option<KeepAwake>>,
    /// Where `mcp.server.dormant` goes.
    events: Emitter,
}

impl Room {
    pub(in crate::instances) fn new(slots: Arc<ProcessSlots>, events: Emitter) -> Self {
        Self { slots, keep_awake: RwLock::new(None), events }
    }

    /// What keeps an idle instance awake when room is made for a start.
    pub(in crate::instances) fn set_keep_awake(&self, keep_awake: KeepAwake) {
        *self.keep_awake.write() = Some(keep_awake);
    }

    /// Live stdio children counted against the process caps.
    pub(in crate::instances) fn in_use(&self) -> usize {
        self.slots.in_use()
    }

    /// Whether `user` could take a slot now.
    pub(in crate::instances) fn has_room(&self, user: &UserId) -> bool {
        self.slots.has_room(user)
    }

    /// Told of every slot given back from now on.
    pub(in crate::instances) fn releases(&self) -> tokio::sync::watch::Receiver<()> {
        self.slots.releases()
    }

    /// A process slot for `spec`, making room when the cap refuses one: the idle stdio instances among `running`
    /// that free a slot `spec`'s user may take (for the per-user cap, that user's own; for the total cap, anyone's)
    /// are put to sleep, least recently used first, until one slot is taken.
    pub(in crate::instances) async fn slot_for(
        &self,
        spec: &InstanceSpec,
        running: impl FnOnce() -> Vec<Arc<Instance>>,
    ) -> Result<ProcessSlot, LimitError> {
        let refused = match self.slots.acquire(&spec.user_id) {
            Ok(slot) => return Ok(slot),
            Err(refused) => refused,
        };
        let mut candidates = candidates(running(), spec, &refused);
        // Least recently used first.
        candidates.sort_by_key(|i| std::cmp::Reverse(i.idle().0));
        let keep_awake = self.keep_awake.read().clone();
        let keep_awake = |instance: &Instance| keep_awake.as_ref().is_some_and(|keep| keep(instance));
        for instance in candidates {
            if !self.put_to_sleep(&instance, ROOM_MIN_IDLE, Duration::ZERO, &keep_awake).await {
                continue;
            }
            if let Ok(slot) = self.slots.acquire(&spec.user_id) {
                info!(process_id = %spec.process_id, made_room_by = %instance.spec().process_id,
                      "process cap reached: the least recently used idle process was stopped (dormant) to start this one");
                return Ok(slot);
            }
        }
        Err(refused)
    }

    /// Whether a start of `spec` waiting for a slot may find one now: a slot is free, or a process among `running`
    /// it could stop is idle (no call, no listen, idle long enough). Read only: the start itself stops it.
    pub(in crate::instances) fn room_likely(
        &self,
        spec: &InstanceSpec,
        running: impl FnOnce() -> Vec<Arc<Instance>>,
    ) -> bool {
        let Some(refused) = self.slots.refusal(&spec.user_id) else { return true };
        candidates(running(), spec, &refused).iter().any(|i| {
            i.in_flight() == 0 && i.listens() == 0 && i.idle().0 >= ROOM_MIN_IDLE && i.state() == InstanceStatus::Online
        })
    }

    /// A respawn that the process cap would refuse waits for a slot to be given back (another of the user's
    /// processes going dormant or ending), as a call waits for a call slot: up to `timeout`, then the start is
    /// tried and refused with the reason. The wait ends early when the instance is removed or the satellite stops
    /// (`shutdown`; the respawn then finds it so and starts nothing).
    pub(in crate::instances) async fn wait_for_slot(
        &self,
        instance: &Instance,
        timeout: Duration,
        shutdown: &CancellationToken,
    ) {
        let user = &instance.spec().user_id;
        let mut releases = self.slots.releases();
        let room = async {
            while !self.slots.has_room(user) {
                if releases.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::timeout(timeout, room) => {}
            _ = instance.retired.cancelled() => {}
            _ = shutdown.cancelled() => {}
        }
    }

    /// Stops `instance`'s process (dormant: its tools stay, the next call wakes it) if it is online, up at least
    /// `grace`, idle at least `idle_for`, with no call or listen running and not kept awake. True when it did.
    pub(in crate::instances) async fn put_to_sleep(
        &self,
        instance: &Arc<Instance>,
        idle_for: Duration,
        grace: Duration,
        keep_awake: &(dyn Fn(&Instance) -> bool + Sync),
    ) -> bool {
        let idle = |i: &Instance| {
            i.state() == InstanceStatus::Online && i.uptime().is_some_and(|up| up >= grace) && i.idle().0 >= idle_for
        };
        if !idle(instance) || instance.in_flight() > 0 || instance.listens() > 0 || keep_awake(instance) {
            return false;
        }
        // Busy with a start, restart or rediscovery: not now.
        let Ok(_lifecycle) = instance.lifecycle.try_lock() else { return false };
        // Hold every call slot while the process goes, so no call can pick up the closing connection;
        // getting them all proves no call is running.
        let Ok(_all_slots) = instance.calls.try_acquire_many(instance.max_calls as u32) else { return false };
        if !idle(instance) || instance.retired.is_cancelled() {
            return false;
        }
        let pid = instance.pid();
        let (idle_for, last_activity) = instance.idle();
        let Some(client) = instance.take_client() else { return false };
        // Whatever the old process does from here on is not a crash.
        instance.next_generation();
        instance.set_dormant();
        info!(process_id = %instance.spec().process_id, idle_s = idle_for.as_secs(), "instance idle, stopping its process (dormant)");
        self.events.emit(Event::dormant(instance.spec(), pid, idle_for.as_secs(), last_activity)).await;
        client.close().await;
        true
    }
}

/// The running stdio processes among `running` whose slot `spec` could take, when the cap refused it as `refused`.
fn candidates(running: Vec<Arc<Instance>>, spec: &InstanceSpec, refused: &LimitError) -> Vec<Arc<Instance>> {
    running
        .into_iter()
        .filter(|i| i.pid().is_some() && i.spec().process_id != spec.process_id)
        .filter(|i| matches!(refused, LimitError::Total { .. }) || i.spec().user_id == spec.user_id)
        .collect()
}
