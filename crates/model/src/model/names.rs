//! A catalog's tools by name. Small catalogs (most servers list a few dozen tools) are scanned; a larger one gets
//! a map from name to place, built on the first lookup and kept with the catalog (never patched, as the catalog is
//! not). Every discover result and every call looks its tool up by name: a scan of a 4,500-tool listing per
//! result cost more than the search that found it.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Catalogs of at most this many tools are scanned.
const SCAN_MAX: usize = 64;

/// The map of a large catalog, by name (the first tool of a name listed twice, as a scan finds it).
#[derive(Default, Clone)]
pub struct ToolNames(OnceLock<HashMap<Box<str>, u32>>);

impl ToolNames {
    /// The place of the first tool named `name` in `tools` (the catalog this index belongs to), each named by
    /// `name_of`.
    pub fn position<T>(&self, tools: &[T], name_of: impl Fn(&T) -> &str, name: &str) -> Option<usize> {
        if tools.len() <= SCAN_MAX {
            return tools.iter().position(|t| name_of(t) == name);
        }
        let map = self.0.get_or_init(|| {
            let mut map = HashMap::with_capacity(tools.len());
            for (at, tool) in tools.iter().enumerate() {
                map.entry(Box::from(name_of(tool))).or_insert(at as u32);
            }
            map
        });
        map.get(name).map(|at| *at as usize)
    }
}

/// Derived from the tools: takes no part in comparing catalogs.
impl PartialEq for ToolNames {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for ToolNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            Some(map) => write!(f, "ToolNames({} mapped)", map.len()),
            None => f.write_str("ToolNames(scanned)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_found_in_small_and_large_catalogs_alike() {
        for size in [3, SCAN_MAX, SCAN_MAX + 1, 500] {
            let mut tools: Vec<String> = (0..size).map(|n| format!("t{n}")).collect();
            tools.push("t1".into());
            let names = ToolNames::default();
            for probe in [0, 1, size / 2, size - 1] {
                let name = format!("t{probe}");
                let scanned = tools.iter().position(|t| *t == name);
                assert_eq!(names.position(&tools, |t| t.as_str(), &name), scanned, "{size} tools, {name}");
            }
            assert_eq!(names.position(&tools, |t| t.as_str(), "nope"), None);
        }
    }
}
