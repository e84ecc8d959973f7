//! Managed mode's settings: the backend, this satellite's name and cadences, read from the environment.

use super::*;

#[derive(Debug, Clone)]
pub struct ManagedSettings {
    pub backend_url: Url,
    pub satellite_name: String,
    pub registration_token: Option<SecretString>,
    /// Where `backend.key.json` lives (`./persistent_data`, OQ-48).
    pub persistent_dir: PathBuf,
    /// `DEPLOYSTACK_SATELLITE_URL` as set, `""` when unset (sent once in the first heartbeat, BP §3.2).
    pub satellite_url: String,
    /// Idle ("slow") poll interval.
    pub poll_idle: Duration,
    pub heartbeat_interval: Duration,
    pub event_interval: Duration,
    pub event_flush_timeout: Duration,
    /// Most events the outbox keeps while the backend is away.
    pub outbox_max: i64,
    /// The most the outbox may take on disk while the backend is away (default 512 MiB).
    pub outbox_max_bytes: u64,
    /// How long a replica's claim on a batch of events lasts (`SATELLITE_EVENT_LEASE_MS`, default 60 s): a
    /// replica that dies mid-batch delays that batch this long. Keep it above the backend's 10 s request
    /// timeout, or a slow batch may be sent twice.
    pub event_lease: Duration,
    /// How long a batch of events waits for the backend's answer (`SATELLITE_EVENT_TIMEOUT_MS`, default 10 s); a
    /// timeout doubles it for the next batches (at most 30 s) and an accepted batch halves it back.
    pub event_timeout: Duration,
    /// How long an introspected token is trusted without asking again (`SATELLITE_TOKEN_CACHE_SECONDS`, default 300).
    pub token_cache_ttl: Duration,
    /// How long past its last successful check a token keeps working while the backend cannot be asked
    /// (`SATELLITE_TOKEN_STALE_SECONDS`, default 3600, 0 never).
    pub token_stale_for: Duration,
    /// Audiences accepted in introspection answers besides the built-in ones (`DEPLOYSTACK_TOKEN_AUDIENCES`,
    /// comma-separated).
    pub extra_audiences: Vec<String>,
    /// Where GitHub repository tarballs come from: `{base}/{owner}/{repo}/tarball/{sha}`
    /// (`DEPLOYSTACK_GITHUB_TARBALL_URL`, default the GitHub API).
    pub github_tarball_base: Url,
    /// Where GitHub-deployed servers are extracted, one directory per installation (`DEPLOYSTACK_DEPLOYMENTS_DIR`,
    /// default `<data dir>/deployments`; `None` until the data dir is known).
    pub deployments_dir: Option<PathBuf>,
}

/// GitHub's tarball endpoint: `{base}/{owner}/{repo}/tarball/{sha}`.
pub const GITHUB_TARBALL_BASE: &str = "https://api.github.com/repos";

/// The logical resource identifier DeployStack's authorization server puts in `aud` (BP §10, OQ-14).
pub const BACKEND_AUDIENCE: &str = "deploystack:mcp:satellite";

impl ManagedSettings {
    /// Every audience an introspected token may carry (BP §10): the backend's identifier, `{SAT_URL}/mcp`,
    /// `{SAT_URL}`, and what the operator adds; compared without a trailing `/`.
    pub fn accepted_audiences(&self, public_url: &str) -> Vec<String> {
        let base = public_url.trim_end_matches('/');
        let mut audiences = vec![BACKEND_AUDIENCE.to_owned(), format!("{base}/mcp"), base.to_owned()];
        audiences.extend(self.extra_audiences.iter().map(|a| a.trim_end_matches('/').to_owned()));
        audiences
    }
}

/// Read in a fixed order, so of several bad settings the same one is reported first.
pub(super) fn managed(env: &Env, url: &str) -> Result<ManagedSettings, ConfigError> {
    let backend_url = parse_http_url(url).ok_or_else(|| not_http_url("backend.url", Some(env::BACKEND_URL), url))?;
    let name = satellite_name(env)?;
    Ok(ManagedSettings {
        backend_url,
        satellite_name: name.to_owned(),
        registration_token: env::get(env, env::REGISTRATION_TOKEN).map(|t| SecretString::from(t.to_owned())),
        persistent_dir: env::get(env, env::PERSISTENT_DATA_DIR)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("./persistent_data")),
        satellite_url: env::get(env, env::PUBLIC_URL).map(|u| u.trim_end_matches('/').to_owned()).unwrap_or_default(),
        poll_idle: seconds(env, "backend.polling_interval", env::BACKEND_POLLING_INTERVAL, None, 60)?,
        heartbeat_interval: millis(env, "backend.heartbeat_interval_ms", env::HEARTBEAT_INTERVAL_MS, None, 30_000)?,
        event_interval: millis(env, "backend.event_batch_interval_ms", env::EVENT_BATCH_INTERVAL_MS, None, 3_000)?,
        event_flush_timeout: millis(env, "backend.event_flush_timeout_ms", env::EVENT_FLUSH_TIMEOUT_MS, None, 5_000)?,
        outbox_max: number(env, "backend.event_outbox_max", env::EVENT_OUTBOX_MAX, None, 100_000i64, false)?,
        outbox_max_bytes: number(env, "backend.event_outbox_max_mib", env::EVENT_OUTBOX_MAX_MIB, None, 512u64, false)?
            .saturating_mul(1024 * 1024),
        event_lease: millis(env, "backend.event_lease_ms", env::EVENT_LEASE_MS, None, 60_000)?,
        event_timeout: millis(env, "backend.event_timeout_ms", env::EVENT_TIMEOUT_MS, None, 10_000)?,
        token_cache_ttl: seconds(env, "backend.token_cache_seconds", env::TOKEN_CACHE_SECONDS, None, 300)?,
        token_stale_for: seconds(env, "backend.token_stale_seconds", env::TOKEN_STALE_SECONDS, None, 3_600)?,
        extra_audiences: env::get(env, env::TOKEN_AUDIENCES)
            .map(|list| list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default(),
        github_tarball_base: github_tarball_base(env)?,
        deployments_dir: env::get(env, env::DEPLOYMENTS_DIR).map(PathBuf::from),
    })
}

/// The satellite's name: required, 10-32 characters of a-z, 0-9, `_` and `-`.
fn satellite_name(env: &Env) -> Result<&str, ConfigError> {
    let name = env::get(env, env::SATELLITE_NAME).ok_or_else(|| {
        ConfigError::new("backend.satellite_name", Some(env::SATELLITE_NAME), "required in managed mode")
    })?;
    let valid = (10..=32).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !valid {
        return Err(ConfigError::new(
            "backend.satellite_name",
            Some(env::SATELLITE_NAME),
            "must be 10-32 characters of a-z, 0-9, '_' and '-'",
        ));
    }
    Ok(name)
}

/// Where GitHub tarballs come from: the variable without a trailing `/`, else [`GITHUB_TARBALL_BASE`].
fn github_tarball_base(env: &Env) -> Result<Url, ConfigError> {
    let (key, var) = ("backend.github_tarball_url", env::GITHUB_TARBALL_URL);
    match env::get(env, var) {
        Some(raw) => parse_http_url(raw.trim_end_matches('/')).ok_or_else(|| not_http_url(key, Some(var), raw)),
        None => Url::parse(GITHUB_TARBALL_BASE).map_err(|err| ConfigError::new(key, Some(var), err.to_string())),
    }
}
