//! Masking of secret values for logs, listings and `check-config` (SB §22).

use std::collections::BTreeMap;

use url::Url;

use crate::model::SecretNames;

/// What the satellite keeps and reports of a session id (events, activity, logs): a stable reference that pairs
/// a session's connect and disconnect, from which the id itself (a credential-like handle) cannot be recovered.
pub fn session_reference(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("session-{hex}")
}

/// Keep the first 3 characters and append `*****`; shorter values become `***`.
pub fn mask(value: &str) -> String {
    if value.chars().count() < 3 {
        return "***".into();
    }
    let head: String = value.chars().take(3).collect();
    format!("{head}*****")
}

/// Names that carry credentials even when no metadata says so.
pub fn looks_secret(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["token", "secret", "password", "passwd", "key", "auth", "credential", "cookie", "session"]
        .iter()
        .any(|needle| lower.contains(needle))
}

/// Mask the values of a map whose names are listed as secret or look secret.
pub fn mask_map(values: &BTreeMap<String, String>, listed: &[String]) -> BTreeMap<String, String> {
    values
        .iter()
        .map(|(k, v)| {
            let secret = looks_secret(k) || listed.iter().any(|n| n.eq_ignore_ascii_case(k));
            (k.clone(), if secret { mask(v) } else { v.clone() })
        })
        .collect()
}

/// A URL with the values of secret query parameters masked.
pub fn mask_url(url: &Url, secrets: &SecretNames) -> String {
    if url.query().is_none() {
        return url.to_string();
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| {
            let secret = looks_secret(&k) || secrets.query_params.iter().any(|n| n == k.as_ref());
            (k.into_owned(), if secret { mask(&v) } else { v.into_owned() })
        })
        .collect();
    let mut masked = url.clone();
    masked.query_pairs_mut().clear().extend_pairs(pairs);
    masked.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_keep_three_characters() {
        assert_eq!(mask("ghp_abcdef"), "ghp*****");
        assert_eq!(mask("ab"), "***");
    }

    #[test]
    fn listed_and_secret_looking_names_are_masked() {
        let values = BTreeMap::from([
            ("GITHUB_TOKEN".to_owned(), "ghp_123456".to_owned()),
            ("WORKSPACE".to_owned(), "acme".to_owned()),
            ("X-Custom".to_owned(), "hidden-value".to_owned()),
        ]);
        let masked = mask_map(&values, &["x-custom".to_owned()]);
        assert_eq!(masked["GITHUB_TOKEN"], "ghp*****");
        assert_eq!(masked["WORKSPACE"], "acme");
        assert_eq!(masked["X-Custom"], "hid*****");
        let url = Url::parse("https://x/mcp?workspace=a&api_key=supersecret").unwrap();
        assert_eq!(mask_url(&url, &SecretNames::default()), "https://x/mcp?workspace=a&api_key=sup*****");
    }
}
