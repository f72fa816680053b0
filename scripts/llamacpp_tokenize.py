#!/usr/bin/env python3
"""Tokenise texts with llama.cpp (llama-cpp-python, vocab only) to produce the independent expected
ids of reference/tests/gguf_tokenizer.rs.

Usage: python3 scripts/llamacpp_tokenize.py MODEL.gguf TEXTS.json   (TEXTS.json: a JSON list of strings)
Prints a JSON list of id lists. Needs `pip install llama-cpp-python` (builds from source, ~10 min).
"""
import json
import sys

from llama_cpp import Llama

model = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
with open(sys.argv[2], encoding="utf-8") as f:
    texts = json.load(f)
print(json.dumps([model.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in texts]))
