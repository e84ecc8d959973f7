//! The admin page (`/admin`, `/admin/app.js`, `/admin/app.css`): static files compiled in from `assets/admin/`,
//! served with a strict content security policy. The page reads `/api/analytics/...` with the admin's own token.

use warp::http::header;
use warp::reply::Response;
use warp::{Filter, Reply};

const PAGE_HTML: &str = include_str!("../../../../assets/admin/index.html");
const PAGE_JS: &str = include_str!("../../../../assets/admin/app.js");
const PAGE_CSS: &str = include_str!("../../../../assets/admin/app.css");

/// The page and its two files.
pub(super) fn routes() -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone {
    let page = warp::path("admin")
        .and(warp::path::end())
        .and(super::allow::get())
        .map(|| asset(PAGE_HTML, "text/html; charset=utf-8"));
    let js = warp::path!("admin" / "app.js")
        .and(super::allow::get())
        .map(|| asset(PAGE_JS, "text/javascript; charset=utf-8"));
    let css =
        warp::path!("admin" / "app.css").and(super::allow::get()).map(|| asset(PAGE_CSS, "text/css; charset=utf-8"));
    page.or(js).unify().or(css).unify()
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = warp::reply::with_header(body, header::CONTENT_TYPE, content_type).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("no-referrer"));
    response
}
