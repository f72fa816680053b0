#!/usr/bin/env bash
# Issue 10, item "healthy runs stay healthy": SmolLM2 on the emulator, 3 prompts x 2 geometries,
# plain `diagnose` and `diagnose --stage-only` (only stale/causality/splits decide). Prints one
# line per run: verdict, stage, stray / leak / padding-row causality cells, stale's moved step.
# Usage: scripts/healthy-stage-check.sh            (release build; SmolLM2 fetched)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
scripts/fetch-model.sh >/dev/null
cargo build --release -q -p kvprobe
BIN=target/release/kvprobe
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PROMPTS=(
    "The capital of France is Paris. The capital of Italy is"
    "Once upon a time, a small robot lived in a quiet village by the sea. Every morning it"
    "def fibonacci(n):"
)
GEOMS=("64 16" "128 32")
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
bad=0
for g in "${GEOMS[@]}"; do
    read -r l p <<<"$g"
    for prompt in "${PROMPTS[@]}"; do
        for mode in "" "--stage-only"; do
            "$BIN" diagnose $mode --sim --model "$MODEL" --cache-len "$l" --prefill-len "$p" \
                --steps 16 --prompt "$prompt" --json >"$TMP/out.json" || [[ $? -eq 1 ]]
            line="$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1])); c = d["probes"].get("causality") or {}; s = d["probes"].get("stale") or {}
print(d["verdict"], d.get("stage"), "stray", c.get("stray_cells"), "leak", c.get("leak_cells"),
      "padding", c.get("padding_cells"), "stale-moved", s.get("first_moved_step"))' "$TMP/out.json")"
            echo "L$l P$p ${mode:-plain} \"${prompt:0:24}…\": $line"
            [[ "$line" == healthy* ]] || bad=$((bad + 1))
        done
    done
done
echo "not healthy: $bad of $((${#GEOMS[@]} * ${#PROMPTS[@]} * 2))"
