//! Managed mode: the DeployStack backend's wire types (checked against `proto/`), its client, the start-up
//! identity, heartbeats, the configuration and command poller, and the uploader that sends the outbox's events in
//! batches and loses none while the backend is down.
//!
//! The floors below are imported under their own names, so a path reads `crate::model::…` as in every crate.

use satellite_auth::auth;
use satellite_config::control;
use satellite_instances::instances;
use satellite_mcp::mcp;
use satellite_model::model;
use satellite_store::{events, store};

pub mod backend;
