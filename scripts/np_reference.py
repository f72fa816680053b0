#!/usr/bin/env python3
"""Independent numpy reference for kvprobe's float32 reference model.

Written from the GGUF specification (ggml's file format and block layouts) and the Hugging Face
model definitions, sharing no code with the Rust crate, so that agreement between the two is
evidence and not an echo. Only numpy is needed.

GGUF files are run the llama.cpp way on the file's own row layout: llama.cpp's converter permutes
attn_q / attn_k rows so that RoPE rotates *adjacent* pairs (x[2i], x[2i+1]); this script applies
exactly that rotation to the raw rows. The Rust side instead un-permutes the rows and applies the
HF rotate_half convention. A wrong un-permutation there cannot agree with this script.

GGUF architectures: llama (permuted q/k rows, adjacent-pair RoPE, the `rope_freqs` tensor divides
the frequencies as llama.cpp's ggml_rope_ext does), qwen2 and qwen3 (NeoX-style rotate_half RoPE on
unpermuted rows, as llama.cpp's LLM_ARCH_QWEN2/QWEN3; qwen3's attn_q_norm/attn_k_norm per head
before RoPE).

HF directories (config.json + *.safetensors) run Llama-family (rotate_half, as HF does: Llama with
rope_scaling llama3 per transformers' _compute_llama3_parameters, Mistral, Qwen2 with q/k/v biases,
Qwen3 with q_norm/k_norm) and GPT-2-family models. Anything else is refused.

Commands:
  logits  --model PATH --ids 1,2,3 [--single-key K] --out FILE.npy
  greedy  --model PATH --ids 1,2,3 --max-new N            (prints JSON {"generated_ids": [...]})
  compare A.npy B.npy [--label L]                          (per-position cosine + top-1 agreement)
  tensors --model PATH                                     (prints GGUF tensor names, types, shapes)
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------------------------------------
# GGUF reader (spec: magic "GGUF", version, tensor count, kv count, kv pairs, tensor infos,
# aligned data section). Little-endian throughout.
# ---------------------------------------------------------------------------------------------

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

# ggml type id -> (name, block elements, block bytes)
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    30: ("BF16", 1, 2),
}


class Reader:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype = self.take("<I")
            count = self.take("<Q")
            return [self.value(itype) for _ in range(count)]
        raise ValueError(f"unknown GGUF metadata value type {vtype}")


def read_gguf(path):
    with open(path, "rb") as f:
        buf = f.read()
    r = Reader(buf)
    if buf[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    r.pos = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise SystemExit(f"{path}: unsupported GGUF version {version}")
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("<I")
        meta[key] = r.value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        ttype = r.take("<I")
        off = r.take("<Q")
        infos.append((name, dims, ttype, off))
    align = int(meta.get("general.alignment", 32))
    data_start = (r.pos + align - 1) // align * align
    tensors = {}
    for name, dims, ttype, off in infos:
        if ttype not in GGML_TYPES:
            raise SystemExit(f"{path}: tensor {name} has ggml type {ttype}, not supported by np_reference.py")
        tname, blk, bbytes = GGML_TYPES[ttype]
        n = int(np.prod(dims))
        nbytes = n // blk * bbytes
        start = data_start + off
        raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start)
        # dims[0] is the contiguous (fastest) axis: numpy shape is the reverse.
        shape = tuple(reversed(dims))
        tensors[name] = (tname, shape, raw)
    return meta, tensors


def dequantize(tname, shape, raw):
    """Block layouts from ggml: each block holds 32 weights of one row."""
    if tname == "F32":
        out = raw.view("<f4")
    elif tname == "F16":
        out = raw.view("<f2").astype(np.float32)
    elif tname == "BF16":
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif tname == "Q8_0":
        b = raw.reshape(-1, 34)
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)  # [nb,1]
        q = b[:, 2:].view(np.int8).astype(np.float32)
        out = (q * d).reshape(-1)
    elif tname == "Q4_0":
        b = raw.reshape(-1, 18)
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)
        qs = b[:, 2:]
        lo = (qs & 0x0F).astype(np.float32) - 8.0
        hi = (qs >> 4).astype(np.float32) - 8.0
        out = (np.concatenate([lo, hi], axis=1) * d).reshape(-1)
    elif tname == "Q4_1":
        b = raw.reshape(-1, 20)
        d = b[:, 0:2].copy().view("<f2").astype(np.float32)
        m = b[:, 2:4].copy().view("<f2").astype(np.float32)
        qs = b[:, 4:]
        # element j < 16 is the low nibble of byte j, element j + 16 its high nibble
        lo = (qs & 0x0F).astype(np.float32)
        hi = (qs >> 4).astype(np.float32)
        out = (np.concatenate([lo, hi], axis=1) * d + m).reshape(-1)
    else:
        raise SystemExit(f"np_reference.py: no dequantiser for {tname}")
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------
# safetensors reader (8-byte little-endian header length, JSON header, raw data)
# ---------------------------------------------------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (hlen,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        raw = np.frombuffer(buf, dtype=np.uint8, count=e - s, offset=base + s)
        dt = info["dtype"]
        if dt == "F32":
            a = raw.view("<f4")
        elif dt == "F16":
            a = raw.view("<f2").astype(np.float32)
        elif dt == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} dtype {dt} not supported by np_reference.py")
        out[name] = a.reshape(info["shape"])
    return out


def load_hf_dir(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(path, "model.safetensors.index.json")
    w = {}
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    for fn in files:
        w.update(read_safetensors(os.path.join(path, fn)))
    return cfg, w


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def softmax_masked(scores, allow):
    """Rows with nothing allowed give zeros (no key contributes)."""
    s = np.where(allow, scores, -np.inf)
    mx = np.max(s, axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.where(allow, np.exp(s - mx), 0.0)
    den = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(den > 0, den, 1.0)


def build_mask(T, single_key):
    allow = np.tril(np.ones((T, T), dtype=bool))
    if single_key is not None:
        if not 0 <= single_key < T:
            raise SystemExit(f"--single-key {single_key} must be in 0..{T - 1}")
        allow[T - 1, :] = False
        allow[T - 1, single_key] = True
        allow[T - 1, T - 1] = True
    return allow


class Llama:
    """Llama family. `rope` is "adjacent" (GGUF raw rows, as llama.cpp's ROPE_TYPE_NORM) or
    "half" (HF rotate_half on HF rows)."""

    def __init__(self, w, n_layers, n_heads, n_kv, eps, theta, rope, dtype, rope_dim=None, head_dim=None,
                 inv_freq=None):
        self.w = {k: v.astype(dtype) for k, v in w.items()}
        self.n_layers, self.n_heads, self.n_kv = n_layers, n_heads, n_kv
        self.eps, self.theta, self.rope, self.dtype = eps, theta, rope, dtype
        self.hidden = self.w["embed"].shape[1]
        self.hd = head_dim or self.hidden // n_heads
        self.rope_dim = rope_dim or self.hd
        # explicit inverse frequencies (RoPE scaling); None = base^(-2i/rope_dim)
        self.inv_freq = inv_freq

    def apply_rope(self, x, pos):
        # x: [T, H, hd]; theta_i = pos * base^(-2i/rope_dim)
        rd = self.rope_dim
        i = np.arange(rd // 2, dtype=np.float64)
        inv = self.theta ** (-2.0 * i / rd) if self.inv_freq is None else np.asarray(self.inv_freq, np.float64)
        ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]  # [T, rd/2]
        c = np.cos(ang).astype(self.dtype)[:, None, :]
        s = np.sin(ang).astype(self.dtype)[:, None, :]
        out = x.copy()
        if self.rope == "adjacent":
            a = x[..., 0:rd:2]
            b = x[..., 1:rd:2]
            out[..., 0:rd:2] = a * c - b * s
            out[..., 1:rd:2] = a * s + b * c
        else:
            a = x[..., : rd // 2]
            b = x[..., rd // 2: rd]
            out[..., : rd // 2] = a * c - b * s
            out[..., rd // 2: rd] = b * c + a * s
        return out

    def forward(self, ids, allow, last_only=False):
        w = self.w
        T = len(ids)
        pos = np.arange(T)
        x = w["embed"][np.asarray(ids)]
        H, KV, hd = self.n_heads, self.n_kv, self.hd
        rep = H // KV
        for l in range(self.n_layers):
            p = f"l{l}."
            h = rms_norm(x, w[p + "attn_norm"], self.eps)
            q = h @ w[p + "q"].T
            k = h @ w[p + "k"].T
            v = h @ w[p + "v"].T
            if p + "q_bias" in w:
                q = q + w[p + "q_bias"]
                k = k + w[p + "k_bias"]
                v = v + w[p + "v_bias"]
            q = q.reshape(T, H, hd)
            k = k.reshape(T, KV, hd)
            if p + "q_norm" in w:  # Qwen3: RMSNorm over each head's hd features, before RoPE
                q = rms_norm(q, w[p + "q_norm"], self.eps)
                k = rms_norm(k, w[p + "k_norm"], self.eps)
            q = self.apply_rope(q, pos)
            k = self.apply_rope(k, pos)
            v = v.reshape(T, KV, hd)
            # query head j uses KV head j // rep (HF repeat_kv, llama.cpp broadcast)
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            sc = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
            pr = softmax_masked(sc, allow[None, :, :])
            o = np.einsum("hts,shd->thd", pr, v).reshape(T, H * hd)
            x = x + o @ w[p + "o"].T
            h = rms_norm(x, w[p + "ffn_norm"], self.eps)
            g = h @ w[p + "gate"].T
            u = h @ w[p + "up"].T
            with np.errstate(over="ignore"):  # exp overflow for very negative g gives silu = -0, correct
                silu = g / (1.0 + np.exp(-g))
            x = x + (silu * u) @ w[p + "down"].T
        x = rms_norm(x, w["norm"], self.eps)
        if last_only:
            x = x[-1:]
        return x @ w["lm_head"].T


class Gpt2:
    def __init__(self, w, n_layers, n_heads, eps, dtype):
        self.w = {k: v.astype(dtype) for k, v in w.items()}
        self.n_layers, self.n_heads, self.eps = n_layers, n_heads, eps

    def forward(self, ids, allow, last_only=False):
        w = self.w
        T = len(ids)
        x = w["wte.weight"][np.asarray(ids)] + w["wpe.weight"][np.arange(T)]
        D = x.shape[1]
        H = self.n_heads
        hd = D // H
        for l in range(self.n_layers):
            p = f"h.{l}."
            h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.eps)
            # Conv1D: weight is [in, out], y = x @ W + b
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (a.reshape(T, H, hd) for a in np.split(qkv, 3, axis=1))
            sc = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
            pr = softmax_masked(sc, allow[None, :, :])
            o = np.einsum("hts,shd->thd", pr, v).reshape(T, D)
            x = x + o @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], self.eps)
            a = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
            a = 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))
            x = x + a @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], self.eps)
        if last_only:
            x = x[-1:]
        return x @ w["wte.weight"].T


GGUF_ARCHS = ("llama", "qwen2", "qwen3")
GGUF_LAYER = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
              "up": "ffn_up", "down": "ffn_down", "attn_norm": "attn_norm", "ffn_norm": "ffn_norm"}


def load_gguf_model(path, dtype):
    meta, raw = read_gguf(path)
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHS:
        raise SystemExit(f"{path}: architecture {arch!r} not supported by np_reference.py")
    for k in meta:
        if k.startswith(arch + ".rope.scaling.") and k.endswith(".type") and meta[k] not in ("none", ""):
            raise SystemExit(f"{path}: {k} = {meta[k]} not supported by np_reference.py")
    t = {name: dequantize(*v) for name, v in raw.items()}
    n_layers = int(meta[arch + ".block_count"])
    w = {"embed": t["token_embd.weight"], "norm": t["output_norm.weight"]}
    w["lm_head"] = t.get("output.weight", t["token_embd.weight"])
    known = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
    for l in range(n_layers):
        for short, g in GGUF_LAYER.items():
            w[f"l{l}.{short}"] = t[f"blk.{l}.{g}.weight"]
            known.add(f"blk.{l}.{g}.weight")
        for short in ("q", "k", "v"):
            bn = f"blk.{l}.attn_{short}.bias"
            if bn in t:
                w[f"l{l}.{short}_bias"] = t[bn]
                known.add(bn)
        if arch == "qwen3":
            for short in ("q", "k"):
                w[f"l{l}.{short}_norm"] = t[f"blk.{l}.attn_{short}_norm.weight"]
                known.add(f"blk.{l}.attn_{short}_norm.weight")
    unknown = sorted(set(t) - known)
    if unknown:
        raise SystemExit(f"{path}: tensor {unknown[0]} not supported by np_reference.py")
    n_heads = int(meta[arch + ".attention.head_count"])
    n_kv = int(meta.get(arch + ".attention.head_count_kv", n_heads))
    eps = float(meta[arch + ".attention.layer_norm_rms_epsilon"])
    theta = float(meta.get(arch + ".rope.freq_base", 10000.0))
    head_dim = meta.get(arch + ".attention.key_length")
    head_dim = int(head_dim) if head_dim is not None else None
    rope_dim = meta.get(arch + ".rope.dimension_count")
    rope_dim = int(rope_dim) if rope_dim is not None else None
    inv = None
    if "rope_freqs.weight" in t:
        if arch != "llama":
            raise SystemExit(f"{path}: rope_freqs in a {arch} file is not supported by np_reference.py")
        # ggml_rope_ext with freq_factors: theta_i = pos * base^(-2i/d) / freq_factors[i]
        rd = rope_dim or head_dim or w["embed"].shape[1] // n_heads
        i = np.arange(rd // 2, dtype=np.float64)
        inv = theta ** (-2.0 * i / rd) / t["rope_freqs.weight"].astype(np.float64).reshape(-1)
    # llama.cpp: LLAMA_ROPE_TYPE_NORM (adjacent pairs) for llama, NEOX (rotate_half) for qwen2/3
    rope = "adjacent" if arch == "llama" else "half"
    return Llama(w, n_layers, n_heads, n_kv, eps, theta, rope, dtype, rope_dim=rope_dim, head_dim=head_dim,
                 inv_freq=inv)


def hf_inv_freq(cfg, head_dim):
    """transformers' RoPE init: default, or llama3 (_compute_llama3_parameters); others refused."""
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta", params.get("rope_theta", 10000.0)))
    rs = cfg.get("rope_scaling") or params or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise SystemExit(f"rope_scaling type {kind!r} not supported by np_reference.py")
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return theta, np.where(medium, smoothed, scaled)


def load_hf_model(path, dtype):
    cfg, t = load_hf_dir(path)
    mtype = cfg.get("model_type", "")
    archs = cfg.get("architectures") or [""]
    if mtype == "gpt2" or archs[0].startswith("GPT2"):
        t = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in t.items()}
        return Gpt2(t, int(cfg["n_layer"]), int(cfg["n_head"]), float(cfg.get("layer_norm_epsilon", 1e-5)), dtype)
    n_layers = int(cfg["num_hidden_layers"])
    w = {"embed": t["model.embed_tokens.weight"], "norm": t["model.norm.weight"]}
    w["lm_head"] = t["lm_head.weight"] if "lm_head.weight" in t else t["model.embed_tokens.weight"]
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    for l in range(n_layers):
        p = f"model.layers.{l}."
        for short, hf in names.items():
            w[f"l{l}.{short}"] = t[p + hf + ".weight"]
        for short in ("q", "k", "v"):
            bn = p + f"self_attn.{short}_proj.bias"
            if bn in t:
                w[f"l{l}.{short}_bias"] = t[bn]
        if p + "self_attn.q_norm.weight" in t:
            w[f"l{l}.q_norm"] = t[p + "self_attn.q_norm.weight"]
            w[f"l{l}.k_norm"] = t[p + "self_attn.k_norm.weight"]
    n_heads = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads", n_heads))
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads)
    theta, inv = hf_inv_freq(cfg, head_dim)
    return Llama(w, n_layers, n_heads, n_kv, float(cfg.get("rms_norm_eps", 1e-6)), theta, "half", dtype,
                 head_dim=head_dim, inv_freq=inv)


