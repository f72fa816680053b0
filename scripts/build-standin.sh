#!/usr/bin/env bash
# Builds the test-only HailoRT stand-in (npu/standin): a libhailort.so that implements kvprobe's
# HailoRT header subset over the KV-cache emulator. The .so is never part of a default build; the
# emulator's staticlib it links is (npu/standin's second crate type).
# STANDIN_FEATURES=onnx: build with the features the preceding test run used (CI), so that the
# workspace build this runs finds everything compiled.
#
# Output: target/standin/lib/libhailort.so, target/standin/lib/pkgconfig/hailort.pc and the
# header subset under npu/standin/include. Prints the environment a --features hailo build
# and run need; `eval "$(scripts/build-standin.sh --env)"` sets it in the current shell.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="$root/target/standin"
mkdir -p "$out/lib/pkgconfig"

# The emulator as a static library: the stand-in crate's staticlib output of a workspace build
# with the test targets (dev profile). The same package selection and features as the test run
# (STANDIN_FEATURES=onnx after `cargo test --workspace --features onnx`) resolve the same
# dependency features, so nothing is compiled twice; `-p kvprobe-standin` alone would resolve
# fewer features and rebuild every dependency.
features=()
if [[ -n "${STANDIN_FEATURES:-}" ]]; then features=(--features "$STANDIN_FEATURES"); fi
cargo build -q --workspace --lib --tests "${features[@]}" >&2
rlib_dir="$root/target/debug"
g++ -std=c++17 -O1 -g -fPIC -shared -Wall -Wextra -Werror \
    -I "$root/npu/standin/include" -I "$root/npu/standin/cpp" \
    "$root/npu/standin/cpp/hailort_standin.cpp" \
    -Wl,--whole-archive "$rlib_dir/libkvprobe_standin.a" -Wl,--no-whole-archive \
    -Wl,--version-script="$root/npu/standin/cpp/libhailort.map" \
    -Wl,-soname,libhailort.so \
    -lpthread -ldl -lm \
    -o "$out/lib/libhailort.so"

cat > "$out/lib/pkgconfig/hailort.pc" <<PC
prefix=$out
libdir=\${prefix}/lib
includedir=$root/npu/standin/include

Name: hailort
Description: kvprobe's test stand-in for HailoRT (emulator-backed)
Version: 5.2.0
Libs: -L\${libdir} -lhailort
Cflags: -I\${includedir}
PC

env_lines="export HAILORT_INCLUDE_DIR=$root/npu/standin/include
export PKG_CONFIG_PATH=$out/lib/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$out/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
if [[ "${1:-}" == "--env" ]]; then
    echo "$env_lines"
else
    echo "built $out/lib/libhailort.so ($(du -h "$out/lib/libhailort.so" | cut -f1))" >&2
    echo "$env_lines"
fi
