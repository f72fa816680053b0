"""Per-op taps of a QDQ static graph and of the float graph it was quantised from, for
htp-qdq-check.py --decode (docs/qnn.md "HTP's self-only rows").

`taps` picks the float tensors worth comparing, by layer: the attention path (q·kᵀ, scaled,
masked, softmax, softmax·allowed, attention·V, o_proj), the residual stream after attention and
after the MLP, the norms' outputs, gate / up / gate·up / down_proj, and the logits. `cut_open`
writes a copy of a graph with those tensors as extra outputs: in the float graph the tensor
itself; in the QDQ graph a new DequantizeLinear on the tensor's QuantizeLinear output (the
pattern the logits output already has), so every node unit stays as the QNN EP groups it and
the tap reads the value HTP wrote on the tensor's grid. `grid` gives a tap's [lo, hi]."""

import os
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LAYER = re.compile(r"layers\.(\d+)\.")


def taps(graph):
    """(float tensor, label) in graph order."""
    inits = {i.name for i in graph.initializer}
    kind = {}  # tensor -> what made it, for the nodes that read it
    layer = 0
    out = []

    def tap(t, what):
        kind[t] = what
        out.append((t, f"L{layer} {what}"))

    for n in graph.node:
        w = [i for i in n.input if i in inits]
        for i in w:
            m = LAYER.search(i)
            if m:
                layer = int(m.group(1))
        o = n.output[0] if n.output else ""
        srcs = [kind.get(i) for i in n.input]
        if n.op_type == "Gather" and any("embed_tokens" in i for i in w):
            tap(o, "embedding")
        elif n.op_type == "Mul" and any("norm.weight" in i for i in w):
            part = next((p for p in ("input_layernorm", "post_attention_layernorm") if any(p in i for i in w)),
                        "final norm")
            tap(o, f"{part} output")
        elif n.op_type == "MatMul" and w:
            proj = next((p for p in ("o_proj", "gate_proj", "up_proj", "down_proj", "lm_head") if any(p in i for i in w)),
                        None)
            if proj:
                tap(o, proj)
        elif n.op_type == "MatMul":
            tap(o, "attention·V" if "softmax·allowed" in srcs else "q·kT")
        elif n.op_type == "Mul" and "q·kT" in srcs:
            tap(o, "scores scaled")
        elif n.op_type == "Where" and "scores scaled" in srcs:
            tap(o, "scores masked")
        elif n.op_type == "Softmax":
            tap(o, "softmax")
        elif n.op_type == "Mul" and "softmax" in srcs:
            tap(o, "softmax·allowed")
        elif n.op_type == "Mul" and "up_proj" in srcs:
            tap(o, "gate·up")
        elif n.op_type == "Add" and "o_proj" in srcs:
            tap(o, "residual + attention")
        elif n.op_type == "Add" and "down_proj" in srcs:
            tap(o, "residual + MLP")
    return out


def quantizers(graph):
    """float tensor -> its QuantizeLinear node."""
    return {n.input[0]: n for n in graph.node if n.op_type == "QuantizeLinear"}


def grid(graph, q):
    """(lo, hi, step) of the QuantizeLinear node `q`'s grid."""
    init = {t.name: t for t in graph.initializer}
    scale = float(numpy_helper.to_array(init[q.input[1]]))
    zp = numpy_helper.to_array(init[q.input[2]])
    info = np.iinfo(zp.dtype)
    return (info.min - int(zp)) * scale, (info.max - int(zp)) * scale, scale


def cut_open(path, chosen, dest, qdq, mask_min=None):
    """A copy of the graph at `path` in `dest` with the tensors `chosen` as extra outputs (each
    named `<tensor>.tap`); `qdq`: read them through a new DequantizeLinear of their grid.
    `mask_min`: the masked score replaced (the graph's `mask_min` initializer). The external
    data is hard-linked beside the copy (ONNX Runtime refuses data outside the model's folder)."""
    m = onnx.load(path, load_external_data=False)
    if mask_min is not None:
        found = [t for t in m.graph.initializer if t.name == "mask_min"]
        if len(found) != 1:
            raise SystemExit(f"{path}: no mask_min initializer to replace")
        found[0].CopyFrom(numpy_helper.from_array(np.array(mask_min, np.float32), "mask_min"))
    qs = quantizers(m.graph) if qdq else {}
    kept = []
    for t in chosen:
        name = t + ".tap"
        if qdq:
            q = qs.get(t)
            if q is None:
                continue
            m.graph.node.append(helper.make_node("DequantizeLinear", [q.output[0], q.input[1], q.input[2]],
                                                 [name], name=name))
        else:
            m.graph.node.append(helper.make_node("Identity", [t], [name], name=name))
        m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
        kept.append(t)
    folder = os.path.dirname(os.path.realpath(path))
    for f in os.listdir(folder):
        if f.endswith(".data") and not os.path.exists(os.path.join(dest, f)):
            os.link(os.path.realpath(os.path.join(folder, f)), os.path.join(dest, f))
    out = os.path.join(dest, os.path.basename(path))
    onnx.save(m, out)
    return out, kept
