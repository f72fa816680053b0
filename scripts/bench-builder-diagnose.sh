#!/usr/bin/env bash
# `diagnose --onnx` on onnxruntime-genai's model builder exports of SmolLM2 (issue 35), fp32 and
# int4, --max-ctx 128, 32 steps: scripts/bench-onnx.sh with CONVENTION=builder (median of RUNS,
# peak RSS). Goal: <= 15 s median on 2 cores.
set -euo pipefail
for p in ${PRECISIONS:-fp32 int4}; do
  echo "== builder $p"
  env CONVENTION=builder PRECISION="$p" "$(dirname "$0")/bench-onnx.sh" "$@"
done
