#!/usr/bin/env bash
# The official MCP conformance suite (npm @modelcontextprotocol/conformance, 2026-07-28 scenarios included)
# against the satellite, judged against the same suite run directly on the upstream:
#   - the upstream is the suite's own reference "everything" server (tests/conformance/upstream, vendored);
#   - /i/alice-conf/mcp fronts it as it is (the satellite negotiates 2026-07-28 with it), and
#     /i/alice-conf25/mcp fronts it as a handshake-era server (a forwarder refuses 2026-07-28 requests);
#   - every scenario of the 2025-11-25 and 2026-07-28 requirement sets that passes directly must pass through
#     the instance router, and the scenarios that apply to /mcp (no fixture tools there) must pass on /mcp.
# Needs a built satellite (SATELLITE_BIN, default target/debug/satellite) and npm; installs Node 22 locally.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="${SATELLITE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/satellite}"
[ -x "$BIN" ] || { echo "error: $BIN missing: cargo build first" >&2; exit 1; }

echo "==> conformance suite and Node 22 (tests/conformance), reference server (tests/conformance/upstream)"
npm ci --prefix tests/conformance --no-audit --no-fund --loglevel=error
npm ci --prefix tests/conformance/upstream --no-audit --no-fund --loglevel=error
NODE22="$ROOT/tests/conformance/node_modules/.bin/node"
CONFORMANCE="$ROOT/tests/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js"
PYTHON=$(command -v python3)

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # url: wait until something answers there
  for _ in $(seq 1 300); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "error: nothing answers at $1" >&2; for f in "$WORK"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1
}
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

UPSTREAM=$(free_port); HANDSHAKE=$(free_port); TWIN=$(free_port); TASKS=$(free_port); SAT=$(free_port)
FRONT=$(free_port)
(cd tests/conformance/upstream && PORT=$UPSTREAM exec node_modules/.bin/tsx everything-server.ts) >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
LISTEN=$HANDSHAKE TARGET=http://127.0.0.1:$UPSTREAM HANDSHAKE_ONLY=1 \
  node tests/conformance/auth-proxy.mjs >"$WORK/handshake.log" 2>&1 &
PIDS+=($!)
# The fourth pairing's upstream: the reference server's handshake-era fixtures asked the 2026-07-28 way
# (era-twin.mjs says why the reference server's own 2026-07-28 path cannot serve them).
LISTEN=$TWIN TARGET=http://127.0.0.1:$UPSTREAM node tests/conformance/era-twin.mjs >"$WORK/twin.log" 2>&1 &
PIDS+=($!)
# The Tasks extension's fixtures (greet, slow_compute, failing_job, ...), which the reference server lacks.
PORT=$TASKS "$NODE22" tests/conformance/tasks-server.mjs >"$WORK/tasks.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$UPSTREAM/mcp"

# /mcp is tried as bob (another team), who has one instance of the reference server (alice's two would make its resource URIs
# ambiguous on /mcp, which the satellite rightly refuses to guess).
USER_TOKEN=$(openssl rand -hex 24)
TOKEN_NEW="ds_inst_$(openssl rand -hex 32)"
TOKEN_OLD="ds_inst_$(openssl rand -hex 32)"
TOKEN_TWIN="ds_inst_$(openssl rand -hex 32)"
TOKEN_TASKS="ds_inst_$(openssl rand -hex 32)"
cat >"$WORK/satellite.toml" <<EOF
[satellite]
debug_route = true

[[teams]]
id = "acme"
[[teams]]
id = "beta"

[[users]]
id = "alice"
teams = ["acme"]
token_sha256 = ["$(sha "$(openssl rand -hex 24)")"]

[[users]]
id = "bob"
teams = ["beta"]
token_sha256 = ["$(sha "$USER_TOKEN")"]

[[servers]]
slug = "conf"
transport = "http"
url = "http://127.0.0.1:$UPSTREAM/mcp"

[[servers]]
slug = "conf25"
transport = "http"
url = "http://127.0.0.1:$HANDSHAKE/mcp"

[[servers]]
slug = "conftwin"
transport = "http"
url = "http://127.0.0.1:$TWIN/mcp"

