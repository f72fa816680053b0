#!/usr/bin/env bash
# Healthy sweep (issue 18): fault-free diagnose runs over everyday prompts (1-64 tokens) on the
# HailoRT and the ANE emulators, SmolLM2 and the fixtures, every geometry class; prints the false
# alarms with their commands and a table per model × device × geometry class.
# Usage: scripts/sweep-healthy.sh [--seed N] [--smollm2 N] [--fixture N] [--onnx N] [--jobs N] [--list]
# Defaults: seed 18, 60 SmolLM2 and 45 fixture cases per device family, 2 jobs; --onnx N adds N
# cases per ONNX GenAI folder (SmolLM2 and the Llama fixture, default decoder and uint8 windowed
# cache) on the real ONNX Runtime, exported once (python3 with onnx).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
scripts/fetch-onnxruntime.sh >/dev/null
cargo build --release --quiet --features onnx --bin kvprobe
cargo build --release --quiet -p kvprobe-testkit --example healthy_sweep
exec target/release/examples/healthy_sweep "$@"
