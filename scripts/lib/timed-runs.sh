# Sourced by the bench scripts: `timed_runs RUNS COMMAND...` runs COMMAND RUNS times (its stdout
# discarded, its exit status ignored: a diagnosed fault exits 1 and is still a timed run), prints
# each run's wall time and peak RSS, the median wall time and the largest peak RSS.
# Needs GNU time (scripts/ensure-gnu-time.sh).
timed_runs() {
  local runs="$1"; shift
  local log times=() rss=0 i start end t kb
  log="$(mktemp)"
  for i in $(seq "$runs"); do
    start=$(date +%s.%N)
    /usr/bin/time -f '%M' -o "$log" "$@" >/dev/null || true
    end=$(date +%s.%N)
    t=$(echo "$end - $start" | bc -l)
    kb=$(tail -1 "$log")
    [ "$kb" -gt "$rss" ] && rss=$kb
    times+=("$t")
    printf 'run %d: %.2f s, peak RSS %d MB\n' "$i" "$t" "$((kb / 1024))"
  done
  rm -f "$log"
  printf '%s\n' "${times[@]}" | sort -g \
    | awk '{a[NR]=$1} END {printf "median of %d: %.2f s\n", NR, a[int((NR+1)/2)]}'
  echo "largest peak RSS: $((rss / 1024)) MB"
}
