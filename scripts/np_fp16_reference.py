#!/usr/bin/env python3
"""Independent numpy fp16 forward for kvprobe's fp16 precision-matched reference (issue 36).

The same layer math as scripts/np_reference.py's Llama (HF folders), with every op output rounded
to fp16 the way the ONNX graphs compute it: float32 accumulation inside an op (products, means,
softmax sums), the output cast to fp16. Weights are cast to fp16 once. Written from the ONNX
graphs of scripts/export-onnx.py and numpy's own float16 cast, sharing no code with the Rust crate.

  logits --model HF_DIR --ids 1,2,3 --out FILE.npy --overflow inf|saturate:LIMIT
         --norm squares|max-scaled|fused
Prints JSON {"overflow": null | {"layer": L|null, "op": NAME, "value": V}}: the first op output
that left the declared range (inf: rounded to ±inf; saturate: beyond LIMIT).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import np_reference  # noqa: E402


class Fp16:
    """Rounds op outputs to fp16; `only` (a set of op names) rounds those alone, the rest stay
    float32 (scripts/ort-cpu-fp16-sites.py: where ONNX Runtime's CPU EP keeps fp16)."""

    def __init__(self, overflow, only=None):
        self.limit = None if overflow == "inf" else float(overflow.split(":", 1)[1])
        self.only = only
        self.layer = None
        self.within = None
        self.first = None

    def __call__(self, x, op):
        x = np.asarray(x, np.float32)
        if self.only is not None and op not in self.only:
            return x
        if self.limit is None:
            with np.errstate(over="ignore"):
                y = x.astype(np.float16).astype(np.float32)
            lost = np.isinf(y) & np.isfinite(x)
        else:
            # 11 significant bits at the value's own exponent, clamped at the limit
            m, e = np.frexp(x.astype(np.float64))
            y = (np.round(m * 2048.0) / 2048.0 * np.exp2(e)).astype(np.float32)
            small = np.abs(x) <= 65504.0
            with np.errstate(over="ignore"):
                y = np.where(small, x.astype(np.float16).astype(np.float32), y)
            lost = np.abs(y) > self.limit
            y = np.where(lost, np.copysign(self.limit, x), y).astype(np.float32)
        if self.first is None and lost.any():
            v = x[lost]
            self.first = {"layer": self.layer, "within": self.within, "op": op,
                          "value": float(v[np.argmax(np.abs(v))])}
        return y


def mean64(v):
    """The mean over the last axis accumulated in float64 (as the fp16 reference declares)."""
    return (np.sum(v.astype(np.float64), axis=-1, keepdims=True) / v.shape[-1]).astype(np.float32)


def rms(r, name, x, w, eps, form):
    r.within = name
    y = rms_in(r, x, w, eps, form)
    r.within = None
    return y


def rms_in(r, x, w, eps, form):
    if form == "fused":
        return r(x / np.sqrt(mean64(x * x) + np.float32(eps)) * w, "output")
    if form == "squares":
        sq = r(x * x, "x·x")
        ms = r(mean64(sq), "mean(x·x)")
        den = r(np.sqrt(r(ms + np.float32(eps), "mean + eps")), "sqrt")
    else:
        m = np.maximum(np.max(np.abs(x), axis=-1, keepdims=True), np.float32(2.0 ** -14))
        s = r(np.sqrt(m), "sqrt(max)")
        y = r(x / s, "x/√m")
        sq = r(y * y, "y·y")
        ms = r(mean64(sq), "mean(y·y)")
        e = r(np.float32(eps) / m, "eps/m")
        den = r(s * r(np.sqrt(r(ms + e, "mean + eps")), "sqrt"), "denominator")
    return r(r(x / den, "x/den") * w, "output")


def forward(m, ids, r, form, fp16_weights=True, skip_sum_f32=False):
    """`skip_sum_f32`: each norm after a residual add reads the float32 sum, not its fp16 rounding
    (ONNX Runtime's fp16 SkipSimplifiedLayerNormalization kernel; the rounded sum still carries on)."""
    w = {k: v.astype(np.float16).astype(np.float32) if fp16_weights else v for k, v in m.w.items()}
    T = len(ids)
    H, KV, hd = m.n_heads, m.n_kv, m.hd
    pos = np.arange(T)
    x = r(w["embed"][np.asarray(ids)], "embeddings")
    xn = x  # what the next norm reads
    allow = np.tril(np.ones((T, T), dtype=bool))
    for l in range(m.n_layers):
        r.layer = l
        p = f"l{l}."
        h = rms(r, "input_layernorm", xn, w[p + "attn_norm"], m.eps, form)
        q = r(h @ w[p + "q"].T, "q_proj").reshape(T, H, hd)
        k = r(h @ w[p + "k"].T, "k_proj").reshape(T, KV, hd)
        v = r(h @ w[p + "v"].T, "v_proj").reshape(T, KV, hd)
        q = r(m.apply_rope(q, pos), "rope q")
        k = r(m.apply_rope(k, pos), "rope k")
        k = np.repeat(k, H // KV, axis=1)
        v = np.repeat(v, H // KV, axis=1)
        sc = r(np.einsum("thd,shd->hts", q, k), "scores") / np.float32(np.sqrt(hd))
        pr = r(np_reference.softmax_masked(sc, allow[None]), "softmax")
        o = r(np.einsum("hts,shd->thd", pr, v).reshape(T, H * hd), "attention output")
        xs = x + r(o @ w[p + "o"].T, "o_proj")
        x = r(xs, "residual add")
        h = rms(r, "post_attention_layernorm", xs if skip_sum_f32 else x, w[p + "ffn_norm"], m.eps, form)
        g = r(h @ w[p + "gate"].T, "gate_proj")
        u = r(h @ w[p + "up"].T, "up_proj")
        with np.errstate(over="ignore"):
            s = r(g / (1.0 + np.exp(-g)), "silu")
        xs = x + r(r(s * u, "silu·up") @ w[p + "down"].T, "down_proj")
        x = r(xs, "residual add")
        xn = xs if skip_sum_f32 else x
    r.layer = None
    x = rms(r, "norm", xn, w["norm"], m.eps, form)
    return r(x @ w["lm_head"].T, "logits")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["logits"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--overflow", default="inf")
    ap.add_argument("--norm", choices=["squares", "max-scaled", "fused"], default="squares")
    a = ap.parse_args()
    m = np_reference.load_model(a.model, np.float32)
    if not isinstance(m, np_reference.Llama) or m.rope != "half" or m.rope_dim != m.hd:
        raise SystemExit(f"np_fp16_reference: {a.model}: only Llama-family HF folders (rotate_half RoPE)")
    r = Fp16(a.overflow)
    logits = forward(m, [int(t) for t in a.ids.split(",")], r, a.norm)
    np.save(a.out, logits.astype(np.float32))
    print(json.dumps({"overflow": r.first}))


if __name__ == "__main__":
    main()
