#!/usr/bin/env bash
# `diagnose --onnx` on SmolLM2's default-decoder export (convention (a)), max_ctx 128, 32 steps:
# scripts/bench-onnx.sh with CONVENTION=a (median of RUNS, peak RSS).
exec env CONVENTION=a "$(dirname "$0")/bench-onnx.sh" "$@"
