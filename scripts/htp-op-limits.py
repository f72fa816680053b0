#!/usr/bin/env python3
"""Where Qualcomm's HTP simulator (fp16, issue 36) clamps each op's output: one 64-wide row through
Mul, Div, Add, MatMul (identity and all-ones weights) and x·x → ReduceMean, on the QNN HTP backend
(every node on HTP) and in float64, printed side by side. The precision-matched reference
(reference/src/arith.rs) models one saturation point for every op; this shows which ops keep it.

Usage: htp-op-limits.py   (the QNN libraries as for scripts/htp-bisect.py)
"""
import importlib.util
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
OPS = {  # name: (nodes, float64 of the row x)
    "mul x*2": ([helper.make_node("Mul", ["x", "two"], ["mul x*2"])], lambda x: 2 * x),
    "div x/0.5": ([helper.make_node("Div", ["x", "half"], ["div x/0.5"])], lambda x: 2 * x),
    "add x+x": ([helper.make_node("Add", ["x", "x"], ["add x+x"])], lambda x: 2 * x),
    "matmul x·I": ([helper.make_node("MatMul", ["x", "eye"], ["matmul x·I"])], lambda x: x),
    "matmul x·1": ([helper.make_node("MatMul", ["x", "ones"], ["matmul x·1"])], lambda x: np.full_like(x, x.sum())),
    "mean(x*x)": ([helper.make_node("Mul", ["x", "x"], ["sq"]),
                   helper.make_node("ReduceMean", ["sq"], ["mean(x*x)"], axes=[-1], keepdims=1)],
                  lambda x: np.array([np.mean(x * x)])),
}


def graph():
    nodes = [n for ns, _ in OPS.values() for n in ns]
    outs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in OPS]
    inits = [numpy_helper.from_array(np.eye(N, dtype=np.float32), "eye"),
             numpy_helper.from_array(np.ones((N, N), np.float32), "ones"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, N])
    m = helper.make_model(helper.make_graph(nodes, "limits", [x], outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "limits.onnx")
        onnx.save(graph(), path)
        sess = htp_bisect.htp_session(path, {})
        rows = {f"all {v:g}": np.full(N, v) for v in (1000.0, 1500.0, 3000.0, 20000.0, 40000.0, 64000.0)}
        rows["one 1000, rest 0"] = np.eye(1, N)[0] * 1000.0
        for label, row in rows.items():
            x = row.astype(np.float32).reshape(1, 1, N)
            got = dict(zip(OPS, sess.run(None, {"x": x})))
            cells = [f"{k} {got[k].ravel()[0]:.6g} (f64 {f(row.astype(np.float64)).ravel()[0]:.6g})" for k, (_, f) in OPS.items()]
            print(f"{label}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
