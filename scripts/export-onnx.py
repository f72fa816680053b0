#!/usr/bin/env python3
"""Exports a float32 Llama-family Hugging Face folder as an ONNX Runtime GenAI model folder.

Why a project script and not a real converter (issue 22): onnxruntime-genai's model builder
(`onnxruntime_genai.models.builder`) and optimum both import torch and transformers (gigabytes,
and the builder downloads a config from the hub for a GGUF); this needs only the `onnx` package
and numpy, runs offline in seconds, and follows the builder's names and shapes
(onnxruntime-genai `src/python/py/models/builders/base.py`, contract doc G:b):

  inputs   input_ids int64 [batch_size, sequence_length]
           attention_mask int64 [batch_size, total_sequence_length]
           position_ids int64 [batch_size, sequence_length]
           past_key_values.N.key / .value float32 [batch_size, H, past_sequence_length, D]
  outputs  logits float32 [batch_size, sequence_length, vocab_size]
           present.N.key / .value float32 [batch_size, H, total_sequence_length, D]

Convention (a), the default decoder: dynamic past/present, fp32, no shared buffer
(`search.past_present_share_buffer` false: present = concat(past, new)). One deviation from a
builder export, on purpose: attention is plain ONNX ops (MatMul, Softmax) instead of the
contrib GroupQueryAttention op, and the 2-D attention_mask is applied per key column (HF
semantics) on top of the causal rule. GQA reads the mask only as a length (seqlens_k =
sum(mask) - 1), so it cannot express the masks kvprobe's probes send (self only, single key);
with the all-ones mask GenAI builds the two graphs compute the same function.

Convention (b), `--window W` (context C = --max-length): the NPU style of GenAI's windowed cache
(contract doc §3, onnxruntime-genai `src/models/windowed_kv_cache.cpp`, docs/onnx-genai.md W0-W6):
static shapes around a fixed window and cache, the prompt padded and run in chunks of W:

  inputs   input_ids int32 [1, sequence_length]      (W for a prompt chunk, 1 for a token)
           attention_mask int32 [1, C]               (static)
           position_ids int32 [1, sequence_length]
           past_key_values.N.key [H, 1, D, past_sequence_length]   (C - W, then C - 1)
           past_key_values.N.value [H, 1, past_sequence_length, D]
  outputs  logits float32 [1, sequence_length, vocab_size]
           present.N.key [H, 1, D, sequence_length], present.N.value [H, 1, sequence_length, D]

with the KV I/O float32 or, `--kv-dtype uint8`, QDQ uint8 (zero point 128 = pad_value; one scale
per layer and K/V, calibrated on the float32 graph, also written to kv_quant.json). GenAI itself
runs only the uint8 variant (its windowed cache requires uint8).

`--static` (with --window) also writes the two static-shape graphs an NPU compiler needs (QNN HTP
takes no symbolic axis; the shape of Qualcomm's LLM flows): model.prefill.onnx (sequence_length
= W, past_sequence_length = C - W) and model.decode.onnx (1 and C - 1), the same graph with the
axes fixed, sharing model.onnx.data; static_graphs.json names them (docs/qnn.md).

`--rmsnorm naive` writes RMSNorm as x*x straight into ReduceMean (the default divides each row by
its max |x| first): the graph whose squares overflow fp16 on SmolLM2, kept as the regression case
of the HTP garbage (docs/qnn.md).

Usage: export-onnx.py HF_DIR OUT_DIR [--max-length N] [--window W [--kv-dtype float32|uint8] [--static]] [--rmsnorm scaled|naive]
HF_DIR: config.json + model.safetensors (+ tokenizer.json), e.g. written by
`cargo run -p kvprobe-npu --example onnx_weights -- MODEL HF_DIR` (the reference's f32 weights).
"""
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    sys.exit("export-onnx.py: the `onnx` Python package is missing; pip install onnx")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from np_reference import load_hf_dir  # noqa: E402  (the project's independent safetensors reader)

OPSET = 17


class Graph:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0
        self.rmsnorm = "scaled"

    def name(self, base):
        self.n += 1
        return f"/{base}_{self.n}"

    def op(self, op_type, inputs, base=None, **attrs):
        out = self.name(base or op_type)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out + "/node", **attrs))
        return out

    def op_to(self, op_type, inputs, output, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output + "/node", **attrs))
        return output

    def const(self, name, array):
        # (np.ascontiguousarray would turn a 0-d scalar into shape [1])
        a = np.asarray(array)
        self.inits.append(numpy_helper.from_array(a if a.ndim == 0 else np.ascontiguousarray(a), name))
        return name

    def i64(self, values, base="c"):
        return self.const(self.name(base), np.asarray(values, dtype=np.int64))


