#!/usr/bin/env python3
"""Rewrite a GGUF with every tensor dequantised to F32 (rows kept in the file's own layout, so
llama.cpp reads it exactly as it reads the original). Lets llama.cpp run the float32 weights that
kvprobe's reference uses: on the quantised file llama.cpp computes quantised matmuls and lands
near cosine 0.996, which says nothing about our float32 path.

Usage: python3 scripts/make_f32_gguf.py IN.gguf OUT.gguf     (needs numpy and the `gguf` package)
"""
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import np_reference  # noqa: E402  (our own spec-derived dequantiser)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    reader = gguf.GGUFReader(src)
    _, raw = np_reference.read_gguf(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst + ".partial", arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        w = np.ascontiguousarray(np_reference.dequantize(*raw[t.name]), dtype=np.float32)
        writer.add_tensor(t.name, w, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(dst + ".partial", dst)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
