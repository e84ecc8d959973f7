#!/usr/bin/env bash
# Serve the 4,500-tool search corpus through a satellite:
#   1. the demo server serves every corpus server over Streamable HTTP (/servers/{slug}/mcp);
#   2. a satellite whose config installs every corpus server for one user (`bench`) connects to them.
# Honours PORT (the satellite's, default 3001), CORPUS_PORT (the demo server's, default 3102),
# SATELLITE_DEMO_TOKEN (the user's bearer token; generated when unset), CORPUS (the corpus file) and FEATURES
# (cargo features of the satellite; `FEATURES=semantic` with SATELLITE_SEMANTIC_MODEL set measures the semantic
# stage; the satellite is ready once every tool is indexed, its vectors may still be computing).
# Prints the endpoint; stops both on SIGINT/SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${PORT:-3001}"
CORPUS_PORT="${CORPUS_PORT:-3102}"
CORPUS="${CORPUS:-../shared/data/toolsearch/corpus.jsonl}"
TOKEN="${SATELLITE_DEMO_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(32))')}"
WORK="$(mktemp -d)"

cargo build --release --quiet --bin satellite ${FEATURES:+--features "$FEATURES"}
BIN=target/release/satellite

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BIN" demo-server --http "127.0.0.1:$CORPUS_PORT" --corpus "$CORPUS" > "$WORK/demo.out" &
pids+=($!)

python3 scripts/corpus_config.py "$CORPUS" "$CORPUS_PORT" \
  "$(python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())' "$TOKEN")" \
  > "$WORK/satellite.toml"

for _ in $(seq 1 100); do grep -q listening "$WORK/demo.out" 2>/dev/null && break; sleep 0.1; done

SATELLITE_DATA_DIR="$WORK/data" "$BIN" serve --config "$WORK/satellite.toml" --port "$PORT" &
pids+=($!)

for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
tools=$(curl -fs "http://127.0.0.1:$PORT/api/status/debug" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tools"]["total_tools"])')
echo "corpus satellite ready: $tools tools"
echo "endpoint: http://127.0.0.1:$PORT/mcp"
echo "token:    $TOKEN"
wait