def rms_norm(g, x, w_name, eps):
    """RMSNorm, x / sqrt(mean(x^2) + eps) * w. Scaled (the default): the statistic is taken on
    y = x / sqrt(m), m = the row's max |x|, so no square exceeds m (itself an fp16 value), and x
    is divided by sqrt(m) * sqrt(mean(y^2) + eps / m): the same function, inside fp16's range
    where HTP computes in fp16. SmolLM2's residual stream reaches |x| ~ 770 from layer 3 on (2.5e4
    on one channel from layer 12), whose square fp16 cannot hold: HTP saturates it and the naive
    norm's output is garbage from there (docs/qnn.md, scripts/htp-bisect.py). Dividing by m itself
    is not enough: 1 / 2.5e4 is below fp16's normal range, and HTP (measured) then loses y.
    `naive` (--rmsnorm naive) keeps the overflowing graph as the regression case of the diagnosis."""
    if g.rmsnorm == "naive":
        sq = g.op("Mul", [x, x])
        mean = g.op("ReduceMean", [sq], axes=[-1], keepdims=1)
        den = g.op("Sqrt", [g.op("Add", [mean, g.const(g.name("eps"), np.array(eps, np.float32))])])
        return g.op("Mul", [g.op("Div", [x, den]), w_name])
    # m floored at fp16's smallest normal: an all-zero row stays 0 instead of 0/0
    tiny = g.const(g.name("norm_floor"), np.array(2.0 ** -14, np.float32))
    m = g.op("Max", [g.op("ReduceMax", [g.op("Abs", [x])], axes=[-1], keepdims=1), tiny])
    r = g.op("Sqrt", [m])
    y = g.op("Div", [x, r])
    mean = g.op("ReduceMean", [g.op("Mul", [y, y])], axes=[-1], keepdims=1)
    e = g.op("Div", [g.const(g.name("eps"), np.array(eps, np.float32)), m])
    den = g.op("Mul", [r, g.op("Sqrt", [g.op("Add", [mean, e])])])
    return g.op("Mul", [g.op("Div", [x, den]), w_name])


def rope(g, x, cos, sin, half):
    """HF rotate_half RoPE on x [B, h, S, D] with cos/sin [B, 1, S, D]."""
    x1 = g.op("Slice", [x, g.i64([0]), g.i64([half]), g.i64([3])])
    x2 = g.op("Slice", [x, g.i64([half]), g.i64([2 * half]), g.i64([3])])
    rot = g.op("Concat", [g.op("Neg", [x2]), x1], axis=3)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rot, sin])])


def heads(g, x, n, d):
    """[B, S, n*d] -> [B, n, S, d]."""
    r = g.op("Reshape", [x, g.i64([0, 0, n, d])])
    return g.op("Transpose", [r], perm=[0, 2, 1, 3])


def expand_kv(g, x, kv, rep, d):
    """[B, kv, T, d] -> [B, kv*rep, T, d], each KV head repeated rep times in a row (HF repeat_kv)."""
    if rep == 1:
        return x
    u = g.op("Unsqueeze", [x, g.i64([2])])
    shp = g.op("Shape", [u])
    reps = g.op("Concat", [g.op("Slice", [shp, g.i64([0]), g.i64([2]), g.i64([0])]), g.i64([rep]),
                           g.op("Slice", [shp, g.i64([3]), g.i64([5]), g.i64([0])])], axis=0)
    e = g.op("Expand", [u, reps])
    return g.op("Reshape", [e, g.i64([0, kv * rep, -1, d])])


