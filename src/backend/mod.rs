//! Managed mode: the satellite's side of the DeployStack backend protocol (BP).

pub mod credentials;
pub mod dedup;
pub mod metrics;
pub mod polling;
pub mod uploader;
