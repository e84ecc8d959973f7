//! Managed mode: the satellite as a client of the DeployStack backend (BP).
//!
//! `wire` holds the bodies exchanged with the backend (data only). Beside it: the pure policies (`polling`,
//! `dedup`), stored `credentials`, process `metrics` for heartbeats, and the event `uploader`.

pub mod client;
pub mod credentials;
pub mod dedup;
pub mod managed;
pub mod metrics;
pub mod monitor;
pub mod oauth;
pub mod polling;
pub mod retry_after;
pub mod startup;
pub mod uploader;
pub mod wire;
