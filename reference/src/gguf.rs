//! GGUF loading: `llama`, `qwen2` and `qwen3` files into f32 weights under canonical Hugging Face
//! names, a [`ModelConfig`] from `<arch>.*` metadata (`gguf_config.rs`) and a tokenizer from
//! `tokenizer.ggml.*` metadata. Every tensor must map to a weight the forward uses; the
//! `rope_freqs` tensor (Llama 3.1/3.2 RoPE scaling) becomes the config's frequency divisors.
//!
//! Weights stay in the mapped file in their storage type (issue 21 "Memory"): f32/f16/bf16
//! tensors always, quantised blocks when the model's f32 copy would exceed
//! [`DEQUANTISE_AT_LOAD_MAX_BYTES`] (a smaller quantised model, SmolLM2 among them, is
//! dequantised once at load, as before: the products then skip the per-tile dequantisation).
//! Either way the products compute in f32 on the values candle's dequantisation gives.
//! llama.cpp's HF→GGUF converter reorders the rows of `attn_q` / `attn_k` inside every head so that
//! RoPE rotates adjacent pairs (x[2i], x[2i+1]); our forward uses HF's rotate_half, which pairs
//! (x[i], x[i + hd/2]). [`unpermute_rows`] restores the HF order. Only the `llama` architecture
//! is permuted: qwen2/qwen3 use NeoX-style RoPE in llama.cpp, which is rotate_half already.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;
use candle_core::Tensor;

use crate::gguf_meta::Meta;
pub use crate::gguf_pending::unpermute_rows;
use crate::gguf_pending::{bad_tensor, bad_tensor_msg, Pending};
use crate::store::{Bytes, Kind, Weight};
use crate::weights::StoredWeights;
use crate::{Error, LoadedParts, ModelConfig, Result, StoredParts};

/// A quantised model whose f32 copy fits in this many bytes is dequantised once at load; a
/// larger one keeps its blocks and dequantises them a tile at a time in every product.
pub const DEQUANTISE_AT_LOAD_MAX_BYTES: u64 = 1 << 30;

/// Load a `.gguf` file (llama, qwen2, qwen3) into config, f32 weights (HF names) and tokenizer.
pub fn load(path: &Path) -> Result<LoadedParts> {
    load_stored(path)?.into_loaded()
}

/// [`load`] with the weights in the mapped file, in their storage type.
pub(crate) fn load_stored(path: &Path) -> Result<StoredParts> {
    load_stored_with(path, DEQUANTISE_AT_LOAD_MAX_BYTES)
}

/// [`load_stored`] dequantising quantised blocks at load only when the model's f32 copy takes at
/// most `dequantise_max` bytes.
pub(crate) fn load_stored_with(path: &Path, dequantise_max: u64) -> Result<StoredParts> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            path: path.to_path_buf(),
        },
        _ => Error::Io {
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    let mut reader = BufReader::new(file);
    let content = read_header(&mut reader, path)?;
    let meta = Meta {
        map: &content.metadata,
        path,
    };
    let arch = crate::gguf_config::architecture(&meta)?;
    let mut config = crate::gguf_config::config_from_meta(&meta, &content, &arch)?;
    // SAFETY: a read-only mapping; the tool does not support a model file rewritten while it
    // runs (as candle's own mmap loaders)
    let map = unsafe { memmap2::Mmap::map(reader.get_ref()) }.map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file = Source {
        map: Arc::new(map),
        file: reader.get_ref(),
    };
    let weights = load_weights(&file, &content, &mut config, path, dequantise_max)?;
    let tokenizer = crate::gguf_tokenizer::from_metadata(&content.metadata, path)?;
    Ok(StoredParts {
        config,
        weights,
        tokenizer,
    })
}

fn read_header(reader: &mut BufReader<File>, path: &Path) -> Result<Content> {
    // Check the magic ourselves: candle's message for a wrong magic does not say "not GGUF".
    let mut magic = [0u8; 4];
    let got = read_up_to(reader, &mut magic).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    if got < 4 || &magic != b"GGUF" {
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail: "not a GGUF file (no `GGUF` magic); pass a .gguf file or a Hugging Face model folder".into(),
        });
    }
    // what llama.cpp refuses and candle does not (an alignment of 0 is a panic in candle's
    // division): refused first, so the file means what llama.cpp reads it to mean
    if let Some(detail) = crate::gguf_scan::layout_defect(path) {
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail,
        });
    }
    reader.seek(SeekFrom::Start(0)).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    Content::read(reader).map_err(|e| header_error(e, path))
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn candle_msg(e: &candle_core::Error) -> String {
    crate::error::candle_message(e)
}

