#!/usr/bin/env python3
"""The QDQ variant of a static-shape folder (issue 36, docs/qnn.md): both static graphs of
`export-onnx.py --window W --static` quantised by onnxruntime's own tools for QNN
(`get_qnn_qdq_config`: QuantizeLinear/DequantizeLinear pairs on every activation, uint8 weights),
with static scales calibrated (MinMax) on prompt windows run through the float graphs.

    scripts/export-qdq.py STATIC_FOLDER OUT [--activations u8|u16] [--windows N] [--seed S]
                          [--fault present-shift|rope-offset] [--mask-min V]
                          [--only prefill|decode] [--calibrate-self-only]

`--fault present-shift` writes an NPU bug into both graphs before they are quantised (a cache
written at the wrong position, docs/qnn.md): every present K / V row holds the next row's entry
(rolled by one along the sequence axis), so the host's cache keeps each position's K / V one
slot early while the run's own attention is unchanged. `--fault rope-offset` (field-bugs: wrong
position encodings, Qualcomm AI Hub) makes the decode graph rotate q and k at position id + 1
(its cos / sin rows gathered one row on) while the prefill graph is right: a uniform offset in
both would be invisible, RoPE being relative.

Calibration windows are random token ids of the folder's vocabulary (seeded; a window is the
prompt chunk of W tokens right-aligned with an empty past, as kvprobe's first run); the decode
graph is calibrated on one token after each window, its past the window's presents read back
from the float prefill graph. OUT gets the other files of the folder as links. Prints, per graph,
the time and the Q/DQ node counts, then OUT on the last line.

Two things of the float graphs would not survive a per-tensor grid, so the copy that is
quantised differs from them (docs/qnn.md "The QDQ variant"):
- the masked score is `mask_min` = float32's lowest; a tensor holding it next to the real scores
  gets a scale of ~5e33, every visible score rounds to 0 and attention becomes uniform. The copy
  masks with MASK_ON_GRID instead (exp(-100) next to any visible score is below float32's step),
  or with `--mask-min V` (the experiment of docs/qnn.md "HTP's self-only rows").

Experiments (docs/qnn.md "HTP's self-only rows"): `--only decode` quantises one graph (OUT then
serves htp-qdq-check.py --decode, not kvprobe); `--calibrate-self-only` also calibrates the decode
graph on a self-only step after each window (a random token seeing only itself, as kvprobe's
selfmask probe feeds it; its own seed, so the other windows stay the same).
- the prefill graph's past is all zeros in a first window, so its grid would be [0, 1e-4] and a
  second window's past would be wiped: each calibration prompt is followed by a second window
  that reads the first window's presents.

kvprobe's precision-matched reference fake-quantises at the Q/DQ tensors it maps onto its own
computation (kvprobe_reference::qdq)."""

import argparse
import json
import os
import sys
import time

import numpy as np
import onnx

from lib.static_window import prompt_feed, right_aligned  # scripts/lib (this script's folder is on sys.path)

# The masked score of the quantised copy: far below any visible score, inside a u16 grid
# (a step of about 1.6e-3 over [-100, 5]).
MASK_ON_GRID = -100.0


def continuation_feed(rng, vocab, n, shapes, presents, names):
    """The prefill feed of the window after a first prompt of n ids: w new ids at positions
    n..n+w, the past the first window's presents (right-aligned), the mask over n + w slots."""
    w, c = shapes["input_ids"][1], shapes["attention_mask"][1]
    f = {"input_ids": rng.randint(0, vocab, (1, w)).astype(np.int32),
         "attention_mask": np.zeros((1, c), np.int32),
         "position_ids": np.arange(n, n + w, dtype=np.int32)[None, :]}
    f["attention_mask"][0, c - n - w:] = 1
    for k, s in shapes.items():
        if k.startswith("past"):
            f[k] = right_aligned(k, s, presents, names, w)
    return f


