//! DNS-rebinding protection (MCP transports: "Servers MUST validate the Origin header"): a request naming a
//! `Host` the satellite does not answer to, or sent by a browser from an `Origin` it does not trust, is refused
//! with 403 before any route runs. Defaults come from the bind address and the public URL (`config`).

use std::collections::HashSet;

use warp::http::{HeaderMap, HeaderValue};
use warp::Filter;

/// Which hosts and origins are accepted; `None` accepts any.
#[derive(Debug, Clone, Default)]
pub struct HostGuard {
    hosts: Option<HashSet<String>>,
    origins: Option<HashSet<String>>,
}

/// Why a request was refused.
#[derive(Debug)]
pub struct Refused(pub String);

impl warp::reject::Reject for Refused {}

impl HostGuard {
    pub fn new(hosts: Option<Vec<String>>, origins: Option<Vec<String>>) -> Self {
        let normal =
            |items: Vec<String>| items.into_iter().map(|i| i.trim_end_matches('/').to_ascii_lowercase()).collect();
        Self { hosts: hosts.map(normal), origins: origins.map(normal) }
    }

    /// `Err(reason)` when the request must be refused.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), String> {
        self.check_values(text(headers.get("host")), text(headers.get("origin")))
    }

    /// `check` on the two headers it reads: `None` for a header the request does not have.
    fn check_values(&self, host: Option<&str>, origin: Option<&str>) -> Result<(), String> {
        if let Some(hosts) = &self.hosts {
            let host = host.unwrap_or("");
            let name = host_name(host);
            if !hosts.contains(&name) {
                return Err(format!("Invalid Host: {}", printable(host)));
            }
        }
        if let (Some(origins), Some(origin)) = (&self.origins, origin) {
            let origin = origin.trim_end_matches('/').to_ascii_lowercase();
            if !(origins.contains(&origin) || is_localhost_origin(&origin)) {
                return Err(format!("Invalid Origin: {}", printable(&origin)));
            }
        }
        Ok(())
    }

    /// A filter that passes or rejects with `Refused`.
    pub fn filter(self) -> impl Filter<Extract = (), Error = warp::Rejection> + Clone {
        // One pointer: warp clones the filter, and so this guard's sets, for every request. The two headers
        // are read alone: copying the whole header map cost every request more than the check itself.
        let guard = std::sync::Arc::new(self);
        let value = |name| warp::header::value(name).map(Some).or(warp::any().map(|| None)).unify();
        // HTTP/2 has no `Host` header: its `:authority` (the request URI's) is the host then (RFC 9113 §8.3.1).
        // Read only when the header is missing, so an HTTP/1.1 request costs no more than before.
        let authority = warp::host::optional().map(|authority: Option<warp::host::Authority>| {
            authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        let host = warp::header::value("host").map(Some).or(authority).unify();
        host.and(value("origin"))
            .and_then(move |host: Option<HeaderValue>, origin: Option<HeaderValue>| {
                let verdict = guard.check_values(text(host.as_ref()), text(origin.as_ref()));
                async move { verdict.map_err(|reason| warp::reject::custom(Refused(reason))) }
            })
            .untuple_one()
    }
}

/// A header's text; one that is not visible ASCII reads as empty (and so matches no allowed name).
fn text(value: Option<&HeaderValue>) -> Option<&str> {
    value.map(|v| v.to_str().unwrap_or(""))
}

/// The host part of a `Host` header, lowercase, without port or IPv6 brackets.
fn host_name(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_owned();
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name.to_owned(),
        _ => host,
    }
}

/// A page served from this machine (any port) may always call the satellite: local tools such as the MCP
/// Inspector run there, and a rebinding attack comes from a foreign name.
fn is_localhost_origin(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else { return false };
    matches!(host_name(rest).as_str(), "localhost" | "127.0.0.1" | "::1")
}

fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(warp::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        map
    }

    #[test]
    fn rebinding_hosts_and_foreign_origins_are_refused_on_loopback() {
        let guard = HostGuard::new(
            Some(vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]),
            Some(vec!["http://localhost:3001".into()]),
        );
        assert!(guard.check(&headers(&[("host", "localhost:3001")])).is_ok());
        assert!(guard.check(&headers(&[("host", "127.0.0.1:3001")])).is_ok());
        assert!(guard.check(&headers(&[("host", "[::1]:3001")])).is_ok());
        assert!(guard.check(&headers(&[("host", "evil.example.com")])).is_err());
        assert!(guard.check(&headers(&[("host", "localhost.evil.example.com:3001")])).is_err());
        assert!(guard.check(&headers(&[])).is_err(), "no Host is not this satellite");
        let origin = |o: &str| headers(&[("host", "localhost:3001"), ("origin", o)]);
        assert!(guard.check(&origin("http://evil.example.com")).is_err());
        assert!(guard.check(&origin("http://localhost:6274")).is_ok(), "local tools on any port");
        assert!(guard.check(&origin("http://127.0.0.1:5173")).is_ok());
    }

    #[test]
    fn open_settings_accept_anything() {
        let guard = HostGuard::new(None, None);
        assert!(guard.check(&headers(&[("host", "evil.example.com"), ("origin", "http://evil.example.com")])).is_ok());
        let public = HostGuard::new(None, Some(vec!["https://sat.example.com".into()]));
        assert!(public.check(&headers(&[("host", "sat.example.com"), ("origin", "https://sat.example.com")])).is_ok());
        assert!(public
            .check(&headers(&[("host", "sat.example.com"), ("origin", "https://evil.example.com")]))
            .is_err());
        assert!(public.check(&headers(&[("host", "sat.example.com")])).is_ok(), "no Origin: not a browser");
    }
}
