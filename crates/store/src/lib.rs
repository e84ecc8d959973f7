//! The database and what goes through it: migrations, catalogs, status history, the event outbox, analytics rows
//! and replica locks on SQLite or PostgreSQL (`store`, the only crate that names sqlx, the only SQL), and the
//! closed registry of event kinds with the emitter that queues them durably (`events`).
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_config::config;
use satellite_model::model;

pub mod events;
pub mod store;
