#!/usr/bin/env bash
# Does a proxied call cost more when the satellite serves more users? For each satellite binary given, in one run:
# a standalone config with USERS users in one team, each with an instance of one remote demo server
# (`satellite demo-server --http`), and a config with that one user alone; then `execute_mcp_tool demo:echo` as the
# first user with wrk at concurrency 1 and 32. Prints req/s and the satellite's own CPU per call (utime + stime
# from /proc/{pid}/stat over the requests wrk counted).
#
#   bash scripts/bench-users.sh target/release/satellite [OTHER_BINARY...]
#
# Needs wrk (apt-get install wrk) and curl. USERS (default 2000), ROUNDS (2), SECONDS_EACH (6), PORT (3903).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SATELLITE_BINARY..." >&2; exit 64; }
command -v wrk >/dev/null || { echo "error: wrk is required (apt-get install wrk)" >&2; exit 1; }
USERS=${USERS:-2000} ROUNDS=${ROUNDS:-2} SECONDS_EACH=${SECONDS_EACH:-6} PORT=${PORT:-3903}
UPSTREAM_PORT=$((PORT + 47))
TOKEN=ds_user_bench_users_token_0001
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
config() { # config FILE USERS
  {
    printf '[satellite]\nport = %s\n\n[[teams]]\nid = "acme"\n\n' "$PORT"
    printf '[[users]]\nid = "user00000"\nteams = ["acme"]\ntoken_sha256 = ["%s"]\n\n' "$(sha "$TOKEN")"
    local other
    other=$(sha unused-token-of-the-other-users)
    for i in $(seq 1 $(($2 - 1))); do
      printf '[[users]]\nid = "user%05d"\nteams = ["acme"]\ntoken_sha256 = ["%s"]\n\n' "$i" "$other"
    done
    printf '[[servers]]\nslug = "demo"\ntransport = "http"\nurl = "http://127.0.0.1:%s/mcp"\n\n' "$UPSTREAM_PORT"
    printf '[[installations]]\nid = "demo-acme"\nteam = "acme"\nserver = "demo"\n'
  } > "$1"
}
config "$work/one.toml" 1
config "$work/many.toml" "$USERS"

"$1" demo-server --http "127.0.0.1:$UPSTREAM_PORT" > "$work/demo.log" 2>&1 &
pids+=($!)

post() { # post SESSION BODY: headers and body of one POST to /mcp
  curl -si "http://127.0.0.1:$PORT/mcp" -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' \
    -H 'accept: application/json, text/event-stream' ${1:+-H "mcp-session-id: $1"} -d "$2"
}
CALL='{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_mcp_tool","arguments":{"tool_path":"demo:echo","arguments":{"text":"hi"}}}}'
INIT='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"wrk","version":"1"}}}'

measure() { # measure BINARY CONFIG_NAME
  local data pid session
  data=$(mktemp -d -p "$work")
  RUST_LOG=warn "$1" serve --config "$work/$2.toml" --data-dir "$data" > "$data/satellite.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 0.1; done
  session=$(post "" "$INIT" | tr -d '\r' | awk 'tolower($1) == "mcp-session-id:" {print $2}')
  # The first user's instance answers once it is online; then the others' discoveries get a moment to settle.
  for _ in $(seq 1 300); do post "$session" "$CALL" | grep -q '"text":"hi"' && break; sleep 0.2; done
  sleep 3
  cat > "$data/call.lua" <<LUA
wrk.method = "POST"
wrk.body = '$CALL'
wrk.headers["content-type"] = "application/json"
wrk.headers["accept"] = "application/json, text/event-stream"
wrk.headers["authorization"] = "Bearer $TOKEN"
wrk.headers["mcp-session-id"] = "$session"
LUA
  for c in 1 32; do
    local before after out requests
    before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    out=$(wrk -t1 -c$c -d"${SECONDS_EACH}s" -s "$data/call.lua" "http://127.0.0.1:$PORT/mcp")
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    printf '%-28s %-5s users=%-6s c=%-3s req/s=%-10s CPU us/call=%s %s\n' "$(basename "$1")" "$2" \
      "$([ "$2" = one ] && echo 1 || echo "$USERS")" "$c" "$(echo "$out" | awk '/Requests\/sec/ {print $2}')" \
      "$(echo "($after - $before) * 1000000 / $(getconf CLK_TCK) / $requests" | bc -l | xargs printf '%.1f')" \
      "$(echo "$out" | grep -i 'non-2xx' || true)"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in $(seq 1 "$ROUNDS"); do
  for binary in "$@"; do
    for name in one many; do
      measure "$binary" "$name"
    done
  done
done
