#!/usr/bin/env bash
# Exports a Llama model with onnxruntime-genai's own model builder (issue 35): the folder a GenAI
# user has (GroupQueryAttention, shared KV buffer, positions implied by the mask, int4 / fp16
# weights), to run under `kvprobe --onnx`.
#   scripts/export-builder.sh tiny PRECISION...     # the tests' random Llama (reference fixture, seed 13)
#   scripts/export-builder.sh smollm2 PRECISION...  # SmolLM2 from the fetched GGUF (local measurements)
# PRECISION: fp32 | fp16 | bf16 | int4 (the builder's -p, execution provider cpu). Writes
# .cache/builder/<model>-<precision> and prints each on a line, once: a folder is kept while the
# pinned versions, the arguments and the input are unchanged (a stamp).
#
# The builder imports torch: installed with its dependencies, pinned, into .cache/builder/py
# (2.8 GB of wheels, 5.6 GB installed; scripts/lib/builder-torch.sh says why). With
# KVPROBE_BUILDER_DROP=1 (CI) that folder is removed after the export; the exported folders stay.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/export-builder.sh tiny|smollm2 fp32|fp16|bf16|int4..." >&2; exit 2; }
MODEL="${1:-}"
[ $# -ge 2 ] || usage
shift
case "$MODEL" in tiny|smollm2) ;; *) usage ;; esac
for p in "$@"; do case "$p" in fp32|fp16|bf16|int4) ;; *) usage ;; esac; done
# the builder ships inside this wheel (.ci/run installs it)
GENAI=onnxruntime-genai==0.18.0
. scripts/lib/builder-torch.sh
PINS=("${BUILDER_TORCH_PINS[@]}")
PY=$BUILDER_TORCH_PY
GGUF=.cache/models/smollm2-135m-instruct-q4_1.gguf
have_genai="$(python3 -c 'import importlib.metadata as m; print(m.version("onnxruntime-genai"))' 2>/dev/null || true)"
if [ "onnxruntime-genai==$have_genai" != "$GENAI" ]; then
    echo "export-builder.sh: needs $GENAI (found '${have_genai:-none}'): python3 -m pip install $GENAI" >&2
    exit 2
fi
case "$MODEL" in
    tiny) input="fixture tiny-llama seed 13 $(sha256sum reference/src/fixtures.rs | cut -d' ' -f1)" ;;
    smollm2)
        if [ ! -f "$GGUF" ]; then echo "export-builder.sh: $GGUF missing; run scripts/fetch-model.sh first" >&2; exit 2; fi
        input="$(cat "$GGUF.sha256" 2>/dev/null || sha256sum "$GGUF" | cut -d' ' -f1) $(sha256sum npu/src/onnx/export.rs | cut -d' ' -f1)" ;;
esac
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for PREC in "$@"; do
    OUT=.cache/builder/$MODEL-$PREC
    stamp="$GENAI ${PINS[*]} $MODEL $PREC cpu $input"
    if [ -f "$OUT/.kvprobe-stamp" ] && [ "$(cat "$OUT/.kvprobe-stamp")" = "$stamp" ]; then
        echo "$(pwd)/$OUT"
        continue
    fi
    builder_torch_env
    if [ ! -d "$tmp/hf" ]; then
        # the example built with the workspace's features (the tests' build), not -p's own set
        cargo build -q --workspace --features onnx --example onnx_weights >&2
        case "$MODEL" in
            tiny) target/debug/examples/onnx_weights --tiny-llama 13 "$tmp/hf" >&2 ;;
            smollm2) target/debug/examples/onnx_weights "$GGUF" "$tmp/hf" >&2 ;;
        esac
    fi
    t1=$SECONDS
    # the environment's packages first (torch, transformers, onnx_ir and their pins), the
    # system's onnxruntime-genai (the builder) after
    rm -rf "$tmp/out"
    PYTHONPATH="$(realpath "$PY")" python3 -m onnxruntime_genai.models.builder \
        -i "$tmp/hf" -o "$tmp/out" -p "$PREC" -e cpu -c "$tmp/cache" >&2
    rm -rf "$OUT"
    mkdir -p .cache/builder
    mv "$tmp/out" "$OUT"
    echo "$stamp" > "$OUT/.kvprobe-stamp"
    echo "export-builder.sh: $MODEL $PREC exported in $((SECONDS - t1)) s" >&2
    echo "$(pwd)/$OUT"
done
if [ "${KVPROBE_BUILDER_DROP:-0}" = 1 ] && [ -z "${KVPROBE_TORCH_PY:-}" ]; then rm -rf "$PY"; fi
