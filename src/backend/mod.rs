//! Managed mode: the satellite's side of the DeployStack backend protocol (BP).

pub mod uploader;
