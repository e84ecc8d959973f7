//! Room on demand (issue 73): a spawn the process cap refuses first puts the least recently used idle stdio
//! process to sleep (dormant: its tools stay listed, the next call wakes it) and takes the slot it gave back. Only
//! when no process is idle does the spawn fail as "at capacity", a retryable answer; the instance then starts by
//! itself as soon as a slot is given back (`Retry::Slot`). Before, instances over the cap stayed `error` until
//! idle processes timed out (about 3.5 minutes with the defaults).

use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use crate::instances::limits::{LimitError, ProcessSlot};
use crate::instances::{Inner, Instance};
use crate::model::InstanceSpec;

/// A process stopped to make room has been idle at least this long (not between two calls of a burst).
const ROOM_MIN_IDLE: Duration = Duration::from_secs(1);

/// How often a start waiting for a slot looks for an idle process to stop, besides every slot given back.
pub(in crate::instances) const ROOM_CHECK: Duration = Duration::from_secs(2);

impl Inner {
    /// A process slot for `spec`, making room when the cap refuses one: the idle stdio instances that free a slot
    /// `spec`'s user may take (for the per-user cap, that user's own; for the total cap, anyone's) are put to sleep,
    /// least recently used first, until one slot is taken.
    pub(in crate::instances) async fn slot_for(&self, spec: &InstanceSpec) -> Result<ProcessSlot, LimitError> {
        let refused = match self.slots.acquire(&spec.user_id) {
            Ok(slot) => return Ok(slot),
            Err(refused) => refused,
        };
        let mut candidates = self.room_candidates(spec, &refused);
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

    /// The running stdio processes whose slot `spec` could take, when the cap refused it as `refused`.
    fn room_candidates(&self, spec: &InstanceSpec, refused: &LimitError) -> Vec<Arc<Instance>> {
        self.running_stdio()
            .into_iter()
            .filter(|i| i.pid().is_some() && i.spec().process_id != spec.process_id)
            .filter(|i| matches!(refused, LimitError::Total { .. }) || i.spec().user_id == spec.user_id)
            .collect()
    }

    /// Whether a start of `spec` waiting for a slot may find one now: a slot is free, or a process it could stop is
    /// idle (no call, no listen, idle long enough). Read only: the start itself stops it.
    pub(in crate::instances) fn room_likely(&self, spec: &InstanceSpec) -> bool {
        let Some(refused) = self.slots.refusal(&spec.user_id) else { return true };
        self.room_candidates(spec, &refused).iter().any(|i| {
            i.in_flight() == 0
                && i.listens() == 0
                && i.idle().0 >= ROOM_MIN_IDLE
                && i.state() == crate::model::InstanceStatus::Online
        })
    }
}
