#!/usr/bin/env bash
# Median speed of `kvprobe diagnose` on the emulator (issue 4 "Benchmark"): SmolLM2-135M, L=128, P=32,
# 32 steps, healthy and with a few cache faults (which run every probe). Release build; for each
# case the median wall time and peak RSS over $RUNS runs, and the per-probe timings of the median
# run. Goal: <= 15 s wall and <= 2.5x the f32 weights (~540 MB -> 1350 MB) peak RSS.
# Usage: scripts/bench-diagnose-median.sh [RUNS] [FAULT...]   (FAULT "" = healthy)
#        KVPROBE_BIN=path times that binary instead of building target/release/kvprobe
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
RUNS="${1:-3}"
shift || true
# prefill-write-layout=head-major (a layout the named rules never try) ends `unknown`, so the
# stale/causality/splits probes run too (issue 10).
if [[ $# -gt 0 ]]; then FAULTS=("$@"); else FAULTS=("" "tbt-read-layout=feature-major" "kv-swap" "prefill-write-layout=head-major"); fi

scripts/ensure-gnu-time.sh bench-diagnose
scripts/fetch-model.sh >/dev/null
# KVPROBE_BIN: time an already built binary (e.g. while a sweep uses target/release)
if [[ -n "${KVPROBE_BIN:-}" ]]; then BIN="$KVPROBE_BIN"; else
    cargo build --release -q -p kvprobe
    BIN=target/release/kvprobe
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"

for fault in "${FAULTS[@]}"; do
    args=(diagnose --sim --model "$MODEL" --cache-len 128 --prefill-len 32 --steps 32 --json)
    [[ -n "$fault" ]] && args+=(--fault "$fault")
    : >"$TMP/runs"
    for i in $(seq "$RUNS"); do
        /usr/bin/time -f '%e %M %U %S' -o "$TMP/time" "$BIN" "${args[@]}" >"$TMP/out.$i" 2>"$TMP/err" || [[ $? -eq 1 ]] \
            || { cat "$TMP/err" >&2; exit 1; }
        # GNU time prefixes "Command exited with non-zero status 1" when a fault is diagnosed
        read -r wall kb usr sys < <(tail -1 "$TMP/time")
        cpu="$(python3 -c "print(f'{$usr + $sys:.2f}')")"
        echo "$wall $((kb / 1024)) $i $cpu" >>"$TMP/runs"
    done
    read -r wall mib idx cpu < <(sort -n "$TMP/runs" | sed -n "$(((RUNS + 1) / 2))p")
    maxrss="$(sort -k2 -n "$TMP/runs" | tail -1 | cut -d' ' -f2)"
    python3 - "$TMP/out.$idx" "${fault:-healthy}" "$wall" "$mib" "$maxrss" "$RUNS" "$cpu" <<'EOF'
import json, sys
path, name, wall, mib, maxrss, runs, cpu = sys.argv[1:]
d = json.load(open(path))
t = ", ".join(f"{x['what']} {x['seconds']:.2f}" for x in d["provenance"]["timings"])
print(f"{name}: verdict {d['verdict']}; median wall {wall} s over {runs} runs (that run: {cpu} s CPU, user + sys), its peak RSS {mib} MiB (max {maxrss} MiB)")
print(f"  {t}")
for e in d["evidence"]:
    if "skipped" in e or e.startswith("→ stage"):
        print(f"  {e}")
EOF
done
