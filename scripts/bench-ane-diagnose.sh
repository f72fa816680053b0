#!/usr/bin/env bash
# Wall time of `kvprobe diagnose --device ane-sim` on SmolLM2, max_ctx 128, 32 steps (issue 9
# target: <= 15 s median of 3 on 2 cores). Prints each run, the median and the peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
RUNS=${RUNS:-3}
[ -f "$MODEL" ] || scripts/fetch-model.sh
# KVPROBE_BIN: time an already built binary
BIN="${KVPROBE_BIN:-}"
if [[ -z "$BIN" ]]; then cargo build --release --quiet; BIN=./target/release/kvprobe; fi
scripts/ensure-gnu-time.sh bench-ane-diagnose >/dev/null
. scripts/lib/timed-runs.sh
timed_runs "$RUNS" "$BIN" diagnose --device ane-sim --model "$MODEL" --max-ctx 128 --steps 32 "$@"
