#!/usr/bin/env bash
# The workspace's rust-version must be at least every locked dependency's: fails (exit 1) naming
# the dependency when an update raises it, so the README's toolchain requirement stays true.
# (clippy's incompatible_msrv lint, run with -D warnings in CI, checks our own code against it.)
# The optional `onnx` feature pulls in `ort`, which needs a newer Rust than the default build;
# its own floor is `[workspace.metadata.kvprobe] onnx-rust-version`, checked the same way on the
# graph with the feature on (cargo metadata lists only the packages the features resolve).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked >/tmp/kvprobe-metadata.json
cargo metadata --format-version 1 --locked --features onnx >/tmp/kvprobe-metadata-onnx.json
python3 - /tmp/kvprobe-metadata.json /tmp/kvprobe-metadata-onnx.json <<'PY'
import json, sys
meta = json.load(open(sys.argv[1]))
meta_onnx = json.load(open(sys.argv[2]))
def ver(s):
    return tuple(int(x) for x in s.split("."))
def text(v):
    return ".".join(map(str, v))
ours = {p["name"]: p["rust_version"] for p in meta["packages"] if p["source"] is None}
missing = [n for n, v in ours.items() if not v]
if missing:
    print("no rust-version in " + ", ".join(missing) + "; inherit it from the workspace")
    sys.exit(1)
def worst(m):
    return max((ver(p["rust_version"]), p["name"], p["version"]) for p in m["packages"]
               if p["source"] is not None and p.get("rust_version"))
msrv = ver(ours["kvprobe"])
w = worst(meta)
if w[0] > msrv:
    print(f"rust-version {text(msrv)} is too low: {w[1]} {w[2]} needs {text(w[0])}; "
          "raise workspace.package.rust-version and the README")
    sys.exit(1)
print(f"rust-version {text(msrv)} covers every locked dependency of the default build "
      f"(highest: {w[1]} {w[2]} at {text(w[0])})")
declared = (meta["metadata"] or {}).get("kvprobe", {}).get("onnx-rust-version")
if not declared:
    print("no [workspace.metadata.kvprobe] onnx-rust-version in Cargo.toml; declare the --features onnx floor")
    sys.exit(1)
w = worst(meta_onnx)
if w[0] > ver(declared):
    print(f"onnx-rust-version {declared} is too low: {w[1]} {w[2]} needs {text(w[0])}; "
          "raise it in Cargo.toml and the README")
    sys.exit(1)
print(f"onnx-rust-version {declared} covers every locked dependency of --features onnx "
      f"(highest: {w[1]} {w[2]} at {text(w[0])})")
PY
