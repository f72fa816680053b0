#!/usr/bin/env bash
# Re-derives the replay score's decision margin from a healthy distribution (issue 34): runs
# fault-free `diagnose` cases of the healthy sweep on the ANE emulator (SmolLM2, declared
# precision f16, so the matched reference does NOT reproduce the device exactly and the healthy
# hypothesis competes with the mild fault replays), reads each case's "replay score" evidence
# line — the healthy hypothesis' median miss and the closest mild fault's — and prints the
# ratio healthy/closest per case (both floored at STEP_NOISE_FLOOR = 1e-4), its quantiles, and
# the margin a fault replay must beat: the largest healthy ratio times the safety factor.
# A ratio > 1 on a healthy case means a fault replay came closer than the healthy hypothesis
# did; the margin must sit above every such ratio, with room.
# Usage: scripts/derive-replay-margin.sh [--seed N] [--cases N] [--safety F]
#        (defaults: seed 34, 24 cases, safety 2); KVPROBE_PROFILE=dev builds both binaries in the
#        dev profile (optimised too; reuses a test build's artifacts) instead of release.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SEED=34 CASES=24 SAFETY=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seed) SEED="$2"; shift 2 ;;
        --cases) CASES="$2"; shift 2 ;;
        --safety) SAFETY="$2"; shift 2 ;;
        *) echo "derive-replay-margin.sh: unknown argument $1 (--seed N, --cases N, --safety F)" >&2; exit 2 ;;
    esac
done
scripts/fetch-model.sh >/dev/null
PROFILE="${KVPROBE_PROFILE:-release}"
case "$PROFILE" in
    release) DIR=target/release ;;
    dev) DIR=target/debug ;;
    *) echo "derive-replay-margin.sh: KVPROBE_PROFILE must be release or dev (got $PROFILE)" >&2; exit 2 ;;
esac
cargo build --profile "$PROFILE" -q --features onnx,openvino --bin kvprobe
cargo build --profile "$PROFILE" -q -p kvprobe-testkit --example healthy_sweep
BIN="$DIR/kvprobe"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# the sweep's own cases (prompts, geometry classes), ANE emulator only
"$DIR/examples/healthy_sweep" --seed "$SEED" --smollm2 "$CASES" --fixture 0 --list \
    | grep -- '--device ane-sim' | sed 's/^#[0-9]* \[[^]]*\]: kvprobe //' >"$TMP/cases"
echo "cases: $(wc -l <"$TMP/cases") (seed $SEED, ANE emulator, SmolLM2)" >&2
i=0
while IFS= read -r line; do
    i=$((i + 1))
    eval "args=($line)"
    "$BIN" "${args[@]}" --json >"$TMP/$i.json" 2>/dev/null || true
done <"$TMP/cases"
python3 - "$TMP" "$SAFETY" <<'PY'
import glob, json, re, sys
tmp, safety = sys.argv[1], float(sys.argv[2])
floor = 1e-4
ratios, quiet, alarms = [], 0, []
for f in sorted(glob.glob(f"{tmp}/*.json")):
    try:
        d = json.load(open(f))
    except ValueError:
        alarms.append(f"{f}: no JSON")
        continue
    if d.get("verdict") != "healthy":
        alarms.append(f"{f}: {d.get('verdict')}")
    lines = [e for e in d.get("evidence", []) if e.startswith("replay score:")]
    m = re.search(r"misses the device by ([0-9.e+-]+)", lines[0]) if lines else None
    c = re.search(r"closest \S+ ([0-9.e+-]+)\)", lines[0]) if lines else None
    if not (m and c):
        quiet += 1  # the healthy hypothesis below ratio × floor: nothing replayed
        continue
    h, best = float(m.group(1)), float(c.group(1))
    ratios.append(max(h, floor) / max(best, floor))
ratios.sort()
q = lambda p: ratios[min(len(ratios) - 1, int(p * len(ratios)))] if ratios else float("nan")
print(f"replayed cases: {len(ratios)}; not replayed (healthy miss below the gate): {quiet}")
print(f"alarms: {len(alarms)}" + "".join(f"\n  {a}" for a in alarms))
if ratios:
    print(f"healthy/closest-fault ratio: min {ratios[0]:.3f} median {q(0.5):.3f} "
          f"q90 {q(0.9):.3f} max {ratios[-1]:.3f}")
    print(f"margin = max × safety {safety:g} = {ratios[-1] * safety:.3f}")
PY
