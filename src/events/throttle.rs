//! At most one event per key per window, for events a hostile or overloaded peer could otherwise repeat without
//! bound (`security.auth.failed`, `resource.limit.exceeded`). What is held back is counted and reported with the
//! next event of that key. Memory is bounded: past `max_keys` keys, those whose window ended are forgotten, and
//! if every key is still fresh the table starts over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
pub struct Throttle {
    window: Duration,
    max_keys: usize,
    /// Key → (when its last event went, events held back since).
    seen: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Throttle {
    pub fn new(window: Duration, max_keys: usize) -> Self {
        Self { window, max_keys: max_keys.max(1), seen: Mutex::new(HashMap::new()) }
    }

    /// `Some(held back since the last event)` when an event for `key` may go at `now`; `None` (counted) when not.
    pub fn allow(&self, key: &str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock();
        if let Some((last, held)) = seen.get_mut(key) {
            if now.duration_since(*last) < self.window {
                *held += 1;
                return None;
            }
            let suppressed = std::mem::take(held);
            *last = now;
            return Some(suppressed);
        }
        if seen.len() >= self.max_keys {
            let window = self.window;
            seen.retain(|_, (last, _)| now.duration_since(*last) < window);
            if seen.len() >= self.max_keys {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), (now, 0));
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
    fn the_table_stays_bounded_under_a_flood_of_sources() {
        let throttle = Throttle::new(Duration::from_secs(60), 10);
        let t0 = Instant::now();
        for i in 0..1_000 {
            assert_eq!(throttle.allow(&format!("source-{i}"), t0), Some(0));
        }
        assert!(throttle.seen.lock().len() <= 10);
    }
}
