#!/usr/bin/env python3
"""Production functions over 50 lines and files over 500 production lines (issue 74): `python3 scripts/fnlen.py [dirs]`.
Production = lines before a file's `#[cfg(test)] mod tests {`; tests/, benches/ and *_tests.rs are left out."""
import re, sys, os, pathlib
roots = sys.argv[1:] or ["src", "crates"]
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
files = []
for r in roots:
    for p in pathlib.Path(r).rglob("*.rs"):
        s = str(p)
        if "/tests/" in s or s.endswith("/tests.rs") or "/benches/" in s or s.endswith("_tests.rs"):
            continue
        files.append(p)
fns, flens = [], []
for p in files:
    lines = p.read_text().split("\n")
    # production part: up to first #[cfg(test)] followed by mod
    end = len(lines)
    for i, l in enumerate(lines):
        if l.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(r'\s*(pub\s+)?mod\s', lines[i+1]) and not lines[i+1].strip().endswith(";"):
            end = i; break
    flens.append((end, str(p)))
    i = 0
    while i < end:
        m = fn_re.match(lines[i])
        if m:
            depth = 0; started = False; j = i
            while j < end:
                code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j])
                code = re.sub(r"'(\\.|[^'\\])'", "''", code)
                code = code.split("//")[0]
                for ch in code:
                    if ch == "{": depth += 1; started = True
                    elif ch == "}": depth -= 1
                if not started and code.rstrip().endswith(";"): break
                if started and depth <= 0: break
                j += 1
            if started:
                fns.append((j - i + 1, str(p), i + 1, m.group(7)))
            i += 1
        else:
            i += 1
fns.sort(reverse=True)
print("functions >100:", sum(1 for f in fns if f[0] > 100), " >50:", sum(1 for f in fns if f[0] > 50))
for f in fns:
    if f[0] > 50: print(f"{f[0]:5} {f[1]}:{f[2]} {f[3]}")
print("files >500 production lines:")
for n, p in sorted(flens, reverse=True):
    if n > 500: print(f"{n:5} {p}")