def windowed_kv(g, i, k, v, scales):
    """Convention (b), one layer: the new K [1, H, S, D] leaves as present K [H, 1, D, S], V as
    [H, 1, S, D]; the past (K [H, 1, D, C-S], V [H, 1, C-S, D]) and the new entries are joined
    along the sequence into [1, H, C, D] for the attention. With scales (k, v) the cache I/O is
    uint8 with zero point 128 (= pad_value, so an unwritten slot dequantises to 0): present =
    QuantizeLinear(new), and the attention reads every entry, the new ones included, as
    DequantizeLinear(uint8), i.e. exactly what a later run reads back from the cache."""
    pk_in, pv_in = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
    k_out = g.op("Transpose", [k], perm=[1, 0, 3, 2])  # [H, 1, D, S]
    v_out = g.op("Transpose", [v], perm=[1, 0, 2, 3])  # [H, 1, S, D]
    if scales is not None:
        zp = g.const(f"kv_zero_point", np.array(128, np.uint8)) if i == 0 else "kv_zero_point"
        ks = g.const(f"{pk_in}_scale", np.array(scales[0], np.float32))
        vs = g.const(f"{pv_in}_scale", np.array(scales[1], np.float32))
        kq = g.op_to("QuantizeLinear", [k_out, ks, zp], f"present.{i}.key")
        vq = g.op_to("QuantizeLinear", [v_out, vs, zp], f"present.{i}.value")
        k_new, v_new = g.op("DequantizeLinear", [kq, ks, zp]), g.op("DequantizeLinear", [vq, vs, zp])
        k_past, v_past = g.op("DequantizeLinear", [pk_in, ks, zp]), g.op("DequantizeLinear", [pv_in, vs, zp])
    else:
        g.op_to("Identity", [k_out], f"present.{i}.key")
        g.op_to("Identity", [v_out], f"present.{i}.value")
        k_new, v_new, k_past, v_past = k_out, v_out, pk_in, pv_in
    kall = g.op("Concat", [k_past, k_new], axis=3)  # [H, 1, D, C]
    vall = g.op("Concat", [v_past, v_new], axis=2)  # [H, 1, C, D]
    return g.op("Transpose", [kall], perm=[1, 0, 3, 2]), g.op("Transpose", [vall], perm=[1, 0, 2, 3])


