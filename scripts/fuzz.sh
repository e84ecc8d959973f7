#!/usr/bin/env bash
# Runs every fuzz target for a fixed number of executions and keeps what it finds.
#
#   bash scripts/fuzz.sh            # 10^6 executions per target (the benchmark figure)
#   RUNS=20000 bash scripts/fuzz.sh # a short run
#   TARGETS="sse names" bash scripts/fuzz.sh
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain; with only stable it sets
# RUSTC_BOOTSTRAP=1 and fuzzes without a sanitizer. Each target starts from fuzz/seeds/<target> plus a scratch
# corpus under fuzz/corpus (not committed). Any crash is copied to fuzz/regressions/<target>/, which
# tests/fuzz_regressions.rs replays on every `cargo test`: commit it with the fix. Prints one line per target:
# executions, wall time, executions per second, corpus size, crashes kept.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
RUNS=${RUNS:-1000000}
TARGETS=${TARGETS:-"jsonrpc sse stdio_lines config names query masking"}
MAX_LEN=${MAX_LEN:-4096}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
  exit 2
fi
if rustup run nightly rustc --version >/dev/null 2>&1; then
  toolchain=(+nightly)
  sanitizer=${SANITIZER:-address}
else
  toolchain=()
  sanitizer=none
  export RUSTC_BOOTSTRAP=1
fi

cargo "${toolchain[@]}" fuzz build -O -s "$sanitizer" >/dev/null || exit 1

status=0
printf '%-12s %10s %9s %12s %8s %8s\n' target runs seconds execs/s corpus crashes
for target in $TARGETS; do
  mkdir -p "corpus/$target" "regressions/$target" "artifacts/$target"
  start=$(date +%s.%N)
  log=$(mktemp)
  cargo "${toolchain[@]}" fuzz run -O -s "$sanitizer" "$target" "corpus/$target" "seeds/$target" -- \
    -runs="$RUNS" -max_len="$MAX_LEN" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  crashes=0
  for artifact in artifacts/"$target"/*; do
    [ -f "$artifact" ] || continue
    cp "$artifact" "regressions/$target/"
    rm "$artifact"
    crashes=$((crashes + 1))
  done
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  corpus=$(ls "corpus/$target" | wc -l)
  seconds=$(echo "$end - $start" | bc)
  rate=$(echo "${runs:-0} / $seconds" | bc)
  printf '%-12s %10s %9.1f %12s %8s %8s\n' "$target" "${runs:-?}" "$seconds" "$rate" "$corpus" "$crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status=1
    grep -E 'panicked|ERROR|SUMMARY' "$log" | head -5 >&2
  fi
  rm -f "$log"
done
exit $status
