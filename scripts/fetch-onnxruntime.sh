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

if [ ! -s "$LIB" ]; then
    mkdir -p "$DEST"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
        -d "$tmp" "onnxruntime==${VERSION}" >&2
    got="$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)"
    if [ "$got" != "$SHA256" ]; then
        echo "fetch-onnxruntime.sh: $WHEEL has sha256 $got, expected $SHA256; refusing it" >&2
        exit 3
    fi
    python3 - "$tmp/$WHEEL" "$LIB" "$VERSION" <<'PY'
import sys, zipfile, shutil
wheel, out, ver = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(f"onnxruntime/capi/libonnxruntime.so.{ver}") as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    mv "$LIB.part" "$LIB"
fi

if [ "${1:-}" = "--env" ]; then
    echo "export ORT_DYLIB_PATH=$(pwd)/$LIB"
else
    echo "$(pwd)/$LIB"
fi
