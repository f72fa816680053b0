#!/usr/bin/env bash
# Healthy sweep (issue 18): fault-free diagnose runs over everyday prompts (1-64 tokens) on the
# HailoRT and the ANE emulators, SmolLM2 and the fixtures, every geometry class; prints the false
# alarms with their commands and a table per model × device × geometry class.
# Usage: scripts/sweep-healthy.sh [--seed N] [--smollm2 N] [--fixture N] [--jobs N] [--list]
# Defaults: seed 18, 60 SmolLM2 and 45 fixture cases per device family, 2 jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh >/dev/null
cargo build --release --quiet --bin kvprobe
cargo build --release --quiet -p kvprobe-testkit --example healthy_sweep
exec target/release/examples/healthy_sweep "$@"
