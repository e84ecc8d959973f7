#!/usr/bin/env bash
# Idle memory of a satellite serving the search corpus: the first N corpus servers (default: all 422) installed
# for one user over Streamable HTTP, as scripts/corpus.sh does, and /proc/{pid}/status read 90 s after every
# instance is online (the token encoder is released after a minute idle). Prints one line: RssAnon, RssFile, the peak
# RSS so far (VmHWM), threads, instances.
#   bash scripts/corpus-rss.sh [BIN] [N]      BIN defaults to target/release/satellite (built if missing)
# USERS=U installs every server for U team members (U x N instances of N servers: what one more member costs).
# ONE_SERVER=1 serves the first N tools (default: all 4,500) as one server's listing (each name prefixed with its
# own server's slug), so one instance holds them all: the cost of a tool without the cost of an instance.
# Compare two builds by alternating them: host noise between runs of one binary is several MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN="${1:-target/release/satellite}"
N="${2:-100000}"
CORPUS="${CORPUS:-../shared/data/toolsearch/corpus.jsonl}"
WAIT="${WAIT:-90}"
[ -x "$BIN" ] || cargo build --release --quiet --bin satellite
WORK="$(mktemp -d)"
pids=()
if [ "${ONE_SERVER:-0}" = 1 ]; then
  python3 - "$CORPUS" "$N" > "$WORK/one-server.jsonl" <<'PY'
import json, sys
corpus, limit = sys.argv[1], int(sys.argv[2])
with open(corpus) as lines:
    for number, line in enumerate(lines):
        if number >= limit:
            break
        tool = json.loads(line)
        tool["name"], tool["server"] = (tool["server"] + "__" + tool["name"])[:128], "all"
        print(json.dumps(tool))
PY
  CORPUS="$WORK/one-server.jsonl"
  N=1
fi
cleanup() {
  # The satellite first: the demo server would log each connection it still held as cancelled.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CORPUS_PORT="$(free_port)"
PORT="$(free_port)"
"$BIN" demo-server --http "127.0.0.1:$CORPUS_PORT" --corpus "$CORPUS" > "$WORK/demo.out" 2>&1 &
pids+=($!)
# The user's token is never used: nothing is asked of this satellite but its memory.
python3 scripts/corpus_config.py "$CORPUS" "$CORPUS_PORT" "$(printf unused | sha256sum | cut -d" " -f1)" "$N" \
  "${USERS:-1}" > "$WORK/satellite.toml"
for _ in $(seq 1 100); do grep -q listening "$WORK/demo.out" 2>/dev/null && break; sleep 0.1; done

SATELLITE_DATA_DIR="$WORK/data" RUST_LOG=warn "$BIN" serve --config "$WORK/satellite.toml" --port "$PORT" > "$WORK/satellite.out" 2>&1 &
pid=$!
pids+=($pid)
servers=$(grep -c '^\[\[installations\]\]' "$WORK/satellite.toml")
instances=$((servers * ${USERS:-1}))
online() { curl -fs "http://127.0.0.1:$PORT/api/status/debug" 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["server_status"]["stats"]["online"])' 2>/dev/null || echo 0; }
# The wait starts once every instance is online: their token counts come last, and the encoder is released a
# minute after the last one.
started=$SECONDS
until [ "$(online)" = "$instances" ] || [ $((SECONDS - started)) -gt 600 ]; do sleep 0.5; done
settled=$((SECONDS - started))
sleep "$WAIT"
status() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$pid/status"; }
echo "RssAnon $(status RssAnon) kB, RssFile $(status RssFile) kB, peak RSS $(status VmHWM) kB, threads $(status Threads), $servers servers x ${USERS:-1} users, $(online) of $instances instances online (all after ${settled} s), read ${WAIT} s later"
