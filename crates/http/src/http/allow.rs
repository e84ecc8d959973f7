//! What a 405 names in its `Allow` header (RFC 9110 §15.5.6): while a request is routed, each route whose path it
//! matched but whose method it did not notes the methods that route takes, and a 405 names them all.
//!
//! Noted rather than listed per path: the routes are the only list, so a route added or changed cannot leave a
//! table behind. Every route matches its path before its method, so only routes of the request's path note.

use std::cell::Cell;
use std::future::Future;

use warp::http::{HeaderValue, Method};
use warp::{Filter, Rejection};

/// A set of methods, in the order an `Allow` header names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Methods(u8);

/// The methods a set may hold, each with its bit (its index).
const NAMES: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

impl Methods {
    pub const GET: Methods = Methods(1);
    pub const POST: Methods = Methods(1 << 2);
    pub const PUT: Methods = Methods(1 << 3);
    pub const DELETE: Methods = Methods(1 << 5);
    pub const OPTIONS: Methods = Methods(1 << 6);

    pub const fn and(self, other: Methods) -> Methods {
        Methods(self.0 | other.0)
    }

    pub fn contains(self, other: Methods) -> bool {
        self.0 & other.0 == other.0
    }

    /// The `Allow` value: the names, comma-separated (empty for none, which RFC 9110 §10.2.1 allows).
    pub fn header(self) -> HeaderValue {
        let names: Vec<&str> =
            NAMES.iter().enumerate().filter(|(bit, _)| self.0 & (1 << bit) != 0).map(|(_, name)| *name).collect();
        HeaderValue::from_str(&names.join(", ")).unwrap_or(HeaderValue::from_static(""))
    }
}

/// One request's routing: whether it asks OPTIONS, and what the routes of its path take.
struct Routing {
    options: bool,
    noted: Cell<Methods>,
}

tokio::task_local! {
    static ROUTING: Routing;
}

/// Route a request of `method` (the future `routing`), noting what the routes of its path take.
pub async fn noting<F: Future>(method: &Method, routing: F) -> F::Output {
    ROUTING.scope(Routing { options: method == Method::OPTIONS, noted: Cell::new(Methods::default()) }, routing).await
}

/// What the routes of the request's path take (nothing outside `noting`).
pub fn noted() -> Methods {
    ROUTING.try_with(|routing| routing.noted.get()).unwrap_or_default()
}

/// Whether the request routed asks OPTIONS.
pub fn asks_options() -> bool {
    ROUTING.try_with(|routing| routing.options).unwrap_or(false)
}

fn note(methods: Methods) {
    let _ = ROUTING.try_with(|routing| routing.noted.set(routing.noted.get().and(methods)));
}

/// `filter` (one of warp's method filters), which takes the methods `takes`: a request of another method is
/// refused as warp refuses it (405, unless another route takes it), and `takes` noted.
fn taking<F>(filter: F, takes: Methods) -> impl Filter<Extract = (), Error = Rejection> + Clone
where
    F: Filter<Extract = (), Error = Rejection> + Clone,
{
    filter.or_else(move |rejection: Rejection| async move {
        note(takes);
        Err::<(), Rejection>(rejection)
    })
}

/// What the routes open to pages of other origins (the MCP, OAuth and legacy routes) take besides their own method:
/// their CORS preflight, OPTIONS, is served.
const CORS: Methods = Methods::OPTIONS;

pub fn get() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::get(), Methods::GET)
}

pub fn post() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::post(), Methods::POST)
}

pub fn put() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::put(), Methods::PUT)
}

pub fn delete() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::delete(), Methods::DELETE)
}

/// GET on a route open to other origins.
pub fn cors_get() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::get(), Methods::GET.and(CORS))
}

/// POST on a route open to other origins.
pub fn cors_post() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::post(), Methods::POST.and(CORS))
}

/// DELETE on a route open to other origins.
pub fn cors_delete() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    taking(warp::delete(), Methods::DELETE.and(CORS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_names_the_methods_in_order() {
        let mcp = Methods::DELETE.and(Methods::POST).and(Methods::GET).and(Methods::OPTIONS);
        assert_eq!(mcp.header(), "GET, POST, DELETE, OPTIONS");
        assert_eq!(Methods::default().header(), "");
        assert!(mcp.contains(Methods::OPTIONS.and(Methods::GET)));
        assert!(!Methods::GET.contains(Methods::POST));
    }

    /// Routes of the request's path note what they take; routes of another path note nothing.
    #[tokio::test]
    async fn a_refused_method_notes_what_the_routes_of_its_path_take() {
        use tower::ServiceExt;
        let routes = warp::path!("a").and(get()).map(|| "a").or(warp::path!("a").and(cors_post()).map(|| "a"));
        let routes = routes.or(warp::path!("b").and(put()).map(|| "b")).or(warp::path!("a").and(delete()).map(|| "a"));
        let service = warp::service(routes.recover(|_| async { Ok::<_, std::convert::Infallible>("refused") }));
        let ask = |method: Method| {
            let request = warp::http::Request::builder().method(method.clone()).uri("/a");
            let request = request.body(http_body_util::Empty::<bytes::Bytes>::new()).expect("a request");
            let service = service.clone();
            async move { noting(&method, async { (service.oneshot(request).await, noted()) }).await }
        };
        let (answer, noted) = ask(Method::PATCH).await;
        assert!(answer.is_ok());
        assert_eq!(noted.header(), "GET, POST, DELETE, OPTIONS");
        let (answer, _) = ask(Method::GET).await;
        assert!(answer.is_ok_and(|answer| answer.status().is_success()), "a method a route takes is served");
    }
}
