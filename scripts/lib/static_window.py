"""The feeds of a static-shape export (scripts/export-onnx.sh --static). The prefill feed: a
prompt of n ids right-aligned in a window of w, the mask over the context c marking its n newest
slots, positions 0..n, and every past input zero (a fresh cache). The past of a later run: a
window's presents at the right end of the past inputs. Shared by export-qdq.py's calibration and
htp-qdq-check.py's comparison, so both feed the graph the same way."""

import numpy as np


def prompt_feed(rng, vocab, n, shapes, ids=None, pad=0):
    """The feed for one prompt of n ids (random ones of the vocabulary, or `ids`; the slots
    before them hold `pad` at position 0, masked, as GenAI pads a first window); `shapes` maps
    each graph input to its fixed dims."""
    w, c = shapes["input_ids"][1], shapes["attention_mask"][1]
    f = {"input_ids": np.full((1, w), pad, np.int32), "attention_mask": np.zeros((1, c), np.int32),
         "position_ids": np.zeros((1, w), np.int32)}
    f["input_ids"][0, w - n:] = rng.randint(0, vocab, n) if ids is None else ids
    f["attention_mask"][0, c - n:] = 1
    f["position_ids"][0, w - n:] = np.arange(n)
    for k, s in shapes.items():
        if k.startswith("past"):
            f[k] = np.zeros(s, np.float32)
    return f


def right_aligned(k, s, presents, names, w):
    """The past input `k` of dims `s` holding a window's presents [.., W] at its right end
    (`names`: genai_config's decoder outputs, naming the presents)."""
    layer, kind = k.split(".")[1], k.split(".")[2]
    present = presents[names[f"present_{kind}_names"] % int(layer)]
    past = np.zeros(s, np.float32)
    if kind == "key":  # [H, 1, D, P] <- presents [H, 1, D, W]
        past[..., -w:] = present
    else:  # [H, 1, P, D] <- [H, 1, W, D]
        past[..., -w:, :] = present
    return past
