#!/usr/bin/env python3
"""What HTP computes on a QDQ graph (issue 36, docs/qnn.md): the prefill graph of a static folder
and of its QDQ variant (scripts/export-qdq.py) run on the same prompt windows on ONNX Runtime's
CPU EP (the float graph, and the QDQ graph: float arithmetic with every Q/DQ pair applied, i.e.
the graph's declared quantisation) and on the HTP simulator (the QDQ graph, every node on HTP,
CPU fallback disabled). Prints per window the per-row logits cosine and top-1 agreement of HTP
against each, and the HTP compile time.

    scripts/htp-qdq-check.py FLOAT_FOLDER QDQ_FOLDER [--windows N] [--seed S]
    scripts/htp-qdq-check.py FLOAT_FOLDER QDQ_FOLDER --decode IDS [--tokens IDS] [--mask self|context]
                             [--mask-min V] [--taps] [--json OUT]

Random token ids of the folder's vocabulary (seeded, not the calibration seed of export-qdq.py),
W − 2 of them right-aligned in the window, an empty past, positions from 0.

`--decode IDS` runs the decode graph instead (docs/qnn.md "HTP's self-only rows"): the prompt IDS
through the float prefill graph (pads as GenAI pads a first window), its presents right-aligned
as every step's past, then one decode step per token of `--tokens` (default: the prompt's) at
positions n, n + 1, …, each seeing only itself (`--mask self`, kvprobe's selfmask probe) or the
prompt and itself (`--mask context`). The same feeds run through the float decode graph (CPU EP),
the QDQ decode graph on the CPU EP with graph optimisation off (the graph's own Q/DQ arithmetic:
the default level rewrites its weight MatMuls into MatMulNBits with int8 inputs, docs/qnn.md "The
0.006 on SmolLM2") and on HTP. `--mask-min V` replaces the QDQ graph's masked score (export-qdq.py
MASK_ON_GRID) on its unchanged grid. `--taps` cuts both graphs open (scripts/lib/qdq_taps.py) and
prints per tensor the cosine of HTP against the CPU EP's QDQ run and of that run against float32,
and the share of the float32 values outside the tensor's grid (what its calibration never saw)."""

import argparse
import json
import os
import time

import tempfile

import numpy as np
import onnx

from lib import qdq_taps
from lib.static_window import prompt_feed, right_aligned  # scripts/lib (this script's folder is on sys.path)
import onnxruntime as ort

QNN = os.environ.get("KVPROBE_QNN_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache",
                                                     "onnxruntime-qnn", "2.7.0", "onnxruntime_qnn"))


