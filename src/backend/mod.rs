//! Managed mode: the satellite as a client of the DeployStack backend (BP).
//!
//! `wire` holds the bodies exchanged with the backend; it is data only. The client that sends them (startup,
//! heartbeat, polling, config, events, introspection) will sit beside it.

pub mod wire;
