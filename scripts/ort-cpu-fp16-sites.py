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

With --graph it prints instead, from the optimized graph ONNX Runtime writes for the export
(SessionOptions.optimized_model_filepath), the op types it runs in fp16 and in float32 (a node
runs in float32 when a Cast to float32 feeds it or it reads no fp16 value): what
npu/src/onnx/ort_cpu_fp16.rs derives from the graph itself.

Usage: ort-cpu-fp16-sites.py HF_DIR BUILDER_FOLDER [--ids 1,2,3]
       ort-cpu-fp16-sites.py --graph BUILDER_FOLDER
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


def placement(folder):
    """Per op type of the optimized graph: (runs in fp16, runs in float32) node names."""
    import collections
    import tempfile

    import onnx
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(os.path.join(folder, "model.onnx"), so, providers=["CPUExecutionProvider"])
        g = onnx.load(so.optimized_model_filepath, load_external_data=False).graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    # the Casts ONNX Runtime inserted carry no value_info: their `to`, and on from there
    for n in g.node:
        for o in n.output:
            if o in types:
                continue
            if n.op_type == "Cast":
                types[o] = next(a.i for a in n.attribute if a.name == "to")
            else:
                types[o] = next((types[i] for i in n.input if types.get(i) in (1, 10)), None)
    seen = collections.defaultdict(lambda: ([], []))
    for n in g.node:
        if n.op_type in ("Cast", "Constant") or "attn_mask_reformat" in n.name:
            continue
        ins = [types.get(i) for i in n.input if i]
        if 10 in ins:
            seen[n.op_type][0].append(n.name)
        elif 1 in ins:
            seen[n.op_type][1].append(n.name)
    for op, (h, f) in sorted(seen.items()):
        print(f"{op}: fp16 {len(h)}, float32 {len(f)}" + (f" (float32: {', '.join(f[:3])}…)" if h and f else ""))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--graph":
        placement(sys.argv[2])
        return
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
