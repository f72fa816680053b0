#!/usr/bin/env bash
# Fetches OpenVINO's runtime libraries for `--openvino` (a build with `--features openvino` loads
# libopenvino_c at run time) from the registries' `openvino` wheel, pinned by version and sha256,
# and extracts `openvino/libs/` (the C API, the core, the CPU and NPU plugins, the IR and ONNX
# frontends, TBB) into .cache/openvino/<version>/. Idempotent: a folder whose stamp names the
# wheel's sha256 is kept. Prints the path of libopenvino_c on the last line.
#   scripts/fetch-openvino.sh          fetch (if needed) and print the path
#   scripts/fetch-openvino.sh --env    print `export KVPROBE_OPENVINO_LIB=...` for eval
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=2026.4.1
BUILD=22982
SONAME=2641
# The cp311 manylinux_2_28 x86-64 wheel; the libraries inside do not depend on the Python version,
# so any interpreter may fetch it.
WHEEL="openvino-${VERSION}-${BUILD}-cp311-cp311-manylinux_2_28_x86_64.whl"
SHA256=2d22b1da03f7caf74df30e9f6417d0ab2f637e4a38e08e1dcd294d2c37407aaf
DEST=.cache/openvino/$VERSION
LIB="$DEST/libopenvino_c.so.$SONAME"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "fetch-openvino.sh: only the Linux x86-64 wheel is pinned; on $(uname -s)-$(uname -m) install OpenVINO ${VERSION} and set KVPROBE_OPENVINO_LIB to its libopenvino_c" >&2
    exit 3
fi

python3 scripts/lib/pinned_wheel.py --script fetch-openvino.sh \
    --requirement "openvino==${VERSION}" --platform manylinux_2_28_x86_64 \
    --wheel "$WHEEL" --sha256 "$SHA256" --dest "$DEST" --flatten \
    --member "openvino/libs/*" --expect "libopenvino_c.so.$SONAME"

if [ "${1:-}" = "--env" ]; then
    echo "export KVPROBE_OPENVINO_LIB=$(pwd)/$LIB"
else
    echo "$(pwd)/$LIB"
fi
