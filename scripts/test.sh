#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one:
# installs the published MCP servers the tests talk to (npm) and the
# official MCP Python SDK (PyPI, in .venv), checks
# formatting and lints, then runs every unit and integration test, the
# SDK client tests and the MCP conformance suite. Starts a throwaway PostgreSQL
# server on loopback (installing the Debian package when missing) for the tests
# that run on both database engines.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's heading says how long the run has taken so far, so a slow CI run shows where its time went.
step() { echo "==> [$(( SECONDS / 60 ))m$(printf '%02d' $(( SECONDS % 60 )))s] $*"; }

for tool in cargo node npm python3 curl openssl; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 1; }
done

step "bubblewrap for the sandbox tests (tests/sandbox.rs)"
if ! command -v bwrap >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get install -y -qq bubblewrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }
  else
    echo "error: bwrap is required (apt-get install bubblewrap)" >&2; exit 1
  fi
fi

step "Chromium for the admin page test (tests/python/test_admin_page.py drives it with playwright-core)"
if ! command -v chromium >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get install -y -qq chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
  else
    echo "error: chromium is required (apt-get install chromium)" >&2; exit 1
  fi
fi

step "installing npm MCP servers, the TypeScript SDK and playwright-core used by the tests (tests/node)"
npm ci --prefix tests/node --no-audit --no-fund --loglevel=error

step "the MCP conformance suite's reference server (tests/conformance/upstream), a 2026-07-28 upstream for tests/python"
npm ci --prefix tests/conformance/upstream --no-audit --no-fund --loglevel=error

step "reference token counts from gpt-tokenizer (tests/node/token_counts.json, read by tests/tokens.rs)"
node tests/node/token_counts.mjs ../shared/data/toolsearch/corpus.jsonl tests/node/token_counts.json

step "Python tools in .venv: the official MCP Python SDK, pytest, and uv (GitHub deployments of Python servers)"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
# tests/github.rs deploys a Python server with uv, found on PATH like an operator's.
export PATH="$PWD/.venv/bin:$PATH"

step "PostgreSQL on loopback: the store, outbox and replica tests run on both engines (scripts/postgres.sh)"
eval "$(bash scripts/postgres.sh start)"
trap 'bash scripts/postgres.sh stop "$PGTEST_DIR"' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "unused dependencies: cargo-machete (installed from crates.io when missing)"
if ! command -v cargo-machete >/dev/null; then
  # Built in a directory of its own, not in the project's target directory.
  env -u CARGO_TARGET_DIR cargo install --locked --quiet cargo-machete@0.9.2
fi
cargo machete

step "cargo clippy (warnings denied)"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "cargo test"
cargo test --locked --workspace --lib --bins --tests

step "the integration tests again, every test satellite on PostgreSQL (SATELLITE_TEST_ENGINE=postgres)"
# Skipped here: tests that start no test satellite (cli, fuzz_regressions), that choose their databases
# themselves (replicas), or that restart from a copy of the SQLite-only credentials file (managed mode keeps them
# in PostgreSQL).
SATELLITE_TEST_ENGINE=postgres cargo test --locked --test integration -- --skip cli:: --skip fuzz_regressions:: \
  --skip replicas:: --skip managed::stored_credentials --skip managed::a_2xx_answer_that_cannot_be_read \
  --skip managed::a_verification_heartbeat_failing --skip compat::every_event_type_reaches_the_backend

step "deploy/ validated offline: Kubernetes manifests, compose, Dockerfile, systemd unit (scripts/validate-deploy.sh)"
SATELLITE_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/satellite" bash scripts/validate-deploy.sh

step "real MCP clients: the official Python SDK (tests/python)"
SATELLITE_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/satellite" .venv/bin/python -m pytest -q tests/python

step "the official MCP conformance suite, directly and through the satellite (scripts/conformance.sh)"
bash scripts/conformance.sh
step "done"