def present_shift(m):
    """Each present output rolled by one along its sequence axis (K [H, 1, D, S]: the last
    axis; V [H, 1, S, D]: axis 2): row i holds row i + 1's entry."""
    outs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output}
    nodes = []
    for n in m.graph.node:
        o = n.output[0] if n.output else ""
        if not o.startswith("present.") or n.op_type != "Identity":
            nodes.append(n)
            continue
        dims = outs[o]
        axis = len(dims) - 1 if o.endswith("key") else len(dims) - 2
        roll = np.roll(np.arange(dims[axis], dtype=np.int64), -1)  # row i <- row i + 1
        m.graph.initializer.append(onnx.numpy_helper.from_array(roll, o + "_roll"))
        nodes.append(onnx.helper.make_node("Gather", [n.input[0], o + "_roll"], [o], axis=axis))
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def rope_offset(m):
    """The cos / sin rows gathered at position_ids + 1."""
    dt = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}["position_ids"]
    one = onnx.helper.tensor_dtype_to_np_dtype(dt)
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1, one), "rope_offset_one"))
    nodes = [onnx.helper.make_node("Add", ["position_ids", "rope_offset_one"], ["position_ids_off"])]
    for n in m.graph.node:
        if n.op_type == "Gather" and n.input[1] == "position_ids":
            n.input[1] = "position_ids_off"
        nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def on_grid_copy(src, out, fault=None, mask_min=MASK_ON_GRID):
    """`src` with its mask constant `mask_min` (and `fault` written in), saved into `out` with
    its own copy of the weights (onnx refuses external data behind a link); returns its path."""
    m = onnx.load(src)
    if fault == "present-shift":
        present_shift(m)
    elif fault == "rope-offset":
        rope_offset(m)
    found = [t for t in m.graph.initializer if t.name == "mask_min"]
    if len(found) != 1:
        sys.exit(f"export-qdq.py: {src} has no mask_min constant; export it with export-onnx.sh --static")
    found[0].CopyFrom(onnx.numpy_helper.from_array(np.array(mask_min, np.float32), "mask_min"))
    dst = os.path.join(out, "float." + os.path.basename(src))
    onnx.save(m, dst, save_as_external_data=True, location=os.path.basename(dst) + ".data")
    return dst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--activations", choices=["u8", "u16"], default="u16")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault", choices=["present-shift", "rope-offset"], default=None)
    ap.add_argument("--mask-min", type=float, default=MASK_ON_GRID)
    ap.add_argument("--only", choices=["prefill", "decode"])
    ap.add_argument("--calibrate-self-only", action="store_true")
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
    self_rng = np.random.RandomState(a.seed + 1)
    cpu = ort.InferenceSession(pre, providers=["CPUExecutionProvider"])
    pre_feeds, dec_feeds = [], []
    for i in range(a.windows):
        n = w - i % 3  # a full window and two shorter prompts, right-aligned
        f = prompt_feed(rng, vocab, n, ps)
        pre_feeds.append(f)
        outs = dict(zip([o.name for o in cpu.get_outputs()], cpu.run(None, f)))
        pre_feeds.append(continuation_feed(rng, vocab, n, ps, outs, names))
        g = {"input_ids": rng.randint(0, vocab, (1, 1)).astype(np.int32),
             "attention_mask": np.zeros((1, c), np.int32), "position_ids": np.full((1, 1), n, np.int32)}
        g["attention_mask"][0, c - n - 1:] = 1
        for k, s in ds.items():
            if k.startswith("past"):
                g[k] = right_aligned(k, s, outs, names, w)
        dec_feeds.append(g)
        if a.calibrate_self_only:
            own = dict(g, input_ids=self_rng.randint(0, vocab, (1, 1)).astype(np.int32),
                       attention_mask=np.zeros((1, c), np.int32))
            own["attention_mask"][0, c - 1] = 1
            dec_feeds.append(own)

    class Reader(CalibrationDataReader):
        def __init__(self, feeds):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    qt = {"u8": QuantType.QUInt8, "u16": QuantType.QUInt16}[a.activations]
    for f in os.listdir(a.folder):
        d = os.path.join(a.out, f)
        if f.startswith(".") or os.path.exists(d) or f in (os.path.basename(pre), os.path.basename(dec)):
            continue
        # the real path: a link through one worktree's .cache symlink would die with it
        os.symlink(os.path.realpath(os.path.join(a.folder, f)), d)
    for src, feeds in ((pre, pre_feeds), (dec, dec_feeds)):
        if a.only and src != {"prefill": pre, "decode": dec}[a.only]:
            continue
        t = time.time()
        fault = None if (a.fault == "rope-offset" and src == pre) else a.fault
        copy = on_grid_copy(src, a.out, fault, a.mask_min)
        qcfg = get_qnn_qdq_config(copy, Reader(feeds), activation_type=qt, weight_type=QuantType.QUInt8)
        qcfg.use_external_data_format = True
        dst = os.path.join(a.out, os.path.basename(src))
        quantize(copy, dst, qcfg)
        for f in os.listdir(a.out):
            if f.startswith("float."):
                os.remove(os.path.join(a.out, f))
        m = onnx.load(dst, load_external_data=False)
        ops = [n.op_type for n in m.graph.node]
        print(f"{os.path.basename(src)}: {time.time() - t:.1f} s, {ops.count('QuantizeLinear')} QuantizeLinear, "
              f"{ops.count('DequantizeLinear')} DequantizeLinear ({a.activations} activations, uint8 weights)")
    print(a.out)


if __name__ == "__main__":
    main()
