#!/usr/bin/env bash
# Leave-one-family-out (issue 34): each fault family is diagnosed with its own fault left out of
# the replays' hypothesis set (`diagnose --leave-out FAULT`, a hidden research switch). Since
# the scorer decides every verdict (a rule's verdict stands only when a replay reproduces it), a
# case passes when it comes out `unknown` or `healthy`, or names its declared verdict through a
# reproducing replay of another fault; a rule-named cause no replay reproduces fails the row, as
# does any other cause. Prints one row per case.
# Usage: scripts/leave-one-out.sh [FAULT ...]   (default: the mild faults on SmolLM2, L 32 / P 16,
#        16 steps; a fault of another family passes only as unknown or healthy); KVPROBE_BIN=path runs that binary instead of building target/release/kvprobe
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lib/release-bin.sh
source scripts/lib/release-bin.sh
if [[ $# -gt 0 ]]; then FAULTS=("$@"); else
    FAULTS=(tbt-attn-scale=0.85 tbt-attn-scale=1.15 tbt-cache-scale=0.9 tbt-position=+1 tbt-position=-1)
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "| fault (left out: its family) | declared | verdict | rule | reproducer | pass |"
echo "|---|---|---|---|---|---|"
for fault in "${FAULTS[@]}"; do
    family="${fault%%=*}"
    # the verdict the fault table declares (npu/src/hailo/sim/faults.rs)
    case "$family" in
        tbt-attn-scale) declared=tbt-graph ;;
        prefill-attn-scale) declared=prefill-graph ;;
        tbt-cache-scale) declared=cache-quantization ;;
        tbt-position | prefill-position) declared=position-mismatch ;;
        *) declared="" ;;
    esac
    out="$TMP/case-$((n = ${n:-0} + 1))"
    "$BIN" diagnose --sim --model "$MODEL" --cache-len 32 --prefill-len 16 --steps 16 \
        --fault "$fault" --leave-out "$family" --out "$out" >/dev/null 2>"$TMP/err" || [[ $? -le 1 ]] \
        || { echo "| $fault | error: $(tail -1 "$TMP/err") |"; continue; }
    python3 - "$out/results.json" "$fault" "$declared" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fault, declared = sys.argv[2], sys.argv[3]
v = d["verdict"]
rule = (d.get("hypothesis") or {}).get("rule", "")
rep = d.get("reproducer") or {}
r = rep.get("replay") or {}
repro = f"{r['fault']['name']} {r['replay_miss']:.1e} ({'reproduces' if r.get('reproduces') else 'does not reproduce'})" if r else "none"
family = fault.split("=")[0].split("@")[0]
ok = v in ("unknown", "healthy") or (
    declared and v == declared and r.get("reproduces") and r["fault"]["name"] != family)
print(f"| {fault} | {declared or '?'} | {v} | {rule} | {repro} | {'yes' if ok else 'NO: a cause no replay of another family reproduces'} |")
PY
done
