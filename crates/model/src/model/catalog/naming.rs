//! The two naming schemes that expose an instance's tools and resources through the hierarchical router:
//! `server:tool` paths and `server|uri` (or `satellite://server/…`) resource URIs.

use serde_json::Value;

/// Separator of the external tool path `{server_slug}:{tool_name}` (split at the first one).
pub const TOOL_PATH_SEPARATOR: char = ':';
/// Separator of namespaced resource URIs `{server_slug}|{original_uri}` (split at the first one).
pub const URI_SEPARATOR: char = '|';

/// `{server_slug}:{tool_name}`.
pub fn tool_path(server_slug: &str, tool_name: &str) -> String {
    format!("{server_slug}{TOOL_PATH_SEPARATOR}{tool_name}")
}

/// Split a tool path at the first `:`; both parts must be non-empty.
pub fn parse_tool_path(path: &str) -> Option<(&str, &str)> {
    let (slug, name) = path.split_once(TOOL_PATH_SEPARATOR)?;
    (!slug.is_empty() && !name.is_empty()).then_some((slug, name))
}

/// `{server_slug}|{original_uri}`; also used for templates.
pub fn namespaced_uri(server_slug: &str, uri: &str) -> String {
    format!("{server_slug}{URI_SEPARATOR}{uri}")
}

/// The public URI of a resource whose original URI several of a caller's servers share: a valid URI that names
/// the server, `satellite://{slug}/{percent-encoded original}`. A unique original URI is served as itself.
pub fn shared_uri(server_slug: &str, uri: &str) -> String {
    let encoded = percent_encoding::utf8_percent_encode(uri, percent_encoding::NON_ALPHANUMERIC);
    format!("{SHARED_URI_PREFIX}{server_slug}/{encoded}")
}

const SHARED_URI_PREFIX: &str = "satellite://";

/// The server slug and original URI of a `shared_uri`.
pub fn parse_shared_uri(value: &str) -> Option<(&str, String)> {
    let (slug, encoded) = value.strip_prefix(SHARED_URI_PREFIX)?.split_once('/')?;
    let original = percent_encoding::percent_decode_str(encoded).decode_utf8().ok()?.into_owned();
    (!slug.is_empty() && !original.is_empty()).then_some((slug, original))
}

/// Split a namespaced URI at the first `|`; the slug must be non-empty.
pub fn parse_namespaced_uri(value: &str) -> Option<(&str, &str)> {
    let (slug, uri) = value.split_once(URI_SEPARATOR)?;
    (!slug.is_empty() && !uri.is_empty()).then_some((slug, uri))
}

/// Rewrite a string `_meta.ui.resourceUri` to its namespaced form, unless it already is (SB §12.6, OQ-37).
pub fn namespace_ui_meta(meta: &Value, server_slug: &str) -> Value {
    let mut meta = meta.clone();
    let prefix = format!("{server_slug}{URI_SEPARATOR}");
    if let Some(uri) = meta.pointer_mut("/ui/resourceUri") {
        if let Some(s) = uri.as_str() {
            if !s.starts_with(&prefix) {
                *uri = Value::String(format!("{prefix}{s}"));
            }
        }
    }
    meta
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tool_paths_split_at_the_first_colon() {
        assert_eq!(tool_path("github", "create_issue"), "github:create_issue");
        assert_eq!(parse_tool_path("a:b:c"), Some(("a", "b:c")));
        assert_eq!(parse_tool_path(":b"), None);
        assert_eq!(parse_tool_path("a:"), None);
        assert_eq!(parse_tool_path("ab"), None);
    }

    #[test]
    fn uris_split_at_the_first_pipe() {
        let ns = namespaced_uri("excalidraw", "ui://excalidraw/app.html");
        assert_eq!(ns, "excalidraw|ui://excalidraw/app.html");
        assert_eq!(parse_namespaced_uri(&ns), Some(("excalidraw", "ui://excalidraw/app.html")));
        assert_eq!(parse_namespaced_uri("x|a|b"), Some(("x", "a|b")));
        assert_eq!(parse_namespaced_uri("|a"), None);
    }

    #[test]
    fn ui_meta_is_prefixed_once() {
        let meta = json!({"ui": {"resourceUri": "ui://demo/app.html"}, "other": 1});
        let once = namespace_ui_meta(&meta, "demo");
        assert_eq!(once["ui"]["resourceUri"], "demo|ui://demo/app.html");
        assert_eq!(namespace_ui_meta(&once, "demo"), once);
        assert_eq!(namespace_ui_meta(&json!({"ui": {"resourceUri": 3}}), "demo")["ui"]["resourceUri"], 3);
    }
    #[test]
    fn shared_uris_are_valid_and_round_trip() {
        for original in ["demo://readme", "file:///tmp/a b|c?x=1#y", "ui://demo/app.html"] {
            let public = shared_uri("my-server", original);
            assert!(url::Url::parse(&public).is_ok(), "{public}");
            assert_eq!(parse_shared_uri(&public), Some(("my-server", original.to_owned())));
        }
        assert_eq!(parse_shared_uri("demo://readme"), None);
        assert_eq!(parse_shared_uri("satellite://slug/"), None);
    }
}
