//! Who is calling: `Authenticator` checks static tokens, JWTs (verified locally), OAuth bearer tokens (introspected
//! at the control plane, cached, single flight, stale-if-error) and instance tokens into a `Principal` of one team;
//! `toolsets` are the named subsets of a member's tools.
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_config::{config, control};
use satellite_model::model;
use satellite_store::store;

pub mod auth;
pub mod toolsets;
