//! The satellite's outbound HTTP clients: one for remote MCP servers (following redirects only within the server's
//! origin), one for downloads.

use std::time::Duration;

/// Sent to remote MCP servers (SB §12.2).
pub const REMOTE_USER_AGENT: &str = "Mozilla/5.0 (compatible; DeployStack-Satellite/1.0; +https://deploystack.io)";

/// The shared reqwest client for remote MCP servers: pooled, with the satellite's user agent, following
/// redirects only within the server's origin (`same_origin_redirects`).
pub fn remote_http_client() -> Result<reqwest::Client, reqwest::Error> {
    outbound_http().redirect(reqwest::redirect::Policy::custom(same_origin_redirects)).build()
}

/// What every outbound client of the satellite shares: its user agent, connect timeout and pool.
fn outbound_http() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(REMOTE_USER_AGENT)
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(90))
}

/// The client for downloads (GitHub tarballs): reqwest's own redirect policy, since GitHub answers a download
/// with a redirect to another origin (`codeload.github.com`); reqwest drops the `Authorization` header there, and
/// the request carries no other credential.
pub fn download_http_client() -> Result<reqwest::Client, reqwest::Error> {
    outbound_http().build()
}

/// Most redirects followed in one request.
const MAX_REDIRECTS: usize = 10;

/// A redirect is followed only within the origin the server's URL names (or from `http` to `https` on the same
/// host): a request carries the server's headers (`X-API-Key`, a bearer token), which reqwest strips on another
/// host only when they are the standard credential headers. A server pointing elsewhere fails the request with
/// a reason that names where it points (not its query, where a key may be).
fn same_origin_redirects(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let Some(first) = attempt.previous().first() else { return attempt.stop() };
    let next = attempt.url();
    let same_origin = next.origin() == first.origin();
    let upgraded = first.scheme() == "http"
        && next.scheme() == "https"
        && next.host_str() == first.host_str()
        && next.port().is_none()
        && first.port().is_none();
    if attempt.previous().len() > MAX_REDIRECTS {
        attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
    } else if same_origin || upgraded {
        attempt.follow()
    } else {
        let elsewhere = next.origin().ascii_serialization();
        attempt.error(format!(
            "the server redirected to another origin ({elsewhere}), which the satellite does not follow with the \
             server's headers; configure that URL if it is the server's"
        ))
    }
}