[[servers]]
slug = "tasks"
transport = "http"
url = "http://127.0.0.1:$TASKS/mcp"

[[installations]]
id = "tasks-acme"
team = "acme"
server = "tasks"
[installations.users.alice]
instance_path = "alice-tasks"
instance_token_sha256 = "$(sha "$TOKEN_TASKS")"

[[installations]]
id = "conftwin-acme"
team = "acme"
server = "conftwin"
[installations.users.alice]
instance_path = "alice-conftwin"
instance_token_sha256 = "$(sha "$TOKEN_TWIN")"

[[installations]]
id = "conf-acme"
team = "acme"
server = "conf"
[installations.users.alice]
instance_path = "alice-conf"
instance_token_sha256 = "$(sha "$TOKEN_NEW")"

[[installations]]
id = "conf-beta"
team = "beta"
server = "conf"

[[installations]]
id = "conf25-acme"
team = "acme"
server = "conf25"
[installations.users.alice]
instance_path = "alice-conf25"
instance_token_sha256 = "$(sha "$TOKEN_OLD")"
EOF
env -u DEPLOYSTACK_BACKEND_URL SATELLITE_DATA_DIR="$WORK/data" \
  "$BIN" serve --config "$WORK/satellite.toml" --port "$SAT" >"$WORK/satellite.log" 2>&1 &
PIDS+=($!)
LISTEN=$FRONT TARGET=http://127.0.0.1:$SAT USER_TOKEN=$USER_TOKEN \
  INSTANCE_TOKENS="{\"alice-conf\":\"$TOKEN_NEW\",\"alice-conf25\":\"$TOKEN_OLD\",\"alice-conftwin\":\"$TOKEN_TWIN\",\"alice-tasks\":\"$TOKEN_TASKS\"}" \
  node tests/conformance/auth-proxy.mjs >"$WORK/front.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
  online=$(curl -s "http://127.0.0.1:$SAT/api/status/debug" | "$PYTHON" -c \
    'import json,sys; print(json.load(sys.stdin)["server_status"]["stats"]["online"])' 2>/dev/null || echo 0)
  [ "$online" = 5 ] && break
  sleep 0.1
done
[ "$online" = 5 ] || { echo "error: instances did not come online"; tail -30 "$WORK/satellite.log"; exit 1; }

suite() { # name url requirements
  echo "==> conformance $3: $1"
  # Exit status 1 only says some check failed; compare.py judges the results.
  "$NODE22" "$CONFORMANCE" server --url "$2" --requirements "$3" -o "$WORK/$1" >"$WORK/$1.txt" 2>&1 || true
  grep -E "^Total" "$WORK/$1.txt" || { cat "$WORK/$1.txt"; exit 1; }
}
suite direct-2025 "http://localhost:$UPSTREAM/mcp" 2025-11-25
suite through-2025 "http://localhost:$FRONT/i/alice-conf25/mcp" 2025-11-25
suite direct-2026 "http://localhost:$UPSTREAM/mcp" 2026-07-28
suite through-2026 "http://localhost:$FRONT/i/alice-conf/mcp" 2026-07-28
suite through-2025-to-2026 "http://localhost:$FRONT/i/alice-conftwin/mcp" 2025-11-25
suite through-2026-to-2025 "http://localhost:$FRONT/i/alice-conf25/mcp" 2026-07-28
# The Tasks extension's scenarios, against tasks-server.mjs directly and through the instance router.
TASK_SCENARIOS="tasks-capability-negotiation tasks-dispatch-and-envelope tasks-lifecycle tasks-mrtr-composition
  tasks-mrtr-input tasks-request-headers tasks-request-state-removal tasks-required-task-error tasks-wire-fields"
scenarios() { # name url scenario...
  local name=$1 url=$2; shift 2
  echo "==> conformance: $name ($# scenarios)"
  for scenario in "$@"; do
    "$NODE22" "$CONFORMANCE" server --url "$url" --scenario "$scenario" -o "$WORK/$name" >>"$WORK/$name.txt" 2>&1 || true
  done
}
# shellcheck disable=SC2086
scenarios direct-tasks "http://localhost:$TASKS/mcp" $TASK_SCENARIOS
# shellcheck disable=SC2086
scenarios through-tasks "http://localhost:$FRONT/i/alice-tasks/mcp" $TASK_SCENARIOS
suite mcp-2025 "http://localhost:$FRONT/mcp" 2025-11-25
suite mcp-2026 "http://localhost:$FRONT/mcp" 2026-07-28

