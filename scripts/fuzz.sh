#!/usr/bin/env bash
# Seeded mutation fuzzing of every parser of untrusted bytes (examples/fuzz): HEF, sim manifest,
# results.json, GGUF header and metadata, config.json, tokenizer.json, safetensors header,
# genai_config.json (--onnx).
#
#   scripts/fuzz.sh [--iterations N] [--seed S] [--seconds T] [PARSER...]
#   target/debug/examples/fuzz --parser P --replay fuzz-crashes/FILE   (one finding, with its panic)
#
# Defaults: 1,000,000 inputs per parser, seed 1, every parser. CI runs a 2-second smoke
# (--seconds 2). Findings (a panic, or an input whose heap grows past 64 MiB + 64 × its size)
# are saved under fuzz-crashes/ and make the script exit 1; an abort (an allocation past 4 GiB)
# is reported with the seed that reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=1000000
seed=1
seconds=
parsers=()
while [ $# -gt 0 ]; do
  case "$1" in
    --iterations) iterations="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    -*) echo "fuzz.sh: unknown flag $1" >&2; exit 2 ;;
    *) parsers+=("$1"); shift ;;
  esac
done
[ ${#parsers[@]} -gt 0 ] || parsers=(hef manifest results gguf config tokenizer safetensors genai)
# The dev profile by default: it is optimised here (Cargo.toml) and keeps overflow checks, so
# arithmetic that wraps silently in a release build is a finding; FUZZ_PROFILE=release for speed.
# FUZZ_FEATURES=onnx builds against the feature set the tests just built (CI), which reuses their
# libraries instead of compiling the workspace a second time; the parsers are the same.
# `--workspace` resolves the dependencies' features as the test run does (the other members'
# dev-dependencies included): without it every dependency was compiled again (CI: ~4 minutes).
profile="${FUZZ_PROFILE:-dev}"
features=()
if [ -n "${FUZZ_FEATURES:-}" ]; then features=(--features "$FUZZ_FEATURES"); fi
if [ "$profile" = release ]; then
  cargo build --release --workspace --example fuzz --quiet "${features[@]}"
  bin=target/release/examples/fuzz
else
  cargo build --workspace --example fuzz --quiet "${features[@]}"
  bin=target/debug/examples/fuzz
fi
status=0
for p in "${parsers[@]}"; do
  args=(--parser "$p" --seed "$seed" --iterations "$iterations")
  if [ -n "$seconds" ]; then args+=(--seconds "$seconds"); fi
  if ! "$bin" "${args[@]}"; then
    echo "fuzz.sh: $p failed (seed $seed); see fuzz-crashes/ or rerun: $bin ${args[*]}" >&2
    status=1
  fi
done
exit $status
