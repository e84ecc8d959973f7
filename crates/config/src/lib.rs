//! What the satellite is told: `Config::load` (defaults < file < environment < flags), and `control`, which turns
//! the backend's configuration entries or the standalone file into the `DesiredState` of instances, with the user
//! directory.
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_model::model;

pub mod config;
pub mod control;