def load_model(path, dtype):
    if os.path.isdir(path):
        return load_hf_model(path, dtype)
    return load_gguf_model(path, dtype)


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------

def parse_ids(s):
    return [int(x) for x in s.split(",") if x.strip()]


def cmd_logits(a):
    dtype = np.float64 if a.dtype == "float64" else np.float32
    m = load_model(a.model, dtype)
    ids = parse_ids(a.ids)
    logits = m.forward(ids, build_mask(len(ids), a.single_key)).astype(np.float32)
    np.save(a.out, logits)


def cmd_greedy(a):
    dtype = np.float64 if a.dtype == "float64" else np.float32
    m = load_model(a.model, dtype)
    ids = parse_ids(a.ids)
    gen = []
    for _ in range(a.max_new):
        seq = ids + gen
        nxt = int(np.argmax(m.forward(seq, build_mask(len(seq), None), last_only=True)[0]))
        gen.append(nxt)
        if a.eos is not None and nxt == a.eos:
            break
    print(json.dumps({"generated_ids": gen}))


def cmd_compare(a):
    x = np.load(a.a).astype(np.float64)
    y = np.load(a.b).astype(np.float64)
    if x.shape != y.shape:
        raise SystemExit(f"shape mismatch: {a.a} {x.shape} vs {a.b} {y.shape}")
    cos = np.sum(x * y, axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    top = np.argmax(x, axis=1) == np.argmax(y, axis=1)
    label = f"[{a.label}] " if a.label else ""
    for t in range(x.shape[0]):
        print(f"{label}pos {t:3d}  cosine {cos[t]:.9f} (1-cos {1.0 - cos[t]:.1e})  top1 {int(np.argmax(x[t])):6d} vs {int(np.argmax(y[t])):6d}"
              f"  {'ok' if top[t] else 'DIFF'}  max|d| {np.max(np.abs(x[t] - y[t])):.3e}")
    print(f"{label}min cosine {cos.min():.9f} (1-cos {1.0 - cos.min():.1e})  mean cosine {cos.mean():.9f}  top-1 agreement "
          f"{int(top.sum())}/{len(top)} ({100.0 * top.mean():.1f} %)")
    if a.min_cos is not None and (cos.min() < a.min_cos or not top.all()):
        print(f"{label}FAIL: need min cosine >= {a.min_cos} and 100 % top-1", file=sys.stderr)
        sys.exit(1)


def cmd_tensors(a):
    meta, raw = read_gguf(a.model)
    for name, (tname, shape, _) in raw.items():
        print(f"{name:40s} {tname:5s} {shape}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits")
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--single-key", type=int, default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.set_defaults(fn=cmd_logits)
    p = sub.add_parser("greedy")
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--max-new", type=int, default=20)
    p.add_argument("--eos", type=int, default=None)
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.set_defaults(fn=cmd_greedy)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--label", default="")
    p.add_argument("--min-cos", type=float, default=None)
    p.set_defaults(fn=cmd_compare)
    p = sub.add_parser("tensors")
    p.add_argument("--model", required=True)
    p.set_defaults(fn=cmd_tensors)
    a = ap.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
