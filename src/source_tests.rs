//! What the source-reading tests (`layering_tests`, `invariants_tests`) see of `src/`: every production file with
//! its module path, and each file's lines with comments, the insides of string and char literals, and test-only
//! items (`#[cfg(test)]` modules, functions, statements) blanked out, so that a rule matches code and nothing else.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A module path, `["http", "mcp"]` for `crate::http::mcp`.
pub(crate) type ModPath = Vec<String>;

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn display(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".into()
    } else {
        path.join("::")
    }
}

/// A file's path as the failures show it, relative to the workspace (`crates/http/src/http/sse.rs`).
pub(crate) fn shown(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// Every non-test source file of the workspace with its module path (`src/main.rs` and `src/main/` are `main`).
pub(crate) fn source_files() -> Vec<(ModPath, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    // The binary crate's `src/` and each workspace crate's (`crates/store/src/`): a crate's `lib.rs` declares its
    // modules under their names, so `crates/store/src/store/mod.rs` is `store`, as `src/app/mod.rs` is `app`.
    let mut roots = vec![root().join("src")];
    let crates = std::fs::read_dir(root().join("crates")).expect("crates/ is readable");
    roots.extend(crates.flatten().map(|entry| entry.path().join("src")).filter(|src| src.is_dir()));
    let mut paths = Vec::new();
    for src in &roots {
        let mut found = Vec::new();
        walk(src, &mut found);
        paths.extend(found.into_iter().map(|path| (src.clone(), path)));
    }
    let mut files: Vec<(ModPath, PathBuf)> = paths
        .into_iter()
        .map(|(src, path)| {
            let rel = path.strip_prefix(&src).expect("under its src").with_extension("");
            let mut parts: ModPath = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            (parts, path)
        })
        .collect();
    // Modules declared under `#[cfg(test)]` (`#[cfg(test)] mod x;`, other attributes between) are test code.
    let test_only: BTreeSet<ModPath> = files
        .iter()
        .flat_map(|(me, path)| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            let mut found = Vec::new();
            for (n, line) in lines.iter().enumerate() {
                if *line != "#[cfg(test)]" {
                    continue;
                }
                let item = lines[n + 1..].iter().find(|l| !l.starts_with("#[")).copied().unwrap_or_default();
                let item = item.strip_prefix("pub(crate) ").or_else(|| item.strip_prefix("pub ")).unwrap_or(item);
                if let Some(name) = item.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                    found.push(me.iter().cloned().chain([name.to_owned()]).collect::<ModPath>());
                }
            }
            found
        })
        .collect();
    // …and so are the unit-test files beside their module (`#[cfg(test)] #[path = "x_tests.rs"] mod tests;`).
    files.retain(|(me, _)| {
        let test_file = me.last().is_some_and(|name| name == "tests" || name.ends_with("_tests"));
        !test_file && !test_only.iter().any(|t| me.starts_with(t))
    });
    files.sort();
    files
}

/// One line of a file as the rules read it.
pub(crate) struct Line {
    /// 1-based.
    pub number: usize,
    /// The line as written, trimmed: what a failure quotes.
    pub raw: String,
    /// The line's code: comments, the insides of literals and test-only items are spaces (delimiters stay, so
    /// `"…"` reads `"   "`).
    pub code: String,
    /// The string literals that open on this line, as written between their quotes (escapes not undone).
    pub strings: Vec<String>,
}

/// A file's lines for the rules: production code only.
pub(crate) fn production(text: &str) -> Vec<Line> {
    let (mut code, strings) = blank_comments_and_literals(text);
    blank_test_items(&mut code);
    let raw: Vec<&str> = text.split('\n').collect();
    let mut lines: Vec<Line> = code
        .split(|c| *c == '\n')
        .enumerate()
        .map(|(n, chars)| Line {
            number: n + 1,
            raw: raw.get(n).copied().unwrap_or_default().trim().to_owned(),
            code: chars.iter().collect(),
            strings: Vec::new(),
        })
        .collect();
    for literal in strings {
        // A literal inside a test-only item lost its opening quote with the rest of the item.
        if code[literal.opening] == '"' {
            lines[literal.line].strings.push(literal.text);
        }
    }
    lines
}

/// A string literal: where its opening quote is (index into the file's chars), its line (0-based), its text.
struct Literal {
    opening: usize,
    line: usize,
    text: String,
}

