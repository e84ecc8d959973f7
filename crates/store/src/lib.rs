//! The database and what goes through it on SQLite or PostgreSQL (`store`, the only crate that names sqlx, the only
//! SQL): the `Store` opens it, migrated, and hands out one repository per concern (the event outbox, status
//! history, catalogs, toolsets, analytics rows, what replicas coordinate through), so each component holds only
//! the tables it uses; and the closed registry of event kinds with the emitter that queues them durably in the
//! outbox (`events`).
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_config::config;
use satellite_model::model;

pub mod events;
pub mod store;
