#!/usr/bin/env bash
# Memory and time of `kvprobe diagnose --sim` on a 1.5B model (issue 21 "Numbers"): the seeded
# Qwen2-1.5B-geometry bf16 Hugging Face folder (scripts/make-qwen2-fixture.sh, ~3.1 GB, written to
# a temporary folder and deleted afterwards), L 256, P 64, 16 steps. Median over RUNS runs of the
# wall time and of the peak RSS (GNU time -v "Maximum resident set size"), against the targets:
# wall <= 120 s, peak RSS <= 1.3 x the checkpoint's size and <= 4.5 GB (a Pi 5 with 8 GB beside
# HailoRT). The load average is printed before and after: a loaded machine makes the times longer.
# Usage: scripts/bench-ref-memory.sh [RUNS]
#        QWEN2_DIR=folder  use (and keep) an existing fixture folder
#        KVPROBE_BIN=path  time that binary instead of building target/release/kvprobe
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${1:-3}"
scripts/ensure-gnu-time.sh bench-ref-memory
if [[ -n "${KVPROBE_BIN:-}" ]]; then BIN="$KVPROBE_BIN"; else
    cargo build --release -q -p kvprobe
    BIN=target/release/kvprobe
fi
TMP="$(mktemp -d)"
if [[ -n "${QWEN2_DIR:-}" ]]; then
    MODEL="$QWEN2_DIR"
    trap 'rm -rf "$TMP"' EXIT
else
    MODEL="$TMP/qwen2-1.5b-bf16"
    trap 'rm -rf "$TMP"' EXIT
    scripts/make-qwen2-fixture.sh "$MODEL"
fi
CKPT_BYTES="$(find "$MODEL" -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {printf "%.0f\n", s}')"
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "checkpoint: $MODEL, safetensors $((CKPT_BYTES / 1048576)) MiB"
args=(diagnose --sim --model "$MODEL" --cache-len 256 --prefill-len 64 --steps 16 --json)
: >"$TMP/runs"
for i in $(seq "$RUNS"); do
    /usr/bin/time -v -o "$TMP/time" "$BIN" "${args[@]}" >"$TMP/out.$i" 2>"$TMP/err" || [[ $? -eq 1 ]] \
        || { cat "$TMP/err" >&2; exit 1; }
    wall="$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (j = 1; j <= n; j++) s = s * 60 + t[j]; print s}' "$TMP/time")"
    kb="$(awk -F': ' '/Maximum resident set size/ {print $2}' "$TMP/time")"
    verdict="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["verdict"])' "$TMP/out.$i")"
    echo "run $i: wall ${wall} s, peak RSS $((kb / 1024)) MiB, verdict $verdict"
    echo "$wall $kb" >>"$TMP/runs"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$TMP/runs" "$CKPT_BYTES" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
ckpt = int(sys.argv[2])
wall = statistics.median(r[0] for r in rows)
rss = statistics.median(r[1] for r in rows) * 1024
limit = min(1.3 * ckpt, 4.5e9)
print(f"median of {len(rows)}: wall {wall:.1f} s (target <= 120: {'ok' if wall <= 120 else 'MISSED'}), "
      f"peak RSS {rss / 2**20:.0f} MiB = {rss / ckpt:.2f} x the checkpoint "
      f"(target <= {limit / 2**20:.0f} MiB: {'ok' if rss <= limit else 'MISSED'})")
PY
