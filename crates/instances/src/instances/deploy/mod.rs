//! GitHub-deployed stdio servers (SB §9.9, BP §6.1.3, §12): the repository tarball at the pinned commit is
//! downloaded with the installation's token, extracted into one directory per installation (shared by all its
//! members' instances, kept across dormancy, crashes and restarts), installed and built with timeouts, a clean
//! environment and checked scripts, and its entry point resolved into the command the instance runs.
//!
//! A deployment is single-flight per installation and atomic: it is built in a temporary directory and renamed
//! into place with a marker naming the commit, so a half-done deployment is never used and a new commit
//! replaces the old one whole. A failure names its step (`token`, `download`, `extract`, `install`, `build`,
//! `entry`) in the error, which becomes the instance's `error` status and a server-log line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::model::{Deployment, InstallationId, InstanceSpec, Runtime, TeamId, Upstream};

mod build;
mod fetch;

/// Download budget (SB §9.9).
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// Install and build budgets (SB §9.9).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest tarball accepted.
pub const MAX_TARBALL_BYTES: u64 = 200 * 1024 * 1024;
/// The marker a finished deployment carries.
const MARKER: &str = ".satellite-deployment.json";

/// The step a deployment failed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Token,
    Download,
    Extract,
    Install,
    Build,
    Entry,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Token => "token",
            Step::Download => "download",
            Step::Extract => "extract",
            Step::Install => "install",
            Step::Build => "build",
            Step::Entry => "entry",
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("GitHub deployment failed at {}: {reason}", .step.as_str())]
pub struct DeployError {
    pub step: Step,
    pub reason: String,
    /// The same deployment may succeed later: the token or the tarball could not be had for now (the network,
    /// a 5xx, a 429), as opposed to a repository that is not there or a build that fails.
    pub transient: bool,
}

impl DeployError {
    fn at(step: Step, reason: impl Into<String>) -> Self {
        Self { step, reason: reason.into(), transient: false }
    }

    fn for_now(step: Step, reason: impl Into<String>) -> Self {
        Self { step, reason: reason.into(), transient: true }
    }
}

/// Why no installation token came.
#[derive(Debug, Clone, PartialEq)]
pub struct NoGithubToken {
    pub reason: String,
    /// Asking again later may work (the backend unreachable, failing or busy).
    pub transient: bool,
}

/// Where the installation token comes from (the backend, BP §12).
pub trait GithubTokens: Send + Sync {
    fn token<'a>(&'a self, installation: &'a InstallationId) -> BoxFuture<'a, Result<String, NoGithubToken>>;
}

/// What a finished deployment runs: written as the marker, read back on the next start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployed {
    pub commit_sha: String,
    pub runtime: Runtime,
    /// Absolute command (`node`, or the deployment's own venv python).
    pub command: String,
    pub args: Vec<String>,
}

/// Everything a deployment needs from outside.
pub struct DeploySettings {
    /// `<root>/<team>/<installation>` per installation.
    pub root: PathBuf,
    /// `{base}/{owner}/{repo}/tarball/{sha}`.
    pub tarball_base: url::Url,
    pub http: reqwest::Client,
    pub tokens: Arc<dyn GithubTokens>,
    /// Where `npm`, `node`, `uv` and `python3` are looked up.
    pub search: Vec<PathBuf>,
}

