# Sourced by the exporters that import torch (export-builder.sh, export-optimum-intel.sh): one
# pinned torch environment in .cache/builder/py, shared, so a second exporter does not install
# another 5.6 GB. The registries' torch 2.15.0 wheel does not import without its CUDA packages
# (libtorch_cuda.so links libcudart, cublas, cudnn, nccl, …; measured: `import torch` raises
# "libcublasLt.so.*[0-9] not found"), so it is installed with its dependencies.
BUILDER_TORCH_PINS=(torch==2.15.0 transformers==5.23.0 onnx_ir==1.1.0)
# KVPROBE_TORCH_PY: an environment installed with these pins elsewhere (its .kvprobe-pins
# stamp must match; it is never changed here)
BUILDER_TORCH_PY="${KVPROBE_TORCH_PY:-.cache/builder/py}"

# Installs the environment unless its pins stamp matches; prints nothing on stdout.
builder_torch_env() {
    local t0=$SECONDS
    if [ -n "${KVPROBE_TORCH_PY:-}" ]; then
        if [ "$(cat "$KVPROBE_TORCH_PY/.kvprobe-pins" 2>/dev/null)" != "${BUILDER_TORCH_PINS[*]}" ]; then
            echo "$(basename "$0"): KVPROBE_TORCH_PY=$KVPROBE_TORCH_PY has no .kvprobe-pins stamp '${BUILDER_TORCH_PINS[*]}'; unset it to install the environment in .cache/builder/py" >&2
            exit 2
        fi
        return 0
    fi
    if [ "$(cat "$BUILDER_TORCH_PY/.kvprobe-pins" 2>/dev/null)" != "${BUILDER_TORCH_PINS[*]}" ]; then
        rm -rf "$BUILDER_TORCH_PY"
        python3 -m pip install -q --disable-pip-version-check --no-cache-dir --target "$BUILDER_TORCH_PY" "${BUILDER_TORCH_PINS[@]}" >&2
        echo "${BUILDER_TORCH_PINS[*]}" > "$BUILDER_TORCH_PY/.kvprobe-pins"
        echo "$(basename "$0"): torch environment installed in $((SECONDS - t0)) s ($(du -sh "$BUILDER_TORCH_PY" | cut -f1))" >&2
    fi
}
