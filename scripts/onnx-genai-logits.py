#!/usr/bin/env python3
"""Per-step logits of a GenAI model folder from the real ONNX Runtime GenAI runtime (issue 22).

The `onnxruntime-genai` wheel's Generator builds input_ids, attention_mask, position_ids and
past/present itself from genai_config.json; this script only feeds tokens: the prompt with one
append_tokens call, then each next token (GenAI's own greedy argmax) with another, reading the last
row of `logits` after every call. kvprobe's host side must give the same logits
(npu/tests/onnx_genai.rs).

Usage: onnx-genai-logits.py DIR --ids 1,2,3 --steps N --out FILE.npy [--then 4,5,6] [--prompt-rows ROWS.npy]
Writes FILE.npy (float32 [N, vocab], one more row with --then) and prints JSON {"tokens": [...]} (the N generated ids).
Exit 3 with one line when onnxruntime_genai is not installed.
"""
import argparse
import json
import sys

import numpy as np

try:
    import onnxruntime_genai as og
except ImportError:
    print("onnxruntime_genai is not installed (pip install onnxruntime-genai==0.18.0)", file=sys.stderr)
    sys.exit(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-length", type=int, default=None,
                    help="search max_length [default: prompt + steps; a windowed model counts its pads too]")
    ap.add_argument("--prompt-rows", default=None, metavar="FILE.npy",
                    help="also write every row of the prompt's append_tokens call (float32 [rows, vocab]; "
                         "a windowed model's last window, pads included)")
    ap.add_argument("--then", default=None,
                    help="ids appended as one more append_tokens call after the steps (GenAI's continuous "
                         "decoding: a chunk over the past); its last row is one more row")
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    then = [int(x) for x in a.then.split(",")] if a.then else []
    model = og.Model(a.dir)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=a.max_length or len(ids) + a.steps + len(then), do_sample=False)
    gen = og.Generator(model, params)
    rows, tokens = [], []
    feed = ids
    for _ in range(a.steps):
        gen.append_tokens(np.array(feed, dtype=np.int32))
        lg = np.array(gen.get_output("logits"), dtype=np.float32)
        if a.prompt_rows and not rows:
            np.save(a.prompt_rows, lg.reshape(-1, lg.shape[-1]))
        row = lg.reshape(-1, lg.shape[-1])[-1]
        rows.append(row)
        tokens.append(int(np.argmax(row)))
        feed = [tokens[-1]]
    if then:
        gen.append_tokens(np.array(then, dtype=np.int32))
        lg = np.array(gen.get_output("logits"), dtype=np.float32)
        rows.append(lg.reshape(-1, lg.shape[-1])[-1])
    np.save(a.out, np.stack(rows))
    print(json.dumps({"tokens": tokens}))


if __name__ == "__main__":
    main()
