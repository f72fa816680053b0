#!/usr/bin/env python3
"""The ONNX Runtime GenAI export of scripts/export-onnx.sh (convention (a): past_key_values.N.* in,
present.N.* out) turned into the stateful OpenVINO IR openvino.genai and the NPU plugin's NPUW LLM
pipeline take, with OpenVINO's own Python API only (no torch, no optimum):

  1. `openvino.Core().read_model(model.onnx)` (OpenVINO's ONNX frontend);
  2. a `beam_idx` i32 [batch] Parameter gathering every past tensor along the batch axis (the
     cache reorder optimum-intel's `patch_stateful` adds, built from opset Gather, so genai's
     `beam_idx` input exists and a batch-1 request feeds [0]);
  3. `openvino._offline_transformations.apply_make_stateful_transformation` with the
     past → present pairs: each pair becomes a ReadValue/Assign variable, so the IR's inputs are
     input_ids, attention_mask, position_ids, beam_idx and its output logits;
  4. `--weights int8|int4`: `nncf.compress_weights` (int8_asym per channel, int4_sym in groups of
     64) where NNCF installs (optional), else refused;
  5. `openvino.save_model` (xml + bin, f32 weights: compress_to_fp16=False, so the f32 reference is
     the precision-matched one; `--weights f16` keeps OpenVINO's default compress_to_fp16=True, f16
     weights the matched reference reads from the IR) with config.json / tokenizer.json copied
     beside it.

usage: export-openvino.py GENAI_DIR OUT_DIR [--weights f32|f16|int8|int4] [--no-state]
  --no-state writes the IR without step 3 (the past/present tensors stay inputs/outputs): the
  bad-input IR kvprobe must refuse.
"""
import argparse
import shutil
import sys
from pathlib import Path

import openvino as ov
import openvino.opset13 as ops
from openvino._offline_transformations import apply_make_stateful_transformation


def add_beam_idx(model):
    """Gather(past, beam_idx, axis 0) in front of every past input's consumers."""
    beam = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    axis = ops.constant(0, ov.Type.i64)
    for p in model.get_parameters():
        name = p.output(0).get_any_name()
        if not name.startswith("past_key_values."):
            continue
        consumers = list(p.output(0).get_target_inputs())
        g = ops.gather(p, beam, axis)
        for c in consumers:
            c.replace_source_output(g.output(0))
    model.add_parameters([beam])
    model.validate_nodes_and_infer_types()


def pairs(model):
    out = {}
    for p in model.get_parameters():
        n = p.output(0).get_any_name()
        if n.startswith("past_key_values."):
            out[n] = n.replace("past_key_values.", "present.")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--weights", default="f32", choices=["f32", "f16", "int8", "int4"])
    ap.add_argument("--no-state", action="store_true")
    a = ap.parse_args()
    src, out = Path(a.src), Path(a.out)
    model = ov.Core().read_model(str(src / "model.onnx"))
    if not a.no_state:
        pp = pairs(model)
        if not pp:
            sys.exit(f"export-openvino.py: {src}/model.onnx has no past_key_values inputs; export it with scripts/export-onnx.sh (convention (a))")
        add_beam_idx(model)
        apply_make_stateful_transformation(model, pp)
    if a.weights in ("int8", "int4"):
        try:
            import nncf
        except ImportError:
            sys.exit(f"export-openvino.py: --weights {a.weights} needs nncf (pip install nncf)")
        if a.weights == "int8":
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
        else:
            # groups of 64: NNCF's default 128 does not divide SmolLM2's 576-wide channels
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_SYM, group_size=64)
    out.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(out / "openvino_model.xml"), compress_to_fp16=a.weights == "f16")
    for f in ["tokenizer.json", "tokenizer_config.json", "config.json", "genai_config.json"]:
        if (src / f).is_file():
            shutil.copy(src / f, out / f)


if __name__ == "__main__":
    main()