def build(cfg, w, inv_freq, max_len, window=None, kv_scales=None, rmsnorm="scaled"):
    """window None: convention (a). window W: convention (b), GenAI's windowed cache (see the
    module doc); kv_scales [(k_scale, v_scale)] per layer makes its cache I/O uint8 (QDQ);
    rmsnorm "scaled" or "naive" (see rms_norm)."""
    H, NH = cfg["num_key_value_heads"], cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    D = cfg.get("head_dim") or hidden // NH
    L, V, eps = cfg["num_hidden_layers"], cfg["vocab_size"], float(cfg["rms_norm_eps"])
    g = Graph()
    g.rmsnorm = rmsnorm
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    # RoPE tables [rows, D/2]: angle = f32(pos) * f32(inv_freq) in f32, as HF and the reference;
    # the windowed graph's positions may pass C (generation past capacity, a fault to observe)
    rows = max_len if window is None else max(max_len, int(cfg.get("max_position_embeddings", max_len)))
    pos = np.arange(rows, dtype=np.float32)[:, None]
    ang = (pos * f32(inv_freq)[None, :]).astype(np.float32)
    g.const("cos_cache", np.cos(ang.astype(np.float64)).astype(np.float32))
    g.const("sin_cache", np.sin(ang.astype(np.float64)).astype(np.float32))
    g.const("model.embed_tokens.weight", f32(w["model.embed_tokens.weight"]))

    x = g.op("Gather", ["model.embed_tokens.weight", "input_ids"], axis=0)
    # cos/sin [B, 1, S, D] from position_ids
    def table(name):
        t = g.op("Gather", [name, "position_ids"], axis=0)  # [B, S, D/2]
        full = g.op("Concat", [t, t], axis=2)
        return g.op("Unsqueeze", [full, g.i64([1])])
    cos, sin = table("cos_cache"), table("sin_cache")
    # mask [B, 1, S, T]: key j allowed iff attention_mask[b, j] == 1 and j <= T - S + i
    # scalar S and T by Gather (a Squeeze of a Slice trips ORT's shape inference when T is static)
    s0 = g.op("Gather", [g.op("Shape", ["input_ids"]), g.i64(1)], axis=0)
    t0 = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.i64(1)], axis=0)
    q_abs = g.op("Range", [g.op("Sub", [t0, s0]), t0, g.i64(1)])  # [S]
    k_idx = g.op("Range", [g.i64(0), t0, g.i64(1)])  # [T]
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [k_idx, g.i64([0])]),
                                  g.op("Unsqueeze", [q_abs, g.i64([1])])])  # [S, T]
    one = g.i64(1) if window is None else g.const(g.name("one32"), np.array(1, np.int32))
    keys = g.op("Equal", ["attention_mask", one])  # [B, T]
    keys = g.op("Unsqueeze", [keys, g.i64([1, 2])])  # [B, 1, 1, T]
    allowed = g.op("And", [causal, keys])  # [B, 1, S, T]
    allowed_f = g.op("Cast", [allowed], to=TensorProto.FLOAT)
    neg = g.const("mask_min", np.array(np.finfo(np.float32).min, np.float32))
    scale = g.const("attn_scale", np.array(1.0 / math.sqrt(D), np.float32))

    for i in range(L):
        p = f"model.layers.{i}."
        for n in ["input_layernorm", "post_attention_layernorm"]:
            g.const(p + n + ".weight", f32(w[p + n + ".weight"]))
        def lin(name, inp):
            wt = g.const(p + name + ".weight.T", f32(w[p + name + ".weight"]).T)
            y = g.op("MatMul", [inp, wt])
            if p + name + ".bias" in w:
                y = g.op("Add", [y, g.const(p + name + ".bias", f32(w[p + name + ".bias"]))])
            return y
        h = rms_norm(g, x, p + "input_layernorm.weight", eps)
        q = rope(g, heads(g, lin("self_attn.q_proj", h), NH, D), cos, sin, D // 2)
        k = rope(g, heads(g, lin("self_attn.k_proj", h), H, D), cos, sin, D // 2)
        v = heads(g, lin("self_attn.v_proj", h), H, D)
        if window is None:
            pk = g.op_to("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
            pv = g.op_to("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        else:
            pk, pv = windowed_kv(g, i, k, v, None if kv_scales is None else kv_scales[i])
        ke, ve = expand_kv(g, pk, H, NH // H, D), expand_kv(g, pv, H, NH // H, D)
        sc = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [ke], perm=[0, 1, 3, 2])]), scale])
        sc = g.op("Where", [allowed, sc, neg])
        # a row that may attend nothing gets a zero output (as the reference), never uniform
        pr = g.op("Mul", [g.op("Softmax", [sc], axis=-1), allowed_f])
        o = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [pr, ve])], perm=[0, 2, 1, 3]),
                             g.i64([0, 0, NH * D])])
        x = g.op("Add", [x, lin("self_attn.o_proj", o)])
        h = rms_norm(g, x, p + "post_attention_layernorm.weight", eps)
        gate = lin("mlp.gate_proj", h)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), lin("mlp.up_proj", h)])
        x = g.op("Add", [x, lin("mlp.down_proj", act)])
    g.const("model.norm.weight", f32(w["model.norm.weight"]))
    x = rms_norm(g, x, "model.norm.weight", eps)
    g.const("lm_head.weight.T", f32(w["lm_head.weight"]).T)
    g.op_to("MatMul", [x, "lm_head.weight.T"], "logits")

    if window is None:
        kv = lambda n, t: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch_size", H, t, D])  # noqa: E731
        inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
                  helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
                  helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", V])]
        for i in range(L):
            inputs += [kv(f"past_key_values.{i}.key", "past_sequence_length"), kv(f"past_key_values.{i}.value", "past_sequence_length")]
            outputs += [kv(f"present.{i}.key", "total_sequence_length"), kv(f"present.{i}.value", "total_sequence_length")]
    else:
        # GenAI's windowed cache (G:wkv): head axis first, batch second, K transposed; the
        # sequence axis is W (a prompt chunk) or 1 (a token), the past C - W or C - 1, so every
        # run attends over exactly C = context_length slots (the static mask [1, C]).
        C = max_len
        et = TensorProto.FLOAT if kv_scales is None else TensorProto.UINT8
        i32 = lambda n, shp: helper.make_tensor_value_info(n, TensorProto.INT32, shp)  # noqa: E731
        kvi = lambda n, shp: helper.make_tensor_value_info(n, et, shp)  # noqa: E731
        inputs = [i32("input_ids", [1, "sequence_length"]), i32("attention_mask", [1, C]),
                  i32("position_ids", [1, "sequence_length"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "sequence_length", V])]
        for i in range(L):
            inputs += [kvi(f"past_key_values.{i}.key", [H, 1, D, "past_sequence_length"]),
                       kvi(f"past_key_values.{i}.value", [H, 1, "past_sequence_length", D])]
            outputs += [kvi(f"present.{i}.key", [H, 1, D, "sequence_length"]),
                        kvi(f"present.{i}.value", [H, 1, "sequence_length", D])]
    graph = helper.make_graph(g.nodes, "kvprobe-genai-decoder", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="kvprobe scripts/export-onnx.py")
    model.ir_version = 8
    return model, D