def htp_session(path, fp16=False):
    """`path` on the HTP simulator, every node on HTP (CPU fallback disabled)."""
    ort.register_execution_provider_library("QNNExecutionProvider",
                                            os.path.join(QNN, "libonnxruntime_providers_qnn.so"))
    devs = [e for e in ort.get_ep_devices() if e.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    opts = {"backend_path": os.path.join(QNN, "libQnnHtp.so"), "htp_arch": "73", "soc_model": "60"}
    if fp16:  # what kvprobe's --ep qnn sets (npu/src/onnx/qnn.rs): float ops, if any, in fp16
        opts["enable_htp_fp16_precision"] = "1"
    so.add_provider_for_devices(devs, opts)
    t = time.time()
    s = ort.InferenceSession(path, so)
    print(f"HTP compile of {path}: {time.time() - t:.1f} s (every node on HTP: fallback disabled)")
    return s


def cos(x, y):
    return (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("float_folder")
    ap.add_argument("qdq_folder")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--decode", metavar="IDS")
    ap.add_argument("--tokens", metavar="IDS")
    ap.add_argument("--mask", choices=["self", "context"], default="self")
    ap.add_argument("--mask-min", type=float)
    ap.add_argument("--taps", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.decode:
        return decode(a)
    name = json.load(open(os.path.join(a.float_folder, "static_graphs.json")))["prefill"]["filename"]
    vocab = json.load(open(os.path.join(a.float_folder, "genai_config.json")))["model"]["vocab_size"]
    f32, qdq = os.path.join(a.float_folder, name), os.path.join(a.qdq_folder, name)
    m = onnx.load(f32, load_external_data=False)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    w, c = shapes["input_ids"][1], shapes["attention_mask"][1]
    htp = htp_session(qdq)
    cpu = ort.InferenceSession(f32, providers=["CPUExecutionProvider"])
    cpu_qdq = ort.InferenceSession(qdq, providers=["CPUExecutionProvider"])
    rng = np.random.RandomState(a.seed)
    n = w - 2

    for i in range(a.windows):
        f = prompt_feed(rng, vocab, n, shapes)
        t = time.time()
        h = htp.run(["logits"], f)[0].reshape(-1, vocab)[-n:]
        th = time.time() - t
        x = cpu.run(["logits"], f)[0].reshape(-1, vocab)[-n:]
        q = cpu_qdq.run(["logits"], f)[0].reshape(-1, vocab)[-n:]
        for what, ref in (("float32 (CPU EP)", x), ("the QDQ graph on the CPU EP", q)):
            cs = cos(h, ref)
            top = (h.argmax(-1) == ref.argmax(-1)).mean()
            print(f"window {i} ({n} tokens, HTP run {th:.1f} s): HTP vs {what}: cosine mean {cs.mean():.4f} "
                  f"min {cs.min():.4f}, top-1 {100 * top:.0f} %")


def decode_feeds(a, graphs, cfg):
    """The prompt's presents from the float prefill graph, then one decode feed per step."""
    pre = os.path.join(a.float_folder, graphs["prefill"]["filename"])
    dec = os.path.join(a.float_folder, graphs["decode"]["filename"])
    inputs = lambda p: {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
                        for i in onnx.load(p, load_external_data=False).graph.input}
    ps, ds = inputs(pre), inputs(dec)
    w, c = ps["input_ids"][1], ps["attention_mask"][1]
    ids = [int(x) for x in a.decode.split(",")]
    tokens = [int(x) for x in (a.tokens or a.decode).split(",")]
    n = len(ids)
    if not 0 < n <= w:
        raise SystemExit(f"htp-qdq-check.py: --decode takes 1 to {w} ids (one prompt window of {pre}), not {n}")
    s = ort.InferenceSession(pre, providers=["CPUExecutionProvider"])
    f = prompt_feed(None, cfg["vocab_size"], n, ps, ids=ids, pad=cfg.get("pad_token_id", 0))
    presents = dict(zip([o.name for o in s.get_outputs()], s.run(None, f)))
    feeds = []
    for i, t in enumerate(tokens):
        g = {"input_ids": np.array([[t]], np.int32), "position_ids": np.array([[n + i]], np.int32),
             "attention_mask": np.zeros((1, c), np.int32)}
        g["attention_mask"][0, c - 1 if a.mask == "self" else c - 1 - n:] = 1
        for k, sh in ds.items():
            if k.startswith("past"):
                g[k] = right_aligned(k, sh, presents, cfg["decoder"]["outputs"], w)
        feeds.append(g)
    return feeds, tokens, n


def decode(a):
    """--decode: the decode steps through float32, the QDQ graph on the CPU EP and on HTP."""
    graphs = json.load(open(os.path.join(a.float_folder, "static_graphs.json")))
    cfg = json.load(open(os.path.join(a.float_folder, "genai_config.json")))["model"]
    name = graphs["decode"]["filename"]
    f32, qdq = os.path.join(a.float_folder, name), os.path.join(a.qdq_folder, name)
    feeds, tokens, n = decode_feeds(a, graphs, cfg)
    chosen = [t for t, _ in qdq_taps.taps(onnx.load(f32, load_external_data=False).graph)] if a.taps else []
    qg = onnx.load(qdq, load_external_data=False).graph
    with tempfile.TemporaryDirectory(prefix="htp-qdq-", dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        os.mkdir(os.path.join(tmp, "f")), os.mkdir(os.path.join(tmp, "q"))
        fpath, _ = qdq_taps.cut_open(f32, chosen, os.path.join(tmp, "f"), qdq=False)
        qpath, kept = qdq_taps.cut_open(qdq, chosen, os.path.join(tmp, "q"), qdq=True, mask_min=a.mask_min)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        runs = {"f32": ort.InferenceSession(fpath, providers=["CPUExecutionProvider"]),
                "cpu": ort.InferenceSession(qpath, so, providers=["CPUExecutionProvider"]),
                "htp": htp_session(qpath, fp16=True)}
        outs = {}
        for k, s in runs.items():
            names = [o.name for o in s.get_outputs()]
            t = time.time()
            outs[k] = [dict(zip(names, s.run(None, f))) for f in feeds]
            print(f"{k}: {len(feeds)} decode steps in {time.time() - t:.1f} s")
    rows = []
    mask = f"{a.mask}-only" if a.mask == "self" else "prompt + self"
    for i, t in enumerate(tokens):
        lg = {k: outs[k][i]["logits"].reshape(-1).astype(np.float64) for k in outs}
        row = {"step": i, "token": t, "position": n + i,
               "htp_vs_f32": cos(lg["htp"], lg["f32"]), "htp_vs_cpu_qdq": cos(lg["htp"], lg["cpu"]),
               "cpu_qdq_vs_f32": cos(lg["cpu"], lg["f32"]),
               "top1": {k: int(v.argmax()) for k, v in lg.items()}}
        rows.append(row)
        print(f"step {i} (token {t}, position {n + i}, {mask}): HTP vs float32 {row['htp_vs_f32']:.4f}, "
              f"HTP vs the QDQ graph on the CPU EP {row['htp_vs_cpu_qdq']:.4f}, "
              f"CPU EP QDQ vs float32 {row['cpu_qdq_vs_f32']:.4f}, top-1 {row['top1']}")
    labels = dict(qdq_taps.taps(onnx.load(f32, load_external_data=False).graph)) if a.taps else {}
    quants = qdq_taps.quantizers(qg)
    tapped = []
    for t in kept:
        lo, hi, step = qdq_taps.grid(qg, quants[t])
        v = {k: np.stack([o[t + ".tap"].reshape(-1) for o in outs[k]]).astype(np.float64) for k in outs}
        r = {"tensor": t, "label": labels[t], "grid": [lo, hi],
             "htp_vs_cpu_qdq": float(min(cos(v["htp"], v["cpu"]))),
             "htp_minus_cpu_qdq_steps": float(np.abs(v["htp"] - v["cpu"]).max() / step),
             "cpu_qdq_vs_f32": float(min(cos(v["cpu"], v["f32"]))),
             # what the cosine does not see: a clamped row keeps its direction, not its size
             "cpu_qdq_over_f32_norm": float(min(np.linalg.norm(v["cpu"], axis=-1) / np.linalg.norm(v["f32"], axis=-1))),
             "f32_range": [float(v["f32"].min()), float(v["f32"].max())],
             # the float graph masks with float32's lowest, the QDQ graph with MASK_ON_GRID
             "f32_off_grid": float((((v["f32"] < lo) | (v["f32"] > hi)) & (v["f32"] > -1e30)).mean()),
             # at the grid's top, or its bottom where that is not zero (softmax's masked columns)
             "htp_at_edge": float(((v["htp"] >= hi - step) | ((lo < 0) & (v["htp"] <= lo + step))).mean())}
        tapped.append(r)
        print(f"{r['label']:32s} HTP vs CPU-QDQ {r['htp_vs_cpu_qdq']:+.4f} (max {r['htp_minus_cpu_qdq_steps']:.0f} steps)  CPU-QDQ vs f32 {r['cpu_qdq_vs_f32']:+.4f} "
              f"(norm x{r['cpu_qdq_over_f32_norm']:.3f})  "
              f"grid [{lo:.4g}, {hi:.4g}] f32 [{r['f32_range'][0]:.4g}, {r['f32_range'][1]:.4g}] "
              f"off grid {100 * r['f32_off_grid']:.2f} %  HTP at an edge {100 * r['htp_at_edge']:.2f} %")
    for what, key in (("HTP leaves the CPU EP's QDQ run", "htp_vs_cpu_qdq"), ("the QDQ graph leaves float32", "cpu_qdq_vs_f32")):
        first = next((r for r in tapped if r[key] < 0.99), None)
        if first:
            print(f"{what} (cosine < 0.99) first at {first['label']}: {first[key]:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "steps": rows, "taps": tapped}, f, indent=1)


if __name__ == "__main__":
    main()
