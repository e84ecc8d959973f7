//! Per-user instances: the reconciler that moves the live set toward a
//! desired state, and the supervisor of each instance (`lifecycle`): start
//! (spawn or connect, handshake, discovery), crash and restart policy, idle
//! dormancy and respawn, recovery of remote servers, call limits, stop.
//! Only this module spawns processes.
//!
//! Reconciles are serialised; within one, instances are stopped and started
//! with bounded parallelism, and each instance's lifecycle lock keeps it from
//! being worked on twice at once. A failed discovery never clears the tools
//! an instance had. Every status change goes through the transition function
//! and is recorded with its `mcp.server.status_changed` event.
//!
//! `InstanceManager` is a handle on `Inner` (`inner`), made of parts that each hold the few handles their job needs:
//! the `roster` (the instances wanted and running), the `reporter` (status changes, events, who must look again),
//! the drift `holds`, and the lifecycle's connector, room (process slots, dormancy), catalog publisher and call
//! log. The manager's methods are grouped by job: `lookup`, `calling`, `commands`, `holds` and `reconcile`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::UpstreamSettings;
use crate::events::Emitter;
use crate::mcp::client::ClientOptions;
use crate::model::InstanceSpec;
use crate::search::SearchIndex;
use crate::store::Catalogs;

mod calling;
mod commands;
pub mod deploy;
mod holds;
mod http_clients;
mod inner;
mod instance;
mod lifecycle;
pub mod limits;
mod live;
mod lookup;
pub mod policy;
mod reconcile;
mod reporter;
mod roster;
pub mod sandbox;
pub mod status;

pub use http_clients::{download_http_client, remote_http_client, REMOTE_USER_AGENT};
use inner::Inner;
pub use instance::{
    missed_announcements, Instance, InstanceError, Release, StatusEntry, ToolOverrides, MAX_SUBSCRIPTIONS,
};
pub use lifecycle::RefreshReport;
pub use reconcile::ReconcileReport;
pub use reporter::ViewChange;

/// Time a stdio child gets to leave after stdin closes, before signals.
const STDIO_CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Everything the manager needs from outside.
pub struct ManagerDeps {
    pub settings: UpstreamSettings,
    pub client_options: ClientOptions,
    /// The environment every stdio child starts from (already stripped of the satellite's own settings).
    pub inherited_env: BTreeMap<String, String>,
    /// Allow-list, argument checks, per-team directories, rlimits and isolation of stdio children.
    pub sandbox: Arc<sandbox::SandboxPolicy>,
    pub http: reqwest::Client,
    pub store: Catalogs,
    /// The tool index; the manager keeps it in step with every catalog it holds.
    pub search: SearchIndex,
    /// Where lifecycle events go (the SQLite outbox).
    pub events: Emitter,
    /// Server and request log capture (BP §9).
    pub logs: crate::logcapture::LogCapture,
    /// Managed mode: users' OAuth tokens for remote servers that require them (BP §11).
    pub oauth: Option<Arc<dyn OAuthTokens>>,
    /// Managed mode: builds GitHub-deployed servers (SB §9.9).
    pub deployer: Option<Arc<deploy::Deployer>>,
    /// Tool calls by server and outcome, for `/metrics`.
    pub metrics: crate::metrics::Metrics,
}

/// Where a remote instance's OAuth bearer token comes from (the backend, in managed mode).
pub trait OAuthTokens: Send + Sync {
    /// The access token for this instance's user, or why there is none.
    fn bearer<'a>(&'a self, spec: &'a InstanceSpec) -> futures::future::BoxFuture<'a, Result<String, NoToken>>;
    /// The server refused the token: forget it.
    fn invalidate(&self, spec: &InstanceSpec);
}

/// Why an instance has no OAuth token to connect with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoToken {
    /// The user must authorise (again): the backend holds no token for them. A message for the user.
    Required(String),
    /// The backend could not be asked now (5xx, 429, a timeout): the token may well exist, so the instance is
    /// retried like an unreachable server, not sent to re-authorisation (SB §11.3).
    Unavailable(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("no instance {0}")]
    NotFound(String),
    #[error("no enabled instance of installation {0}")]
    NoInstallation(String),
}

/// Handle to the instance set; cheap to clone.
#[derive(Clone)]
pub struct InstanceManager {
    inner: Arc<Inner>,
}

/// Whether an idle instance must stay awake.
pub type KeepAwake = Arc<dyn Fn(&Instance) -> bool + Send + Sync>;

/// How long what a removed instance or installation leaves behind (its stored catalog, the installation's drift
/// holds) is kept in case it comes back: a configuration file written half, or a backend answering with part of
/// the team's servers for a moment, must not cost an administrator's holds. Past it, `purge_removed` deletes them.
pub const REMOVAL_GRACE: Duration = Duration::from_secs(10 * 60);

impl InstanceManager {
    /// A manager with no instances yet; catalogs stored by a previous run are loaded.
    pub async fn new(deps: ManagerDeps) -> Result<Self, crate::store::StoreError> {
        Ok(Self { inner: Arc::new(Inner::new(deps).await?) })
    }
}

/// The key under which a member's client streams take seats (`Seats`): an instance's server asks only the
/// clients of the member it belongs to, in its team.
pub fn seat_owner(team: &crate::model::TeamId, user: &crate::model::UserId) -> String {
    format!("{}\u{0}{}", team.0, user.0)
}
