#!/usr/bin/env bash
# Wall time and peak RSS of `kvprobe diagnose --onnx` on the SmolLM2 GenAI export (default
# decoder, fp32, CPU execution provider), max_ctx 128, 32 steps (issue 22). Prints each run, the
# median of RUNS (default 3) and the largest peak RSS. Needs GNU time (scripts/ensure-gnu-time.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
RUNS=${RUNS:-3}
[ -f "$MODEL" ] || scripts/fetch-model.sh
scripts/fetch-onnxruntime.sh >/dev/null
DIR="$(scripts/export-onnx.sh | tail -1)"
scripts/ensure-gnu-time.sh bench-onnx-diagnose >/dev/null
cargo build --release --quiet --features onnx
times=()
rss=0
for i in $(seq "$RUNS"); do
  log="$(mktemp)"
  start=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$log" ./target/release/kvprobe diagnose --onnx "$DIR" --model "$MODEL" \
      --max-ctx 128 --steps 32 "$@" >/dev/null || true
  end=$(date +%s.%N)
  t=$(echo "$end - $start" | bc -l)
  kb=$(tail -1 "$log"); rm -f "$log"
  [ "$kb" -gt "$rss" ] && rss=$kb
  times+=("$t")
  printf 'run %d: %.2f s, peak RSS %d MB\n' "$i" "$t" "$((kb / 1024))"
done
printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {printf "median of %d: %.2f s\n", NR, a[int((NR+1)/2)]}'
echo "largest peak RSS: $((rss / 1024)) MB"
