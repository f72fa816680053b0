#!/usr/bin/env python3
"""The QDQ variant of a static-shape folder (issue 36, docs/qnn.md): both static graphs of
`export-onnx.py --window W --static` quantised by onnxruntime's own tools for QNN
(`get_qnn_qdq_config`: QuantizeLinear/DequantizeLinear pairs on every activation, uint8 weights),
with static scales calibrated (MinMax) on prompt windows run through the float graphs.

    scripts/export-qdq.py STATIC_FOLDER OUT [--activations u8|u16] [--windows N] [--seed S]

Calibration windows are random token ids of the folder's vocabulary (seeded; a window is the
prompt chunk of W tokens right-aligned with an empty past, as kvprobe's first run); the decode
graph is calibrated on one token after each window, its past the window's presents read back
from the float prefill graph. OUT gets the other files of the folder as links. Prints, per graph,
the time and the Q/DQ node counts, then OUT on the last line.

kvprobe's precision-matched reference does not compute quantised activations yet, so
`diagnose` refuses these graphs in one line (docs/qnn.md); the folder is the input of that work."""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnx

from lib.static_window import prompt_feed  # scripts/lib (this script's folder is on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--activations", choices=["u8", "u16"], default="u16")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    except ImportError as e:
        sys.exit(f"export-qdq.py: onnxruntime's quantization tools are missing ({e}); pip install onnxruntime")
    graphs_file = os.path.join(a.folder, "static_graphs.json")
    if not os.path.isfile(graphs_file):
        sys.exit(f"export-qdq.py: {graphs_file} missing; export the folder with export-onnx.sh --window W --static")
    graphs = json.load(open(graphs_file))
    cfg = json.load(open(os.path.join(a.folder, "genai_config.json")))["model"]
    vocab = cfg["vocab_size"]
    names = cfg["decoder"]["outputs"]
    os.makedirs(a.out, exist_ok=True)
    pre = os.path.join(a.folder, graphs["prefill"]["filename"])
    dec = os.path.join(a.folder, graphs["decode"]["filename"])

    def shapes(path):
        m = onnx.load(path, load_external_data=False)
        return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}

    ps, ds = shapes(pre), shapes(dec)
    w, c = ps["input_ids"][1], ps["attention_mask"][1]
    rng = np.random.RandomState(a.seed)
    cpu = ort.InferenceSession(pre, providers=["CPUExecutionProvider"])
    pre_feeds, dec_feeds = [], []
    for i in range(a.windows):
        n = w - i % 3  # a full window and two shorter prompts, right-aligned
        f = prompt_feed(rng, vocab, n, ps)
        pre_feeds.append(f)
        outs = dict(zip([o.name for o in cpu.get_outputs()], cpu.run(None, f)))
        g = {"input_ids": rng.randint(0, vocab, (1, 1)).astype(np.int32),
             "attention_mask": np.zeros((1, c), np.int32), "position_ids": np.full((1, 1), n, np.int32)}
        g["attention_mask"][0, c - n - 1:] = 1
        for k, s in ds.items():
            if not k.startswith("past"):
                continue
            layer, kind = k.split(".")[1], k.split(".")[2]
            present = outs[names[f"present_{kind}_names"] % int(layer)]
            past = np.zeros(s, np.float32)
            if kind == "key":  # [H, 1, D, C-1] ← presents [H, 1, D, W] at the right end
                past[..., -w:] = present
            else:  # [H, 1, C-1, D] ← [H, 1, W, D]
                past[..., -w:, :] = present
            g[k] = past
        dec_feeds.append(g)

    class Reader(CalibrationDataReader):
        def __init__(self, feeds):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    qt = {"u8": QuantType.QUInt8, "u16": QuantType.QUInt16}[a.activations]
    for src, feeds in ((pre, pre_feeds), (dec, dec_feeds)):
        t = time.time()
        qcfg = get_qnn_qdq_config(src, Reader(feeds), activation_type=qt, weight_type=QuantType.QUInt8)
        qcfg.use_external_data_format = True
        dst = os.path.join(a.out, os.path.basename(src))
        quantize(src, dst, qcfg)
        m = onnx.load(dst, load_external_data=False)
        ops = [n.op_type for n in m.graph.node]
        print(f"{os.path.basename(src)}: {time.time() - t:.1f} s, {ops.count('QuantizeLinear')} QuantizeLinear, "
              f"{ops.count('DequantizeLinear')} DequantizeLinear ({a.activations} activations, uint8 weights)")
    for f in os.listdir(a.folder):
        d = os.path.join(a.out, f)
        if f.startswith(".") or os.path.exists(d):
            continue
        os.symlink(os.path.abspath(os.path.join(a.folder, f)), d)
    print(a.out)


if __name__ == "__main__":
    main()
