#!/usr/bin/env bash
# Writes the seeded random-weight model at Qwen2-1.5B's geometry (28 layers, hidden 1536, 12 heads
# on 2 KV heads, head 128, FFN 8960, vocab 151936, tied, θ 1e6) as a bf16 Hugging Face folder,
# about 3.1 GB (no package ships the real weights; docs/reference.md). Used by
# scripts/bench-ref-memory.sh; delete the folder after use, the disk is shared.
# Usage: scripts/make-qwen2-fixture.sh OUT_DIR [SEED]     exit 2: not enough free disk
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:?usage: scripts/make-qwen2-fixture.sh OUT_DIR [SEED]}"
SEED="${2:-1}"
PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"
# the folder (3.1 GB) plus a margin for the other builds sharing the disk
NEED_KB=$((4 * 1024 * 1024))
AVAIL_KB="$(df -Pk "$PARENT" | awk 'NR==2 {print $4}')"
if ((AVAIL_KB < NEED_KB)); then
    echo "make-qwen2-fixture: $PARENT has $((AVAIL_KB / 1024)) MiB free, the bf16 folder needs about 4 GiB; free some disk or pass another OUT_DIR" >&2
    exit 2
fi
cd "$ROOT"
cargo run --release -q -p kvprobe-reference --example write_fixture -- qwen2-1.5b hf bf16 "$OUT" "$SEED"
echo "make-qwen2-fixture: wrote $OUT ($(du -sh "$OUT" | cut -f1))"
