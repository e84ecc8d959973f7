//! At most a few events per key per window (one by default), for events a hostile or overloaded peer could
//! otherwise repeat without bound (`security.auth.failed`, `resource.limit.exceeded`, a legacy SSE client's
//! `mcp.client.connected`). What is held back is counted and reported with the next event of that key. Memory is
//! bounded: past `max_keys` keys, those whose window ended are forgotten, and if every key is still fresh the table
//! starts over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
pub struct Throttle {
    window: Duration,
    per_window: u32,
    max_keys: usize,
    seen: Mutex<HashMap<String, Seen>>,
}

#[derive(Debug)]
struct Seen {
    /// When the key's current window began.
    since: Instant,
    /// Events let through in that window.
    sent: u32,
    /// Events held back since the last one let through.
    held: u64,
}

impl Throttle {
    /// One event per key per `window`.
    pub fn new(window: Duration, max_keys: usize) -> Self {
        Self::with_burst(window, 1, max_keys)
    }

    /// `per_window` events per key per `window`.
    pub fn with_burst(window: Duration, per_window: u32, max_keys: usize) -> Self {
        Self { window, per_window: per_window.max(1), max_keys: max_keys.max(1), seen: Mutex::new(HashMap::new()) }
    }

    /// `Some(held back since the last event)` when an event for `key` may go at `now`; `None` (counted) when not.
    pub fn allow(&self, key: &str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock();
        if let Some(entry) = seen.get_mut(key) {
            if now.duration_since(entry.since) >= self.window {
                entry.since = now;
                entry.sent = 0;
            }
            if entry.sent >= self.per_window {
                entry.held += 1;
                return None;
            }
            entry.sent += 1;
            return Some(std::mem::take(&mut entry.held));
        }
        if seen.len() >= self.max_keys {
            let window = self.window;
            seen.retain(|_, entry| now.duration_since(entry.since) < window);
            if seen.len() >= self.max_keys {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), Seen { since: now, sent: 1, held: 0 });
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_key_per_window_with_the_held_back_count() {
        let throttle = Throttle::new(Duration::from_secs(60), 100);
        let t0 = Instant::now();
        assert_eq!(throttle.allow("203.0.113.7", t0), Some(0));
        assert_eq!(throttle.allow("203.0.113.7", t0 + Duration::from_secs(1)), None);
        assert_eq!(throttle.allow("203.0.113.7", t0 + Duration::from_secs(59)), None);
        assert_eq!(throttle.allow("198.51.100.1", t0 + Duration::from_secs(2)), Some(0), "another source");
        assert_eq!(throttle.allow("203.0.113.7", t0 + Duration::from_secs(60)), Some(2));
        assert_eq!(throttle.allow("203.0.113.7", t0 + Duration::from_secs(120)), Some(0));
    }

    #[test]
    fn a_burst_per_window_then_the_held_back_count() {
        let throttle = Throttle::with_burst(Duration::from_secs(60), 3, 100);
        let t0 = Instant::now();
        for n in 0..3 {
            assert_eq!(throttle.allow("alice", t0 + Duration::from_secs(n)), Some(0), "event {n}");
        }
        assert_eq!(throttle.allow("alice", t0 + Duration::from_secs(4)), None);
        assert_eq!(throttle.allow("alice", t0 + Duration::from_secs(5)), None);
        assert_eq!(throttle.allow("alice", t0 + Duration::from_secs(60)), Some(2), "a new window");
        assert_eq!(throttle.allow("alice", t0 + Duration::from_secs(61)), Some(0));
    }

    #[test]
    fn the_table_stays_bounded_under_a_flood_of_sources() {
        let throttle = Throttle::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        for i in 0..1_000 {
            assert_eq!(throttle.allow(&format!("source-{i}"), t0), Some(0));
        }
        assert!(throttle.seen.lock().len() <= 10);
    }
}
