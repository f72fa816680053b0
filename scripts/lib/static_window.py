"""The prefill feed of a static-shape export (scripts/export-onnx.sh --static): a prompt of n
random ids right-aligned in a window of w, the mask over the context c marking its n newest
slots, positions 0..n, and every past input zero (a fresh cache). Shared by export-qdq.py's
calibration and htp-qdq-check.py's comparison, so both feed the graph the same way."""

import numpy as np


def prompt_feed(rng, vocab, n, shapes):
    """The feed for one prompt of n ids; `shapes` maps each graph input to its fixed dims."""
    w, c = shapes["input_ids"][1], shapes["attention_mask"][1]
    f = {"input_ids": np.zeros((1, w), np.int32), "attention_mask": np.zeros((1, c), np.int32),
         "position_ids": np.zeros((1, w), np.int32)}
    f["input_ids"][0, w - n:] = rng.randint(0, vocab, n)
    f["attention_mask"][0, c - n:] = 1
    f["position_ids"][0, w - n:] = np.arange(n)
    for k, s in shapes.items():
        if k.startswith("past"):
            f[k] = np.zeros(s, np.float32)
    return f
