#!/usr/bin/env bash
# Fetches Qualcomm's QNN execution provider for `--ep qnn` from the registries' `onnxruntime-qnn`
# wheel, pinned by version and sha256: the plugin `libonnxruntime_providers_qnn.so` and the QNN
# backends built for x86-64 (`libQnnHtp.so`, the HTP simulator; `libHtpPrepare.so`, the HTP graph
# compiler; `libQnnGpu.so`; `libQnnSystem.so`; the wheel has no QNN CPU backend) with the C++ runtime
# they link, into .cache/onnxruntime-qnn/<version>/ in the wheel's own layout (the libraries find
# their C++ runtime through their RPATH, ../onnxruntime_qnn.libs).
# The plugin needs ONNX Runtime >= 1.24.2: scripts/fetch-onnxruntime.sh (1.31.1). Idempotent.
# Prints the plugin's path on the last line.
#   scripts/fetch-onnxruntime-qnn.sh          fetch (if needed) and print the path
#   scripts/fetch-onnxruntime-qnn.sh --env    print `export KVPROBE_QNN_DIR=...` for eval
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=2.7.0
WHEEL="onnxruntime_qnn-${VERSION}-cp311-cp311-manylinux_2_35_x86_64.whl"
SHA256=c56c01562b8534fe8980cfea4601408d950c065f8251fb862ce82101c52c9849
DEST=.cache/onnxruntime-qnn/$VERSION
PLUGIN="$DEST/onnxruntime_qnn/libonnxruntime_providers_qnn.so"

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "fetch-onnxruntime-qnn.sh: only the Linux x86-64 wheel is pinned; on $(uname -s)-$(uname -m) install onnxruntime-qnn ${VERSION} and set KVPROBE_QNN_DIR to the folder holding libonnxruntime_providers_qnn.so" >&2
    exit 3
fi

# the shared libraries only (not libGenie.so, Qualcomm's own LLM runner, which kvprobe does not use),
# in the wheel's layout: they find their C++ runtime through their RPATH
python3 scripts/lib/pinned_wheel.py --script fetch-onnxruntime-qnn.sh \
    --requirement "onnxruntime-qnn==${VERSION}" --platform manylinux_2_35_x86_64 \
    --wheel "$WHEEL" --sha256 "$SHA256" --dest "$DEST" \
    --member "*.so" --member "*.so.*" --skip libGenie.so \
    --expect onnxruntime_qnn/libonnxruntime_providers_qnn.so

if [ "${1:-}" = "--env" ]; then
    echo "export KVPROBE_QNN_DIR=$(pwd)/$DEST/onnxruntime_qnn"
else
    echo "$(pwd)/$PLUGIN"
fi
