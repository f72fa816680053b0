#!/usr/bin/env python3
"""What HTP computes on a QDQ graph (issue 36, docs/qnn.md): the prefill graph of a static folder
and of its QDQ variant (scripts/export-qdq.py) run on the same prompt windows on ONNX Runtime's
CPU EP (the float graph, and the QDQ graph: float arithmetic with every Q/DQ pair applied, i.e.
the graph's declared quantisation) and on the HTP simulator (the QDQ graph, every node on HTP,
CPU fallback disabled). Prints per window the per-row logits cosine and top-1 agreement of HTP
against each, and the HTP compile time.

    scripts/htp-qdq-check.py FLOAT_FOLDER QDQ_FOLDER [--windows N] [--seed S]

Random token ids of the folder's vocabulary (seeded, not the calibration seed of export-qdq.py),
W − 2 of them right-aligned in the window, an empty past, positions from 0."""

import argparse
import json
import os
import time

import numpy as np
import onnx

from lib.static_window import prompt_feed  # scripts/lib (this script's folder is on sys.path)
import onnxruntime as ort

QNN = os.environ.get("KVPROBE_QNN_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache",
                                                     "onnxruntime-qnn", "2.7.0", "onnxruntime_qnn"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("float_folder")
    ap.add_argument("qdq_folder")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--seed", type=int, default=100)
    a = ap.parse_args()
    name = json.load(open(os.path.join(a.float_folder, "static_graphs.json")))["prefill"]["filename"]
    vocab = json.load(open(os.path.join(a.float_folder, "genai_config.json")))["model"]["vocab_size"]
    f32, qdq = os.path.join(a.float_folder, name), os.path.join(a.qdq_folder, name)
    m = onnx.load(f32, load_external_data=False)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    w, c = shapes["input_ids"][1], shapes["attention_mask"][1]
    ort.register_execution_provider_library("QNNExecutionProvider",
                                            os.path.join(QNN, "libonnxruntime_providers_qnn.so"))
    devs = [e for e in ort.get_ep_devices() if e.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devs, {"backend_path": os.path.join(QNN, "libQnnHtp.so"),
                                       "htp_arch": "73", "soc_model": "60"})
    t = time.time()
    htp = ort.InferenceSession(qdq, so)
    print(f"HTP compile of {qdq}: {time.time() - t:.1f} s (every node on HTP: fallback disabled)")
    cpu = ort.InferenceSession(f32, providers=["CPUExecutionProvider"])
    cpu_qdq = ort.InferenceSession(qdq, providers=["CPUExecutionProvider"])
    rng = np.random.RandomState(a.seed)
    n = w - 2

    def cos(x, y):
        return (x * y).sum(-1) / np.linalg.norm(x, axis=-1) / np.linalg.norm(y, axis=-1)

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


if __name__ == "__main__":
    main()
