//! Keeps ARCHITECTURE.md's code map true: it reads the map's module order and every `crate::` and `super::`
//! path in `src/` (test code aside, wherever it sits in a file: `source_tests`), and fails on a module missing from the map, on a path that reaches a
//! module listed below the one using it, and on a cycle between files that are not parent and child, naming
//! the offending lines.

use std::collections::{BTreeMap, BTreeSet};

use crate::source_tests::{display, production, root, shown, source_files, ModPath};

/// One reference from a file to a module: where it is written and what it reaches.
struct Reference {
    line: usize,
    text: String,
    target: ModPath,
}

/// The code map's modules, in order (bottom-up: each may use only those before it).
fn map_order() -> Vec<ModPath> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md is readable");
    map_order_in(&text)
}

/// The modules of a "## Code map" table in `text`, in order: every backticked name of a row's first cell, so a
/// row may list one module (`| `store` | … |`) or several, bottom-up (`| `model`, `mcp::payload` | … |`).
fn map_order_in(text: &str) -> Vec<ModPath> {
    let section = text.split("## Code map").nth(1).expect("ARCHITECTURE.md has a \"## Code map\" section");
    section
        .lines()
        .take_while(|line| !line.starts_with("## ") && !line.starts_with("**"))
        .filter_map(|line| line.strip_prefix('|'))
        .filter_map(|row| row.split('|').next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::trim).collect::<Vec<_>>())
        .filter(|name| !name.is_empty())
        .map(|name| name.trim_end_matches(".rs").split("::").map(str::to_owned).collect())
        .collect()
}

/// The `crate::…` and `super::…` paths of a file's production code (comments, literals and test items aside).
fn references(me: &ModPath, text: &str) -> Vec<Reference> {
    let mut out = Vec::new();
    for line in production(text) {
        let mut rest = line.code.as_str();
        while let Some((start, kind)) = next_anchor(rest) {
            let tail = &rest[start..];
            let (base, after): (ModPath, &str) = match kind {
                Anchor::Crate => (Vec::new(), &tail["crate::".len()..]),
                Anchor::Super => {
                    let mut after = tail;
                    let mut base = me.clone();
                    while let Some(next) = after.strip_prefix("super::") {
                        base.pop();
                        after = next;
                    }
                    (base, after)
                }
            };
            for target in paths(base, after) {
                out.push(Reference { line: line.number, text: line.raw.clone(), target });
            }
            rest = &tail[1..];
        }
    }
    out
}

/// The paths written after an anchor: `a::b::C` is one, `a::{b::C, D}` is one per group member.
fn paths(base: ModPath, text: &str) -> Vec<ModPath> {
    let mut path = base;
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            return group
                .split(',')
                .map(|member| {
                    let member = member.trim();
                    let member = member.strip_prefix("self").map_or(member, |m| m.trim_start_matches("::"));
                    path.iter()
                        .cloned()
                        .chain(member.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned))
                        .collect()
                })
                .collect();
        }
        let ident: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if ident.is_empty() {
            return vec![path];
        }
        rest = &rest[ident.len()..];
        path.push(ident);
        match rest.strip_prefix("::") {
            Some(next) => rest = next,
            None => return vec![path],
        }
    }
}

enum Anchor {
    Crate,
    Super,
}

/// The next `crate::` or `super::` that starts a path (not the end of another identifier).
fn next_anchor(text: &str) -> Option<(usize, Anchor)> {
    let starts_path = |i: usize| {
        i == 0 || {
            let before = text[..i].chars().next_back().unwrap_or(' ');
            !(before.is_alphanumeric() || before == '_' || before == ':')
        }
    };
    let find = |needle: &str| text.match_indices(needle).map(|(i, _)| i).find(|&i| starts_path(i));
    match (find("crate::"), find("super::")) {
        (Some(c), Some(s)) if s < c => Some((s, Anchor::Super)),
        (Some(c), _) => Some((c, Anchor::Crate)),
        (None, Some(s)) => Some((s, Anchor::Super)),
        (None, None) => None,
    }
}

/// The longest map entry that is a prefix of `path`.
fn map_module(map: &[ModPath], path: &ModPath) -> Option<usize> {
    map.iter().enumerate().filter(|(_, m)| path.starts_with(m)).max_by_key(|(_, m)| m.len()).map(|(i, _)| i)
}

/// The longest existing module that is a prefix of `path`.
fn file_module(modules: &BTreeSet<ModPath>, path: &ModPath) -> Option<ModPath> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| modules.contains(p))
}

