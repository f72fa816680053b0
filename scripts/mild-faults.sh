#!/usr/bin/env bash
# The mild faults of issue 34 on SmolLM2 (HailoRT emulator, cache 32 / prefill 16, default prompt
# and steps): each one's verdict, the rule that heads it, and its reproducer's replay — the miss
# against the device beside the healthy hypothesis' miss and the declared precision (medians over
# the greedy steps). Prints one table row per fault and the machine load.
# Usage: scripts/mild-faults.sh [FAULT ...]   (default: tbt-position=±1, tbt-attn-scale=0.85 and
#        1.15, tbt-cache-scale=0.9); KVPROBE_BIN=path runs that binary instead of building
#        target/release/kvprobe
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lib/release-bin.sh
source scripts/lib/release-bin.sh
if [[ $# -gt 0 ]]; then FAULTS=("$@"); else
    FAULTS=(tbt-position=+1 tbt-position=-1 tbt-attn-scale=0.85 tbt-attn-scale=1.15 tbt-cache-scale=0.9)
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| fault | verdict | rule | replayed | replay miss | healthy miss | precision | wall s |"
echo "|---|---|---|---|---|---|---|---|"
for fault in "${FAULTS[@]}"; do
    out="$TMP/case-$((n = ${n:-0} + 1))"
    start=$(date +%s.%N)
    "$BIN" diagnose --sim --model "$MODEL" --cache-len 32 --prefill-len 16 --fault "$fault" \
        --out "$out" >/dev/null 2>"$TMP/err" || [[ $? -le 1 ]] \
        || { echo "| $fault | error: $(tail -1 "$TMP/err") |"; continue; }
    wall=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
    python3 - "$out/results.json" "$fault" "$wall" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fault, wall = sys.argv[2], sys.argv[3]
r = (d.get("reproducer") or {}).get("replay") or {}
e = lambda x: "n/a" if x is None else f"{x:.2e}"
name = r.get("fault", {}).get("name", "none")
val = (r.get("fault", {}).get("value") or {}).get("value")
name = name if val is None else f"{name}={val:g}"
rule = (d.get("hypothesis") or {}).get("rule", "")
print(f"| {fault} | {d['verdict']} | {rule} | {name} | {e(r.get('replay_miss'))} | {e(r.get('healthy_miss'))} | {e(r.get('precision'))} | {wall} |")
PY
done
