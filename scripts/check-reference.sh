#!/usr/bin/env bash
# Independent check of kvprobe's float32 reference on SmolLM2 (issue 2 "Checks you should build").
#
# Runs `kvprobe ref logits` and independent implementations on the same token ids and prints, per
# position, the cosine of the logits and whether the top-1 token agrees:
#   1. scripts/np_reference.py: numpy (float64) from the GGUF spec, llama.cpp-style RoPE on the raw
#      permuted q/k rows: causal, and with --single-key K.
#   2. llama.cpp (llama-cpp-python) on the weights dequantised to F32, causal only, if installed.
# Target: min cosine >= 0.99999 and 100 % top-1. Exits non-zero when a comparison misses it.
#
# Usage: scripts/check-reference.sh [PROMPT] [K]     (defaults: a 15-token chat prompt, K=3)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
F32=.cache/models/smollm2-135m-instruct-f32.gguf
PROMPT="${1:-$'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant'}"
K="${2:-3}"
MIN_COS=0.99999

command -v python3 >/dev/null || { echo "check-reference: python3 is required" >&2; exit 2; }
python3 -c 'import numpy' 2>/dev/null || { echo "check-reference: numpy is required (python3 -m pip install numpy)" >&2; exit 2; }
scripts/fetch-model.sh >/dev/null
cargo build --release -q -p kvprobe
BIN=target/release/kvprobe
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

IDS="$("$BIN" ref generate --model "$MODEL" --prompt "$PROMPT" --max-new 0 --json \
    | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))')"
N="$(echo "$IDS" | tr ',' '\n' | wc -l | tr -d ' ')"
echo "prompt: $(printf '%q' "$PROMPT")"
echo "ids ($N tokens): $IDS"
status=0

"$BIN" ref logits --model "$MODEL" --ids "$IDS" --out "$TMP/ours.npy"
"$BIN" ref logits --model "$MODEL" --ids "$IDS" --single-key "$K" --out "$TMP/ours_sk.npy"

echo "== kvprobe vs numpy reference (causal)"
python3 scripts/np_reference.py logits --model "$MODEL" --ids "$IDS" --out "$TMP/np.npy"
python3 scripts/np_reference.py compare "$TMP/ours.npy" "$TMP/np.npy" --label causal --min-cos "$MIN_COS" || status=1

echo "== kvprobe vs numpy reference (--single-key $K)"
python3 scripts/np_reference.py logits --model "$MODEL" --ids "$IDS" --single-key "$K" --out "$TMP/np_sk.npy"
python3 scripts/np_reference.py compare "$TMP/ours_sk.npy" "$TMP/np_sk.npy" --label "single-key $K" --min-cos "$MIN_COS" || status=1

echo "== kvprobe vs llama.cpp on F32-dequantised weights (causal)"
if python3 -c 'import llama_cpp, gguf' 2>/dev/null; then
    [[ -f "$F32" ]] || python3 scripts/make_f32_gguf.py "$MODEL" "$F32"
    python3 scripts/llamacpp_reference.py logits --model "$F32" --ids "$IDS" --out "$TMP/lc.npy"
    python3 scripts/np_reference.py compare "$TMP/ours.npy" "$TMP/lc.npy" --label llama.cpp --min-cos "$MIN_COS" || status=1
else
    echo "SKIP: llama-cpp-python and gguf not installed (python3 -m pip install llama-cpp-python gguf; builds ~10 min)"
fi

if [[ $status -eq 0 ]]; then echo "check-reference: PASS"; else echo "check-reference: FAIL" >&2; fi
exit $status
