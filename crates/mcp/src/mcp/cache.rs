//! The cache hints of a 2026-07-28 listing or read (`ttlMs`, `cacheScope`, SEP-2549): how long the client may
//! keep the answer and whether a cache may share it between callers, as the satellite can vouch for them.

use serde_json::{json, Map, Value};

/// The methods whose 2026-07-28 results carry cache hints.
pub fn cacheable(method: &str) -> bool {
    method.ends_with("/list") || method == "resources/read" || method == "server/discover"
}

/// What the satellite can vouch for of one answer: the longest it may be kept, the time given when the server
/// named none, and whether it is the same for every caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheHints {
    /// The time given when the server named none (a handshake-era server, or an answer the satellite made).
    pub default_ms: u64,
    /// The longest time given, whatever the server named: how soon the satellite would tell the client of a change.
    pub max_ms: u64,
    /// The same answer for every caller (`public`); otherwise `private`.
    pub shared: bool,
}

impl CacheHints {
    /// Not to be kept: an answer of which the satellite would announce no change.
    pub const NONE: CacheHints = CacheHints { default_ms: 0, max_ms: 0, shared: false };

    /// Kept up to `ms` (the server's own time when shorter), for this caller only.
    pub fn private_for(ms: u64) -> CacheHints {
        CacheHints { default_ms: ms, max_ms: ms, shared: false }
    }

    /// The server's own time, whatever it is (none: not kept), for this caller only.
    pub const SERVERS_OWN: CacheHints = CacheHints { default_ms: 0, max_ms: u64::MAX, shared: false };

    /// Set `ttlMs` and `cacheScope` on a result: the server's own time within the bound, the scope the satellite's.
    pub fn stamp(self, result: &mut Map<String, Value>) {
        let said = result.get("ttlMs").and_then(Value::as_u64);
        let ttl = said.map_or(self.default_ms, |said| said.min(self.max_ms));
        result.insert("ttlMs".into(), json!(ttl));
        result.insert("cacheScope".into(), json!(if self.shared { "public" } else { "private" }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(hints: CacheHints, result: Value) -> Value {
        let Value::Object(mut result) = result else { unreachable!("an object") };
        hints.stamp(&mut result);
        Value::Object(result)
    }

    #[test]
    fn the_servers_time_is_kept_within_what_the_satellite_vouches_for() {
        let said = json!({"tools": [], "ttlMs": 300000, "cacheScope": "public"});
        assert_eq!(stamped(CacheHints::private_for(60_000), said.clone())["ttlMs"], 60_000, "bounded");
        assert_eq!(stamped(CacheHints::private_for(600_000), said.clone())["ttlMs"], 300_000, "the server's, shorter");
        assert_eq!(stamped(CacheHints::private_for(600_000), said.clone())["cacheScope"], "private", "one caller's");
        assert_eq!(stamped(CacheHints::NONE, said.clone())["ttlMs"], 0);
        assert_eq!(stamped(CacheHints::SERVERS_OWN, said)["ttlMs"], 300_000);
    }

    #[test]
    fn a_result_without_a_time_gets_the_default_and_a_malformed_one_is_replaced() {
        assert_eq!(stamped(CacheHints::private_for(5_000), json!({}))["ttlMs"], 5_000);
        assert_eq!(stamped(CacheHints::SERVERS_OWN, json!({}))["ttlMs"], 0, "no time named: not kept");
        let odd = stamped(CacheHints::private_for(5_000), json!({"ttlMs": -3, "cacheScope": 7}));
        assert_eq!((odd["ttlMs"].clone(), odd["cacheScope"].clone()), (json!(5_000), json!("private")));
        let shared = CacheHints { default_ms: 1, max_ms: 1, shared: true };
        assert_eq!(stamped(shared, json!({"cacheScope": "private"}))["cacheScope"], "public");
    }
}