def genai_config(cfg, D, max_len, window=None, uint8=False):
    bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    out = genai_config_a(cfg, D, max_len, bos, eos)
    if window is not None:
        # G:cfg `decoder.sliding_window`; pad_value fills unwritten slots (GenAI fills uint8
        # bytes: 128 is the zero point here, so they dequantise to 0; the float32 variant's
        # unwritten slots are 0.0 too)
        out["model"]["decoder"]["sliding_window"] = {
            "window_size": window, "pad_value": 128 if uint8 else 0, "alignment": "right",
            "slide_key_value_cache": True, "slide_inputs": True}
        # the builder's QNN exports share no buffer; the windowed cache never does (G:kv)
        out["search"]["past_present_share_buffer"] = False
    return out


def genai_config_a(cfg, D, max_len, bos, eos):
    return {
        "model": {
            "bos_token_id": bos if bos is not None else 0,
            "context_length": max_len,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": D,
                "hidden_size": cfg["hidden_size"],
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "position_ids": "position_ids",
                           "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": cfg["num_attention_heads"],
                "num_hidden_layers": cfg["num_hidden_layers"],
                "num_key_value_heads": cfg["num_key_value_heads"],
            },
            "eos_token_id": eos if eos is not None else 0,
            "pad_token_id": eos if eos is not None else 0,
            "type": "llama",
            "vocab_size": cfg["vocab_size"],
        },
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True,
                   "length_penalty": 1.0, "max_length": max_len, "min_length": 0,
                   "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
                   "past_present_share_buffer": False, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 1, "top_p": 1.0},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--max-length", type=int, default=None,
                    help="context_length and search.max_length [default: max_position_embeddings]")
    ap.add_argument("--window", type=int, default=None,
                    help="convention (b): GenAI's windowed cache with window (chunk) W; context C = --max-length")
    ap.add_argument("--kv-dtype", choices=["float32", "uint8"], default="float32",
                    help="convention (b): the cache I/O type (uint8 = QDQ, scales calibrated on the export's own float run)")
    ap.add_argument("--static", action="store_true",
                    help="convention (b): also the static-shape prefill and decode graphs (docs/qnn.md)")
    ap.add_argument("--rmsnorm", choices=["scaled", "naive"], default="scaled",
                    help="naive = x*x straight into ReduceMean, which overflows fp16 on SmolLM2 (the HTP regression case, docs/qnn.md)")
    a = ap.parse_args()
    if a.static and a.window is None:
        sys.exit("export-onnx.py: --static fixes the windowed graph's axes; it needs --window")
    cfg, w = load_hf_dir(a.hf_dir)
    if cfg.get("model_type") not in ("llama", "mistral", "qwen2"):
        sys.exit(f"export-onnx.py: {a.hf_dir}: model_type {cfg.get('model_type')!r} is not a Llama-family decoder")
    max_len = a.max_length or int(cfg["max_position_embeddings"])
    NH = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // NH
    inv = cfg.get("kvprobe_inv_freq")
    if inv is None:
        inv = 1.0 / (float(cfg.get("rope_theta", 10000.0)) ** (np.arange(0, D, 2, dtype=np.float32) / D))
    if "lm_head.weight" not in w:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    scales = None
    if a.window is not None:
        if a.window <= 1 or max_len < 2 * a.window:
            sys.exit(f"export-onnx.py: --window {a.window} with context {max_len}: GenAI needs W > 1 and C >= 2W")
        if a.kv_dtype == "uint8":
            scales = calibrate(build(cfg, w, inv, max_len, a.window, rmsnorm=a.rmsnorm)[0], cfg, max_len, a.window)
    elif a.kv_dtype != "float32":
        sys.exit("export-onnx.py: --kv-dtype uint8 is for convention (b) (--window)")
    model, D = build(cfg, w, inv, max_len, a.window, scales, a.rmsnorm)
    # a writer's own staging folder (two exports to one folder must not share it), renamed into
    # place whole so a reader never sees half a folder
    tmp = f"{a.out_dir.rstrip('/')}.part-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    onnx.save_model(model, os.path.join(tmp, "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
    if a.static:
        write_static(tmp, a.window, max_len)
    if scales is not None:
        # GenAI only moves the cache's bytes; kvprobe reads the scales to show the states as fp16
        with open(os.path.join(tmp, "kv_quant.json"), "w") as f:
            json.dump({"zero_point": 128, "scales": scales}, f, indent=1)
    with open(os.path.join(tmp, "genai_config.json"), "w") as f:
        json.dump(genai_config(cfg, D, max_len, a.window, scales is not None), f, indent=4)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(a.hf_dir, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(tmp, name))
    # onnx writes model.onnx.data 0600; every file gets what a plain create gives (0666 less the
    # umask), like the other files, so the folder's group can read the weights
    mask = os.umask(0)
    os.umask(mask)
    for name in os.listdir(tmp):
        os.chmod(os.path.join(tmp, name), 0o666 & ~mask)
    shutil.rmtree(a.out_dir, ignore_errors=True)
    os.rename(tmp, a.out_dir)
    print(f"export-onnx.py: wrote {a.out_dir} ({L_desc(cfg)})")


