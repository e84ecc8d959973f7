//! One copy of each identical listing: every member's instance of a server lists the same tools, and all of
//! them share the listing the first made.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::Listing;

/// The live listing equal to `made` if there is one, else `made`, remembered for the next. The process-wide
/// lock is held only to look up and to insert: comparing listings of thousands of tools happens outside it, so
/// concurrent discoveries do not wait on one another.
pub(super) fn intern(made: Listing) -> Arc<Listing> {
    intern_in(&INTERNER, made)
}

fn intern_in(interner: &Mutex<Interner>, made: Listing) -> Arc<Listing> {
    let key = Interner::key(&made);
    let live = interner.lock().listings.get(&key).and_then(Weak::upgrade);
    if let Some(live) = live {
        // An equal key with other content (a 64-bit collision) keeps a listing of its own, not remembered.
        return if live.same_listing(&made) { live } else { Arc::new(made) };
    }
    interner.lock().insert(key, Arc::new(made))
}

/// Every live listing by its content, so that identical listings (every member's instance of one server) are
/// held once however many instances list them. Entries are weak: a listing goes when the last catalog holding
/// it does, and dead entries are swept whenever the table has doubled since the last sweep (so it holds at
/// most about twice the live listings). Keyed by 64 bits of a hash over the tools' content hashes; a listing
/// is shared only when every definition equals.
#[derive(Default)]
struct Interner {
    listings: HashMap<u64, Weak<Listing>>,
    swept_at: usize,
}

static INTERNER: LazyLock<Mutex<Interner>> = LazyLock::new(|| Mutex::new(Interner::default()));

/// Below this many entries the table is never swept.
const SWEEP_FLOOR: usize = 512;

impl Interner {
    /// 64 bits of a SHA-256 over the tools' content hashes, in order.
    fn key(listing: &Listing) -> u64 {
        let mut hasher = Sha256::new();
        for entry in &listing.tools {
            hasher.update(entry.content_hash);
        }
        hasher.finalize().iter().take(8).fold(0u64, |key, byte| (key << 8) | u64::from(*byte))
    }

    /// Remember `made` under `key`, unless an equal listing was made meanwhile (another discovery of the same
    /// server, between the look-up and now): that one is kept and handed back.
    fn insert(&mut self, key: u64, made: Arc<Listing>) -> Arc<Listing> {
        if let Some(live) = self.listings.get(&key).and_then(Weak::upgrade) {
            if live.same_listing(&made) {
                return live;
            }
            return made;
        }
        if self.listings.len() >= 2 * self.swept_at.max(SWEEP_FLOOR) {
            self.listings.retain(|_, listing| listing.strong_count() > 0);
            self.swept_at = self.listings.len();
        }
        self.listings.insert(key, Arc::downgrade(&made));
        made
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::model::catalog::{ListingBuilder, PreparedTool, ToolDef};

    /// Every member's instance of one server lists the same tools: the listing is held once. A listing that
    /// differs in any tool is its own.
    #[test]
    fn identical_listings_are_held_once_and_go_with_their_last_holder() {
        let entry = |description: &str| json!({"name": "interned_probe", "description": description, "inputSchema": {"type": "object"}});
        let listing = || vec![entry("Held once"), json!({"name": "second"})];
        let first = ToolDef::listing(listing());
        let second = ToolDef::listing(listing());
        assert!(first[0].shares_body(&second[0]) && first[1].shares_body(&second[1]), "a second instance's listing");
        assert!(!first[0].shares_body(&first[1]));
        assert_eq!(first, second);
        let changed = ToolDef::listing(vec![entry("Held twice"), json!({"name": "second"})]);
        assert!(!first[1].shares_body(&changed[1]), "one tool changed: a listing of its own");
        assert_eq!(first[1], changed[1], "its unchanged tool still equals");
        assert_ne!(first[0], changed[0]);

        let gone = Arc::downgrade(&first[0].listing);
        drop((first, second));
        assert!(gone.upgrade().is_none(), "the interner holds no listing alive");
    }

    /// One listing of `entries`, made but not interned.
    fn made(entries: Vec<Value>) -> Listing {
        let mut builder = ListingBuilder::default();
        entries.into_iter().for_each(|entry| builder.push(PreparedTool::new(entry).expect("a named tool")));
        builder.seal();
        builder.sealed.pop().expect("one listing")
    }

    /// The table of weak entries stays within about twice its live listings, whatever passes through it.
    #[test]
    fn the_interner_sweeps_what_no_catalog_holds() {
        let interner = Mutex::new(Interner::default());
        let listing = |n: usize| made(vec![json!({"name": format!("t{n}")})]);
        let kept: Vec<Arc<Listing>> = (0..100).map(|n| intern_in(&interner, listing(n))).collect();
        for n in 100..10_000 {
            drop(intern_in(&interner, listing(n)));
            let entries = interner.lock().listings.len();
            assert!(entries <= 2 * SWEEP_FLOOR, "{entries} entries at {n}");
        }
        assert!(kept.iter().all(|listing| interner
            .lock()
            .listings
            .values()
            .any(|w| w.upgrade().is_some_and(|w| Arc::ptr_eq(&w, listing)))));
        assert!(Arc::ptr_eq(&kept[7], &intern_in(&interner, listing(7))), "a live listing is still found after sweeps");
    }
    /// Two discoveries of one server made their listings at once (the look-up and the insert are apart, so that
    /// neither waits on the other): the second to insert gets the first's listing, and the copy is dropped.
    #[test]
    fn a_listing_made_meanwhile_by_another_discovery_is_the_one_kept() {
        let mut interner = Interner::default();
        let tools = || made(vec![json!({"name": "raced", "description": "made twice"})]);
        let key = Interner::key(&tools());
        let first = interner.insert(key, Arc::new(tools()));
        let second = interner.insert(key, Arc::new(tools()));
        assert!(Arc::ptr_eq(&first, &second), "the equal listing inserted first is handed back");
        let colliding = interner.insert(key, Arc::new(made(vec![json!({"name": "other"})])));
        assert!(!Arc::ptr_eq(&first, &colliding), "other content under the same key is not shared");
        assert_eq!(colliding.tools.len(), 1);
    }
}
