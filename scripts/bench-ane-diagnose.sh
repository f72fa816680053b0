#!/usr/bin/env bash
# Wall time of `kvprobe diagnose --device ane-sim` on SmolLM2, max_ctx 128, 32 steps (issue 9
# target: <= 15 s median of 3 on 2 cores). Prints each run and the median.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
RUNS=${RUNS:-3}
[ -f "$MODEL" ] || scripts/fetch-model.sh
# KVPROBE_BIN: time an already built binary
BIN="${KVPROBE_BIN:-}"
if [[ -z "$BIN" ]]; then cargo build --release --quiet; BIN=./target/release/kvprobe; fi
times=()
for i in $(seq "$RUNS"); do
  start=$(date +%s.%N)
  "$BIN" diagnose --device ane-sim --model "$MODEL" --max-ctx 128 --steps 32 "$@" >/dev/null || true
  end=$(date +%s.%N)
  t=$(echo "$end - $start" | bc -l)
  times+=("$t")
  printf 'run %d: %.2f s\n' "$i" "$t"
done
printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {printf "median of %d: %.2f s\n", NR, a[int((NR+1)/2)]}'
