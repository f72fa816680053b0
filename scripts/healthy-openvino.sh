#!/usr/bin/env bash
# False alarms of `--openvino` on healthy SmolLM2 (issue 37): every everyday prompt below through
# `kvprobe diagnose` and `kvprobe chat` on DEVICES (default "CPU NPU"; NPU = the NPU plugin's
# NPUW pipeline with its partitions on the CPU). A healthy run is diagnose exit 0 with verdict
# `healthy`, and a chat whose every turn agrees; anything else is printed as a false alarm.
# Prints one line per run and the counts; exits 1 when any run alarmed.
#   scripts/healthy-openvino.sh                  both devices, every prompt
#   DEVICES=CPU scripts/healthy-openvino.sh      one device
# BIN (default target/release/kvprobe, built with --features openvino when absent) and
# DIR (default scripts/export-openvino.sh's IR) may be given. OV_CONFIG="KEY=VALUE …" is passed to
# every run as --ov-config KEY=VALUE each, e.g. the CPU plugin at the reference's precision:
#   OV_CONFIG="INFERENCE_PRECISION_HINT=f32 KV_CACHE_PRECISION=f32" DEVICES=CPU scripts/healthy-openvino.sh
# PROMPTS=FILE takes the questions from FILE (one a line) instead of the list below, so a sweep
# can use prompts the list was never tuned on.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-.cache/models/smollm2-135m-instruct-q4_1.gguf}
DEVICES=${DEVICES:-CPU NPU}
[ -f "$MODEL" ] || scripts/fetch-model.sh
scripts/fetch-openvino.sh >/dev/null
DIR=${DIR:-$(scripts/export-openvino.sh | tail -1)}
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet --features openvino
    BIN=./target/release/kvprobe
fi

# Everyday requests, short enough for NPUW's 64-token prompt (chat-templated, as a chat app sends them)
QUESTIONS=(
    "What is the capital of France?"
    "How do I boil an egg?"
    "Write a haiku about autumn."
    "What's a good name for a cat?"
    "Explain photosynthesis in one sentence."
    "Give me three tips for better sleep."
    "What is 12 times 7?"
    "Translate 'good morning' into Spanish."
    "Suggest a quick vegetarian dinner."
    "Why is the sky blue?"
    "How many days are in a leap year?"
    "What should I pack for a weekend trip?"
    "Tell me a fun fact about octopuses."
    "How do I say thank you in Japanese?"
    "What is the difference between weather and climate?"
    "Recommend a book for a long flight."
    "How can I stay focused while studying?"
    "What is a healthy breakfast?"
    "Write a short birthday message for my friend."
    "How does a rainbow form?"
    "What are the primary colors?"
    "How do I water a cactus?"
)
if [ -n "${PROMPTS:-}" ]; then
    mapfile -t QUESTIONS < <(grep -v '^[[:space:]]*$' "$PROMPTS")
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
runs=0
alarms=0
for dev in $DEVICES; do
    for q in "${QUESTIONS[@]}"; do
        p="<|im_start|>user
$q<|im_end|>
<|im_start|>assistant
"
        common=(--model "$MODEL" --openvino "$DIR" --ov-device "$dev" --prompt "$p")
        for kv in ${OV_CONFIG:-}; do common+=(--ov-config "$kv"); done
        set +e
        "$BIN" diagnose "${common[@]}" --json >"$tmp/d.json" 2>"$tmp/d.err"
        dcode=$?
        "$BIN" chat "${common[@]}" --steps 6 --json >"$tmp/c.json" 2>"$tmp/c.err"
        ccode=$?
        set -e
        line="$(python3 - "$tmp/d.json" "$tmp/c.json" "$dcode" "$ccode" <<'PY'
import json, sys
d, c, dcode, ccode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
dv, cv = load(d), load(c)
verdict = (dv or {}).get("verdict") or "?"
chat = (((cv or {}).get("probes") or {}).get("extra") or {}).get("chat") if cv else None
if chat is None:
    chat_s, chat_ok = "chat: no finding", False
else:
    div = chat.get("first_divergence")
    mins = [t["min_cosine"] for t in chat["turns"]]
    chat_ok = div is None
    chat_s = f"chat {len(chat['turns'])} turns min cosine {min(mins):.4f}" + ("" if chat_ok else f" DIVERGES turn {div['turn']} step {div['step']}: {div['why']}")
ok = dcode == 0 and verdict == "healthy" and ccode == 0 and chat_ok
print(("ok   " if ok else "ALARM"), f"diagnose exit {dcode} {verdict};", chat_s)
PY
)"
        runs=$((runs + 1))
        case "$line" in ALARM*) alarms=$((alarms + 1)); tail -n 1 "$tmp/d.err" "$tmp/c.err" >&2 || true ;; esac
        echo "$dev | $q | $line"
    done
done
echo "runs: $runs (diagnose + chat each), false alarms: $alarms"
[ "$alarms" -eq 0 ]
