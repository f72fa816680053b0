#!/usr/bin/env bash
# Speed of `kvprobe kvdiff` (issue 20): SmolLM2-135M on the emulator, L=128, P=32, the prefill
# and 31 greedy steps (32 comparison points), release build. For each case: the median over
# $RUNS runs of the probe's own time (provenance timing "kvdiff": model load and emulator
# calibration excluded), its wall and CPU time, and peak RSS.
# Goal: the probe <= 3 s (median).
# Usage: scripts/bench-kvdiff.sh [RUNS] [FAULT...]   (FAULT "" = healthy)
#        KVPROBE_BIN=target/debug/kvprobe scripts/bench-kvdiff.sh   (skip the release build)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
RUNS="${1:-3}"
shift || true
if [[ $# -gt 0 ]]; then CASES=("$@"); else CASES=("" "truncate-entry=96@k,layer=5"); fi

scripts/ensure-gnu-time.sh bench-kvdiff
scripts/fetch-model.sh >/dev/null
if [[ -z "${KVPROBE_BIN:-}" ]]; then
    cargo build --release -q -p kvprobe
    BIN=target/release/kvprobe
else
    BIN="$KVPROBE_BIN"
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg); binary $BIN"
echo "goal: kvdiff <= 3 s (median of the probe's own time)"

for case in "${CASES[@]}"; do
    cmd=(kvdiff --sim --model "$MODEL" --cache-len 128 --prefill-len 32 --steps 32 --json)
    [[ -n "$case" ]] && cmd+=(--fault "$case")
    : >"$TMP/runs"
    for i in $(seq "$RUNS"); do
        /usr/bin/time -f '%e %M %U %S' -o "$TMP/t.$i" "$BIN" "${cmd[@]}" >"$TMP/json.$i" 2>"$TMP/stderr" \
            || { cat "$TMP/stderr" >&2; exit 1; }
        read -r secs kib user sys < <(tail -1 "$TMP/t.$i")
        probe="$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(next(t["seconds"] for t in r["provenance"]["timings"] if t["what"] == "kvdiff"))' "$TMP/json.$i")"
        echo "$probe $secs $((kib * 1024 / 1000000)) $user $sys $i" >>"$TMP/runs"
    done
    read -r probe secs mb user sys idx < <(sort -n "$TMP/runs" | sed -n "$(((RUNS + 1) / 2))p")
    python3 - "$TMP/json.$idx" "${case:-healthy}" "$probe" "$secs" "$mb" "$user" "$sys" "$RUNS" <<'PY'
import json, sys
path, name, probe, secs, mb, user, system, runs = sys.argv[1:]
r = json.load(open(path))
k = r["probes"]["kvdiff"]
split = ", ".join(f"{t['what']} {t['seconds']:.2f} s" for t in r["provenance"]["timings"])
d = k.get("first_divergent")
where = "none" if d is None else f"layer {d['layer']} head {d['kv_head']} {d['kind']} (step {d['step']})"
print(f"{name}: kvdiff median {float(probe):.2f} s over {runs} runs "
      f"(that run: {secs} s wall, {float(user) + float(system):.2f} s CPU, peak RSS {mb} MB)")
print(f"  {split}")
print(f"  {len(k['steps'])} comparison points; first divergent: {where}")
PY
done