def write_static(folder, W, C):
    """The windowed graph with its two symbolic axes fixed, once per run kind: a prompt chunk
    (W new tokens over C - W past slots) and a token (1 over C - 1). Only the graph's I/O shapes
    change; the initializers stay references into model.onnx.data, so the graphs share weights."""
    m = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    graphs = {}
    for kind, seq, past in (("prefill", W, C - W), ("decode", 1, C - 1)):
        g = onnx.ModelProto()
        g.CopyFrom(m)
        fix = {"sequence_length": seq, "past_sequence_length": past}
        for vi in list(g.graph.input) + list(g.graph.output):
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param in fix:
                    v = fix[d.dim_param]
                    d.Clear()
                    d.dim_value = v
        # intermediate shapes were inferred with the symbols; ONNX Runtime infers them again
        del g.graph.value_info[:]
        name = f"model.{kind}.onnx"
        onnx.save_model(g, os.path.join(folder, name))
        graphs[kind] = {"filename": name, "sequence_length": seq, "past_sequence_length": past}
    with open(os.path.join(folder, "static_graphs.json"), "w") as f:
        json.dump(graphs, f, indent=1)


def calibrate(fp32_model, cfg, C, W):
    """Per-layer K and V scales of the uint8 cache: the float32 windowed graph run by ONNX Runtime
    on a fixed calibration prompt (C - W pseudo-random ids of the vocabulary, seed 0, as windows
    of W over the growing cache), scale = 1.25 * max |x| / 127 per tensor (zero point 128)."""
    try:
        import onnxruntime as ort
    except ImportError:
        sys.exit("export-onnx.py: --kv-dtype uint8 calibrates with the `onnxruntime` package; pip install onnxruntime")
    sess = ort.InferenceSession(fp32_model.SerializeToString(), providers=["CPUExecutionProvider"])
    L, H = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], size=C - W)
    past_k = [np.zeros((H, 1, D, C - W), np.float32) for _ in range(L)]
    past_v = [np.zeros((H, 1, C - W, D), np.float32) for _ in range(L)]
    peak = np.zeros((L, 2))
    for c in range(len(ids) // W):
        feed = {"input_ids": ids[c * W:(c + 1) * W][None].astype(np.int32),
                "position_ids": np.arange(c * W, (c + 1) * W, dtype=np.int32)[None],
                "attention_mask": (np.arange(C) >= C - (c + 1) * W).astype(np.int32)[None]}
        for i in range(L):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = past_k[i], past_v[i]
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        for i in range(L):
            k, v = outs[f"present.{i}.key"], outs[f"present.{i}.value"]
            peak[i] = np.maximum(peak[i], [np.abs(k).max(), np.abs(v).max()])
            past_k[i] = np.concatenate([past_k[i][..., W:], k], axis=3)
            past_v[i] = np.concatenate([past_v[i][:, :, W:], v], axis=2)
    return [(float(1.25 * k / 127), float(1.25 * v / 127)) for k, v in np.maximum(peak, 1e-6)]


def L_desc(cfg):
    return (f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads on "
            f"{cfg['num_key_value_heads']} KV heads, vocab {cfg['vocab_size']}")


if __name__ == "__main__":
    main()