/// Deploys GitHub servers, one at a time per installation.
pub struct Deployer {
    settings: DeploySettings,
    locks: Mutex<HashMap<InstallationId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Deployer {
    pub fn new(settings: DeploySettings) -> Self {
        Self { settings, locks: Mutex::new(HashMap::new()) }
    }

    /// The directory an installation deploys into.
    pub fn dir(&self, team: &TeamId, installation: &InstallationId) -> PathBuf {
        self.settings.root.join(safe(&team.0)).join(safe(&installation.0))
    }

    pub fn root(&self) -> &Path {
        &self.settings.root
    }

    /// The spec to launch: the deployed command instead of the entry's own, and the directory to run in.
    /// Deploys first when the installation has no finished deployment of this commit.
    pub async fn launch_spec(
        &self,
        spec: &InstanceSpec,
        deployment: &Deployment,
        log: &(dyn Fn(&str, &str) + Send + Sync),
    ) -> Result<(InstanceSpec, PathBuf), DeployError> {
        let deployed = self.ensure(spec, deployment, log).await?;
        let dir = self.dir(&spec.team_id, &spec.installation_id);
        let env = match &spec.upstream {
            Upstream::Stdio { env, .. } => env.clone(),
            _ => Default::default(),
        };
        let launch = InstanceSpec {
            upstream: Upstream::Stdio { command: deployed.command, args: deployed.args, env },
            ..spec.clone()
        };
        Ok((launch, dir))
    }

    /// The finished deployment of `deployment.commit_sha`, deploying it when there is none.
    async fn ensure(
        &self,
        spec: &InstanceSpec,
        deployment: &Deployment,
        log: &(dyn Fn(&str, &str) + Send + Sync),
    ) -> Result<Deployed, DeployError> {
        let lock = self.locks.lock().entry(spec.installation_id.clone()).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        let dir = self.dir(&spec.team_id, &spec.installation_id);
        if let Some(done) = read_marker(&dir).filter(|d| d.commit_sha == deployment.commit_sha) {
            return Ok(done);
        }
        info!(installation_id = %spec.installation_id, repository = %deployment.repository, commit = %deployment.commit_sha, "deploying from GitHub");
        log("info", &format!("Deploying {}@{} from GitHub", deployment.repository, short(&deployment.commit_sha)));
        let outcome = self.deploy(spec, deployment, &dir, log).await;
        match &outcome {
            Ok(done) => {
                log("info", &format!("Deployment ready: {} {}", done.command, done.args.join(" ")));
            }
            Err(err) => {
                warn!(installation_id = %spec.installation_id, step = err.step.as_str(), reason = %err.reason, "GitHub deployment failed");
                log("error", &err.to_string());
            }
        }
        outcome
    }

    /// Deploy `deployment` into `dir`: built in a staging directory next to it, then put in its place whole.
    async fn deploy(
        &self,
        spec: &InstanceSpec,
        deployment: &Deployment,
        dir: &Path,
        log: &(dyn Fn(&str, &str) + Send + Sync),
    ) -> Result<Deployed, DeployError> {
        let parent =
            dir.parent().ok_or_else(|| DeployError::at(Step::Extract, "deployment directory has no parent"))?;
        std::fs::create_dir_all(parent)
            .map_err(|e| DeployError::at(Step::Extract, format!("{}: {e}", parent.display())))?;
        let staging = parent.join(format!(".{}.{}", safe(&spec.installation_id.0), uuid::Uuid::new_v4().simple()));
        let deployed = match self.build_in(spec, deployment, &staging, dir, log).await {
            Ok(deployed) => deployed,
            Err(err) => {
                let _ = std::fs::remove_dir_all(&staging);
                return Err(err);
            }
        };
        put_in_place(&deployed, &staging, dir)?;
        Ok(deployed)
    }

    /// The tarball downloaded with the installation's token, extracted, installed and built in `staging`; its entry
    /// point resolved there and rebased onto `dir`, where it will run.
    async fn build_in(
        &self,
        spec: &InstanceSpec,
        deployment: &Deployment,
        staging: &Path,
        dir: &Path,
        log: &(dyn Fn(&str, &str) + Send + Sync),
    ) -> Result<Deployed, DeployError> {
        let token = self.settings.tokens.token(&spec.installation_id).await.map_err(|no| DeployError {
            step: Step::Token,
            reason: no.reason,
            transient: no.transient,
        })?;
        let tarball = fetch::download(&self.settings, deployment, &token).await?;
        fetch::extract(&tarball, staging)?;
        let runtime = deployment.runtime.or_else(|| build::detect(staging)).ok_or_else(|| {
            DeployError::at(Step::Install, "neither package.json nor pyproject.toml/requirements.txt found")
        })?;
        build::install(&self.settings.search, runtime, staging, log).await?;
        build::build(&self.settings.search, runtime, staging, log).await?;
        // The entry is resolved in the staging directory and then rebased onto the final one.
        let (command, args) = build::entry(&self.settings.search, runtime, staging)?;
        let rebase = |s: String| match s.strip_prefix(&*staging.to_string_lossy()) {
            Some(rest) => format!("{}{rest}", dir.display()),
            None => s,
        };
        Ok(Deployed {
            commit_sha: deployment.commit_sha.clone(),
            runtime,
            command: rebase(command),
            args: args.into_iter().map(rebase).collect(),
        })
    }

    /// Uninstall semantics (BP §6.1.3): the installation's deployment directory goes; the next start deploys
    /// afresh.
    pub async fn remove(&self, team: &TeamId, installation: &InstallationId) {
        let lock = self.locks.lock().entry(installation.clone()).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        let dir = self.dir(team, installation);
        if dir.exists() {
            if let Err(err) = std::fs::remove_dir_all(&dir) {
                warn!(installation_id = %installation, error = %err, "removing a deployment directory failed");
            } else {
                info!(installation_id = %installation, "deployment directory removed");
            }
        }
    }
}

/// A deployment built in `staging` put in `dir`'s place, with its marker: the old deployment is replaced whole.
fn put_in_place(deployed: &Deployed, staging: &Path, dir: &Path) -> Result<(), DeployError> {
    let marker = serde_json::to_vec_pretty(deployed).map_err(|e| DeployError::at(Step::Entry, e.to_string()))?;
    std::fs::write(staging.join(MARKER), marker).map_err(|e| DeployError::at(Step::Entry, e.to_string()))?;
    // Replace the old deployment whole.
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| DeployError::at(Step::Extract, format!("{}: {e}", dir.display())))?;
    }
    // A venv survives the move: its interpreter finds `pyvenv.cfg` next to itself, and the entry runs that
    // interpreter by its final path (console-script shebangs, which would name the staging path, are not used).
    std::fs::rename(staging, dir).map_err(|e| DeployError::at(Step::Extract, format!("{}: {e}", dir.display())))
}

fn read_marker(dir: &Path) -> Option<Deployed> {
    let text = std::fs::read(dir.join(MARKER)).ok()?;
    serde_json::from_slice(&text).ok()
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// A path component from an id: ASCII letters, digits, `-` and `_` only.
fn safe(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}
