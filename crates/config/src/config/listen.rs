//! Where the satellite listens and which HTTP requests it takes: the address, the public URL, the hosts and
//! origins requests may name, and the limits on requests, connections, streams and their timeouts.

use std::net::IpAddr;
use std::time::Duration;

use url::Url;

use super::env::{self, Env};
use super::file::RawSatellite;
use super::values::{count, seconds};
use super::{not_http_url, parse_http_url, ConfigError, Flags, DEFAULT_HOST, DEFAULT_PORT};

/// The address to bind: each part from the flag, else the environment, else the file, else the default.
pub(super) fn address(env: &Env, flags: &Flags, s: &RawSatellite) -> Result<(IpAddr, u16), ConfigError> {
    let host = match (flags.host, env::get(env, env::HOST), &s.host) {
        (Some(host), _, _) => host,
        (None, Some(v), _) => parse_ip(v, "satellite.host", Some(env::HOST))?,
        (None, None, Some(v)) => parse_ip(v, "satellite.host", Some(env::HOST))?,
        (None, None, None) => DEFAULT_HOST,
    };
    let port = match (flags.port, env::get(env, env::PORT)) {
        (Some(port), _) => port,
        (None, Some(v)) => v
            .parse::<u16>()
            .map_err(|_| ConfigError::new("satellite.port", Some(env::PORT), format!("{v:?} is not a port number")))?,
        (None, None) => s.port.unwrap_or(DEFAULT_PORT),
    };
    Ok((host, port))
}

fn parse_ip(value: &str, key: &str, var: Option<&'static str>) -> Result<IpAddr, ConfigError> {
    value.parse().map_err(|_| ConfigError::new(key, var, format!("{value:?} is not an ip address")))
}

/// The public URL and the hosts and origins requests may name (`None`: any).
pub(super) struct Access {
    pub public_url: String,
    pub allowed_hosts: Option<Vec<String>>,
    pub allowed_origins: Option<Vec<String>>,
}

/// The public URL, then the allowed hosts and origins, whose defaults follow from it and from the bound `host`.
pub(super) fn access(env: &Env, s: &RawSatellite, host: IpAddr, port: u16) -> Result<Access, ConfigError> {
    let public_url = public_url(env, s, port)?;
    let public = Url::parse(&public_url).ok();
    let public_host =
        public.as_ref().and_then(|u| u.host_str()).map(|h| h.trim_matches(['[', ']']).to_ascii_lowercase());
    let allowed_hosts = match list(env, env::ALLOWED_HOSTS, &s.allowed_hosts) {
        Some(hosts) if hosts.iter().any(|h| h == "*") => None,
        Some(hosts) => Some(hosts),
        None if host.is_loopback() => {
            let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
            hosts.extend(public_host.clone());
            Some(hosts)
        }
        None => None,
    };
    let allowed_origins = match list(env, env::ALLOWED_ORIGINS, &s.allowed_origins) {
        Some(origins) if origins.iter().any(|o| o == "*") => None,
        Some(origins) => Some(origins),
        None => Some(public.map(|u| u.origin().ascii_serialization()).into_iter().collect()),
    };
    Ok(Access { public_url, allowed_hosts, allowed_origins })
}

/// An http(s) URL without its trailing `/`; unset, `http://localhost:{port}`.
fn public_url(env: &Env, s: &RawSatellite, port: u16) -> Result<String, ConfigError> {
    match env::get(env, env::PUBLIC_URL).map(str::to_owned).or_else(|| s.public_url.clone()) {
        Some(url) => parse_http_url(&url)
            .map(|_| url.trim_end_matches('/').to_owned())
            .ok_or_else(|| not_http_url("satellite.public_url", Some(env::PUBLIC_URL), &url)),
        None => Ok(format!("http://localhost:{port}")),
    }
}

/// Lower-case names from a comma-separated variable, else the file's list; `None` when empty.
fn list(env: &Env, var: &'static str, file: &Option<Vec<String>>) -> Option<Vec<String>> {
    let items: Vec<String> = match env::get(env, var) {
        Some(v) => v.split(',').map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()).collect(),
        None => file.iter().flatten().map(|s| s.trim().to_ascii_lowercase()).collect(),
    };
    (!items.is_empty()).then_some(items)
}

/// How much HTTP the satellite takes at once, and how long one request and one write may take.
pub(super) struct HttpLimits {
    pub max_concurrent_requests: usize,
    pub max_concurrent_requests_per_caller: usize,
    pub max_connections: usize,
    pub max_streams_per_caller: usize,
    pub http_timeout: Duration,
    pub write_timeout: Duration,
    pub body_read_timeout: Duration,
}

/// A caller's share defaults to [`a_callers_share`] of the whole.
pub(super) fn http_limits(env: &Env, s: &RawSatellite) -> Result<HttpLimits, ConfigError> {
    let max_concurrent_requests =
        count(env, "satellite.max_concurrent_requests", env::MAX_CONCURRENT_REQUESTS, s.max_concurrent_requests)?
            .unwrap_or(1024);
    let max_concurrent_requests_per_caller = count(
        env,
        "satellite.max_concurrent_requests_per_caller",
        env::MAX_CONCURRENT_REQUESTS_PER_CALLER,
        s.max_concurrent_requests_per_caller,
    )?
    .unwrap_or_else(|| a_callers_share(max_concurrent_requests));
    let max_connections = count(env, "satellite.max_connections", env::MAX_CONNECTIONS, s.max_connections)?
        .unwrap_or_else(default_max_connections);
    let max_streams_per_caller =
        count(env, "satellite.max_streams_per_caller", env::MAX_STREAMS_PER_CALLER, s.max_streams_per_caller)?
            .unwrap_or_else(|| a_callers_share(max_connections));
    let http_timeout = seconds(env, "satellite.http_timeout_seconds", env::HTTP_TIMEOUT, s.http_timeout_seconds, 120)?;
    let write_timeout =
        seconds(env, "satellite.write_timeout_seconds", env::WRITE_TIMEOUT, s.write_timeout_seconds, 30)?;
    // Three head timeouts: a 4 MB body (the most taken) still arrives whole at about 1 Mbit/s.
    let body_read_timeout =
        seconds(env, "satellite.body_read_timeout_seconds", env::BODY_READ_TIMEOUT, s.body_read_timeout_seconds, 30)?;
    Ok(HttpLimits {
        max_concurrent_requests,
        max_concurrent_requests_per_caller,
        max_connections,
        max_streams_per_caller,
        http_timeout,
        write_timeout,
        body_read_timeout,
    })
}

/// An eighth of the whole (at least one), so no one caller can hold it all.
fn a_callers_share(whole: usize) -> usize {
    (whole / 8).max(1)
}

/// Half the process's open-file limit (the other half stays for server processes, the database and the config
/// file), so strangers holding connections can never take the descriptors the satellite itself needs.
fn default_max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map(|(soft, _)| soft);
    match soft {
        Ok(soft) if soft != nix::sys::resource::RLIM_INFINITY => (soft / 2).clamp(64, 100_000) as usize,
        _ => 10_000,
    }
}
