#!/usr/bin/env bash
# The case file scripts/behaviour-snapshot.sh runs: a subset of the seed-12 diagnosis sweep
# across every Hailo fault family (fixtures and SmolLM2) plus every ane-sim fault on the Llama
# fixture and SmolLM2. Prints one case a line (the arguments after `kvprobe`).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p kvprobe-testkit --example sweep
target/release/examples/sweep --list --seed 12 --fixture-faulty 84 --fixture-healthy 12 \
    --smollm2-faulty 14 --smollm2-healthy 4 | sed -E 's/^#[0-9]+ want [^:]+: kvprobe //'
fx=target/sweep-fixtures/llama-7
smol=.cache/models/smollm2-135m-instruct-q4_1.gguf
for f in "" ane-write-offset ane-state-layout ane-mask-01 ane-scale-after-qk ane-stale-state; do
    flt=${f:+--fault $f}
    echo "diagnose --device ane-sim --model $fx --max-ctx 96 --max-query 8 --ids 5,17,99,3,250,41,7,8,120,64,33,2,90 --steps 8 $flt"
    echo "diagnose --device ane-sim --model $smol --max-ctx 64 --max-query 16 --prompt 'The capital of France is Paris. The capital of Italy is' --steps 8 $flt"
done