fn header_error(e: candle_core::Error, path: &Path) -> Error {
    let msg = candle_msg(&e);
    if let Some(type_id) = msg
        .strip_prefix("unknown dtype for tensor ")
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        let tensor =
            crate::gguf_scan::tensor_with_type(path, type_id).unwrap_or_else(|| "?".into());
        return Error::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "tensor `{tensor}` has ggml type {} ; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K; re-quantise the model to one of these (or F16)",
                crate::gguf_scan::type_name(type_id)
            ),
        };
    }
    let truncated = is_eof(&e) || msg.contains("remaining");
    Error::Format {
        path: path.to_path_buf(),
        detail: if truncated {
            "truncated GGUF header (file ends early); the download is incomplete, fetch the file again (scripts/fetch-model.sh for SmolLM2)".into()
        } else {
            format!("corrupt GGUF header ({msg}); fetch the file again")
        },
    }
}

fn is_eof(e: &candle_core::Error) -> bool {
    match e {
        candle_core::Error::Io(io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        candle_core::Error::WithBacktrace { inner, .. } => is_eof(inner),
        candle_core::Error::Context { inner, .. } => is_eof(inner),
        candle_core::Error::WithPath { inner, .. } => is_eof(inner),
        _ => false,
    }
}

/// Canonical HF name of a GGUF tensor; None for names without an HF counterpart (`rope_freqs`
/// is handled by the loader, anything else is refused there).
pub fn hf_name(gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// The GGUF name of llama.cpp's per-frequency RoPE divisors (Llama 3.1/3.2 `rope_scaling`).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// The model file, mapped (weights kept in it) and open (blocks dequantised at load are read,
/// not mapped: their pages would otherwise stay in the process's resident memory beside the f32
/// copy).
struct Source<'a> {
    map: Arc<memmap2::Mmap>,
    file: &'a File,
}

/// The mapped bytes of tensor `gguf_name` with its offset and length in the file, after the
/// checks a hostile header needs (sizes that overflow, empty tensors, partial blocks, ranges past
/// the end of the file).
fn tensor_bytes(
    src: &Source<'_>,
    content: &Content,
    gguf_name: &str,
    path: &Path,
) -> Result<(Bytes, u64, u64)> {
    let info = &content.tensor_infos[gguf_name];
    let file_len = src.map.len() as u64;
    // dimensions from the file multiply past 2^64 in a hostile header (found by
    // examples/fuzz): a product that overflows is a tensor past the end of any file
    let elems = info
        .shape
        .dims()
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d));
    if elems == Some(0) {
        // no weight of a model is empty (and candle reads an empty tensor through a
        // misaligned dangling pointer, found by examples/fuzz)
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail: format!(
                "tensor `{gguf_name}` has a zero dimension; the file is damaged, fetch it again"
            ),
        });
    }
    let dtype = info.ggml_dtype;
    let dims = info.shape.dims().to_vec();
    let cols = dims.last().copied().unwrap_or(1);
    if !cols.is_multiple_of(dtype.block_size()) {
        return Err(bad_tensor_msg(
            path,
            gguf_name,
            format!(
                "has rows of {cols} values, not a whole number of {dtype:?} blocks of {}",
                dtype.block_size()
            ),
        ));
    }
    let start = content.tensor_data_offset.checked_add(info.offset);
    let len = elems.and_then(|elems| {
        ((elems / dtype.block_size()) as u64).checked_mul(dtype.type_size() as u64)
    });
    let (Some(start), Some(len)) = (start, len) else {
        return Err(truncated(path, gguf_name));
    };
    if start.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(truncated(path, gguf_name));
    }
    let bytes = Bytes::Mapped {
        map: src.map.clone(),
        start: start as usize,
        len: len as usize,
    };
    Ok((bytes, start, len))
}

