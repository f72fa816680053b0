#!/usr/bin/env bash
# `kvprobe diagnose --ep qnn` on the HTP simulator (issue 36): what a first run (both graphs
# compiled) and a second run (their contexts loaded from the EP context cache, docs/qnn.md) cost,
# split into the QNN compile / context load, the device's prompt windows and its decode steps
# (the run's provenance timings), with the median of RUNS warm runs (default 2) and the ratio.
# The cold run compiles into a fresh cache folder (KVPROBE_QNN_CACHE, removed at the end), so the
# numbers do not depend on what .cache/qnn-context already holds.
#   scripts/bench-qnn.sh                   SmolLM2, scripts/export-onnx.sh --window 16 --static
#   FOLDER=DIR MODEL=HF_OR_GGUF scripts/bench-qnn.sh   another static folder (e.g. the fixture's)
# Extra arguments go to diagnose (default: --steps 4; add --no-shared-runs to run every request on
# the simulator, docs/qnn.md "Shared runs"). KVPROBE_BIN names a binary already built
# (with --features onnx); otherwise a release build. Say the load (uptime) with the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
if [ -z "${FOLDER:-}" ]; then
  [ -f "$MODEL" ] || scripts/fetch-model.sh
  FOLDER="$(scripts/export-onnx.sh --window 16 --static | tail -1)"
fi
scripts/fetch-onnxruntime.sh >/dev/null
scripts/fetch-onnxruntime-qnn.sh >/dev/null
if [ -n "${KVPROBE_BIN:-}" ]; then
  BIN="$KVPROBE_BIN"
else
  cargo build --release --quiet --features onnx --bin kvprobe
  BIN=./target/release/kvprobe
fi
[ $# -gt 0 ] || set -- --steps 4
CACHE="$(mktemp -d "${TMPDIR:-/tmp}/kvprobe-qnn-bench.XXXXXX")"
OUT="$(mktemp -d "${TMPDIR:-/tmp}/kvprobe-qnn-bench-out.XXXXXX")"
trap 'rm -rf "$CACHE" "$OUT"' EXIT
echo "bench-qnn: $FOLDER, $BIN diagnose $*; load: $(uptime | sed 's/.*load average: //')"
for i in $(seq 0 "$RUNS"); do
  t0=$(date +%s.%N)
  set +e
  KVPROBE_QNN_CACHE="$CACHE" "$BIN" diagnose --onnx "$FOLDER" --model "$MODEL" --ep qnn --json "$@" \
      >"$OUT/$i.json" 2>"$OUT/$i.err"
  code=$?
  set -e
  t1=$(date +%s.%N)
  echo "$t0 $t1" >"$OUT/$i.wall"
  if [ "$code" -ne 0 ] && [ "$code" -ne 1 ]; then
    echo "bench-qnn: run $i exited $code: $(head -c 400 "$OUT/$i.err")" >&2
    exit 1
  fi
done
python3 - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def parts(i):
    v = json.load(open(f"{out}/{i}.json"))
    t0, t1 = map(float, open(f"{out}/{i}.wall").read().split())
    p = {"wall": t1 - t0, "compile/load": 0.0, "prompt windows": 0.0, "decode steps": 0.0}
    n = {}
    for t in v["provenance"]["timings"]:
        w = t["what"]
        if w.startswith("qnn compile") or w.startswith("qnn context load"):
            p["compile/load"] += t["seconds"]
        elif w.startswith("device: prompt windows"):
            p["prompt windows"] = t["seconds"]; n["windows"] = w.split("(")[1].split()[0]
        elif w.startswith("device: decode steps"):
            p["decode steps"] = t["seconds"]; n["steps"] = w.split("(")[1].split()[0]
        elif w.startswith("shared: "):
            n["shared"] = w.split(" answered")[0][len("shared: "):]
            p["shared runs (their first runs' device time)"] = t["seconds"]
        elif w == "open device":
            p["open device"] = t["seconds"]
    p["rest (reference, probes, I/O)"] = p["wall"] - p["compile/load"] - p["prompt windows"] - p["decode steps"]
    p.setdefault("shared runs (their first runs' device time)", 0.0)
    ctx = v["provenance"]["versions"].get("qnn context", "")
    return p, n, v.get("verdict"), ctx
cold, n, verdict, ctx = parts(0)
warm = [parts(i) for i in range(1, runs + 1)]
for i, (p, _, vd, c) in enumerate([(cold, n, verdict, ctx)] + warm):
    kind = "cold" if i == 0 else "warm"
    print(f"run {i} ({kind}): verdict {vd}; " + ", ".join(f"{k} {v:.1f} s" for k, v in p.items()))
    print(f"    qnn context: {c[:300]}")
print(f"device runs per diagnose: {n.get('windows','?')} prompt windows, {n.get('steps','?')} decode steps; "
      f"answered from identical earlier requests: {n.get('shared', 'none')}")
print(f"{'':32} {'cold':>9} {'warm median':>12} {'ratio':>7}")
for k in cold:
    m = statistics.median(p[k] for p, *_ in warm)
    r = f"{cold[k] / m:.2f}x" if m > 0 else "-"
    print(f"{k:32} {cold[k]:8.1f}s {m:11.1f}s {r:>7}")
PY
