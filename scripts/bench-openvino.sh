#!/usr/bin/env bash
# Wall time and peak RSS of `kvprobe diagnose --openvino` on SmolLM2 (issue 37), on DEVICE=NPU
# (default: the NPU plugin's NPUW pipeline with its partitions on the CPU) or DEVICE=CPU. Prints
# each run, the median of RUNS (default 3) and the largest peak RSS. Extra arguments go to
# diagnose. PROFILE=dev uses the dev-profile binary (optimised too) instead of a release build;
# BIN=PATH times that binary instead of building one (two builds compared under the same load).
# Needs GNU time (scripts/ensure-gnu-time.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
RUNS=${RUNS:-3}
DEVICE=${DEVICE:-NPU}
PROFILE=${PROFILE:-release}
[ -f "$MODEL" ] || scripts/fetch-model.sh
scripts/fetch-openvino.sh >/dev/null
DIR="$(scripts/export-openvino.sh | tail -1)"
scripts/ensure-gnu-time.sh bench-openvino >/dev/null
if [ -n "${BIN:-}" ]; then
  :
elif [ "$PROFILE" = dev ]; then
  cargo build --quiet --features openvino --bin kvprobe
  BIN=./target/debug/kvprobe
else
  cargo build --release --quiet --features openvino
  BIN=./target/release/kvprobe
fi
. scripts/lib/timed-runs.sh
timed_runs "$RUNS" "$BIN" diagnose --openvino "$DIR" --ov-device "$DEVICE" --model "$MODEL" "$@"
