//! How long a 2026-07-28 client may keep what the routers answer (`ttlMs`, `cacheScope`): as long as the satellite
//! would tell it of a change, and shared only where the answer is the same for every caller.

use serde_json::Value;

use crate::instances::Instance;
use crate::mcp::cache::CacheHints;
use crate::mcp::client::Era;

/// The longest a listing may be kept whose changes the client hears of (an hour: the client lists again after a
/// restart of the satellite or a lost listen in any case).
pub const ANNOUNCED_MS: u64 = 60 * 60 * 1000;

/// An instance's answer, always its one user's (own credentials, own process). A listing whose changes the server
/// announces (it declares `listChanged`) may be kept an hour, within the server's own time; one the satellite
/// finds changed by re-discovering it every N seconds, N seconds; any other, not at all. A read keeps the
/// server's own time: the satellite neither caches nor watches it for a client that did not subscribe.
pub fn for_instance(instance: &Instance, method: &str) -> CacheHints {
    let list = match method {
        "tools/list" => "tools",
        "prompts/list" => "prompts",
        "resources/list" | "resources/templates/list" => "resources",
        "resources/read" => return CacheHints::SERVERS_OWN,
        _ => return CacheHints::NONE,
    };
    let Some(client) = instance.client() else { return CacheHints::NONE };
    let declared = client.capabilities().get(list).and_then(|c| c.get("listChanged")).and_then(Value::as_bool);
    if declared == Some(true) {
        return CacheHints::private_for(ANNOUNCED_MS);
    }
    // A re-discovery that finds tools or resources changed is announced to the endpoint's sessions and to the
    // listens the satellite serves itself (a handshake-era server's); a listen on a 2026-07-28 server is the
    // server's own and hears only what it announces. Prompts are not re-discovered.
    let heard = list != "prompts" && matches!(client.era(), Era::Handshake { .. });
    match instance.spec().rediscover_every.filter(|_| heard) {
        Some(every) => CacheHints::private_for(u64::try_from(every.as_millis()).unwrap_or(u64::MAX)),
        None => CacheHints::NONE,
    }
}

/// The hierarchical router's answer. Its `tools/list`, the four meta-tools, is the same for every caller and
/// changes only with the satellite's version. Its other listings are the caller's own, gathered from their
/// instances, and `/mcp` serves no `subscriptions/listen` to announce their changes on: not kept. A read keeps the
/// server's own time.
pub fn for_hierarchical(method: &str) -> CacheHints {
    match method {
        "tools/list" => CacheHints { default_ms: ANNOUNCED_MS, max_ms: ANNOUNCED_MS, shared: true },
        "resources/read" => CacheHints::SERVERS_OWN,
        _ => CacheHints::NONE,
    }
}
