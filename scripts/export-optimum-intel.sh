#!/usr/bin/env bash
# Exports SmolLM2 with Intel's own exporter, optimum-intel (issue 37: "IRs from the vendor's
# exporter where it installs"): the stateful IR an OpenVINO user has, to run under
# `kvprobe --openvino`, beside the torch-free IR of scripts/export-openvino.sh.
#   scripts/export-optimum-intel.sh [OUT]   # default .cache/openvino-ir/smollm2-135m-optimum
# Prints OUT. Kept while the pins and the input are unchanged (a stamp).
#
# optimum-intel exports through torch (it traces the Hugging Face model), so this script needs
# the pinned torch environment of scripts/export-builder.sh (.cache/builder/py, 5.6 GB; installed
# here if absent, scripts/lib/builder-torch.sh). optimum-intel's own packages go, without their
# dependencies (pip's resolver would replace the torch stack), into .cache/optimum-intel/py
# (155 MB), which comes first on PYTHONPATH: its transformers 5.5 is the one optimum-intel 2.2
# accepts. The system's openvino 2026.4.1 does the conversion. Weights: f32, no compression
# (load_in_8bit=False; optimum-intel compresses models over 1B parameters to int8 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/builder-torch.sh
OUT="${1:-.cache/openvino-ir/smollm2-135m-optimum}"
# exact versions (the ones the measured export ran with): optimum-intel 2.2.0 asks
# transformers < 5.6 and huggingface-hub < 1.22, whose client needs httpx
PINS=(optimum-intel==2.2.0 optimum==2.3.0 transformers==5.5.4 huggingface-hub==1.21.0
      torchvision==0.29.2 openvino-tokenizers==2026.4.1.0 httpx==0.29.0 httpcore==1.0.9
      certifi==2026.10.19.post1 idna==3.20 sniffio==1.3.1 tokenizers==0.22.2)
PY=.cache/optimum-intel/py
GGUF=.cache/models/smollm2-135m-instruct-q4_1.gguf
have_ov="$(python3 -c 'import openvino; print(openvino.__version__)' 2>/dev/null || true)"
case "$have_ov" in
    2026.4.1*) ;;
    *) echo "export-optimum-intel.sh: needs openvino 2026.4.1 in python3 (found '${have_ov:-none}'): python3 -m pip install openvino==2026.4.1" >&2; exit 2 ;;
esac
if [ ! -f "$GGUF" ]; then echo "export-optimum-intel.sh: $GGUF missing; run scripts/fetch-model.sh first" >&2; exit 2; fi
input="$(cat "$GGUF.sha256" 2>/dev/null || sha256sum "$GGUF" | cut -d' ' -f1) $(sha256sum npu/src/onnx/export.rs | cut -d' ' -f1)"
stamp="${PINS[*]} ${BUILDER_TORCH_PINS[*]} openvino $have_ov $input"
if [ -f "$OUT/.kvprobe-stamp" ] && [ "$(cat "$OUT/.kvprobe-stamp")" = "$stamp" ]; then
    echo "$OUT"
    exit 0
fi
builder_torch_env
if [ "$(cat "$PY/.kvprobe-pins" 2>/dev/null)" != "${PINS[*]}" ]; then
    rm -rf "$PY"
    python3 -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps --target "$PY" "${PINS[@]}" >&2
    echo "${PINS[*]}" > "$PY/.kvprobe-pins"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# the reference's float32 weights of the GGUF as a Hugging Face folder (as export-builder.sh)
cargo build -q --workspace --features onnx --example onnx_weights >&2
target/debug/examples/onnx_weights "$GGUF" "$tmp/hf" >&2
t0=$SECONDS
PYTHONPATH="$(realpath "$PY"):$(realpath "$BUILDER_TORCH_PY")" python3 - "$tmp/hf" "$tmp/out" >&2 <<'PY'
import sys
from optimum.intel import OVModelForCausalLM
m = OVModelForCausalLM.from_pretrained(sys.argv[1], export=True, compile=False, load_in_8bit=False)
m.save_pretrained(sys.argv[2])
PY
cp "$tmp/hf/tokenizer.json" "$tmp/out/"
rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
mv "$tmp/out" "$OUT"
echo "$stamp" > "$OUT/.kvprobe-stamp"
echo "export-optimum-intel.sh: exported in $((SECONDS - t0)) s" >&2
echo "$OUT"
