//! One per-user instance: its spec, status, live connection and catalog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::mcp::client::McpClient;
use crate::mcp::transport::{Transport, UpstreamError};
use crate::model::{Catalog, InstanceSpec, InstanceStatus};

/// The current status with its message and when it was set.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusEntry {
    pub status: InstanceStatus,
    pub message: Option<String>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("instance {0} is not connected")]
    NotConnected(String),
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

/// A live instance. Replaced by a new one when its spec changes, so `spec` never changes.
#[derive(Debug)]
pub struct Instance {
    spec: InstanceSpec,
    status: Mutex<StatusEntry>,
    connection: Mutex<Option<Connection>>,
    catalog: Mutex<Option<Arc<Catalog>>>,
    /// Serialises start, stop and rediscovery of this instance.
    pub(super) lifecycle: tokio::sync::Mutex<()>,
    /// Cancelled when the instance is removed or replaced.
    pub(super) retired: CancellationToken,
}

#[derive(Debug, Clone)]
struct Connection {
    client: Arc<McpClient>,
    since: Instant,
}

impl Instance {
    pub(super) fn new(spec: InstanceSpec, catalog: Option<Arc<Catalog>>) -> Self {
        Self {
            spec,
            status: Mutex::new(StatusEntry {
                status: InstanceStatus::Provisioning,
                message: None,
                updated_at: Utc::now(),
            }),
            connection: Mutex::new(None),
            catalog: Mutex::new(catalog),
            lifecycle: tokio::sync::Mutex::new(()),
            retired: CancellationToken::new(),
        }
    }

    pub fn spec(&self) -> &InstanceSpec {
        &self.spec
    }

    pub fn status(&self) -> StatusEntry {
        self.status.lock().clone()
    }

    pub(super) fn set_status(&self, status: InstanceStatus, message: Option<String>) -> StatusEntry {
        let entry = StatusEntry { status, message, updated_at: Utc::now() };
        *self.status.lock() = entry.clone();
        entry
    }

    /// The tools, resources and templates of the last successful discovery.
    pub fn catalog(&self) -> Option<Arc<Catalog>> {
        self.catalog.lock().clone()
    }

    pub(super) fn set_catalog(&self, catalog: Arc<Catalog>) {
        *self.catalog.lock() = Some(catalog);
    }

    pub fn client(&self) -> Option<Arc<McpClient>> {
        self.connection.lock().as_ref().map(|c| c.client.clone())
    }

    pub(super) fn set_client(&self, client: Arc<McpClient>) {
        *self.connection.lock() = Some(Connection { client, since: Instant::now() });
    }

    pub(super) fn take_client(&self) -> Option<Arc<McpClient>> {
        self.connection.lock().take().map(|c| c.client)
    }

    /// How long the current connection has been up.
    pub fn uptime(&self) -> Option<Duration> {
        self.connection.lock().as_ref().map(|c| c.since.elapsed())
    }

    /// The child's pid, for stdio instances with a live process.
    pub fn pid(&self) -> Option<u32> {
        match self.client()?.transport() {
            Transport::Stdio(stdio) if stdio.is_alive() => stdio.pid(),
            _ => None,
        }
    }

    /// The child's last stderr lines (stdio only).
    pub fn stderr_tail(&self) -> Vec<String> {
        match self.client().as_deref().map(McpClient::transport) {
            Some(Transport::Stdio(stdio)) => stdio.stderr_tail(),
            _ => Vec::new(),
        }
    }

    /// Send a request to the instance's server over its live connection.
    pub async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, InstanceError> {
        let client = self.client().ok_or_else(|| InstanceError::NotConnected(self.spec.process_id.0.clone()))?;
        Ok(client.request(method, params, timeout).await?)
    }
}
