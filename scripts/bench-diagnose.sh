#!/usr/bin/env bash
# diagnose on SmolLM2 (L=128, P=32, 32 steps) on the emulator: wall time and peak RSS, and the
# colmap reference side by KV reuse against a full forward per prompt position.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin kvprobe >/dev/null
cargo build --release --example colmap_bench -p kvprobe-probes >/dev/null
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
PROMPT="The quick brown fox jumps over the lazy dog. It was a sunny day and the children were playing in the park near the river."
/usr/bin/time -v ./target/release/kvprobe diagnose --sim --model "$MODEL" --cache-len 128 --prefill-len 32 --steps 32 \
  --prompt "$PROMPT" 2>/tmp/kvprobe-bench-time.txt | head -3
grep -E "Elapsed \(wall|Maximum resident" /tmp/kvprobe-bench-time.txt
./target/release/examples/colmap_bench "$MODEL"
