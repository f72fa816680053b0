//! A GGUF tensor between the header scan and the stored weight: read and dequantised (small
//! quantised models, on every core) and its llama Q/K rows reordered as stored bytes.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use candle_core::Tensor;

use crate::store::{Bytes, Weight};
use crate::{Error, Result};

/// A tensor found in the header, still to be dequantised (when `read_at` is set: its offset
/// and length in the file) and unpermuted (llama's Q and K, `heads` heads).
pub(crate) struct Pending<'n> {
    pub hf: String,
    pub gguf_name: &'n str,
    pub w: Weight,
    pub read_at: Option<(u64, usize)>,
    pub heads: Option<usize>,
}

impl Pending<'_> {
    pub fn finish(self, file: &File, path: &Path) -> Result<(String, Weight)> {
        let Pending {
            hf,
            gguf_name,
            mut w,
            read_at,
            heads,
        } = self;
        if let (Some((start, len)), Some(kind)) = (read_at, w.kind()) {
            // a copy read from the file: mapped pages would stay resident beside the f32 copy
            let mut raw = vec![0u8; len];
            std::os::unix::fs::FileExt::read_exact_at(file, &mut raw, start).map_err(|source| {
                Error::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            let mut stored = Weight::raw(Bytes::Owned(Arc::new(raw)), kind, w.dims().to_vec());
            // llama's Q/K rows reordered as stored bytes before the f32 copy is made, so that
            // the blocks it keeps (`Weight::dequantised`) are in the copy's row order
            if let Some(heads) = heads {
                stored = unpermute(&stored, heads).map_err(|e| bad_tensor(path, gguf_name, &e))?;
            }
            w = stored
                .dequantised()
                .map_err(|e| bad_tensor_msg(path, gguf_name, format!("could not be read ({e})")))?;
        } else if let Some(heads) = heads {
            w = unpermute(&w, heads).map_err(|e| bad_tensor(path, gguf_name, &e))?;
        }
        Ok((hf, w))
    }
}

/// [`unpermute_rows`] on a stored weight: a matrix's rows are reordered as stored bytes (blocks
/// never cross a row), anything else through an f32 tensor.
fn unpermute(w: &Weight, n_heads: usize) -> candle_core::Result<Weight> {
    let to_candle = |e: Error| candle_core::Error::Msg(e.to_string());
    let (Some(kind), [rows, cols]) = (w.kind(), w.dims()) else {
        let t = unpermute_rows(&w.to_tensor().map_err(to_candle)?, n_heads)?;
        return Weight::from_tensor(t).map_err(to_candle);
    };
    let (rows, cols) = (*rows, *cols);
    if n_heads == 0 || !rows.is_multiple_of(n_heads) || !(rows / n_heads).is_multiple_of(2) {
        return Err(candle_core::Error::Msg(format!(
            "has {rows} rows, not {n_heads} heads of an even size"
        )));
    }
    let rb = kind.row_bytes(cols);
    let mut raw = Vec::new();
    w.raw_bytes(|src| {
        let hd = rows / n_heads;
        raw.resize(src.len(), 0);
        for h in 0..n_heads {
            for half in 0..2 {
                for i in 0..hd / 2 {
                    let to = h * hd + half * hd / 2 + i;
                    let from = h * hd + 2 * i + half;
                    raw[to * rb..(to + 1) * rb].copy_from_slice(&src[from * rb..(from + 1) * rb]);
                }
            }
        }
    });
    Ok(Weight::raw(
        Bytes::Owned(Arc::new(raw)),
        kind,
        vec![rows, cols],
    ))
}

/// Undo llama.cpp's converter permutation of q/k rows (weights `[rows, in]` or biases `[rows]`).
///
/// The converter maps, inside each head of `hd` rows, HF row `half * hd/2 + i` (half ∈ {0,1},
/// i < hd/2) to file row `2 * i + half`, i.e. reshape `[heads, 2, hd/2]` → swap the two inner axes.
/// The inverse therefore reads the file rows as `[heads, hd/2, 2]` and swaps them back.
pub fn unpermute_rows(t: &Tensor, n_heads: usize) -> candle_core::Result<Tensor> {
    let dims = t.dims().to_vec();
    let Some(&rows) = dims.first() else {
        return Err(candle_core::Error::Msg(
            "has no dimensions where q/k rows are expected".into(),
        ));
    };
    let hd = rows / n_heads;
    let rest: Vec<usize> = dims[1..].to_vec();
    let mut split = vec![n_heads, hd / 2, 2];
    split.extend_from_slice(&rest);
    t.reshape(split)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)
}

pub(crate) fn bad_tensor_msg(path: &Path, name: &str, detail: String) -> Error {
    Error::BadTensor {
        path: path.to_path_buf(),
        name: name.to_string(),
        detail,
    }
}

pub(crate) fn bad_tensor(path: &Path, name: &str, e: &candle_core::Error) -> Error {
    Error::BadTensor {
        path: path.to_path_buf(),
        name: name.to_string(),
        detail: format!("could not be read ({})", crate::error::candle_message(e)),
    }
}
