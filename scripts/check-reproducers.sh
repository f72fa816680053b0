#!/usr/bin/env bash
# One reproducer per verdict kind, run and compared (issue 34): for one faulty case of each
# verdict the HailoRT emulator's fault table declares, `diagnose` runs on the faulty emulator,
# then the reproducer command its verdict prints runs as written (kvprobe greedy on the
# emulator with only the hypothesis as fault), and so does the same command on the diagnosed
# device (the faulty emulator: `--fault` the fault under test), both fresh processes as a user
# with and without the device would run them. The two greedy runs are compared step by step:
# both compare each step's logits with the same f32 reference, so equal per-step cosines and KLs
# (to 1e-6) and equal top-1 tokens say the reproducer's logits agree with the device's in those
# projections. The diagnosis' own replay miss (1 − cosine of the two logit vectors, from
# results.json) is printed beside it: its replays and its second recording of the device start
# from a fresh start as the commands do (reset, rings cleared, a new process' host window). The
# last column compares the reproducer with diagnose's own greedy probe instead, which ran after
# other probes (their window rows and ring bytes are history a fault may read).
# Usage: scripts/check-reproducers.sh [FAULT ...]   (default: one fault per verdict kind)
#        KVPROBE_BIN=path runs that binary instead of building target/release/kvprobe;
#        GEOMETRY="--cache-len 32 --prefill-len 16" (default) sets the emulator's geometry
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=lib/release-bin.sh
source scripts/lib/release-bin.sh
read -r -a GEO <<<"${GEOMETRY:---cache-len 32 --prefill-len 16}"
if [[ $# -gt 0 ]]; then FAULTS=("$@"); else
    # one per declared verdict (ring-write-race, nondeterministic, is never replayed: a
    # replay reproduces one run of a device that differs between runs)
    FAULTS=(kv-swap tbt-read-layout=feature-major prefill-write-layout=f8cr mask=left-valid
        offset=after-run tbt-cache-scale=0.5 tbt-position=+1 tbt-attn-scale=2
        prefill-attn-scale=2 truncate-entry=48 ring-capacity=24 gqa-repeat=block)
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg); geometry ${GEO[*]}"
echo "| fault | verdict | reproducer fault | replay miss (diagnose) | steps | top-1 equal | max Δ cosine | max Δ KL | verdict | vs diagnose's greedy probe (top-1) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
n=0
for fault in "${FAULTS[@]}"; do
    n=$((n + 1))
    out="$TMP/diag-$n"
    "$BIN" diagnose --sim --model "$MODEL" "${GEO[@]}" --fault "$fault" --out "$out" \
        >/dev/null 2>"$TMP/err" || [[ $? -le 1 ]] \
        || { echo "| $fault | error: $(tail -1 "$TMP/err") |"; continue; }
    # the reproducer's argv, its leading `kvprobe` replaced by this binary
    python3 - "$out/results.json" >"$TMP/argv-$n" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cmd = (d.get("reproducer") or {}).get("command") or []
print("\0".join(cmd[1:]), end="")
PY
    repro="$TMP/repro-$n.json"
    device="$TMP/device-$n.json"
    if [[ -s "$TMP/argv-$n" ]]; then
        mapfile -d '' -t argv <"$TMP/argv-$n"
        "$BIN" "${argv[@]}" --json >"$repro" 2>"$TMP/err" || [[ $? -le 1 ]] \
            || { echo "| $fault | reproducer error: $(tail -1 "$TMP/err") |"; continue; }
        # the same command on the diagnosed device: its fault in place of the hypothesis (the
        # reproducer's argv ends `--fault HYPOTHESIS [--steps N]`)
        for i in "${!argv[@]}"; do
            [[ "${argv[$i]}" == --fault ]] && argv[$((i + 1))]="$fault"
        done
        "$BIN" "${argv[@]}" --json >"$device" 2>"$TMP/err" || [[ $? -le 1 ]] \
            || { echo "| $fault | device greedy error: $(tail -1 "$TMP/err") |"; continue; }
    else
        : >"$repro"
        : >"$device"
    fi
    python3 - "$out/results.json" "$repro" "$fault" "$device" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fault = sys.argv[3]
rep = d.get("reproducer") or {}
r = rep.get("replay") or {}
f = r.get("fault") or {}
def text(f):
    if not f:
        return "none"
    v = (f.get("value") or {}).get("value")
    s = f["name"] if v is None else f"{f['name']}={v}"
    scope = [*(f.get("groups") or []), *(f.get("kinds") or []), *(f"layer={l}" for l in f.get("layers") or [])]
    return s + ("@" + ",".join(map(str, scope)) if scope else "")
miss = r.get("replay_miss")
miss = "n/a" if miss is None else f"{miss:.2e}"
raw = open(sys.argv[2]).read().strip()
if not raw:
    print(f"| {fault} | {d['verdict']} | none ({rep.get('note', 'no reproducer')}) | {miss} | | | | | |")
    sys.exit(0)
g = json.loads(raw)
dev = json.loads(open(sys.argv[4]).read())
def steps(x):
    p = x.get("probes") or x.get("findings") or x
    gr = p.get("greedy") if isinstance(p, dict) else None
    if gr is None and isinstance(p, dict) and "capacity" in (p.get("extra") or {}):
        # a `kvprobe capacity` reproducer (a verdict the capacity check decided): its answered
        # points, each compared with its f32 reference row, in the order they ran
        pts = p["extra"]["capacity"]["points"]
        return [q for q in pts if q.get("comparison")]
    return (gr or {}).get("steps") or []
def top1(a, b):
    k = min(len(a), len(b))
    return k, sum(a[i]["comparison"]["device_top1"] == b[i]["comparison"]["device_top1"] for i in range(k))
a, b = steps(dev), steps(g)
k, top = top1(a, b)
dc = max((abs(a[i]["comparison"]["cosine"] - b[i]["comparison"]["cosine"]) for i in range(k)), default=float("nan"))
dk = max((abs(a[i]["comparison"]["kl"] - b[i]["comparison"]["kl"]) for i in range(k)), default=float("nan"))
ok = k > 0 and top == k and dc < 1e-6 and dk < 1e-6
# a capacity reproducer's points are no greedy steps: nothing to compare with the greedy probe
kp, tp = top1(steps(d), b) if g.get("command") != "capacity" else (0, 0)
vs = f"{tp}/{kp}" if kp else "n/a (capacity points)"
print(f"| {fault} | {d['verdict']} | `{text(f)}` | {miss} | {k} | {top}/{k} | {dc:.1e} | {dk:.1e} | {'reproduced' if ok else 'differs'} | {vs} |")
PY
done
