#!/usr/bin/env bash
# Speed of the float32 reference on SmolLM2-135M (issue 2 "Benchmark"), release build:
#   - whole-process time and peak RSS of `kvprobe ref generate --max-new 20` (best of 3),
#   - 128-token prefill and single-token decode (KV state) tokens/s (hidden `kvprobe ref bench`),
#   - beside it llama.cpp generating the same 20 tokens from the same weights dequantised to F32
#     (llama-cpp-python, if installed), and the time ratio.
# Usage: scripts/bench.sh [PROMPT]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
F32=.cache/models/smollm2-135m-instruct-f32.gguf
PROMPT="${1:-Once upon a time, in a small village by the sea, there lived an old fisherman who}"
RUNS=3

scripts/ensure-gnu-time.sh bench
scripts/fetch-model.sh >/dev/null
cargo build --release -q -p kvprobe
BIN=target/release/kvprobe
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# best wall seconds and its max RSS (MiB) over $RUNS runs of "$@"; stdout of the last run in $TMP/out
measure() {
    local best="" rss=""
    for _ in $(seq "$RUNS"); do
        /usr/bin/time -f '%e %M' -o "$TMP/time" "$@" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; return 1; }
        read -r wall kb <"$TMP/time"
        if [[ -z "$best" ]] || awk "BEGIN{exit !($wall < $best)}"; then best=$wall; rss=$((kb / 1024)); fi
    done
    echo "$best $rss"
}

IDS="$("$BIN" ref generate --model "$MODEL" --prompt "$PROMPT" --max-new 0 --json \
    | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))')"
echo "prompt: $PROMPT"
echo "prompt ids ($(echo "$IDS" | tr ',' '\n' | wc -l | tr -d ' ')): $IDS"

read -r ours_s ours_rss < <(measure "$BIN" ref generate --model "$MODEL" --prompt "$PROMPT" --max-new 20 --json)
ours_ids="$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$TMP/out")"
echo "kvprobe ref generate --max-new 20: ${ours_s} s whole process (best of $RUNS), peak RSS ${ours_rss} MiB"
echo "  generated ids: $ours_ids"

/usr/bin/time -f '%e %M' -o "$TMP/time" "$BIN" ref bench --model "$MODEL" --prefill 128 --decode 32 >"$TMP/bench"
read -r _ bench_kb <"$TMP/time"
sed 's/^/  /' "$TMP/bench"
echo "  peak RSS of the bench process: $((bench_kb / 1024)) MiB"

if python3 -c 'import llama_cpp, gguf' 2>/dev/null; then
    [[ -f "$F32" ]] || python3 scripts/make_f32_gguf.py "$MODEL" "$F32" >/dev/null
    read -r lc_s lc_rss < <(measure python3 scripts/llamacpp_reference.py generate --model "$F32" --ids "$IDS" --max-new 20)
    lc_ids="$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$TMP/out")"
    echo "llama.cpp (llama-cpp-python, F32 weights) same 20 tokens: ${lc_s} s whole process (best of $RUNS), peak RSS ${lc_rss} MiB"
    echo "  generated ids: $lc_ids"
    [[ "$lc_ids" == "$ours_ids" ]] && echo "  same tokens: yes" || echo "  same tokens: NO (the timing compares different work)"
    echo "ratio kvprobe / llama.cpp: $(awk "BEGIN{printf \"%.2f\", $ours_s / $lc_s}") (goal <= 1.5)"
else
    echo "SKIP llama.cpp comparison: llama-cpp-python and gguf not installed (python3 -m pip install llama-cpp-python gguf; builds ~10 min)"
fi
