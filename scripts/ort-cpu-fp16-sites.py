#!/usr/bin/env python3
"""Which fp16 rounding reproduces ONNX Runtime's CPU EP on a model builder fp16 export (issue 35).

Runs the export's model.onnx on onnxruntime's CPU EP (one prompt, empty past) and
scripts/np_fp16_reference.py's numpy forward of the same Hugging Face folder under several
arithmetics: float32 weights and arithmetic; fp16 weights with float32 arithmetic; every op output
rounded (what kvprobe's fp16 reference computes); only the outputs ONNX Runtime keeps in fp16 on
x86-64 (its InsertCastTransformer runs every node without an fp16 CPU kernel in float32 and drops
the float32 → fp16 → float32 Cast pairs between them; docs/onnx-genai.md), with the cos/sin caches
in float32 or fp16, and with each norm after a residual add reading the float32 sum (the fused
SkipSimplifiedLayerNormalization). Prints the relative L2 of each against ONNX Runtime's logits.

Usage: ort-cpu-fp16-sites.py HF_DIR BUILDER_FOLDER [--ids 1,2,3]
  e.g. target/debug/examples/onnx_weights --tiny-llama 13 /tmp/hf   (the builder's tiny input)
       scripts/ort-cpu-fp16-sites.py /tmp/hf .cache/builder/tiny-fp16
"""
import argparse
import os
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import np_fp16_reference as F  # noqa: E402
import np_reference  # noqa: E402

# the op names of np_fp16_reference.forward whose outputs ONNX Runtime's CPU EP keeps in fp16
ORT_CPU_FP16 = {"embeddings", "output", "k_proj", "rope k", "v_proj", "o_proj", "residual add",
                "down_proj", "logits"}


def device_logits(folder, ids, head_dim):
    sess = ort.InferenceSession(os.path.join(folder, "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([ids], np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, len(ids)), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.arange(len(ids), dtype=np.int64)[None]
        else:  # an empty past
            shape = [0 if isinstance(d, str) and "sequence" in d else
                     (head_dim if d == "kv_cache_dim" else (1 if isinstance(d, str) else d)) for d in i.shape]
            feeds[i.name] = np.zeros(shape, np.float16 if "float16" in i.type else np.float32)
    return sess.run(["logits"], feeds)[0][0].astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf")
    ap.add_argument("folder")
    ap.add_argument("--ids", default="1,2,3,4,5,6,7,8,9,10,11")
    a = ap.parse_args()
    ids = [int(t) for t in a.ids.split(",")]
    m = np_reference.load_model(a.hf, np.float32)
    dev = device_logits(a.folder, ids, m.hd)
    rel = lambda x: float(np.linalg.norm(x - dev) / np.linalg.norm(dev))
    rows = [("float32 weights, float32 arithmetic", np.float32, set(), False, False),
            ("fp16 weights, float32 arithmetic", np.float32, set(), True, False),
            ("fp16 weights, every op output rounded", np.float32, None, True, False),
            ("fp16 weights, ONNX Runtime's fp16 sites", np.float32, ORT_CPU_FP16, True, False),
            ("the same, cos/sin caches fp16", np.float16, ORT_CPU_FP16, True, False),
            ("the same, norms after a residual add read its float32 sum", np.float16, ORT_CPU_FP16, True, True)]
    for label, rope_dtype, only, w16, skip in rows:
        m.dtype = rope_dtype  # np_reference's RoPE casts cos/sin to the model's dtype
        lg = F.forward(m, ids, F.Fp16("inf", only), "fused", fp16_weights=w16, skip_sum_f32=skip)
        print(f"{label}: relative L2 {rel(lg):.3e}")


if __name__ == "__main__":
    main()
