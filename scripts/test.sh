#!/usr/bin/env bash
# The README's test command: fetch the real model (no-op when present), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
cargo test --workspace "$@"
