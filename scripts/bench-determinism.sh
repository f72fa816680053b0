#!/usr/bin/env bash
# Cost of issue 20's determinism checks on SmolLM2 (ane-sim, max_ctx 128, default prompt):
# the in-process repeat inside `diagnose` (its "repeat" timing against the whole probe time; the
# diagnose target stays <= 15 s on 2 idle cores) and `kvprobe determinism --steps 4` (two runs
# here, one in a second process). Median of $RUNS. BIN=path skips the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
RUNS=${RUNS:-3}
[ -f "$MODEL" ] || scripts/fetch-model.sh
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  BIN=target/release/kvprobe
fi
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
median() { sort -g | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]}'; }
rep=(); tot=(); det=()
for i in $(seq "$RUNS"); do
  read -r r t < <("$BIN" diagnose --device ane-sim --model "$MODEL" --max-ctx 128 --json "$@" 2>/dev/null |
    python3 -c 'import json,sys; t={x["what"]: x["seconds"] for x in json.load(sys.stdin)["provenance"]["timings"]}; print(t.get("repeat", 0), t["probes total"])' || true)
  rep+=("$r"); tot+=("$t")
  start=$(date +%s.%N)
  "$BIN" determinism --device ane-sim --model "$MODEL" --max-ctx 128 --steps 4 "$@" >/dev/null
  det+=("$(echo "$(date +%s.%N) - $start" | bc -l)")
  printf 'run %d: diagnose repeat %.2f s of %.2f s probes; determinism %.2f s wall\n' "$i" "$r" "$t" "${det[-1]}"
done
printf 'median of %d: diagnose repeat %s s of %s s probes; determinism %s s wall\n' "$RUNS" \
  "$(printf '%s\n' "${rep[@]}" | median)" "$(printf '%s\n' "${tot[@]}" | median)" \
  "$(printf '%s\n' "${det[@]}" | median)"
