#!/usr/bin/env bash
# Memory and time of `kvprobe diagnose --sim` on SmolLM2 at its own context (issue 38): the
# capacity probe's reference rows up to 8192 positions, computed in pieces (reference/src/pieces.rs).
# A one-piece forward there held 2.4 GB of scores per layer and every row's logits (1.6 GB): the
# run before that change peaked at 4.4 GB and had not finished after 900 s. Prints each run's wall
# time and peak RSS, the median and the largest (scripts/lib/timed-runs.sh).
# Usage: scripts/bench-long-context.sh [RUNS] [CACHE_LEN]
#        KVPROBE_BIN=path  time that binary instead of building target/release/kvprobe
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUNS="${1:-1}"
CACHE_LEN="${2:-8192}"
scripts/ensure-gnu-time.sh bench-long-context
if [[ -n "${KVPROBE_BIN:-}" ]]; then BIN="$KVPROBE_BIN"; else
    cargo build --release -q -p kvprobe
    BIN=target/release/kvprobe
fi
# shellcheck source=lib/timed-runs.sh
. scripts/lib/timed-runs.sh
echo "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "diagnose --sim --cache-len $CACHE_LEN (SmolLM2, scripts/fetch-model.sh)"
timed_runs "$RUNS" "$BIN" diagnose --sim --cache-len "$CACHE_LEN" --prompt "The capital of France is" --json
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
