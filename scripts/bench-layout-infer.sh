#!/usr/bin/env bash
# Speed and memory of `kvprobe layout --infer` (issue 10 item 1): SmolLM2-135M on the emulator,
# L=128, P=32, release build. For each case: median wall time and its peak RSS over $RUNS runs,
# the largest RSS, and the split of the median run (model load, emulator calibration, the probe).
# Goal: <= 5 s wall and peak RSS <= 1.5x the f32 weights (134.5 M parameters x 4 B = 538 MB,
# so <= 807 MB).
# Usage: scripts/bench-layout-infer.sh [RUNS] [FAULT...]   (FAULT "" = healthy)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
F32_MB=538
RUNS="${1:-3}"
shift || true
if [[ $# -gt 0 ]]; then CASES=("$@"); else CASES=("" "prefill-write-layout=head-major@v"); fi

scripts/ensure-gnu-time.sh bench-layout-infer
scripts/fetch-model.sh >/dev/null
cargo build --release -q -p kvprobe
BIN=target/release/kvprobe
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "goal: <= 5 s wall, peak RSS <= $((F32_MB * 3 / 2)) MB (1.5 x ${F32_MB} MB f32 weights)"

for case in "${CASES[@]}"; do
    cmd=(layout --infer --sim --model "$MODEL" --cache-len 128 --prefill-len 32 --json)
    [[ -n "$case" ]] && cmd+=(--fault "$case")
    : >"$TMP/walls"
    for i in $(seq "$RUNS"); do
        /usr/bin/time -f '%e %M %U %S' -o "$TMP/t.$i" "$BIN" "${cmd[@]}" >"$TMP/json.$i" 2>"$TMP/stderr" \
            || { cat "$TMP/stderr" >&2; exit 1; }
        read -r secs kib user sys < <(tail -1 "$TMP/t.$i")
        echo "$secs $((kib * 1024 / 1000000)) $i $user $sys" >>"$TMP/walls"
    done
    # on a shared machine wall time includes waiting; CPU time (user + sys) is the work itself
    read -r secs mb idx user sys < <(sort -n "$TMP/walls" | sed -n "$(((RUNS + 1) / 2))p")
    top="$(sort -k2 -n "$TMP/walls" | tail -1 | cut -d' ' -f2)"
    python3 - "$TMP/json.$idx" "${case:-healthy}" "$secs" "$mb" "$top" "$RUNS" "$F32_MB" "$user" "$sys" <<'PY'
import json, sys
path, name, secs, mb, top, runs, f32, user, system = sys.argv[1:]
cpu = f"{float(user) + float(system):.2f}"
r = json.load(open(path))
f = r["probes"]["layout_infer"]
split = ", ".join(f"{t['what']} {t['seconds']:.2f} s" for t in r["provenance"]["timings"])
print(f"{name}: median {secs} s wall ({cpu} s CPU) over {runs} runs, its peak RSS {mb} MB "
      f"({int(mb) / int(f32):.2f}x f32 weights; largest {top} MB)")
print(f"  {split}")
print(f"  {len(f['caches']) - f['unexplained']}/{len(f['caches'])} edges explained; "
      f"majority {f['writer_formula']} at shift {f['writer_shift']}")
PY
done
