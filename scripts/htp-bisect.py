#!/usr/bin/env python3
"""Per-layer / per-op bisection of a static-shape graph on Qualcomm's HTP simulator (issue 36).

Cuts the graph open at intermediate tensors (every RMSNorm's input, mean of squares and output,
every attention's scores and softmax, every o_proj / down_proj output), runs the same inputs on
ONNX Runtime's CPU EP (float32) and on the QNN HTP backend (fp16, every node on HTP), and prints
one line per tensor: cosine, relative L2 and max |x| on both sides, in graph order. The first
tensor whose cosine leaves ~1 is where HTP starts computing something else.

Usage: htp-bisect.py FOLDER [--graph model.prefill.onnx] [--ids 1,2,3] [--json OUT]
FOLDER is a static export (scripts/export-onnx.sh --window W --static); the QNN libraries come
from .cache/onnxruntime-qnn/2.7.0 (scripts/fetch-onnxruntime-qnn.sh) or KVPROBE_QNN_DIR.
Needs the onnx and onnxruntime (>= 1.24) Python packages. Slow: one HTP compile of the graph.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import helper, shape_inference
import onnxruntime as ort


def taps(graph):
    """(tensor, label) in graph order: the tensors worth comparing."""
    inits = {i.name for i in graph.initializer}
    consumers = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out = []
    layer = -1
    norms = 0
    for n in graph.node:
        if n.op_type == "Mul" and len(n.input) == 2 and n.input[0] == n.input[1]:
            # RMSNorm: x*x → ReduceMean → +eps → Sqrt → Div → Mul(weight)
            norms += 1
            layer = (norms - 1) // 2
            part = "input_norm" if norms % 2 == 1 else "post_norm"
            out.append((n.input[0], f"L{layer} {part}: x squared (x/sqrt(m) when scaled)"))
            out.append((n.output[0], f"L{layer} {part}: x*x"))
            for c in consumers.get(n.output[0], []):
                if c.op_type == "ReduceMean":
                    out.append((c.output[0], f"L{layer} {part}: mean(x*x)"))
        elif n.op_type == "Abs":
            # the scaled RMSNorm (export-onnx.py): its input is the residual stream
            part = "input_norm" if norms % 2 == 0 else "post_norm"
            out.append((n.input[0], f"L{norms // 2} {part}: residual stream"))
        elif n.op_type == "Mul" and any("layernorm.weight" in i or "norm.weight" in i for i in n.input):
            out.append((n.output[0], f"L{layer} norm output"))
        elif n.op_type == "Softmax":
            out.append((n.input[0], f"L{layer} attention scores (masked)"))
            out.append((n.output[0], f"L{layer} softmax"))
        elif n.op_type == "MatMul" and any(i in inits and ("o_proj" in i or "down_proj" in i) for i in n.input):
            kind = "o_proj" if any("o_proj" in i for i in n.input) else "down_proj"
            out.append((n.output[0], f"L{layer} {kind} output"))
    seen = set()
    return [(t, l) for t, l in out if not (t in seen or seen.add(t))]


def cut_open(folder, graph_file, dest):
    m = onnx.load(os.path.join(folder, graph_file), load_external_data=False)
    inferred = shape_inference.infer_shapes(m)
    vi = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    chosen = []
    for t, label in taps(m.graph):
        if t in vi and t not in {o.name for o in m.graph.output}:
            m.graph.output.append(vi[t])
            chosen.append((t, label))
    for f in os.listdir(folder):
        if f.endswith(".data") and not os.path.exists(os.path.join(dest, f)):
            # a hard link: ONNX Runtime refuses external data resolving outside the model's folder
            os.link(os.path.realpath(os.path.join(folder, f)), os.path.join(dest, f))
    path = os.path.join(dest, "cut.onnx")
    onnx.save(m, path)
    return path, chosen


def qnn_dir():
    d = os.environ.get("KVPROBE_QNN_DIR")
    if d:
        return d
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", ".cache", "onnxruntime-qnn", "2.7.0", "onnxruntime_qnn")


def htp_session(path, extra):
    lib = os.path.join(qnn_dir(), "libonnxruntime_providers_qnn.so")
    ort.register_execution_provider_library("QNNExecutionProvider", lib)
    devs = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    opts = {
        "backend_path": os.path.join(qnn_dir(), "libQnnHtp.so"),
        "htp_arch": "73",
        "soc_model": "60",
        "enable_htp_fp16_precision": "1",
    }
    opts.update(extra)
    so.add_provider_for_devices(devs, opts)
    return ort.InferenceSession(path, so)


def inputs_for(sess, ids):
    feeds = {}
    for i in sess.get_inputs():
        shape = i.shape
        dt = {"tensor(int32)": np.int32, "tensor(int64)": np.int64,
              "tensor(float)": np.float32, "tensor(float16)": np.float16}[i.type]
        if i.name == "input_ids":
            w = shape[1]
            x = np.zeros(shape, dt)
            x[0, w - len(ids):] = ids
        elif i.name == "position_ids":
            w = shape[1]
            x = np.zeros(shape, dt)
            x[0, w - len(ids):] = np.arange(len(ids))
        elif i.name == "attention_mask":
            x = np.zeros(shape, dt)
            x[0, shape[1] - len(ids):] = 1
        else:
            x = np.zeros(shape, dt)
        feeds[i.name] = x
    return feeds


def compare(a, b):
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    fa, fb = np.isfinite(a), np.isfinite(b)
    ok = fa & fb
    na, nb = np.linalg.norm(a[ok]), np.linalg.norm(b[ok])
    cos = float(a[ok] @ b[ok] / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    rel = float(np.linalg.norm(a[ok] - b[ok]) / na) if na > 0 else float(np.linalg.norm(b[ok]))
    return {
        "cosine": cos,
        "rel_l2": rel,
        "max_abs_cpu": float(np.max(np.abs(a[fa]))) if fa.any() else float("nan"),
        "max_abs_htp": float(np.max(np.abs(b[fb]))) if fb.any() else float("nan"),
        "nonfinite_htp": int((~fb).sum()),
        "nonfinite_cpu": int((~fa).sum()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--graph", default="model.prefill.onnx")
    ap.add_argument("--ids", default="1,504,3458,282,253,655,30,2114,253,1789,2843,1036,281")
    ap.add_argument("--json")
    ap.add_argument("--ep-option", action="append", default=[])
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    extra = dict(kv.split("=", 1) for kv in a.ep_option)
    parent = os.path.dirname(os.path.realpath(a.folder))
    with tempfile.TemporaryDirectory(prefix=".bisect-", dir=parent) as tmp:
        path, chosen = cut_open(a.folder, a.graph, tmp)
        cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = inputs_for(cpu, ids)
        names = [o.name for o in cpu.get_outputs()]
        ref = dict(zip(names, cpu.run(None, feeds)))
        t0 = time.time()
        htp = htp_session(path, extra)
        t1 = time.time()
        got = dict(zip(names, htp.run(None, feeds)))
        t2 = time.time()
    rows = []
    for t, label in [("logits", "logits")] + chosen:
        c = compare(ref[t], got[t])
        c.update(tensor=t, label=label)
        rows.append(c)
        print(f"{label:40s} cos {c['cosine']:+.4f} relL2 {c['rel_l2']:.3g} "
              f"max|cpu| {c['max_abs_cpu']:.4g} max|htp| {c['max_abs_htp']:.4g} "
              f"nonfinite htp {c['nonfinite_htp']}")
    print(f"htp compile {t1 - t0:.1f} s, run {t2 - t1:.1f} s", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ids": ids, "compile_s": t1 - t0, "run_s": t2 - t1, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