status=0
echo "==> instance router, 2025-11-25 (handshake-era upstream)"
# The three sse-polling checks and sse-streams-functional exist only when the answer is an SSE stream; the
# satellite reads the upstream's stream (resuming it with Last-Event-ID when the server closes it early) and may
# answer the client with plain JSON, which those scenarios accept as "not applicable".
"$PYTHON" tests/conformance/compare.py through "$WORK/direct-2025" "$WORK/through-2025" \
  server-sse-multiple-streams:server-sse-streams-functional server-sse-polling:server-sse-priming-event \
  server-sse-polling:server-sse-retry-field server-sse-polling:server-sse-disconnect-resume || status=1
echo "==> instance router, 2026-07-28"
"$PYTHON" tests/conformance/compare.py through "$WORK/direct-2026" "$WORK/through-2026" || status=1
echo "==> instance router, a 2025-11-25 client to a 2026-07-28 upstream (the reference server behind era-twin.mjs)"
# The upstream asks through input_required; the satellite must ask the client on its session and retry.
"$PYTHON" tests/conformance/compare.py through "$WORK/direct-2025" "$WORK/through-2025-to-2026" \
  server-sse-multiple-streams:server-sse-streams-functional server-sse-polling:server-sse-priming-event \
  server-sse-polling:server-sse-retry-field server-sse-polling:server-sse-disconnect-resume || status=1
echo "==> instance router, the Tasks extension (tasks-server.mjs)"
"$PYTHON" tests/conformance/compare.py through "$WORK/direct-tasks" "$WORK/through-tasks" || status=1
echo "==> instance router, a 2026-07-28 client to a handshake-era upstream"
# Exempt: scenarios whose fixtures the reference server serves only on its 2026-07-28 path (the
# test_input_required_result_* tools and prompt, test_missing_capability, test_trigger_tool_change and
# test_trigger_prompt_change), which a handshake-era upstream does not have. Everything else must pass as it does
# directly (the reverse translation, a handshake-era server request reaching a 2026-07-28 client as input_required,
# has no fixture in the 2026-07-28 set: tests/python/test_relay.py covers it).
"$PYTHON" tests/conformance/compare.py through "$WORK/direct-2026" "$WORK/through-2026-to-2025" \
  input-required-result-basic-elicitation input-required-result-basic-list-roots input-required-result-basic-sampling \
  input-required-result-capability-check input-required-result-missing-input-response input-required-result-multi-round \
  input-required-result-multiple-input-requests input-required-result-non-tool-request input-required-result-request-state \
  input-required-result-result-type input-required-result-tampered-state input-required-result-validate-input \
  server-stateless:sep-2575-server-rejects-undeclared-capability server-stateless:sep-2575-missing-capability-http-400 \
  server-stateless:sep-2575-server-sends-prompts-list-changed-on-subscription \
  server-stateless:sep-2575-server-sends-tools-list-changed-on-subscription || status=1
# /mcp serves tools through meta-tools and namespaces prompts, so scenarios that call a fixture by name do not
# apply there; these do.
echo "==> /mcp, 2025-11-25"
"$PYTHON" tests/conformance/compare.py applicable "$WORK/mcp-2025" server-initialize ping logging-set-level \
  tools-list server-sse-multiple-streams resources-list resources-read-text resources-read-binary \
  resources-templates-read prompts-list dns-rebinding-protection server-session-lifecycle || status=1
echo "==> /mcp, 2026-07-28"
"$PYTHON" tests/conformance/compare.py applicable "$WORK/mcp-2026" server-stateless tools-list \
  server-sse-multiple-streams resources-list resources-read-text resources-read-binary resources-templates-read \
  sep-2164-resource-not-found prompts-list dns-rebinding-protection caching \
  input-required-result-unsupported-methods || status=1
if [ "$status" != 0 ]; then
  echo "--- satellite log (tail)"; tail -40 "$WORK/satellite.log"
fi
exit $status
