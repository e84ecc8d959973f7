#!/usr/bin/env bash
# What one proxied call costs the satellite, binary against binary in one run: for each satellite binary given,
# a standalone config with one stdio instance of the bundled demo server (`demo-server --protocol legacy`) behind
# the instance router (/i/bench-demo/mcp), then `tools/call echo` with wrk on one handshake-era session, at the
# default log level (info). Prints req/s and the satellite's own CPU per call (utime + stime from /proc/{pid}/stat
# over the requests wrk counted; the demo server's and wrk's time are not counted). Rounds alternate the binaries,
# so a host that changes speed during the run shows in every binary alike.
#
#   bash scripts/bench-call.sh OLD_BINARY NEW_BINARY
#
# Needs wrk (apt-get install wrk), curl and bc. ROUNDS (3), SECS (6), C (32: connections), LOGGING (false: the
# installation's request logging), TEXT_BYTES (2: the size of the text echoed, so of the result), PORT (3977),
# SYSCALLS (0; 1 adds system calls and context switches per call, read with perf), INSTRUCTIONS (0; 1 runs the
# satellite under valgrind's callgrind and adds the instructions it executed per call, counted only while wrk runs),
# ROUTE (call: `tools/call echo` on the instance router; mcp-list: `tools/list` on /mcp with the user's token;
# mcp-init: `initialize` on /mcp, each a new session, so the table fills and evicts its oldest),
# CALLGRIND_KEEP (with INSTRUCTIONS=1: a path prefix; each binary's profile is kept as PREFIX.BINARY_NAME, for
# callgrind_annotate), HISTORY_MAX (the standalone history's `event_retention_max`, 100,000 by default: a smaller one
# reaches the steady state of a full history, each event written and later pruned, within a run under valgrind).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SATELLITE_BINARY..." >&2; exit 64; }
command -v wrk >/dev/null || { echo "error: wrk is required (apt-get install wrk)" >&2; exit 1; }
ROUNDS=${ROUNDS:-3} SECS=${SECS:-6} C=${C:-32} LOGGING=${LOGGING:-false} PORT=${PORT:-3977} TEXT_BYTES=${TEXT_BYTES:-2}
TEXT=$(head -c "$TEXT_BYTES" /dev/zero | tr '\0' 'x')
# SYSCALLS=1 also counts, per call, the satellite's system calls that move data and its context switches (perf
# tracepoints: root, or kernel.perf_event_paranoid = -1). Counts do not drift with the host's speed as times do.
SYSCALLS=${SYSCALLS:-0}
# INSTRUCTIONS=1 counts what no host's speed changes: the satellite's instructions per call (valgrind; the demo server
# runs outside it). Under valgrind the satellite is ~50x slower and its threads take turns, so req/s and CPU read
# nothing then; and a `rep movsb` copy counts once per byte, so copying memory weighs more there than it costs.
INSTRUCTIONS=${INSTRUCTIONS:-0}
ROUTE=${ROUTE:-call}
case $ROUTE in call|mcp-list|mcp-init) ;; *) echo "error: ROUTE is call, mcp-list or mcp-init" >&2; exit 64 ;; esac
HISTORY_LINE=""
[ -n "${HISTORY_MAX:-}" ] && HISTORY_LINE="event_retention_max = $HISTORY_MAX"
# valgrind refuses a child's setrlimit(RLIMIT_NOFILE) that changes the hard limit (EPERM), which is how the sandbox caps
# the demo server's open files; under valgrind the cap is off (0), or the server would never start.
NOFILE_LINE=""
[ "$INSTRUCTIONS" = 1 ] && NOFILE_LINE="rlimit_nofile = 0"
SYSCALL_EVENTS=syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,context-switches
per_call() { [ -s "$1" ] && awk -F, -v n=$2 '/sys_enter|context/ { sub("syscalls:sys_enter_", "", $3); printf " %s=%.2f", $3, $1 / n }' "$1" || true; }
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
TOKEN=ab-token-0123456789 ITOK="ds_inst_$(sha demo)"
work=$(mktemp -d); pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null||true; done; rm -rf $work' EXIT
measure() {
  local bin=$1 data; data=$(mktemp -d -p $work)
  cat > $data/s.toml <<T
[satellite]
port = $PORT
$HISTORY_LINE
[sandbox]
allowed_commands = ["$bin"]
$NOFILE_LINE
[[teams]]
id = "bench"
[[users]]
id = "bench"
teams = ["bench"]
token_sha256 = ["$(sha $TOKEN)"]
[[servers]]
slug = "demo"
transport = "stdio"
command = "$bin"
args = ["demo-server", "--protocol", "legacy"]
[[installations]]
id = "i-demo"
team = "bench"
server = "demo"
request_logging = $LOGGING
[installations.users.bench]
instance_path = "bench-demo"
instance_token_sha256 = "$(sha $ITOK)"
T
  local under=()
  if [ "$INSTRUCTIONS" = 1 ]; then
    command -v valgrind >/dev/null || { echo "error: INSTRUCTIONS=1 needs valgrind (apt-get install valgrind)" >&2; exit 1; }
    under=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$data/callgrind.out)
  fi
  (cd $data && exec env -u LOG_LEVEL "${under[@]}" "$bin" serve --config $data/s.toml --data-dir $data > $data/log 2>&1) & local pid=$!
  pids+=($pid)
  local url=http://127.0.0.1:$PORT/i/bench-demo/mcp bearer=$ITOK
  [ "$ROUTE" != call ] && url=http://127.0.0.1:$PORT/mcp bearer=$TOKEN
  post() { curl -si $url -H "authorization: Bearer $bearer" -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' ${1:+-H "mcp-session-id: $1"} -d "$2"; }
  for _ in $(seq 1 1200); do curl -sf http://127.0.0.1:$PORT/readyz >/dev/null && break; sleep 0.1; done
  local INIT='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"wrk","version":"1"}}}'
  local CALL='{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"'$TEXT'"}}}'
  local EXPECT="\"text\":\"$TEXT\""
  if [ "$ROUTE" = mcp-list ]; then CALL='{"jsonrpc":"2.0","id":2,"method":"tools/list"}' EXPECT=discover_mcp_tools; fi
  if [ "$ROUTE" = mcp-init ]; then CALL=$INIT EXPECT=protocolVersion; fi
  local session=""
  for _ in $(seq 1 300); do session=$(post "" "$INIT" | tr -d '\r' | awk 'tolower($1) == "mcp-session-id:" {print $2}'); [ -n "$session" ] && break; sleep 0.1; done
  local answered="" with=$session
  [ "$ROUTE" = mcp-init ] && with=""
  for _ in $(seq 1 300); do post "$with" "$CALL" | grep -q "$EXPECT" && answered=1 && break; sleep 0.1; done
  # Measuring anything else (a call refused because the server never started) would be measuring the wrong path.
  [ -n "$answered" ] || { echo "error: $(basename $bin) never answered the call; its log: $data/log" >&2; tail -5 $data/log >&2; exit 1; }
  # What the start leaves running in the background (discovery, counting the tools' tokens, indexing) is not a
  # call's cost: wait until the satellite has been idle for a second (under valgrind that takes tens of seconds).
  local ticks idle=""
  for _ in $(seq 1 300); do
    ticks=$(awk '{print $14 + $15}' /proc/$pid/stat); sleep 1
    [ $(( $(awk '{print $14 + $15}' /proc/$pid/stat) - ticks )) -le 2 ] && idle=1 && break
  done
  [ -n "$idle" ] || { echo "error: $(basename $bin) never fell idle after its start" >&2; exit 1; }
  cat > $data/call.lua <<LUA
wrk.method = "POST"
wrk.body = '$CALL'
wrk.headers["content-type"] = "application/json"
wrk.headers["accept"] = "application/json, text/event-stream"
wrk.headers["authorization"] = "Bearer $bearer"
wrk.headers["mcp-session-id"] = "$session"
LUA
  # Each initialize makes a session of its own.
  [ "$ROUTE" = mcp-init ] && sed -i '/mcp-session-id/d' $data/call.lua
  wrk -t1 -c$C -d2s -s $data/call.lua $url >/dev/null
  local before after out requests
  before=$(awk '{print $14 + $15}' /proc/$pid/stat)
  local counter=""
  if [ "$SYSCALLS" = 1 ]; then
    perf stat -x, -e "$SYSCALL_EVENTS" -p $pid -o $data/syscalls & counter=$!
  fi
  if [ "$INSTRUCTIONS" = 1 ]; then callgrind_control -i on $pid >/dev/null 2>&1; fi
  out=$(wrk -t1 -c$C -d${SECS}s -s $data/call.lua $url)
  if [ "$INSTRUCTIONS" = 1 ]; then callgrind_control -i off $pid >/dev/null 2>&1; fi
  if [ -n "$counter" ]; then kill -INT $counter; wait $counter || true; fi
  after=$(awk '{print $14 + $15}' /proc/$pid/stat)
  requests=$(echo "$out" | awk '/requests in/ {print $1}')
  kill $pid; wait $pid 2>/dev/null || true
  local instructions=""
  if [ "$INSTRUCTIONS" = 1 ]; then
    # callgrind writes its counts when the satellite exits; `totals` is what it counted while switched on.
    instructions=$(awk -v n=$requests '/^totals:/ { printf " instructions/call=%.0f", $2 / n; exit }' $data/callgrind.out)
    # Kept for callgrind_annotate when asked (one file per binary; the last round's).
    if [ -n "${CALLGRIND_KEEP:-}" ]; then cp $data/callgrind.out "$CALLGRIND_KEEP.$(basename $bin)"; fi
  fi
  printf '%-16s c=%-3s text=%-6s logging=%-5s req/s=%-10s CPU us/call=%s %s\n' "$(basename $bin)" $C $TEXT_BYTES $LOGGING "$(echo "$out" | awk '/Requests\/sec/ {print $2}')" \
    "$(echo "($after - $before) * 1000000 / $(getconf CLK_TCK) / $requests" | bc -l | xargs printf '%.1f')" "$(echo "$out" | grep -i 'non-2xx' || true)$(per_call $data/syscalls $requests)$instructions"
}
for r in $(seq 1 $ROUNDS); do for b in "$@"; do measure $b; done; done | tee $work/rounds
# Per binary: the median over its rounds, and against the first binary the ratio of medians and the median of the
# rounds' own ratios (each round's binaries ran minutes apart at most, so that one is the less noisy).
echo "summary over $ROUNDS rounds (CPU us/call; ratio < 1 is less CPU than $(basename $1)):"
awk -v n=$# '
  { for (i = 1; i <= NF; i++) if ($i ~ /^us\/call=/) cpu[NR] = substr($i, 9) + 0; name[(NR - 1) % n] = $1 }
  function median(a, k,   i, j, t) {
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END {
    rounds = NR / n
    for (b = 0; b < n; b++) {
      delete own; delete ratio
      for (r = 0; r < rounds; r++) { own[r + 1] = cpu[r * n + b + 1]; ratio[r + 1] = cpu[r * n + b + 1] / cpu[r * n + 1] }
      m[b] = median(own, rounds)
      if (b == 0) printf "  %-16s median %.1f\n", name[b], m[b]
      else printf "  %-16s median %.1f  ratio of medians %.3f  median of round ratios %.3f\n", name[b], m[b], m[b] / m[0], median(ratio, rounds)
    }
  }' $work/rounds
