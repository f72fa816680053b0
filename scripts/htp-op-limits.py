#!/usr/bin/env python3
"""Where Qualcomm's HTP simulator (fp16, issue 36) clamps each op's output, for every op class
scripts/export-onnx.py's static graphs run on activations: one 64-wide row x (every entry v, or
one entry v and the rest 0) through each op, on the QNN HTP backend (every node on HTP) and in
float64, printed side by side, then one line per op class: with inputs inside fp16's range, the
largest |output| HTP returned where float64's was larger (its clamp point); with an input beyond
65504 (a Mul output, which HTP keeps up to 131008), the rows HTP got wrong.

An op whose output can exceed its inputs (Mul, Div, Add, Sub, MatMul, the means) is fed values
up to 64000; an op that passes or shrinks values (Neg, Abs, Max, ReduceMax, Concat, Transpose,
Reshape, Slice, Gather, Where, Expand, Sqrt, Sigmoid, Softmax) is fed x·2, up to 128000, to see
whether it keeps a value beyond fp16's 65504. Not measured: Cast (the graphs cast only the bool
mask) and the integer ops of the mask (Equal, LessOrEqual, And, Range, Shape). What the numbers
mean for the precision-matched reference (reference/src/arith.rs): docs/qnn.md.

Usage: htp-op-limits.py [--json OUT]   (the QNN libraries as for scripts/htp-bisect.py)
"""
import argparse
import importlib.util
import json
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("htp_bisect", os.path.join(HERE, "htp-bisect.py"))
htp_bisect = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(htp_bisect)

N = 64
node = helper.make_node


def _softmax(r):
    e = np.exp(r - r.max())
    return e / e.sum()


