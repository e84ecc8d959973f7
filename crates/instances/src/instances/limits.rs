//! Caps on stdio processes per user and in total (issue: limits). A slot is
//! taken before a spawn and given back when the connection holding it is
//! dropped, so the count is the number of live children. Every slot given back
//! is announced, so a start the cap refused can be tried again then.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::model::UserId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("process limit reached: user {user} already runs {limit} MCP server processes on this satellite")]
    User { user: String, limit: usize },
    #[error("process limit reached: this satellite already runs {limit} MCP server processes")]
    Total { limit: usize },
}

impl LimitError {
    /// The cap that was reached.
    pub fn limit(&self) -> usize {
        match self {
            LimitError::User { limit, .. } | LimitError::Total { limit } => *limit,
        }
    }
}

#[derive(Debug)]
pub struct ProcessSlots {
    per_user: usize,
    total: usize,
    counts: Mutex<Counts>,
    /// Changed each time a slot is given back.
    released: tokio::sync::watch::Sender<()>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_user: HashMap<UserId, usize>,
}

/// One live child's place in the count; released on drop.
#[derive(Debug)]
pub struct ProcessSlot {
    slots: Arc<ProcessSlots>,
    user: UserId,
}

impl ProcessSlots {
    pub fn new(per_user: usize, total: usize) -> Arc<Self> {
        let (released, _) = tokio::sync::watch::channel(());
        Arc::new(Self { per_user, total, counts: Mutex::new(Counts::default()), released })
    }

    /// Whether `user` could take a slot now.
    pub fn has_room(&self, user: &UserId) -> bool {
        let counts = self.counts.lock();
        counts.total < self.total && counts.by_user.get(user).copied().unwrap_or(0) < self.per_user
    }

    /// Told of every slot given back from now on: subscribe, then check [`Self::has_room`], and no release
    /// in between is missed.
    pub fn releases(&self) -> tokio::sync::watch::Receiver<()> {
        self.released.subscribe()
    }

    /// Which cap would refuse `user` a slot now, if one would.
    pub fn refusal(&self, user: &UserId) -> Option<LimitError> {
        Self::refusal_in(&self.counts.lock(), user, self.per_user, self.total)
    }

    fn refusal_in(counts: &Counts, user: &UserId, per_user: usize, total: usize) -> Option<LimitError> {
        if counts.total >= total {
            return Some(LimitError::Total { limit: total });
        }
        let mine = counts.by_user.get(user).copied().unwrap_or(0);
        (mine >= per_user).then(|| LimitError::User { user: user.0.clone(), limit: per_user })
    }

    pub fn acquire(self: &Arc<Self>, user: &UserId) -> Result<ProcessSlot, LimitError> {
        let mut counts = self.counts.lock();
        if let Some(refused) = Self::refusal_in(&counts, user, self.per_user, self.total) {
            return Err(refused);
        }
        let mine = counts.by_user.get(user).copied().unwrap_or(0);
        counts.total += 1;
        counts.by_user.insert(user.clone(), mine + 1);
        Ok(ProcessSlot { slots: self.clone(), user: user.clone() })
    }

    pub fn in_use(&self) -> usize {
        self.counts.lock().total
    }
}

impl Drop for ProcessSlot {
    fn drop(&mut self) {
        let mut counts = self.slots.counts.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.by_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.by_user.remove(&self.user);
            }
        }
        drop(counts);
        self.slots.released.send_modify(|_| {});
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_user_and_in_total_and_frees_on_drop() {
        let slots = ProcessSlots::new(2, 3);
        let (alice, bob) = (UserId::from("alice"), UserId::from("bob"));
        let a1 = slots.acquire(&alice).unwrap();
        let _a2 = slots.acquire(&alice).unwrap();
        assert_eq!(slots.acquire(&alice).unwrap_err(), LimitError::User { user: "alice".into(), limit: 2 });
        let _b1 = slots.acquire(&bob).unwrap();
        assert_eq!(slots.acquire(&bob).unwrap_err(), LimitError::Total { limit: 3 });
        drop(a1);
        assert_eq!(slots.in_use(), 2);
        assert!(slots.acquire(&bob).is_ok());
        assert!(LimitError::Total { limit: 3 }.to_string().contains("process limit reached"));
    }

    #[test]
    fn a_slot_given_back_is_announced_and_makes_room() {
        let slots = ProcessSlots::new(1, 10);
        let alice = UserId::from("alice");
        let held = slots.acquire(&alice).unwrap();
        assert!(!slots.has_room(&alice));
        assert!(slots.has_room(&UserId::from("bob")));
        let releases = slots.releases();
        assert!(!releases.has_changed().unwrap());
        drop(held);
        assert!(releases.has_changed().unwrap(), "the release is announced");
        assert!(slots.has_room(&alice));
    }
}
