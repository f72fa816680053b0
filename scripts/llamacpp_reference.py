#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) as a second independent reference, on an F32 GGUF made by
scripts/make_f32_gguf.py.

  logits --model F32.gguf --ids 1,2,3 --out FILE.npy
  generate --model F32.gguf --ids 1,2,3 --max-new N      (prints JSON {"generated_ids": [...]})
  bench --model F32.gguf --prefill 16 --decode 32          (the split `kvprobe ref bench` prints:
      load_s, prefill_s, decode_s on the same ids, greedy decode one token per llama_decode)

No single-key mode: llama.cpp (0.3.36) refuses a batch whose position does not follow the highest
position left in the sequence (llama_decode returns -1 after removing KV entries K+1..T-2), so the
single-key check relies on scripts/np_reference.py alone.
"""
import argparse
import json
import time

import numpy as np
from llama_cpp import Llama


def load(path, n_ctx, logits_all):
    return Llama(model_path=path, n_ctx=n_ctx, n_threads=2, n_batch=512, logits_all=logits_all, verbose=False)


def cmd_logits(a):
    ids = [int(x) for x in a.ids.split(",") if x.strip()]
    T = len(ids)
    llm = load(a.model, max(64, T + 8), True)
    llm.eval(ids)
    np.save(a.out, np.array(llm.scores[:T], dtype=np.float32))


def cmd_generate(a):
    ids = [int(x) for x in a.ids.split(",") if x.strip()]
    llm = load(a.model, max(64, len(ids) + a.max_new + 8), False)
    gen = []
    for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        gen.append(int(tok))
        if len(gen) >= a.max_new:
            break
    print(json.dumps({"generated_ids": gen}))


def cmd_bench(a):
    t0 = time.perf_counter()
    llm = load(a.model, a.prefill + a.decode + 8, False)
    load_s = time.perf_counter() - t0
    # the ids `kvprobe ref bench` uses: ordinary ids past the control tokens
    base = min(llm.n_vocab(), 1000) // 2
    span = llm.n_vocab() - base
    ids = [base + (i * 7919) % span for i in range(a.prefill)]
    t1 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    for _ in range(a.decode):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([tok])
    decode_s = time.perf_counter() - t2
    print(f"load_s {load_s:.3f}\nprefill_tokens {a.prefill}\nprefill_s {prefill_s:.3f}")
    print(f"decode_steps {a.decode}\ndecode_s {decode_s:.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits")
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_logits)
    p = sub.add_parser("generate")
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--max-new", type=int, default=20)
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("bench")
    p.add_argument("--model", required=True)
    p.add_argument("--prefill", type=int, default=16)
    p.add_argument("--decode", type=int, default=32)
    p.set_defaults(fn=cmd_bench)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
