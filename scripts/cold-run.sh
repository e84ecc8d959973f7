#!/usr/bin/env bash
# What a newcomer waits for: from `cargo run -- serve` with an empty target directory to `/readyz` answering 200.
# Usage: bash scripts/cold-run.sh [TARGET_DIR]   (default: a fresh directory under /tmp, removed first)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${1:-/tmp/satellite-cold-target}"
data=$(mktemp -d)
rm -rf "$CARGO_TARGET_DIR"
port=3999
start=$(date +%s)
cargo run -- serve --port "$port" --data-dir "$data" >"$data/run.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT
until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do
  kill -0 "$pid" 2>/dev/null || { tail -20 "$data/run.log"; echo "the satellite exited before it was ready" >&2; exit 1; }
  sleep 1
done
echo "cold cargo run -- serve to /readyz: $(( $(date +%s) - start )) s"
