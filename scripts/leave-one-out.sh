#!/usr/bin/env bash
# Leave-one-family-out (issue 34): each fault family is diagnosed with its own fault left out of
# the replays' hypothesis set (`diagnose --leave-out FAULT`, a hidden research switch). Since
# the scorer decides every verdict (a rule's verdict stands only when a replay reproduces it), a
# case passes when it comes out `unknown` or `healthy`, or names its declared verdict through a
# reproducing replay of another fault, or names the graph stage the fault lives in
# (`prefill-graph` / `tbt-graph`: "the right stage", counted apart); a rule-named cause no replay
# reproduces fails the row, as does any other cause; the declared cause named with no replay
# at all (a verdict the scorer leaves to its rule, as nondeterministic) is shown as such.
# Prints one row per case (with its wall time and the load average when it ended).
# Usage: scripts/leave-one-out.sh [FAULT ...]   (default: the mild faults on SmolLM2, L 32 / P 16,
#        16 steps); KVPROBE_BIN=path runs that binary instead of building target/release/kvprobe
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
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg), $BIN"
echo "| fault (left out: its family) | declared | verdict | rule | reproducer | pass | wall s | load |"
echo "|---|---|---|---|---|---|---|---|"
for fault in "${FAULTS[@]}"; do
    family="${fault%%[=@]*}"
    # the verdict the fault table declares (npu/src/hailo/sim/faults.rs) and the graph group the
    # fault lives in (its stage verdict; "" where it is the runtime's, not a graph's)
    group=tbt
    [[ "$fault" == *@prefill* && "$fault" != *tbt* ]] && group=prefill
    case "$family" in
        tbt-attn-scale) declared=tbt-graph ;;
        prefill-attn-scale) declared=prefill-graph group=prefill ;;
        gqa-repeat | softmax) declared=$group-graph ;;
        tbt-cache-scale) declared=cache-quantization ;;
        tbt-position) declared=position-mismatch ;;
        prefill-position) declared=position-mismatch group=prefill ;;
        rope-theta | rope-k-tile | rope-scaling) declared=position-mismatch group=prefill ;;
        tbt-read-layout) declared=cache-layout-mismatch ;;
        prefill-write-layout) declared=cache-layout-mismatch group=prefill ;;
        mask) declared=mask-convention ;;
        offset) declared=cache-offset group="" ;;
        kv-swap) declared=kv-binding ;;
        truncate-entry) declared=cache-truncation group=prefill ;;
        prefill-truncate | ring-capacity) declared=capacity-overflow group="" ;;
        ring-write-race) declared=nondeterministic group="" ;;
        *) declared="" group="" ;;
    esac
    out="$TMP/case-$((n = ${n:-0} + 1))"
    start=$(date +%s)
    "$BIN" diagnose --sim --model "$MODEL" --cache-len 32 --prefill-len 16 --steps 16 \
        --fault "$fault" --leave-out "$family" --out "$out" >/dev/null 2>"$TMP/err" || [[ $? -le 1 ]] \
        || { echo "| $fault | error: $(tail -1 "$TMP/err") |"; continue; }
    wall=$(($(date +%s) - start))
    python3 - "$out/results.json" "$fault" "$declared" "$group" "$wall" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fault, declared, group, wall, load = sys.argv[2:7]
v = d["verdict"]
rule = (d.get("hypothesis") or {}).get("rule", "")
rep = d.get("reproducer") or {}
r = rep.get("replay") or {}
repro = f"{r['fault']['name']} {r['replay_miss']:.1e} ({'reproduces' if r.get('reproduces') else 'does not reproduce'})" if r else "none"
family = fault.split("=")[0].split("@")[0]
if v in ("unknown", "healthy"):
    ok = "yes"
elif declared and v == declared and r.get("reproduces") and r["fault"]["name"] != family:
    ok = "yes (another family's replay reproduces)"
elif declared and v == declared and not r:
    ok = "right cause, not replayed (a rule the scorer does not decide)"
elif group and v == f"{group}-graph":
    ok = "yes (the right stage)"
else:
    ok = "NO: a wrong cause"
print(f"| {fault} | {declared or '?'} | {v} | {rule} | {repro} | {ok} | {wall} | {load} |")
PY
done
