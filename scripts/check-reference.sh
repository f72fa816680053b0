#!/usr/bin/env bash
# Independent check of kvprobe's float32 reference on SmolLM2 (issue 2 "Checks you should build").
#
# Runs `kvprobe ref logits` and independent implementations on the same token ids and prints, per
# position, the cosine of the logits and whether the top-1 token agrees:
#   1. scripts/np_reference.py: numpy (float64) from the GGUF spec, llama.cpp-style RoPE on the raw
#      permuted q/k rows: causal, and with --single-key K.
#   2. llama.cpp (llama-cpp-python) on the weights dequantised to F32, causal only, if installed.
# Then the same checks per architecture of issue 21 (Qwen2, Qwen3, Llama-3 with rope_scaling
# llama3), on seeded random-weight fixtures (no package ships those weights; docs/reference.md),
# each as a Hugging Face folder and as a GGUF file: numpy causal + single-key logits, 20 greedy ids
# against numpy, and llama.cpp on the GGUF when it is installed.
# Target: min cosine >= 0.99999 and 100 % top-1. Exits non-zero when a comparison misses it.
#
# Usage: scripts/check-reference.sh [PROMPT] [K]     (defaults: a 15-token chat prompt, K=3)
#   ARCH_GEOMETRY=real  runs the architecture part at the real geometries (Qwen2.5-0.5B,
#                       Qwen3-0.6B, Llama-3.2-1B; bf16 HF folders, f16 GGUF; several GB, minutes)
#   ARCHS="qwen2 qwen3 llama3"  the architectures to check (default: all three)
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

# ---- architectures (issue 21) on seeded fixtures ----------------------------------------------
cargo build --release -q -p kvprobe-reference --example write_fixture
WRITE=target/release/examples/write_fixture
ARCH_PROMPT="The capital of France is Paris, and 12345 is a number"
for arch in ${ARCHS:-qwen2 qwen3 llama3}; do
    case "${ARCH_GEOMETRY:-tiny}:$arch" in
        tiny:*) name="tiny-$arch"; hf_dtype=f32; gguf_dtype=f32; np_dtype=float64 ;;
        real:qwen2) name=qwen2.5-0.5b; hf_dtype=bf16; gguf_dtype=f16; np_dtype=float64 ;;
        real:qwen3) name=qwen3-0.6b; hf_dtype=bf16; gguf_dtype=f16; np_dtype=float64 ;;
        # numpy in float32: a float64 copy of 1.2 B weights does not fit beside the rest
        real:llama3) name=llama3.2-1b; hf_dtype=bf16; gguf_dtype=f16; np_dtype=float32 ;;
        *) echo "check-reference: unknown ARCHS entry $arch (qwen2, qwen3, llama3)" >&2; exit 2 ;;
    esac
    "$WRITE" "$name" hf "$hf_dtype" "$TMP/$name-hf" >/dev/null
    "$WRITE" "$name" gguf "$gguf_dtype" "$TMP/$name.gguf" >/dev/null
    for m in "$TMP/$name-hf" "$TMP/$name.gguf"; do
        label="$name $(basename "$m" | sed 's/.*\.gguf$/GGUF/; s/.*-hf$/HF/')"
        gen="$("$BIN" ref generate --model "$m" --prompt "$ARCH_PROMPT" --max-new 20 --json)"
        ids="$(echo "$gen" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))')"
        ours_gen="$(echo "$gen" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["generated_ids"])))')"
        n="$(echo "$ids" | tr ',' '\n' | wc -l | tr -d ' ')"
        echo "== $label: kvprobe vs numpy reference ($n prompt tokens)"
        "$BIN" ref logits --model "$m" --ids "$ids" --out "$TMP/a.npy"
        "$BIN" ref logits --model "$m" --ids "$ids" --single-key "$K" --out "$TMP/a_sk.npy"
        python3 scripts/np_reference.py logits --model "$m" --ids "$ids" --dtype "$np_dtype" --out "$TMP/b.npy"
        python3 scripts/np_reference.py logits --model "$m" --ids "$ids" --single-key "$K" --dtype "$np_dtype" --out "$TMP/b_sk.npy"
        python3 scripts/np_reference.py compare "$TMP/a.npy" "$TMP/b.npy" --label "$label causal" --min-cos "$MIN_COS" | tail -1 || status=1
        python3 scripts/np_reference.py compare "$TMP/a_sk.npy" "$TMP/b_sk.npy" --label "$label single-key $K" --min-cos "$MIN_COS" | tail -1 || status=1
        np_gen="$(python3 scripts/np_reference.py greedy --model "$m" --ids "$ids" --max-new 20 --dtype "$np_dtype" \
            | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["generated_ids"])))')"
        # ours stops at EOS; numpy does not: ours must be a prefix of numpy's 20
        if [[ ",$np_gen," == ",$ours_gen,"* ]]; then
            echo "[$label] greedy ids equal ($(echo "$ours_gen" | tr ',' '\n' | wc -l | tr -d ' ') tokens): $ours_gen"
        else
            echo "[$label] FAIL greedy ids differ: ours $ours_gen numpy $np_gen" >&2; status=1
        fi
        if [[ "$m" == *.gguf ]] && python3 -c 'import llama_cpp' 2>/dev/null; then
            [[ "$gguf_dtype" == f32 ]] || continue
            python3 scripts/llamacpp_reference.py logits --model "$m" --ids "$ids" --out "$TMP/c.npy"
            python3 scripts/np_reference.py compare "$TMP/a.npy" "$TMP/c.npy" --label "$label llama.cpp" --min-cos "$MIN_COS" | tail -1 || status=1
            lc_gen="$(python3 scripts/llamacpp_reference.py generate --model "$m" --ids "$ids" --max-new 20 \
                | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["generated_ids"])))')"
            if [[ ",$lc_gen," == ",$ours_gen,"* ]]; then
                echo "[$label llama.cpp] greedy ids equal"
            else
                echo "[$label llama.cpp] FAIL greedy ids differ: ours $ours_gen llama.cpp $lc_gen" >&2; status=1
            fi
        fi
    done
done

if [[ $status -eq 0 ]]; then echo "check-reference: PASS"; else echo "check-reference: FAIL" >&2; fi
exit $status
