#!/usr/bin/env bash
# Exports SmolLM2-135M (the GGUF scripts/fetch-model.sh fetches) as an ONNX Runtime GenAI folder
# under .cache/onnx, once: a folder is kept while the GGUF, the exporter and the arguments are
# unchanged (a stamp of their sha256). The weights are the reference's own f32 tensors
# (npu/examples/onnx_weights.rs), the graph is written by scripts/export-onnx.py. Prints the
# folder on the last line.
#   scripts/export-onnx.sh [--max-length N]
#       convention (a), the default decoder (N default 2048) → .cache/onnx/smollm2-135m-genai
#   scripts/export-onnx.sh --window W [--max-length C] [--kv-dtype float32|uint8]
#       convention (b), the NPU-style windowed cache (C default 128, float32 default)
#       → .cache/onnx/smollm2-135m-genai-w<W>-c<C>[-u8]
#   ... --window W --static: also the static-shape prefill/decode graphs for QNN HTP (docs/qnn.md)
#       → .cache/onnx/smollm2-135m-genai-w<W>-c<C>[-u8]-static
#   ... --rmsnorm naive: RMSNorm's squares unscaled, which overflow fp16 on HTP (the regression
#       case of docs/qnn.md) → the same folder name with -naive-norm appended
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_LENGTH=""
WINDOW=""
KV=float32
STATIC=""
RMSNORM=scaled
while [ $# -gt 0 ]; do
    case "$1" in
        --max-length) MAX_LENGTH="$2"; shift 2 ;;
        --window) WINDOW="$2"; shift 2 ;;
        --kv-dtype) KV="$2"; shift 2 ;;
        --static) STATIC=1; shift ;;
        --rmsnorm) RMSNORM="$2"; shift 2 ;;
        *) echo "export-onnx.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
GGUF=.cache/models/smollm2-135m-instruct-q4_1.gguf
if [ -z "$WINDOW" ]; then
    MAX_LENGTH="${MAX_LENGTH:-2048}"
    OUT=.cache/onnx/smollm2-135m-genai
    EXTRA=()
else
    MAX_LENGTH="${MAX_LENGTH:-128}"
    OUT=.cache/onnx/smollm2-135m-genai-w$WINDOW-c$MAX_LENGTH
    if [ "$KV" = uint8 ]; then OUT="$OUT-u8"; fi
    EXTRA=(--window "$WINDOW" --kv-dtype "$KV")
    if [ -n "$STATIC" ]; then OUT="$OUT-static"; EXTRA+=(--static); fi
fi
case "$RMSNORM" in
    scaled) ;;
    naive) OUT="$OUT-naive-norm"; EXTRA+=(--rmsnorm naive) ;;
    *) echo "export-onnx.sh: --rmsnorm $RMSNORM: scaled or naive" >&2; exit 2 ;;
esac
if [ -n "$STATIC" ] && [ -z "$WINDOW" ]; then
    echo "export-onnx.sh: --static needs --window W (the static graphs fix the windowed graph's axes)" >&2
    exit 2
fi
if [ ! -f "$GGUF" ]; then
    echo "export-onnx.sh: $GGUF missing; run scripts/fetch-model.sh first" >&2
    exit 2
fi
python3 -c "import onnx" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check onnx >&2
stamp="$(cat "$GGUF.sha256" 2>/dev/null || sha256sum "$GGUF" | cut -d' ' -f1) $(cat scripts/export-onnx.py scripts/np_reference.py npu/examples/onnx_weights.rs | sha256sum | cut -d' ' -f1) $MAX_LENGTH ${EXTRA[*]:-}"
if [ -f "$OUT/.kvprobe-stamp" ] && [ "$(cat "$OUT/.kvprobe-stamp")" = "$stamp" ]; then
    echo "$(pwd)/$OUT"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cargo run -q -p kvprobe-npu --example onnx_weights -- "$GGUF" "$tmp/hf" >&2
mkdir -p .cache/onnx
python3 scripts/export-onnx.py "$tmp/hf" "$OUT" --max-length "$MAX_LENGTH" ${EXTRA[@]+"${EXTRA[@]}"} >&2
echo "$stamp" > "$OUT/.kvprobe-stamp"
echo "$(pwd)/$OUT"