# name: (op class, nodes computing output `name` from x (and x2 = x·2), float64 of the row x)
OPS = {
    "mul x*2": ("Mul", [node("Mul", ["x", "two"], ["mul x*2"])], lambda x: 2 * x),
    "mul x*x": ("Mul", [node("Mul", ["x", "x"], ["mul x*x"])], lambda x: x * x),
    "div x/0.5": ("Div", [node("Div", ["x", "half"], ["div x/0.5"])], lambda x: 2 * x),
    "add x+x": ("Add", [node("Add", ["x", "x"], ["add x+x"])], lambda x: 2 * x),
    "add x2+0": ("Add", [node("Add", ["x2", "zero"], ["add x2+0"])], lambda x: 2 * x),
    "add m+m": ("Add", [node("Add", ["m", "m2"], ["add m+m"])], lambda x: 3 * x),
    "add x+y": ("Add", [node("Add", ["x", "y"], ["add x+y"])], lambda x: 2 * x),
    "add mm+mm": ("Add", [node("Add", ["mm", "mm2"], ["add mm+mm"])], lambda x: 2 * x),
    "add g+mm": ("Add", [node("Add", ["g", "mm"], ["add g+mm"])], lambda x: 2 * x),
    "add x2+x": ("Add", [node("Add", ["x2", "x"], ["add x2+x"])], lambda x: 3 * x),
    "sub x-(-x)": ("Sub", [node("Sub", ["x", "negx"], ["sub x-(-x)"])], lambda x: 2 * x),
    "sub x-y": ("Sub", [node("Sub", ["x", "negy"], ["sub x-y"])], lambda x: 2 * x),
    "matmul m·I": ("MatMul", [node("MatMul", ["m", "eye"], ["matmul m·I"])], lambda x: 1.5 * x),
    "matmul m·2I": ("MatMul", [node("MatMul", ["m", "eye2"], ["matmul m·2I"])], lambda x: 3 * x),
    "matmul x·2I": ("MatMul", [node("MatMul", ["x", "eye2"], ["matmul x·2I"])], lambda x: 2 * x),
    "matmul x2·I": ("MatMul", [node("MatMul", ["x2", "eye"], ["matmul x2·I"])], lambda x: 2 * x),
    "matmul x·1": ("MatMul", [node("MatMul", ["x", "ones"], ["matmul x·1"])],
                   lambda x: np.full_like(x, x.sum())),
    "reducemean x2": ("ReduceMean", [node("ReduceMean", ["x2"], ["reducemean x2"], axes=[-1], keepdims=1)],
                      lambda x: np.array([np.mean(2 * x)])),
    "reducemean x*x": ("ReduceMean", [node("Mul", ["x", "x"], ["sq"]),
                                      node("ReduceMean", ["sq"], ["reducemean x*x"], axes=[-1], keepdims=1)],
                       lambda x: np.array([np.mean(x * x)])),
    "sqrt x2": ("Sqrt", [node("Sqrt", ["absx2"], ["sqrt x2"])], lambda x: np.sqrt(np.abs(2 * x))),
    "neg x2": ("Neg", [node("Neg", ["x2"], ["neg x2"])], lambda x: -2 * x),
    "abs -x2": ("Abs", [node("Abs", ["negx2"], ["abs -x2"])], lambda x: np.abs(2 * x)),
    "max(x2,x)": ("Max", [node("Max", ["x2", "x"], ["max(x2,x)"])], lambda x: np.maximum(2 * x, x)),
    "reducemax x2": ("ReduceMax", [node("ReduceMax", ["x2"], ["reducemax x2"], axes=[-1], keepdims=1)],
                     lambda x: np.array([np.max(2 * x)])),
    "concat x2,x": ("Concat", [node("Concat", ["x2", "x"], ["concat x2,x"], axis=-1)],
                    lambda x: np.concatenate([2 * x, x])),
    "transpose x2": ("Transpose", [node("Transpose", ["x2"], ["transpose x2"], perm=[0, 2, 1])],
                     lambda x: 2 * x),
    "reshape x2": ("Reshape", [node("Reshape", ["x2", "shape"], ["reshape x2"])], lambda x: 2 * x),
    "slice x2": ("Slice", [node("Slice", ["x2", "s0", "s1", "sax"], ["slice x2"])], lambda x: 2 * x[:N // 2]),
    "gather x2": ("Gather", [node("Gather", ["x2", "idx"], ["gather x2"], axis=-1)], lambda x: 2 * x[:2]),
    "expand x2": ("Expand", [node("Expand", ["x2", "eshape"], ["expand x2"])], lambda x: np.tile(2 * x, 2)),
    "where x2": ("Where", [node("Where", ["yes", "x2", "lowest"], ["where x2"])], lambda x: 2 * x),
    "sigmoid x2": ("Sigmoid", [node("Sigmoid", ["x2"], ["sigmoid x2"])], lambda x: 1 / (1 + np.exp(-2 * x))),
    "silu x2": ("Mul", [node("Sigmoid", ["x2"], ["sg"]), node("Mul", ["x2", "sg"], ["silu x2"])],
                lambda x: 2 * x / (1 + np.exp(-2 * x))),
    "softmax x2": ("Softmax", [node("Softmax", ["x2"], ["softmax x2"], axis=-1)], lambda x: _softmax(2 * x)),
}
WIDE = {"x2", "m", "m2", "negx2", "absx2"}  # inputs that can hold values beyond 65504 (Mul outputs)
COMMON = [node("Mul", ["x", "two"], ["x2"]), node("Mul", ["x", "minus1"], ["negx"]),
          node("Neg", ["x2"], ["negx2"]), node("Abs", ["x2"], ["absx2"]),
          node("Mul", ["x", "onehalf"], ["m"]), node("Mul", ["y", "onehalf"], ["m2"]),
          node("MatMul", ["x", "eye"], ["mm"]), node("MatMul", ["y", "eye"], ["mm2"]),
          node("Gather", ["x", "all"], ["g"], axis=-1), node("Neg", ["y"], ["negy"])]


def graph():
    nodes = COMMON + [n for _, ns, _ in OPS.values() for n in ns]
    outs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in OPS]
    c = lambda v, name, dt=np.float32: numpy_helper.from_array(np.asarray(v, dt), name)
    inits = [c(np.eye(N), "eye"), c(2 * np.eye(N), "eye2"), c(np.ones((N, N)), "ones"),
             c(2.0, "two"), c(0.5, "half"), c(0.0, "zero"), c(-1.0, "minus1"), c(1.5, "onehalf"), c(np.arange(N), "all", np.int64),
             c([1, N, 1], "shape", np.int64), c([0], "s0", np.int64), c([N // 2], "s1", np.int64),
             c([-1], "sax", np.int64), c([0, 1], "idx", np.int64), c([2, 1, N], "eshape", np.int64),
             c(np.ones((1, 1, N), bool), "yes", bool), c(-65504.0, "lowest")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, N])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, N])
    m = helper.make_model(helper.make_graph(nodes, "limits", [x, y], outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write {op class: {clamp, rows}} here as well")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "limits.onnx")
        onnx.save(graph(), path)
        sess = htp_bisect.htp_session(path, {})
        rows = {f"all {v:g}": np.full(N, v) for v in (1000.0, 3000.0, 20000.0, 33000.0, 40000.0, 50000.0, 64000.0)}
        rows["all -40000"] = np.full(N, -40000.0)
        rows["one 1000, rest 0"] = np.eye(1, N)[0] * 1000.0
        rows["one 50000, rest 0"] = np.eye(1, N)[0] * 50000.0
        # per op class, over the probes whose inputs stay in fp16's range: the largest |HTP output|
        # where float64's was larger (the clamp) and the largest kept; over the probes fed a
        # value beyond 65504 (a Mul output): the rows HTP got wrong beyond fp16 rounding
        summary = {}
        for label, row in rows.items():
            x = row.astype(np.float32).reshape(1, 1, N)
            got = dict(zip(OPS, sess.run(None, {"x": x, "y": x.copy()})))
            cells = []
            for k, (cls, nodes, f) in OPS.items():
                h = got[k].astype(np.float64).ravel()
                e = f(row.astype(np.float64)).ravel()
                cells.append(f"{k} {h[0]:.6g} (f64 {e[0]:.6g})")
                s = summary.setdefault(cls, {"clamped_at": None, "largest_kept": 0.0,
                                             "non_finite": 0, "wide_inputs_wrong": []})
                fin = np.isfinite(h)
                s["non_finite"] += int(np.sum(~fin))
                off = np.abs(h - e) > np.abs(e) * 2 ** -10 + 1e-3
                right = fin & ~off
                s["largest_kept"] = max(s["largest_kept"], float(np.max(np.abs(h[right]), initial=0.0)))
                if any(i in WIDE for n in nodes for i in n.input):
                    if np.any(off):
                        i = int(np.argmax(off))
                        s["wide_inputs_wrong"].append(f"{k} on '{label}': {h[i]:.6g} for {e[i]:.6g}")
                    continue
                s["in_range"] = True
                lost = off & (np.abs(e) > np.abs(h))
                if np.any(lost):
                    s["clamped_at"] = max(s["clamped_at"] or 0.0, float(np.max(np.abs(h[lost]))))
            print(f"{label}: " + "; ".join(cells))
        print()
        for cls, s in summary.items():
            at = f"clamps at {s['clamped_at']:g}" if s["clamped_at"] else "never below float64"
            at = f"in-range inputs {at}" if s.get("in_range") else "inputs from a Mul"
            wrong = s["wide_inputs_wrong"]
            more = f"; fed a value beyond 65504: {len(wrong)} wrong ({wrong[0]})" if wrong else ""
            print(f"{cls}: {at}, largest |output| kept {s['largest_kept']:g}; "
                  f"non-finite {s['non_finite']}{more}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
