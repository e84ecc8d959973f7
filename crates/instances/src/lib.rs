//! The instances: one per member per installed server. `InstanceManager` reconciles the desired state, starts,
//! supervises and calls each instance (stdio child in its sandbox, or a remote server), puts idle ones to sleep and
//! deploys servers from GitHub; `discovery` reads a server's listings into a `Catalog`; `logcapture` batches server
//! and request logs into events; `activity` takes the clients' activity reports.
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

#[cfg(test)]
#[macro_use]
extern crate satellite_model;

use satellite_config::{config, control};
use satellite_mcp::mcp;
use satellite_model::{metrics, model, secrets};
use satellite_search::{search, tokens};
use satellite_store::{events, store};

pub mod activity;
pub mod discovery;
pub mod instances;
pub mod logcapture;
