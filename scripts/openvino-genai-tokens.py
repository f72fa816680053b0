#!/usr/bin/env python3
"""Greedy tokens from openvino.genai's own LLMPipeline (pip openvino-genai==2026.4.1.0) on an IR
folder and device, for the comparison in tests/openvino_cli.rs and docs/openvino.md:

  python3 scripts/openvino-genai-tokens.py DIR CPU|NPU IDS STEPS [KEY=VALUE ...]

NPU is the NPU plugin's NPUW pipeline on the CPU (NPUW_DEVICES=CPU), with MAX_PROMPT_LEN 64 and
MIN_RESPONSE_LEN 64 as kvprobe's default `--ov-device NPU`. Prints the tokens, comma separated.
The IR folder needs no tokenizer: the prompt is passed as token ids (TokenizedInputs).
KEY=VALUE pairs are added to the pipeline's config as kvprobe's `--ov-config` adds them, e.g.
INFERENCE_PRECISION_HINT=f32: the CPU plugin's default precision depends on the host (bf16 where
the CPU has AVX512_BF16 or AMX, f32 elsewhere), so a comparison meant for every machine pins it.
"""
import sys

import numpy as np
import openvino as ov
import openvino_genai as genai


def main():
    d, device, ids, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ids = [int(x) for x in ids.split(",")]
    cfg = {} if device == "CPU" else {"NPUW_DEVICES": "CPU", "MAX_PROMPT_LEN": 64, "MIN_RESPONSE_LEN": 64}
    for kv in sys.argv[5:]:
        key, _, value = kv.partition("=")
        cfg[key] = value
    pipe = genai.LLMPipeline(d, device, **cfg)
    gc = genai.GenerationConfig()
    gc.max_new_tokens = steps
    gc.do_sample = False
    # no generation_config.json beside the IR: an EOS that never stops the run
    gc.eos_token_id = 2
    gc.stop_token_ids = {2}
    gc.ignore_eos = True
    inp = genai.TokenizedInputs(
        ov.Tensor(np.array([ids], np.int64)), ov.Tensor(np.ones((1, len(ids)), np.int64))
    )
    print(",".join(str(t) for t in pipe.generate(inp, gc).tokens[0]))


if __name__ == "__main__":
    main()
