//! The ground floor: ids, `InstanceSpec`, `InstanceStatus` and its moves, catalogs of tools and resources; secret
//! masking, the allocator's knobs, Prometheus families and named periodic jobs. Every crate above shares these, and
//! this crate uses none of them.

pub mod jobs;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod secrets;
