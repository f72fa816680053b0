#!/usr/bin/env bash
# Wall time and peak RSS of `kvprobe diagnose --onnx` on SmolLM2 (CPU execution provider), 32
# steps (issue 22). Prints each run, the median of RUNS (default 3) and the largest peak RSS.
#   CONVENTION=b (default): the NPU style, GenAI's windowed cache: window 16, cache / context 128,
#     KV=uint8 (default, QDQ cache I/O) or KV=float32
#   CONVENTION=a: the default decoder (dynamic past/present, fp32), --max-ctx 128
#   CONVENTION=builder PRECISION=fp32|int4|fp16: onnxruntime-genai's own model builder export
#     (scripts/export-builder.sh smollm2 PRECISION; GroupQueryAttention, shared buffer), --max-ctx 128
# Extra arguments go to diagnose (e.g. --ep qnn --ep-option backend_path=QnnHtp.dll).
# PROFILE=dev uses the dev-profile binary (optimised too, see Cargo.toml) instead of a release
# build; KVPROBE_BIN names a binary already built (e.g. with --features onnx,openvino) and skips
# the build. Needs GNU time (scripts/ensure-gnu-time.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
RUNS=${RUNS:-3}
KV=${KV:-uint8}
CONVENTION=${CONVENTION:-b}
PROFILE=${PROFILE:-release}
[ -f "$MODEL" ] || scripts/fetch-model.sh
scripts/fetch-onnxruntime.sh >/dev/null
if [ "$CONVENTION" = a ]; then
  DIR="$(scripts/export-onnx.sh | tail -1)"
  EXTRA=(--max-ctx 128)
elif [ "$CONVENTION" = builder ]; then
  DIR="$(scripts/export-builder.sh smollm2 "${PRECISION:-fp32}" | tail -1)"
  EXTRA=(--max-ctx 128)
else
  DIR="$(scripts/export-onnx.sh --window 16 --max-length 128 --kv-dtype "$KV" | tail -1)"
  EXTRA=()
fi
scripts/ensure-gnu-time.sh bench-onnx >/dev/null
if [ -n "${KVPROBE_BIN:-}" ]; then
  BIN="$KVPROBE_BIN"
elif [ "$PROFILE" = dev ]; then
  cargo build --quiet --features onnx --bin kvprobe
  BIN=./target/debug/kvprobe
else
  cargo build --release --quiet --features onnx
  BIN=./target/release/kvprobe
fi
. scripts/lib/timed-runs.sh
timed_runs "$RUNS" "$BIN" diagnose --onnx "$DIR" --model "$MODEL" \
    --steps 32 ${EXTRA[@]+"${EXTRA[@]}"} "$@"
