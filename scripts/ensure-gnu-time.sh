#!/usr/bin/env bash
# Installs GNU time (apt) when /usr/bin/time is missing: the benchmarks read peak RSS from it.
# Usage: scripts/ensure-gnu-time.sh NAME   (NAME prefixes the one line it prints)
set -euo pipefail
if [[ ! -x /usr/bin/time ]]; then
    echo "${1:-bench}: installing GNU time (apt) for peak RSS"
    apt-get install -y -qq time >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
fi
