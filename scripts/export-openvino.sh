#!/usr/bin/env bash
# Writes the stateful OpenVINO IR of SmolLM2-135M for `--openvino`, without torch: the ONNX export
# of scripts/export-onnx.sh read by OpenVINO, its past/present pairs made states by OpenVINO's
# own make-stateful transformation (scripts/export-openvino.py says how), saved as
# openvino_model.xml/.bin. Kept while the ONNX export, the converter and the arguments are
# unchanged (a stamp of their sha256). Prints the folder on the last line.
#   scripts/export-openvino.sh                 → .cache/openvino-ir/smollm2-135m
#   scripts/export-openvino.sh --no-state      → .cache/openvino-ir/smollm2-135m-no-state (bad input)
#   scripts/export-openvino.sh --weights f16   → .cache/openvino-ir/smollm2-135m-f16 (OpenVINO's default save: f16 weights)
#   scripts/export-openvino.sh --weights int8  → .cache/openvino-ir/smollm2-135m-int8 (int8 or int4: needs nncf; int4 is NNCF INT4_SYM in groups of 64)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=()
SUFFIX=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-state) EXTRA+=(--no-state); SUFFIX="$SUFFIX-no-state"; shift ;;
        --weights) EXTRA+=(--weights "$2"); [ "$2" = f32 ] || SUFFIX="$SUFFIX-$2"; shift 2 ;;
        *) echo "export-openvino.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
python3 -c "import openvino" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check "openvino==2026.4.1" >&2
SRC="$(scripts/export-onnx.sh | tail -1)"
OUT=.cache/openvino-ir/smollm2-135m$SUFFIX
stamp="$(cat "$SRC/.kvprobe-stamp") $(sha256sum scripts/export-openvino.py | cut -d' ' -f1) $(python3 -c 'import openvino; print(openvino.get_version())') ${EXTRA[*]:-}"
if [ -f "$OUT/.kvprobe-stamp" ] && [ "$(cat "$OUT/.kvprobe-stamp")" = "$stamp" ]; then
    echo "$(pwd)/$OUT"
    exit 0
fi
rm -rf "$OUT.part"
python3 scripts/export-openvino.py "$SRC" "$OUT.part" ${EXTRA[@]+"${EXTRA[@]}"} >&2
echo "$stamp" > "$OUT.part/.kvprobe-stamp"
rm -rf "$OUT"
mv "$OUT.part" "$OUT"
echo "$(pwd)/$OUT"
