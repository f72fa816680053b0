#!/usr/bin/env bash
# Fetches ONNX Runtime's shared library for `--onnx` (a build with `--features onnx` loads it at
# run time) from the registries' `onnxruntime` wheel, pinned by version and sha256, and extracts
# `onnxruntime/capi/libonnxruntime.so.<version>` into .cache/onnxruntime/. Idempotent: a present
# library with the right sha256 is kept. Prints the library's path on the last line.
#   scripts/fetch-onnxruntime.sh          fetch (if needed) and print the path
#   scripts/fetch-onnxruntime.sh --env    print `export ORT_DYLIB_PATH=...` for eval
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.31.1
# The cp311 manylinux_2_28 x86-64 wheel (the one checked in ../shared/docs/dependency-notes.md);
# the library inside does not depend on the Python version, so any interpreter may fetch it.
WHEEL="onnxruntime-${VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl"
SHA256=5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f
DEST=.cache/onnxruntime
LIB="$DEST/libonnxruntime.so.${VERSION}"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "fetch-onnxruntime.sh: only the Linux x86-64 wheel is pinned; on $(uname -s)-$(uname -m) install ONNX Runtime ${VERSION}+ and set ORT_DYLIB_PATH to its library" >&2
    exit 3
fi

python3 scripts/lib/pinned_wheel.py --script fetch-onnxruntime.sh \
    --requirement "onnxruntime==${VERSION}" --platform manylinux_2_28_x86_64 \
    --wheel "$WHEEL" --sha256 "$SHA256" --dest "$DEST" --flatten \
    --member "onnxruntime/capi/libonnxruntime.so.${VERSION}" --expect "libonnxruntime.so.${VERSION}"

if [ "${1:-}" = "--env" ]; then
    echo "export ORT_DYLIB_PATH=$(pwd)/$LIB"
else
    echo "$(pwd)/$LIB"
fi