fn load_weights(
    src: &Source<'_>,
    content: &Content,
    config: &mut ModelConfig,
    path: &Path,
    dequantise_max: u64,
) -> Result<StoredWeights> {
    let llama = config.architecture == "gguf:llama";
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    // File order keeps the reads sequential.
    names.sort_by_key(|n| content.tensor_infos[*n].offset);
    let f32_bytes = names.iter().try_fold(0u64, |sum, n| {
        let elems = content.tensor_infos[*n]
            .shape
            .dims()
            .iter()
            .try_fold(4u64, |p, &d| p.checked_mul(d as u64))?;
        sum.checked_add(elems)
    });
    let dequantise_now = f32_bytes.is_some_and(|b| b <= dequantise_max);
    let mut weights = StoredWeights::new();
    let mut pending = Vec::with_capacity(names.len());
    for gguf_name in names {
        let hf = match hf_name(gguf_name) {
            Some(hf) => hf,
            // llama.cpp reads it for the llama graph only
            None if gguf_name == ROPE_FREQS && llama => ROPE_FREQS.to_string(),
            None => return Err(unknown_tensor(path, gguf_name, &config.architecture)),
        };
        let info = &content.tensor_infos[gguf_name];
        check_type(info.ggml_dtype, gguf_name, path)?;
        let (bytes, start, len) = tensor_bytes(src, content, gguf_name, path)?;
        let dtype = info.ggml_dtype;
        let dims = info.shape.dims().to_vec();
        let (w, read_at) = match dtype {
            GgmlDType::F32 => (Weight::raw(bytes, Kind::F32, dims), None),
            GgmlDType::F16 => (Weight::raw(bytes, Kind::F16, dims), None),
            GgmlDType::BF16 => (Weight::raw(bytes, Kind::Bf16, dims), None),
            // read and dequantised below, on every core
            q if dequantise_now => (
                Weight::raw(bytes, Kind::Quant(q), dims),
                Some((start, len as usize)),
            ),
            q => (Weight::raw(bytes, Kind::Quant(q), dims), None),
        };
        if hf == ROPE_FREQS {
            let t = w.to_tensor()?;
            config.rope_freq_factors = Some(rope_freqs(&t, config, path)?);
            continue;
        }
        let heads = if !llama {
            None
        } else if gguf_name.contains(".attn_q.") {
            Some(config.n_heads)
        } else if gguf_name.contains(".attn_k.") {
            Some(config.n_kv_heads)
        } else {
            None
        };
        pending.push(Pending {
            hf,
            gguf_name,
            w,
            read_at,
            heads,
        });
    }
    // Dequantising a small model at load is most of its load time; each tensor is independent
    // (and the values do not depend on the order), so the tensors go to every core.
    let done: Vec<(String, Weight)> = {
        use rayon::prelude::*;
        pending
            .into_par_iter()
            .map(|p| p.finish(src.file, path))
            .collect::<Result<_>>()?
    };
    for (hf, w) in done {
        weights.insert(hf, w);
    }
    check_complete(&weights, config, path)?;
    Ok(weights)
}

pub(crate) fn truncated(path: &Path, name: &str) -> Error {
    Error::Format {
        path: path.to_path_buf(),
        detail: format!(
            "truncated GGUF: tensor `{name}` ends past the end of the file; the download is incomplete, fetch the file again (scripts/fetch-model.sh for SmolLM2)"
        ),
    }
}

fn unknown_tensor(path: &Path, name: &str, arch: &str) -> Error {
    Error::Unsupported {
        path: path.to_path_buf(),
        what: format!(
            "tensor `{name}` is not one this tool computes with for {arch} (it may change the math); supported: token_embd, output_norm, output, blk.N.{{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}} (weights, biases), blk.N.attn_q_norm/attn_k_norm (qwen3), rope_freqs (llama)"
        ),
    }
}

/// `rope_freqs` as the config's divisors: one per rotated pair (head_dim / 2).
fn rope_freqs(t: &Tensor, c: &ModelConfig, path: &Path) -> Result<Vec<f32>> {
    let v: Vec<f32> = t
        .flatten_all()
        .and_then(|x| x.to_vec1())
        .map_err(|e| bad_tensor(path, ROPE_FREQS, &e))?;
    if v.len() != c.head_dim / 2 {
        return Err(Error::BadTensor {
            path: path.to_path_buf(),
            name: ROPE_FREQS.into(),
            detail: format!(
                "has {} values, head_dim / 2 = {} expected",
                v.len(),
                c.head_dim / 2
            ),
        });
    }
    Ok(v)
}

