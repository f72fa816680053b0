#!/usr/bin/env bash
# Screenshot a report page (or an SVG chart) with headless Chromium, as the report test does.
# usage: scripts/render-report-png.sh FILE.html|FILE.svg OUT.png [WIDTH HEIGHT]
# Needs Debian's `chromium` (apt-get install -y chromium). Prints Chromium's console errors.
set -euo pipefail
in=$(realpath "$1"); out=$2; w=${3:-1400}; h=${4:-3000}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
timeout -s KILL 90 /usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic \
  --no-first-run --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --enable-logging=stderr --v=0 \
  --screenshot="$out" --window-size="$w,$h" "file://$in" >"$profile/log" 2>&1 </dev/null || {
  echo "chromium failed:" >&2; tail -5 "$profile/log" >&2; exit 1; }
grep -E "Uncaught|ERROR:CONSOLE|CONSOLE\(" "$profile/log" >&2 || true
echo "$out"
