#!/usr/bin/env python3
"""Bakes an export bug into a copy of a model-builder folder (issue 35): graph-level faults.

    scripts/builder-graph-fault.py SRC OUT FAULT [--layer N] [--eps E]

SRC is a GenAI folder written by onnxruntime-genai's model builder (GroupQueryAttention, shared KV
buffer; scripts/export-builder.sh). OUT gets genai_config.json and the tokenizer files copied, the
rewritten model.onnx, and a copy of model.onnx.data (ONNX Runtime refuses a symlink that leaves
the folder, the onnx package a hard link): the weights a fault changes are written inline into
model.onnx, so the data file is copied unchanged and SRC is never modified.

The rewrite touches only the builder's own ops: their attributes, constants, initializers and
edges. Where a layout bug needs a data movement the graph lacks (present-layout), it is two
standard ONNX ops on one edge (Transpose, Reshape), what a missing or extra format conversion is.
Nothing here is a kvprobe op, and kvprobe is not told which fault a folder holds.

FAULT (LAYER is --layer, default num_hidden_layers // 2: the middle layer, never layer 0 on a
model of more than one layer, so a one-layer fault is told from a first-layer one):
  kv-heads       LAYER's GroupQueryAttention kv_num_heads set to num_heads: an exporter that
                 read num_attention_heads for the KV heads (the cache keeps num_key_value_heads)
  present-layout LAYER's present key written [B, S, H, D] (the op's [B, H, S, D] transposed)
                 and reinterpreted as [B, H, S, D]: the past is read in another layout than the
                 present is written
  kv-swap        LAYER's GroupQueryAttention outputs present.key and present.value exchanged (the
                 edges): K is stored in the value cache and V in the key cache
  norm-eps       LAYER's input RMSNorm epsilon set to --eps (default 0.1)
  norm-weight    LAYER's input RMSNorm weight dropped (set to ones)
Prints one line saying what was rewritten (node and layer).
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

try:
    import onnx
    from onnx import helper, numpy_helper
except ImportError:
    sys.exit("builder-graph-fault.py: needs the onnx package: python3 -m pip install onnx")

FAULTS = ("kv-heads", "present-layout", "kv-swap", "norm-eps", "norm-weight")


def die(msg):
    print(f"builder-graph-fault.py: {msg}", file=sys.stderr)
    sys.exit(2)


def layer_nodes(graph, layer, op_type):
    prefix = f"/model/layers.{layer}/"
    return [n for n in graph.node if n.op_type == op_type and n.name.startswith(prefix)]


def one(nodes, what):
    if len(nodes) != 1:
        die(f"expected one {what}, found {len(nodes)}: not a model-builder export?")
    return nodes[0]


def attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return a
    die(f"{node.name} has no attribute {name}")


def input_norm(graph, layer):
    """The RMSNorm in front of LAYER's attention: SimplifiedLayerNormalization on layer 0,
    SkipSimplifiedLayerNormalization (the residual add fused in) on the others."""
    prefix = f"/model/layers.{layer}/input_layernorm/"
    nodes = [n for n in graph.node if n.name.startswith(prefix)
             and n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")]
    return one(nodes, f"input RMSNorm of layer {layer}")


def kv_heads(graph, layer, _args):
    gqa = one(layer_nodes(graph, layer, "GroupQueryAttention"), f"GroupQueryAttention in layer {layer}")
    heads = attr(gqa, "num_heads").i
    kv = attr(gqa, "kv_num_heads")
    old = kv.i
    kv.i = heads
    return f"{gqa.name}: kv_num_heads {old} -> {heads} (num_heads)"


def kv_swap(graph, layer, _args):
    gqa = one(layer_nodes(graph, layer, "GroupQueryAttention"), f"GroupQueryAttention in layer {layer}")
    k, v = gqa.output[1], gqa.output[2]
    gqa.output[1], gqa.output[2] = v, k
    return f"{gqa.name}: outputs 1 and 2 exchanged (present key -> {v}, present value -> {k})"


def present_layout(graph, layer, args):
    gqa = one(layer_nodes(graph, layer, "GroupQueryAttention"), f"GroupQueryAttention in layer {layer}")
    present = gqa.output[1]
    kv = attr(gqa, "kv_num_heads").i
    head = args.head_size
    base = f"/model/layers.{layer}/attn/present_key_layout"
    raw = f"{base}/op_output"
    gqa.output[1] = raw
    shape = numpy_helper.from_array(np.array([0, kv, -1, head], dtype=np.int64), f"{base}/shape")
    graph.initializer.append(shape)
    at = list(graph.node).index(gqa) + 1
    graph.node.insert(at, helper.make_node("Transpose", [raw], [f"{base}/bshd"], name=f"{base}/Transpose",
                                           perm=[0, 2, 1, 3]))
    graph.node.insert(at + 1, helper.make_node("Reshape", [f"{base}/bshd", shape.name], [present],
                                               name=f"{base}/Reshape"))
    return f"{gqa.name}: {present} written [B, S, H, D] and read as [B, H, S, D] (Transpose + Reshape on its edge)"


def norm_eps(graph, layer, args):
    norm = input_norm(graph, layer)
    eps = attr(norm, "epsilon")
    old = eps.f
    eps.f = args.eps
    return f"{norm.name}: epsilon {old:g} -> {args.eps:g}"


def norm_weight(graph, layer, args):
    norm = input_norm(graph, layer)
    name = norm.input[2] if norm.op_type == "SkipSimplifiedLayerNormalization" else norm.input[1]
    at = next((i for i, t in enumerate(graph.initializer) if t.name == name), None)
    if at is None:
        die(f"{norm.name}'s weight {name} is not an initializer")
    old = graph.initializer[at]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(old.data_type)
    ones = numpy_helper.from_array(np.ones(list(old.dims), dtype=dtype), name)
    graph.initializer[at].CopyFrom(ones)
    return f"{norm.name}: weight {name} set to ones"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("fault", choices=FAULTS)
    p.add_argument("--layer", type=int)
    p.add_argument("--eps", type=float, default=0.1)
    args = p.parse_args()
    cfg_path = os.path.join(args.src, "genai_config.json")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
        dec = cfg["model"]["decoder"]
        layers = int(dec["num_hidden_layers"])
        model_file = dec.get("filename", "model.onnx")
        args.head_size = int(dec["head_size"])
    except (OSError, ValueError, KeyError) as e:
        die(f"{cfg_path}: not a GenAI folder ({e})")
    layer = layers // 2 if args.layer is None else args.layer
    if not 0 <= layer < layers:
        die(f"--layer {layer}: the model has layers 0..{layers - 1}")
    if os.path.abspath(args.out) == os.path.abspath(args.src):
        die("OUT must not be SRC (the source folder is never modified)")
    model = onnx.load(os.path.join(args.src, model_file), load_external_data=False)
    fn = {"kv-heads": kv_heads, "kv-swap": kv_swap, "present-layout": present_layout,
          "norm-eps": norm_eps, "norm-weight": norm_weight}[args.fault]
    what = fn(model.graph, layer, args)
    os.makedirs(args.out, exist_ok=True)
    for name in sorted(os.listdir(args.src)):
        src = os.path.join(args.src, name)
        dst = os.path.join(args.out, name)
        if name == model_file or name.startswith(".") or not os.path.isfile(src):
            continue
        if os.path.lexists(dst):
            os.remove(dst)
        if name.endswith(".data"):
            # a copy: ONNX Runtime refuses external data that resolves outside the model's
            # folder (a symlink), and the onnx package refuses a file with several hard links
            shutil.copyfile(src, dst)
        else:
            shutil.copyfile(src, dst)
    onnx.save(model, os.path.join(args.out, model_file))
    print(f"{args.fault} (layer {layer}): {what}")


if __name__ == "__main__":
    main()
