#!/usr/bin/env bash
# Exports SmolLM2-135M (the GGUF scripts/fetch-model.sh fetches) as an ONNX Runtime GenAI folder,
# convention (a) (default decoder, fp32), into .cache/onnx/smollm2-135m-genai, once: the folder
# is kept while the GGUF and the exporter are unchanged (a stamp of their sha256). The weights
# are the reference's own f32 tensors (npu/examples/onnx_weights.rs), the graph is written by
# scripts/export-onnx.py. Prints the folder on the last line.
#   scripts/export-onnx.sh [--max-length N]   (default 2048: context_length / search.max_length)
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_LENGTH=2048
if [ "${1:-}" = "--max-length" ]; then MAX_LENGTH="$2"; fi
GGUF=.cache/models/smollm2-135m-instruct-q4_1.gguf
OUT=.cache/onnx/smollm2-135m-genai
if [ ! -f "$GGUF" ]; then
    echo "export-onnx.sh: $GGUF missing; run scripts/fetch-model.sh first" >&2
    exit 2
fi
python3 -c "import onnx" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check onnx >&2
stamp="$(cat "$GGUF.sha256" 2>/dev/null || sha256sum "$GGUF" | cut -d' ' -f1) $(cat scripts/export-onnx.py scripts/np_reference.py npu/examples/onnx_weights.rs | sha256sum | cut -d' ' -f1) $MAX_LENGTH"
if [ -f "$OUT/.kvprobe-stamp" ] && [ "$(cat "$OUT/.kvprobe-stamp")" = "$stamp" ]; then
    echo "$(pwd)/$OUT"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cargo run -q -p kvprobe-npu --example onnx_weights -- "$GGUF" "$tmp/hf" >&2
mkdir -p .cache/onnx
python3 scripts/export-onnx.py "$tmp/hf" "$OUT" --max-length "$MAX_LENGTH" >&2
echo "$stamp" > "$OUT/.kvprobe-stamp"
echo "$(pwd)/$OUT"
