#!/usr/bin/env bash
# The workspace's rust-version must be at least every locked dependency's: fails (exit 1) naming
# the dependency when an update raises it, so the README's toolchain requirement stays true.
# (clippy's incompatible_msrv lint, run with -D warnings in CI, checks our own code against it.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked >/tmp/kvprobe-metadata.json
python3 - /tmp/kvprobe-metadata.json <<'PY'
import json, sys
meta = json.load(open(sys.argv[1]))
def ver(s):
    return tuple(int(x) for x in s.split("."))
def text(v):
    return ".".join(map(str, v))
ours = {p["name"]: p["rust_version"] for p in meta["packages"] if p["source"] is None}
missing = [n for n, v in ours.items() if not v]
if missing:
    print("no rust-version in " + ", ".join(missing) + "; inherit it from the workspace")
    sys.exit(1)
msrv = ver(ours["kvprobe"])
worst = max((ver(p["rust_version"]), p["name"], p["version"]) for p in meta["packages"]
            if p["source"] is not None and p.get("rust_version"))
if worst[0] > msrv:
    print(f"rust-version {text(msrv)} is too low: {worst[1]} {worst[2]} needs {text(worst[0])}; "
          "raise workspace.package.rust-version and the README")
    sys.exit(1)
print(f"rust-version {text(msrv)} covers every locked dependency "
      f"(highest: {worst[1]} {worst[2]} at {text(worst[0])})")
PY