fn check_type(dtype: GgmlDType, name: &str, path: &Path) -> Result<()> {
    use GgmlDType::*;
    match dtype {
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K => Ok(()),
        // Q8_1 / Q8K are llama.cpp's internal activation formats, never meant to be stored.
        other => Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "tensor `{name}` has ggml type {other:?}; re-quantise the model to F16, Q8_0, Q4_0, Q4_1 or a K-quant"
            ),
        }),
    }
}

/// Every tensor the forward needs must be present with the shape the metadata implies.
///
/// Checked one layer at a time: a header claiming millions of layers fails at its first missing
/// one instead of listing them all first (gigabytes from a sub-kilobyte file).
fn check_complete(w: &StoredWeights, c: &ModelConfig, path: &Path) -> Result<()> {
    let h = c.hidden_size;
    let check = |name: String, shape: Vec<usize>| -> Result<()> {
        match w.get(&name) {
            None => Err(Error::MissingTensor {
                path: path.to_path_buf(),
                name: gguf_name_of(&name),
            }),
            Some(t) if t.dims() != shape.as_slice() => Err(Error::BadTensor {
                path: path.to_path_buf(),
                name: gguf_name_of(&name),
                detail: format!("has shape {:?}, the metadata implies {shape:?}", t.dims()),
            }),
            Some(_) => Ok(()),
        }
    };
    check("model.embed_tokens.weight".into(), vec![c.vocab_size, h])?;
    check("model.norm.weight".into(), vec![h])?;
    if !c.tie_embeddings {
        check("lm_head.weight".into(), vec![c.vocab_size, h])?;
    }
    for l in 0..c.n_layers {
        for (name, shape) in layer_shapes(c, l) {
            check(name, shape)?;
        }
    }
    Ok(())
}

/// (HF name, shape) of the tensors of layer `l`.
fn layer_shapes(c: &ModelConfig, l: usize) -> Vec<(String, Vec<usize>)> {
    let (h, hd, f) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let p = format!("model.layers.{l}.");
    let mut want = vec![
        (
            format!("{p}self_attn.q_proj.weight"),
            vec![c.n_heads * hd, h],
        ),
        (
            format!("{p}self_attn.k_proj.weight"),
            vec![c.n_kv_heads * hd, h],
        ),
        (
            format!("{p}self_attn.v_proj.weight"),
            vec![c.n_kv_heads * hd, h],
        ),
        (
            format!("{p}self_attn.o_proj.weight"),
            vec![h, c.n_heads * hd],
        ),
        (format!("{p}mlp.gate_proj.weight"), vec![f, h]),
        (format!("{p}mlp.up_proj.weight"), vec![f, h]),
        (format!("{p}mlp.down_proj.weight"), vec![h, f]),
        (format!("{p}input_layernorm.weight"), vec![h]),
        (format!("{p}post_attention_layernorm.weight"), vec![h]),
    ];
    if c.qk_norm {
        want.push((format!("{p}self_attn.q_norm.weight"), vec![hd]));
        want.push((format!("{p}self_attn.k_norm.weight"), vec![hd]));
    }
    if c.qkv_bias {
        want.push((format!("{p}self_attn.q_proj.bias"), vec![c.n_heads * hd]));
        want.push((format!("{p}self_attn.k_proj.bias"), vec![c.n_kv_heads * hd]));
        want.push((format!("{p}self_attn.v_proj.bias"), vec![c.n_kv_heads * hd]));
    }
    want
}

/// The GGUF name of a Llama-family HF tensor name (error messages, fixture writers).
pub fn gguf_name_of(hf: &str) -> String {
    let direct = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    for (h, g) in direct {
        if hf == h {
            return g.into();
        }
    }
    let pairs = [
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("post_attention_layernorm", "ffn_norm"),
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
    ];
    let mut s = hf.replacen("model.layers.", "blk.", 1);
    for (h, g) in pairs {
        s = s.replacen(h, g, 1);
    }
    s
}
