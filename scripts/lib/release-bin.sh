# Sourced by the SmolLM2 diagnosis scripts (run from the checkout's root): fetches the model into
# MODEL and sets BIN to $KVPROBE_BIN when given, else to target/release/kvprobe built here.
scripts/fetch-model.sh >/dev/null
MODEL=.cache/models/smollm2-135m-instruct-q4_1.gguf
if [[ -n "${KVPROBE_BIN:-}" ]]; then BIN="$KVPROBE_BIN"; else
    cargo build --release -q -p kvprobe
    BIN=target/release/kvprobe
fi
