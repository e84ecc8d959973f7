//! Command de-duplication (BP §4.3): the backend re-delivers a command on
//! every poll until its result is posted, so the satellite keeps the ids in
//! flight and a bounded record of finished results to post again.

use std::collections::{HashMap, HashSet, VecDeque};

use serde_json::Value;

/// Finished results remembered (BP suggests ~1000).
pub const FINISHED_KEPT: usize = 1000;

/// What to do with a command id that arrived in a poll.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// First time: run it.
    New,
    /// Still running: ignore this delivery.
    InFlight,
    /// Already done: post this result again.
    Finished(Value),
}

#[derive(Debug, Default)]
pub struct CommandLedger {
    in_flight: HashSet<String>,
    finished: HashMap<String, Value>,
    order: VecDeque<String>,
    capacity: usize,
}

impl CommandLedger {
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), ..Self::default() }
    }

    /// Classify a delivery; a `New` id is marked in flight.
    pub fn arrive(&mut self, id: &str) -> Seen {
        if self.in_flight.contains(id) {
            return Seen::InFlight;
        }
        if let Some(result) = self.finished.get(id) {
            return Seen::Finished(result.clone());
        }
        self.in_flight.insert(id.to_owned());
        Seen::New
    }

    /// Record the terminal result body of a command.
    pub fn finish(&mut self, id: &str, result: Value) {
        self.in_flight.remove(id);
        if self.finished.insert(id.to_owned(), result).is_none() {
            self.order.push_back(id.to_owned());
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.finished.remove(&oldest);
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn finished(&self) -> usize {
        self.finished.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_runs_once_and_its_result_is_posted_again_on_redelivery() {
        let mut ledger = CommandLedger::new(FINISHED_KEPT);
        assert_eq!(ledger.arrive("c1"), Seen::New);
        assert_eq!(ledger.arrive("c1"), Seen::InFlight, "delivered again while running");
        ledger.finish("c1", json!({"command_id": "c1", "status": "completed"}));
        assert_eq!(ledger.arrive("c1"), Seen::Finished(json!({"command_id": "c1", "status": "completed"})));
        assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn the_record_of_finished_commands_is_bounded_oldest_out() {
        let mut ledger = CommandLedger::new(3);
        for i in 0..5 {
            let id = format!("c{i}");
            assert_eq!(ledger.arrive(&id), Seen::New);
            ledger.finish(&id, json!(i));
        }
        assert_eq!(ledger.finished(), 3);
        assert_eq!(ledger.arrive("c0"), Seen::New, "forgotten: runs again (the handlers are idempotent)");
        assert_eq!(ledger.arrive("c4"), Seen::Finished(json!(4)));
    }
}