#[test]
fn imports_follow_the_code_map_and_files_form_no_cycle() {
    let map = map_order();
    assert!(map.len() > 10, "the code map lists the modules: {map:?}");
    let files = source_files();
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, (String, usize, String)>> = BTreeMap::new();
    for (me, path) in &files {
        let shown = shown(path);
        let text = std::fs::read_to_string(path).expect("source is readable");
        let mine = map_module(&map, me);
        if !me.is_empty() && mine.is_none() && !references(me, &text).is_empty() {
            problems.push(format!("{shown}: module `{}` is not on the code map of ARCHITECTURE.md", display(me)));
        }
        for reference in references(me, &text) {
            if let (Some(mine), Some(theirs)) = (mine, map_module(&map, &reference.target)) {
                if theirs > mine {
                    problems.push(format!(
                        "{shown}:{}: `{}` uses `{}`, which the code map lists after it: {}",
                        reference.line,
                        display(&map[mine]),
                        display(&map[theirs]),
                        reference.text
                    ));
                }
            }
            if let Some(target) = file_module(&modules, &reference.target) {
                let related = target.starts_with(me) || me.starts_with(&target);
                if !related {
                    edges.entry(me.clone()).or_default().entry(target).or_insert((
                        shown.clone(),
                        reference.line,
                        reference.text.clone(),
                    ));
                }
            }
        }
    }
    for cycle in cycles(&edges) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let (file, line, text) = &edges[&w[0]][&w[1]];
                format!("{file}:{line}: {text}")
            })
            .collect();
        problems.push(format!(
            "cycle {}:\n    {}",
            cycle.iter().map(display).collect::<Vec<_>>().join(" -> "),
            steps.join("\n    ")
        ));
    }
    assert!(problems.is_empty(), "the code map is not true:\n{}", problems.join("\n"));
}

/// Each cycle of the file graph once, as a closed walk `a -> b -> … -> a`.
fn cycles(edges: &BTreeMap<ModPath, BTreeMap<ModPath, (String, usize, String)>>) -> Vec<Vec<ModPath>> {
    fn walk(
        node: &ModPath,
        edges: &BTreeMap<ModPath, BTreeMap<ModPath, (String, usize, String)>>,
        stack: &mut Vec<ModPath>,
        done: &mut BTreeSet<ModPath>,
        found: &mut Vec<Vec<ModPath>>,
    ) {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.clone());
            found.push(cycle);
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flat_map(|e| e.keys()) {
            walk(next, edges, stack, done, found);
        }
        stack.pop();
        done.insert(node.clone());
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        walk(node, edges, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

/// The checker itself: an upward path and a cycle are both found.
#[test]
fn the_checker_finds_upward_paths_and_cycles() {
    let me: ModPath = vec!["http".into(), "sse".into()];
    let refs = references(&me, "use super::mcp::{McpDeps, X};\nuse crate::store::Store; // crate::app\n");
    let targets: Vec<String> = refs.iter().map(|r| display(&r.target)).collect();
    assert_eq!(targets, ["http::mcp::McpDeps", "http::mcp::X", "store::Store"]);
    let grouped = references(&me, "use crate::{app::Satellite, model};");
    assert_eq!(grouped.iter().map(|r| display(&r.target)).collect::<Vec<_>>(), ["app::Satellite", "model"]);
    assert!(references(&me, "#[cfg(test)]\nuse crate::app;").is_empty(), "test code is not checked");
    let after_tests = references(&me, "#[cfg(test)]\nmod tests {\n    use crate::app;\n}\nuse crate::router;\n");
    assert_eq!(after_tests.iter().map(|r| (r.line, display(&r.target))).collect::<Vec<_>>(), [(5, "router".into())]);
    let map: Vec<ModPath> = vec![vec!["store".into()], vec!["http".into()], vec!["app".into()]];
    assert_eq!(map_module(&map, &vec!["app".into(), "Satellite".into()]), Some(2));
    let a: ModPath = vec!["http".into(), "mcp".into()];
    let mut edges = BTreeMap::new();
    edges.insert(a.clone(), BTreeMap::from([(me.clone(), ("m".to_owned(), 1, "x".to_owned()))]));
    edges.insert(me.clone(), BTreeMap::from([(a.clone(), ("s".to_owned(), 2, "y".to_owned()))]));
    assert_eq!(cycles(&edges), vec![vec![a.clone(), me.clone(), a]]);
}

/// The code map's rows: one module in the first cell, or several, in order; the header and the prose around the
/// table are not modules.
#[test]
fn the_code_map_reads_one_or_several_modules_per_row() {
    let text = "# A\n## Code map (bottom-up)\n\n`layering_tests` reads this table.\n\n| module | owns |\n| --- | --- |\n\
                | `model`, `mcp::payload`, `mcp::protocol` | vocabulary; `Payload` is data only |\n\
                | `store` | the only SQL (`sqlx`) |\n| `main.rs` | CLI |\n\n**Why** `x` sits here\n| `not` | a module |\n";
    let order: Vec<String> = map_order_in(text).iter().map(display).collect();
    assert_eq!(order, ["model", "mcp::payload", "mcp::protocol", "store", "main"]);
}
