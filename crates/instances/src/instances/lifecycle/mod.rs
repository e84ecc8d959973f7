//! The supervisor of each instance: start, stop, the watcher of a stdio
//! child (crash → restart policy, list changes, stderr warnings), dormancy
//! and respawn, calls with their limits and retries, and recovery of remote
//! servers. Every status change goes through `Inner::set_status`.
//!
//! Locking: an instance's `lifecycle` lock is held while it is started,
//! stopped, restarted, put to sleep, woken or rediscovered. Crash handling
//! and probes run outside it and take it again for each attempt.
//!
//! Each file is one job, all of them `impl Inner` blocks: `start` (start, restart, halt, rediscover, stop),
//! `connect` (spawn or connect, headers, OAuth), `publish` (discovery, index, status, events), `supervise`
//! (crashes, dormancy, respawn) and `calls` (calls, retries, request logs, recovery probes).

mod calls;
mod connect;
pub(super) mod publish;
mod room;
mod start;
mod supervise;
