#!/usr/bin/env bash
# Fault-free `diagnose --onnx` over 32 everyday prompts on one or more ONNX folders (issues 35 and
# 36: the builder's fp32 / int4 SmolLM2 exports, the static export on QNN HTP): one line per
# prompt (verdict, confidence, wall seconds), then per folder the number of false alarms (any
# verdict but healthy) with the command that reproduces each.
# Usage: scripts/sweep-onnx-prompts.sh [--first N] [--steps S] [--] FOLDER [FOLDER ...] [-- EXTRA ARGS]
#   e.g. scripts/sweep-onnx-prompts.sh .cache/builder/smollm2-fp32 .cache/builder/smollm2-int4
#        scripts/sweep-onnx-prompts.sh --first 5 .cache/onnx/smollm2-135m-genai-w16-c128-static -- --ep qnn
# KVPROBE_BIN picks the binary (default: target/release/kvprobe, built with --features onnx).
set -euo pipefail
cd "$(dirname "$0")/.."
FIRST=32
STEPS=16
FOLDERS=()
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --first) FIRST="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) FOLDERS+=("$1"); shift ;;
    esac
done
if [ ${#FOLDERS[@]} -eq 0 ]; then
    echo "sweep-onnx-prompts.sh: name at least one ONNX folder (see the header of this script)" >&2
    exit 2
fi
BIN="${KVPROBE_BIN:-target/release/kvprobe}"
if [ -z "${KVPROBE_BIN:-}" ]; then
    cargo build --release --quiet --features onnx --bin kvprobe
fi
PROMPTS=(
    "Once upon a time"
    "The capital of France is"
    "How do I boil an egg?"
    "Write a short poem about the sea."
    "What is the weather like today?"
    "Explain photosynthesis in simple words."
    "My favourite food is"
    "Tell me a joke about cats."
    "The quick brown fox jumps over the lazy dog."
    "Can you recommend a good book?"
    "How many legs does a spider have?"
    "Translate 'good morning' into Spanish."
    "What time is it in Tokyo?"
    "I went to the market and bought"
    "Summarise the plot of Cinderella."
    "Why is the sky blue?"
    "Give me three tips for better sleep."
    "The meeting is scheduled for"
    "What is two plus two?"
    "Describe a sunset over the mountains."
    "Hello, how are you?"
    "List the days of the week."
    "In 1969, astronauts landed on"
    "A recipe for pancakes needs"
    "What does a computer do?"
    "Dear team, thank you for"
    "The best way to learn a language is"
    "Where do penguins live?"
    "Please write an email asking for a day off."
    "Water boils at"
    "My dog likes to"
    "What is the largest planet in the solar system?"
)
for dir in "${FOLDERS[@]}"; do
    alarms=0
    n=0
    echo "== $dir"
    for p in "${PROMPTS[@]:0:$FIRST}"; do
        n=$((n + 1))
        start=$(date +%s.%N)
        set +e
        out=$("$BIN" diagnose --onnx "$dir" --max-ctx 128 --steps "$STEPS" --prompt "$p" --json ${EXTRA[@]+"${EXTRA[@]}"} 2>/dev/null)
        code=$?
        set -e
        wall=$(echo "$(date +%s.%N) - $start" | bc)
        verdict=$(printf '%s' "$out" | python3 -c 'import json,sys
try:
    d = json.load(sys.stdin); print(d["verdict"], d["confidence"])
except Exception:
    print("error -")')
        printf '%-50s %-22s exit %d  %.1f s\n' "\"$p\"" "$verdict" "$code" "$wall"
        case "$verdict" in
            healthy*) ;;
            *) alarms=$((alarms + 1))
               echo "   false alarm: $BIN diagnose --onnx $dir --max-ctx 128 --steps $STEPS --prompt \"$p\" ${EXTRA[*]:-}" ;;
        esac
    done
    echo "$dir: $alarms false alarm(s) over $n prompts"
done
