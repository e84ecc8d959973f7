#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one:
# installs the published MCP servers the tests talk to (npm), checks
# formatting and lints, then runs every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in cargo node npm python3; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 1; }
done

echo "==> installing npm MCP servers used by the tests (tests/node)"
npm ci --prefix tests/node --no-audit --no-fund --loglevel=error

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy (warnings denied)"
cargo clippy --locked --all-targets -- -D warnings

echo "==> cargo test"
cargo test --locked --lib --bins --tests
