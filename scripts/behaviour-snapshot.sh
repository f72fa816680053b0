#!/usr/bin/env bash
# Behaviour snapshot for refactors (issue 17): runs every case of a case file through a kvprobe
# binary with --json and keeps each case's exit code and JSON, so two binaries (before and after
# a change) can be compared number by number with scripts/behaviour-compare.py.
# Usage: scripts/behaviour-snapshot.sh CASES BIN OUTDIR [JOBS]
#   CASES: one case a line, the arguments after `kvprobe` (shell-quoted); `#` lines are skipped.
# Make a case file from the sweep: scripts/behaviour-cases.sh > cases.txt
set -euo pipefail
cases=$1 bin=$2 out=$3 jobs=${4:-2}
[[ -f $cases ]] || { echo "$cases: no case file" >&2; exit 2; }
[[ -x $bin ]] || { echo "$bin: not an executable kvprobe binary" >&2; exit 2; }
mkdir -p "$out"
run_one() {
    local n=$1 line=$2 bin=$3 out=$4
    local rc=0
    eval "set -- $line"
    "$bin" "$@" --json >"$out/$n.json" 2>"$out/$n.err" || rc=$?
    echo "$rc" >"$out/$n.rc"
}
export -f run_one
grep -v '^#' "$cases" | grep -v '^$' | nl -nrz -w4 -s$'\t' \
    | xargs -P "$jobs" -d '\n' -I{} bash -c 'IFS=$'"'"'\t'"'"' read -r n line <<<"$1"; run_one "$n" "$line" "$2" "$3"' _ {} "$bin" "$out"
echo "$(ls "$out"/*.rc | wc -l) cases in $out"
