#!/usr/bin/env bash
# Full randomised diagnosis sweep (issue 12): seeded fault × scope × value × geometry × prompt
# cases on the fixtures and SmolLM2, run through the release binary. Prints the confusion
# matrix, accuracy, false alarms and every miss with the command that reproduces it.
# Usage: scripts/sweep-diagnose.sh [--seed N] [--fixture-faulty N] [--fixture-healthy N]
#        [--smollm2-faulty N] [--smollm2-healthy N] [--jobs N] [--out FILE] [--family NAME]...
# Defaults: seed 12, 240 + 80 faulty, 45 + 20 healthy, 2 jobs (SmolLM2 ≈ 8 s a case).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
scripts/fetch-onnxruntime.sh >/dev/null
cargo build --release --quiet --features onnx --bin kvprobe
cargo build --release --quiet -p kvprobe-testkit --example sweep
exec target/release/examples/sweep "$@"