/// The file's chars with comments and the insides of string and char literals replaced by spaces (line breaks
/// kept, so lines and columns stay where they were), and the string literals found.
fn blank_comments_and_literals(text: &str) -> (Vec<char>, Vec<Literal>) {
    let mut c: Vec<char> = text.chars().collect();
    let mut literals = Vec::new();
    let mut line = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    let blank = |c: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut c[from..to] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    while i < c.len() {
        let next = c.get(i + 1).copied();
        match c[i] {
            '\n' => {
                line += 1;
                i += 1;
            }
            '/' if next == Some('/') => {
                let end = c[i..].iter().position(|ch| *ch == '\n').map_or(c.len(), |p| i + p);
                blank(&mut c, i, end);
                i = end;
            }
            '/' if next == Some('*') => {
                let (mut depth, mut j) = (0usize, i);
                while j < c.len() {
                    if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                let end = j.min(c.len());
                line += c[i..end].iter().filter(|ch| **ch == '\n').count();
                blank(&mut c, i, end);
                i = end;
            }
            // A raw string: `r"…"`, `r#"…"#`, `br#"…"#`; the `r` must start a token.
            'r' if (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
                && matches!(next, Some('"' | '#')) =>
            {
                let hashes = c[i + 1..].iter().take_while(|ch| **ch == '#').count();
                let opening = i + 1 + hashes;
                if c.get(opening) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let mut j = opening + 1;
                while j < c.len() && !c[j..].starts_with(&closing) {
                    j += 1;
                }
                let end = j.min(c.len());
                literals.push(Literal { opening, line, text: c[opening + 1..end].iter().collect() });
                line += c[opening..end].iter().filter(|ch| **ch == '\n').count();
                blank(&mut c, opening + 1, end);
                i = end + closing.len();
            }
            '"' => {
                let mut j = i + 1;
                while j < c.len() && c[j] != '"' {
                    j += if c[j] == '\\' { 2 } else { 1 };
                }
                let end = j.min(c.len());
                literals.push(Literal { opening: i, line, text: c[i + 1..end].iter().collect() });
                line += c[i..end].iter().filter(|ch| **ch == '\n').count();
                blank(&mut c, i + 1, end);
                i = end + 1;
            }
            // A char literal (`'{'`, `'\''`, `'\u{7f}'`), not a lifetime or a label (`'a`, `'outer:`).
            '\'' if next == Some('\\') => {
                let mut j = i + 3;
                while j < c.len() && c[j] != '\'' && c[j] != '\n' {
                    j += 1;
                }
                let end = j.min(c.len());
                blank(&mut c, i + 1, end);
                i = if c.get(j) == Some(&'\'') { j + 1 } else { j };
            }
            '\'' if c.get(i + 2) == Some(&'\'') => {
                blank(&mut c, i + 1, i + 2);
                i += 3;
            }
            _ => i += 1,
        }
    }
    (c, literals)
}

/// Blank every item an `#[cfg(test)]` attribute gates, the attribute included: a module, a function, a `use`, a
/// statement, a field. The item ends with its braces' block, or with a `;` or `,` outside any bracket.
fn blank_test_items(c: &mut [char]) {
    let attribute: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + attribute.len() <= c.len() {
        if !c[i..].starts_with(&attribute) {
            i += 1;
            continue;
        }
        let end = item_end(c, i + attribute.len());
        for ch in &mut c[i..end] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = end;
    }
}

/// Where the item that starts at or after `from` (after any further attributes) ends, one past its last char.
fn item_end(c: &[char], from: usize) -> usize {
    let mut j = from;
    let mut depth = 0usize;
    while j < c.len() {
        match c[j] {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' if depth == 0 => return j,
            '}' if depth == 0 => return j,
            ')' | ']' => depth -= 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    // `use a::{b, c};`: the `;` after the group belongs to the item too.
                    let after = c[j + 1..].iter().position(|ch| !ch.is_whitespace()).map(|p| j + 1 + p);
                    return match after {
                        Some(k) if c[k] == ';' => k + 1,
                        _ => j + 1,
                    };
                }
            }
            ';' | ',' if depth == 0 => return j + 1,
            // Another attribute of the same item: `#[…]` is skipped whole by the bracket count above.
            _ => {}
        }
        j += 1;
    }
    c.len()
}

/// The lexer and the test-item blanking, on the shapes the code base has.
#[test]
fn production_code_is_what_is_left_once_comments_literals_and_test_items_go() {
    let text = "use crate::a; // crate::b\n\
                let s = \"crate::c // not a comment\"; let r = r#\"x \"crate::d\" y\"#;\n\
                let ch = '{'; let q = '\\''; fn f<'a>(x: &'a str) {}\n\
                #[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod tests;\n\
                #[cfg(test)]\nmod more {\n    fn g() { crate::e(); }\n}\n\
                fn after() { crate::f(); }\n\
                #[cfg(test)]\nuse crate::{g, h};\n\
                /* crate::i /* nested */ still */ fn j() -> [u8; 2] { [0; 2] }\n\
                #[cfg(test)]\nfn k() -> [u8; 2] { crate::k() }\nstruct S { #[cfg(test)] t: u8, u: u8 }\n";
    let lines = production(text);
    let code: Vec<&str> = lines.iter().map(|l| l.code.trim_end()).collect();
    assert_eq!(code[0], "use crate::a;");
    assert!(!code[1].contains("crate::"), "{}", code[1]);
    assert_eq!(lines[1].strings, ["crate::c // not a comment", "x \"crate::d\" y"]);
    assert_eq!(code[2], "let ch = ' '; let q = '  '; fn f<'a>(x: &'a str) {}");
    assert!(code[3..10].iter().all(|l| l.trim().is_empty()), "{:?}", &code[3..10]);
    assert_eq!(code[10], "fn after() { crate::f(); }");
    assert!(code[11..13].iter().all(|l| l.trim().is_empty()));
    assert_eq!(code[13].trim(), "fn j() -> [u8; 2] { [0; 2] }");
    assert!(code[14..16].iter().all(|l| l.trim().is_empty()));
    assert_eq!(code[16].split_whitespace().collect::<Vec<_>>(), ["struct", "S", "{", "u:", "u8", "}"]);
    assert_eq!(lines[4].strings, Vec::<String>::new(), "a test item's literals are not production's");
}
