//! Weights in the checkpoint's own storage type (issue 21 "Memory"): f32, f16, bf16 or quantised
//! GGUF blocks, inside the memory-mapped file where the file allows, turned into f32 a few rows
//! at a time when a product or a lookup needs them. A 1.5B bf16 model then costs its file size
//! instead of a 6 GB f32 copy; the compute stays f32 (`matmul::tiled_transposed`).

use std::fmt;
use std::sync::Arc;

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType};
use candle_core::{DType, Device, Tensor};
use half::f16;
use memmap2::Mmap;

use crate::{matmul, Result};

/// The bytes of one tensor: a range of a memory-mapped checkpoint, or an owned buffer (rows the
/// loader had to reorder, e.g. llama GGUF q/k).
#[derive(Clone)]
pub(crate) enum Bytes {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
}

impl Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, start, len } => &map[*start..*start + *len],
            Bytes::Owned(v) => v,
        }
    }
}

/// How a raw tensor's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    F16,
    Bf16,
    /// ggml blocks (Q4_0, Q8_0, K-quants, ...), dequantised by candle's own code.
    Quant(GgmlDType),
}

impl Kind {
    /// Bytes of one row of `cols` values (`cols` a whole number of blocks for `Quant`).
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            Kind::F32 => 4 * cols,
            Kind::F16 | Kind::Bf16 => 2 * cols,
            Kind::Quant(t) => cols / t.block_size() * t.type_size(),
        }
    }
}

#[derive(Clone)]
enum Repr {
    /// f32 values already in memory (in-memory weights, small GGUF models dequantised at load).
    Tensor(Tensor),
    Raw {
        bytes: Bytes,
        kind: Kind,
    },
    /// Per-output-channel int8 values and their channel steps (`--sim-weights int8`): the
    /// device's own weights in its storage type, a quarter of an f32 copy, widened per tile.
    Int8 {
        values: Arc<Vec<i8>>,
        /// `max|w| / 127` per channel.
        scales: Arc<Vec<f32>>,
        /// true = channels are columns (Conv1D `[in, out]`), false = rows.
        per_column: bool,
    },
    /// Block-quantised levels with block scales and zero points (a device's declared weights:
    /// ONNX `MatMulNBits`), widened per tile.
    Blocks(Arc<crate::blockquant::BlockQuant>),
}

/// A weight as stored: `dims` as the forward sees it (`[rows, cols]` for matrices, rows being
/// the leading dimensions).
#[derive(Clone)]
pub(crate) struct Weight {
    repr: Repr,
    dims: Vec<usize>,
    /// The GGUF blocks an f32 weight was dequantised from at load, kept so that a one-row
    /// product reads them instead of the f32 copy (`block_gemv`: same bits, a fifth of the
    /// bytes). None for any other weight, and for every weight derived from this one.
    dequantised_from: Option<Arc<(Bytes, GgmlDType)>>,
}

impl fmt::Debug for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.repr {
            Repr::Tensor(_) => "f32 tensor".to_string(),
            Repr::Raw { kind, bytes } => format!(
                "{kind:?} {}",
                if matches!(bytes, Bytes::Mapped { .. }) {
                    "mapped"
                } else {
                    "owned"
                }
            ),
            Repr::Int8 { .. } => "int8 per channel".to_string(),
            Repr::Blocks(q) => format!("{}-bit blocks of {}", q.bits, q.block),
        };
        write!(f, "Weight({:?}, {kind})", self.dims)
    }
}

impl Weight {
    /// An in-memory tensor of any float type, kept as f32 (contiguous).
    pub fn from_tensor(t: Tensor) -> Result<Weight> {
        let dims = t.dims().to_vec();
        let t = if t.dtype() == DType::F32 {
            t.contiguous()?
        } else {
            t.to_dtype(DType::F32)?.contiguous()?
        };
        Ok(Weight {
            repr: Repr::Tensor(t),
            dims,
            dequantised_from: None,
        })
    }

    /// A block-quantised `[rows, cols]` matrix.
    pub fn blocks(q: crate::blockquant::BlockQuant) -> Weight {
        Weight {
            dims: vec![q.rows, q.cols],
            repr: Repr::Blocks(Arc::new(q)),
            dequantised_from: None,
        }
    }

    /// The block length of the int8 quantisation a block-quantised weight applies to its input
    /// rows (`accuracy_level` 4), if any.
    pub fn input_int8_block(&self) -> Option<usize> {
        match &self.repr {
            Repr::Blocks(q) if q.act_int8 => Some(q.block),
            _ => None,
        }
    }

    /// Raw stored values; the caller has checked that `bytes` holds exactly `dims` values of
    /// `kind` (the row length a whole number of blocks for quantised kinds).
    pub fn raw(bytes: Bytes, kind: Kind, dims: Vec<usize>) -> Weight {
        Weight {
            repr: Repr::Raw { bytes, kind },
            dims,
            dequantised_from: None,
        }
    }

    /// This stored weight as an f32 copy (dequantised at load). Q4_1 / Q8_0 blocks are kept
    /// beside the copy for the one-row products (`block_gemv`); other kinds are not read there.
    pub fn dequantised(&self) -> Result<Weight> {
        let mut w = Weight::from_tensor(self.to_tensor()?)?;
        if let (
            Repr::Raw {
                bytes,
                kind: Kind::Quant(t),
            },
            [_, _],
        ) = (&self.repr, &self.dims[..])
        {
            if crate::block_gemv::reads(*t) {
                w.dequantised_from = Some(Arc::new((bytes.clone(), *t)));
            }
        }
        Ok(w)
    }

    /// `x · Wᵀ` for one row `x` of `k` values read from the blocks this weight was dequantised
    /// from, with the bits of the product on its f32 copy; None where that cannot be promised
    /// (see `block_gemv::applies`) or the weight kept no blocks.
    pub fn one_row_from_blocks(&self, x: &[f32], k: usize) -> Option<Vec<f32>> {
        let (bytes, kind) = self.dequantised_from.as_deref()?;
        if self.cols() != k {
            return None;
        }
        crate::block_gemv::one_row(x, k, self.rows(), bytes.as_slice(), *kind)
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Values per row (the last dimension; 1 for a scalar).
    pub fn cols(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// Rows (the product of the leading dimensions).
    pub fn rows(&self) -> usize {
        self.dims[..self.dims.len().saturating_sub(1)]
            .iter()
            .product()
    }

    /// The storage type, None for values already held as f32.
    pub fn kind(&self) -> Option<Kind> {
        match &self.repr {
            Repr::Tensor(_) | Repr::Int8 { .. } | Repr::Blocks(_) => None,
            Repr::Raw { kind, .. } => Some(*kind),
        }
    }

    /// Runs `f` on the stored bytes; None for values held as an f32 tensor or derived.
    pub fn raw_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match &self.repr {
            Repr::Tensor(_) | Repr::Int8 { .. } | Repr::Blocks(_) => None,
            Repr::Raw { bytes, .. } => Some(f(bytes.as_slice())),
        }
    }

    /// Bytes a one-row product reads: the blocks kept beside an f32 copy where the product
    /// reads them (`one_row_from_blocks`), else the values as stored.
    pub fn one_row_bytes(&self) -> usize {
        match self.dequantised_from.as_deref() {
            Some((bytes, kind)) if crate::block_gemv::applies(*kind, self.cols(), self.rows()) => {
                bytes.as_slice().len()
            }
            _ => self.stored_bytes(),
        }
    }

    /// Bytes the values occupy as stored.
    pub fn stored_bytes(&self) -> usize {
        match &self.repr {
            Repr::Tensor(t) => 4 * t.elem_count(),
            Repr::Raw { bytes, .. } => bytes.as_slice().len(),
            Repr::Int8 { values, scales, .. } => values.len() + 4 * scales.len(),
            Repr::Blocks(q) => q.stored_bytes(),
        }
    }

    /// Stored as 16-bit floats (bf16 / f16 checkpoints): a one-row product streams them
    /// (`streamed_gemv`). Int8 and quantised blocks keep the tiled path their results were
    /// measured on.
    pub fn is_half(&self) -> bool {
        matches!(
            self.repr,
            Repr::Raw {
                kind: Kind::F16 | Kind::Bf16,
                ..
            }
        )
    }

    /// Runs `f` on the values when they are f32 in memory (no conversion needed); None otherwise.
    pub fn with_f32<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
        match &self.repr {
            Repr::Tensor(t) => matmul::with_slice(t, f),
            Repr::Raw {
                bytes,
                kind: Kind::F32,
            } => {
                // SAFETY: every bit pattern is a valid f32; `align_to` only yields the aligned
                // middle, and a prefix or suffix means the mapping is misaligned (then None).
                let (pre, vals, post) = unsafe { bytes.as_slice().align_to::<f32>() };
                (pre.is_empty() && post.is_empty() && cfg!(target_endian = "little"))
                    .then(|| f(vals))
            }
            Repr::Raw { .. } | Repr::Int8 { .. } | Repr::Blocks(_) => None,
        }
    }

    /// Rows `r0..r1` as f32 into `out` (resized to `(r1 - r0) * cols`). Every conversion is exact
    /// (f16/bf16 widen; quantised blocks go through candle's dequantisation, as at load).
    pub fn rows_into(&self, r0: usize, r1: usize, out: &mut Vec<f32>) -> Result<()> {
        let cols = self.cols();
        // an f32 weight is copied without zeroing the buffer first (a memset was a tenth of
        // the ANE emulator's time, which converts every tile of every product)
        out.clear();
        if self
            .with_f32(|v| out.extend_from_slice(&v[r0 * cols..r1 * cols]))
            .is_some()
        {
            return Ok(());
        }
        let n = (r1 - r0) * cols;
        if let Repr::Blocks(q) = &self.repr {
            q.rows_into(r0, r1, out);
            return Ok(());
        }
        if let Repr::Int8 {
            values,
            scales,
            per_column,
        } = &self.repr
        {
            out.resize(n, 0.0);
            let src = &values[r0 * cols..r1 * cols];
            for (i, (o, q)) in out
                .chunks_exact_mut(cols)
                .zip(src.chunks_exact(cols))
                .enumerate()
            {
                if *per_column {
                    for ((o, &q), &s) in o.iter_mut().zip(q).zip(scales.iter()) {
                        *o = f32::from(q) * s;
                    }
                } else {
                    let s = scales[r0 + i];
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = f32::from(q) * s;
                    }
                }
            }
            return Ok(());
        }
        let Repr::Raw { bytes, kind } = &self.repr else {
            // a tensor without a contiguous f32 slice (not produced by `from_tensor`)
            let t = self.to_tensor()?.flatten_all()?;
            out.resize(n, 0.0);
            out.copy_from_slice(&t.narrow(0, r0 * cols, (r1 - r0) * cols)?.to_vec1::<f32>()?);
            return Ok(());
        };
        let rb = kind.row_bytes(cols);
        let src = &bytes.as_slice()[r0 * rb..r1 * rb];
        // the widening kinds append to the cleared buffer (extending from an exact-size iterator
        // writes in place): zero-filling a tile, or copying it from a stack block, before
        // overwriting it cost as much as the conversion (bf16 1.5B decode step 0.95 → 0.6 s)
        out.reserve(n);
        match kind {
            Kind::F32 => {
                out.extend(
                    src.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
            }
            Kind::F16 => {
                // the slice conversion uses the CPU's F16C instructions when it has them (the
                // decode step converts every weight, so this loop is the step's cost)
                use half::slice::HalfFloatSliceExt;
                let (mut halves, mut block) = ([f16::ZERO; 1024], [0f32; 1024]);
                for b in src.chunks(2048) {
                    let (h, o) = (&mut halves[..b.len() / 2], &mut block[..b.len() / 2]);
                    for (x, b) in h.iter_mut().zip(b.chunks_exact(2)) {
                        *x = f16::from_le_bytes([b[0], b[1]]);
                    }
                    h.convert_to_f32_slice(o);
                    out.extend_from_slice(o);
                }
            }
            Kind::Bf16 => {
                // bf16 is the high half of an f32: widening is a shift (exact for every value,
                // NaN payloads included), which vectorises where the library call does not
                out.extend(
                    src.chunks_exact(2)
                        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
                );
            }
            Kind::Quant(t) => {
                // candle casts the byte pointer to its block type: hand it an 8-byte aligned copy
                let mut aligned = vec![0u64; src.len().div_ceil(8)];
                // SAFETY: a u64 buffer viewed as bytes (u8 has no alignment or validity needs)
                let buf = unsafe {
                    std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), src.len())
                };
                buf.copy_from_slice(src);
                let q = qtensor_from_ggml(*t, buf, vec![r1 - r0, cols], &Device::Cpu)?;
                let d = q.dequantize(&Device::Cpu)?;
                matmul::with_slice(&d, |v| out.extend_from_slice(v)).ok_or_else(|| {
                    crate::Error::InvalidInput("dequantised block is not f32".into())
                })?;
            }
        }
        if out.len() != n {
            return Err(crate::Error::InvalidInput(format!(
                "rows {r0}..{r1} of {cols} values converted to {} values",
                out.len()
            )));
        }
        Ok(())
    }

    /// All values as an f32 tensor of shape `dims` (a copy unless already f32 in memory). For
    /// small tensors (norms, biases) and for paths that need a whole matrix (int8, fp16 export).
    pub fn to_tensor(&self) -> Result<Tensor> {
        if let Repr::Tensor(t) = &self.repr {
            return Ok(t.clone());
        }
        let mut v = Vec::new();
        self.rows_into(0, self.rows(), &mut v)?;
        Ok(Tensor::from_vec(v, self.dims.clone(), &Device::Cpu)?)
    }

    /// Runs `f(r0, rows)` on the weight's rows as f32, about 1 MiB of them at a time from row
    /// `r0` on (a pass over a stored weight without its f32 copy).
    pub fn for_each_tile(&self, mut f: impl FnMut(usize, &[f32])) -> Result<()> {
        let rows = self.rows();
        let tile = (matmul::TILE_VALUES / self.cols().max(1)).max(1);
        let mut buf = Vec::new();
        for r0 in (0..rows).step_by(tile) {
            self.rows_into(r0, (r0 + tile).min(rows), &mut buf)?;
            f(r0, &buf);
        }
        Ok(())
    }

    /// The index of the first NaN or infinite value, if any (issue 38: refused on load). Stored
    /// floats are read as bit patterns (all exponent bits set), without a conversion; quantised
    /// blocks are widened a tile at a time.
    pub fn first_non_finite(&self) -> Result<Option<usize>> {
        fn first<const N: usize>(b: &[u8], bad: impl Fn([u8; N]) -> bool) -> Option<usize> {
            b.chunks_exact(N)
                .position(|c| bad(c.try_into().unwrap_or([0; N])))
        }
        match &self.repr {
            Repr::Tensor(_)
            | Repr::Raw {
                kind: Kind::F32, ..
            } => {
                if let Some(found) = self.with_f32(crate::float_scan::first_non_finite_f32) {
                    return Ok(found);
                }
            }
            Repr::Raw {
                bytes,
                kind: Kind::F16,
            } => {
                let exp = |c: [u8; 2]| u16::from_le_bytes(c) & 0x7c00 == 0x7c00;
                return Ok(first(bytes.as_slice(), exp));
            }
            Repr::Raw {
                bytes,
                kind: Kind::Bf16,
            } => {
                let exp = |c: [u8; 2]| u16::from_le_bytes(c) & 0x7f80 == 0x7f80;
                return Ok(first(bytes.as_slice(), exp));
            }
            Repr::Int8 { scales, .. } => {
                return Ok(scales.iter().position(|x| !x.is_finite()));
            }
            // scales checked finite when built (BlockQuant::new), levels are integers
            Repr::Blocks(_) => return Ok(None),
            Repr::Raw { .. } => {}
        }
        let mut found = None;
        let cols = self.cols();
        self.for_each_tile(|r0, rows| {
            if found.is_none() {
                found = rows
                    .iter()
                    .position(|x| !x.is_finite())
                    .map(|i| r0 * cols + i);
            }
        })?;
        Ok(found)
    }

    /// The largest |w| (NaN ignored), read a tile of rows at a time.
    pub fn max_abs(&self) -> Result<f32> {
        let mut m = 0f32;
        self.for_each_tile(|_, rows| m = rows.iter().fold(m, |m, v| m.max(v.abs())))?;
        Ok(m)
    }

    /// This weight fake-quantised to int8 per output channel (`int8::fake_quant_per_output`'s
    /// values), held as int8 values and channel steps: two passes over the stored rows a tile
    /// at a time (the channel maxima, then the values), no f32 copy of the matrix.
    /// `per_column` = channels are columns (Conv1D `[in, out]`).
    pub fn to_int8(&self, per_column: bool) -> Result<Weight> {
        let (rows, cols) = (self.rows(), self.cols());
        let mut amax = vec![0f32; if per_column { cols } else { rows }];
        self.for_each_tile(|r0, buf| {
            for (i, row) in buf.chunks_exact(cols).enumerate() {
                for (j, v) in row.iter().enumerate() {
                    let a = &mut amax[if per_column { j } else { r0 + i }];
                    *a = a.max(v.abs());
                }
            }
        })?;
        let scales: Vec<f32> = amax.into_iter().map(crate::int8::scale_of).collect();
        let mut values = Vec::with_capacity(rows * cols);
        self.for_each_tile(|r0, buf| {
            for (i, row) in buf.chunks_exact(cols).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    let s = scales[if per_column { j } else { r0 + i }];
                    // an all-zero channel (step 0) stays zero
                    values.push(if s == 0.0 {
                        0
                    } else {
                        crate::int8::level(v, s)
                    });
                }
            }
        })?;
        Ok(Weight {
            repr: Repr::Int8 {
                values: Arc::new(values),
                scales: Arc::new(scales),
                per_column,
            },
            dims: self.dims.clone(),
            dequantised_from: None,
        })
    }

    /// Rows `idx` gathered into a `[idx.len(), cols]` tensor (an embedding lookup).
    pub fn gather_rows(&self, idx: &[u32]) -> Result<Tensor> {
        let cols = self.cols();
        let mut all = Vec::with_capacity(idx.len() * cols);
        let mut row = Vec::new();
        for &i in idx {
            let i = i as usize;
            self.rows_into(i, i + 1, &mut row)?;
            all.extend_from_slice(&row);
        }
        Ok(Tensor::from_vec(all, (idx.len(), cols), &Device::Cpu)?)
    }
}

/// A model's embedding table as stored, shared (no copy): rows are converted to f32 when asked
/// for. What an emulator's host side reads its embedding rows from.
#[derive(Debug, Clone)]
pub struct EmbeddingRows(pub(crate) Weight);

impl EmbeddingRows {
    /// A table held as f32 values, `features` per row (a host table built outside a model).
    pub fn from_f32(values: Vec<f32>, features: usize) -> Result<EmbeddingRows> {
        if features == 0 || !values.len().is_multiple_of(features) {
            return Err(crate::Error::InvalidInput(format!(
                "embedding table of {} values is not whole rows of {features}",
                values.len()
            )));
        }
        let rows = values.len() / features;
        let t = Tensor::from_vec(values, (rows, features), &Device::Cpu)?;
        Ok(EmbeddingRows(Weight::from_tensor(t)?))
    }

    /// `(rows, features)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.0.rows(), self.0.cols())
    }

    /// Rows `r0..r1` as f32 into `out` (resized to `(r1 - r0) × features`).
    pub fn rows_into(&self, r0: usize, r1: usize, out: &mut Vec<f32>) -> Result<()> {
        let (rows, f) = self.dims();
        if r0 > r1 || r1 > rows {
            return Err(crate::Error::InvalidInput(format!(
                "embedding rows {r0}..{r1} of a {rows} × {f} table"
            )));
        }
        self.0.rows_into(r0, r1, out)
    }

    /// The largest |value| in the table (NaN ignored), read a tile of rows at a time.
    pub fn max_abs(&self) -> Result<f32> {
        self.0.max_abs()
    }

    /// The whole table as an f32 `[rows, features]` tensor (a copy: for writers of weight files).
    pub fn to_tensor(&self) -> Result<Tensor> {
        self.0.to_tensor()
    }

    /// Row `id` as f32 into `out` (`features` values).
    pub fn row_into(&self, id: usize, out: &mut [f32]) -> Result<()> {
        let (rows, f) = self.dims();
        if id >= rows || out.len() != f {
            return Err(crate::Error::InvalidInput(format!(
                "embedding row {id} of a {rows} × {f} table into {} values",
                out.len()
            )));
        }
        if self
            .0
            .with_f32(|v| out.copy_from_slice(&v[id * f..(id + 1) * f]))
            .is_some()
        {
            return Ok(());
        }
        let mut v = Vec::with_capacity(f);
        self.0.rows_into(id, id + 1, &mut v)?;
        out.copy_from_slice(&v);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(bytes: Vec<u8>, kind: Kind, dims: Vec<usize>) -> Weight {
        Weight::raw(Bytes::Owned(Arc::new(bytes)), kind, dims)
    }

    /// The int8 weight converts rows to the values of the whole-matrix fake quantisation (bit for
    /// bit), for channels as rows and as columns, over f32 and bf16 storage and across tiles
    /// (a channel's step spans every tile of rows), at one byte per value.
    #[test]
    fn int8_weights_equal_the_whole_matrix_quantisation() {
        let (rows, cols) = (700, 600);
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 10007) as f32 - 5003.0) * 1e-3 * (1.0 + (i % cols) as f32))
            .collect();
        let t = Tensor::from_vec(vals.clone(), (rows, cols), &Device::Cpu).unwrap();
        let bf: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let bf_weight = owned(bf, Kind::Bf16, vec![rows, cols]);
        for w in [Weight::from_tensor(t).unwrap(), bf_weight] {
            for per_column in [false, true] {
                let want = crate::int8::fake_quant_per_output(&w.to_tensor().unwrap(), per_column)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let view = w.to_int8(per_column).unwrap();
                let channels = if per_column { cols } else { rows };
                assert_eq!(view.stored_bytes(), rows * cols + 4 * channels);
                assert!(view.with_f32(|_| ()).is_none());
                let mut got = Vec::new();
                view.rows_into(0, rows, &mut got).unwrap();
                assert_eq!(got, want, "{w:?} per_column {per_column}");
                view.rows_into(333, 335, &mut got).unwrap();
                assert_eq!(got, want[333 * cols..335 * cols]);
            }
        }
    }

    /// The fast widening paths give the library's scalar conversion for every bit pattern (NaNs
    /// compared as NaN), across the 1024-value chunks of the f16 path.
    #[test]
    fn every_half_value_widens_as_the_library_does() {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|x| x.to_le_bytes()).collect();
        for kind in [Kind::Bf16, Kind::F16] {
            let w = owned(bytes.clone(), kind, vec![256, 256]);
            let mut out = Vec::new();
            w.rows_into(0, 256, &mut out).unwrap();
            for (&b, &got) in bits.iter().zip(&out) {
                let want = match kind {
                    Kind::Bf16 => half::bf16::from_bits(b).to_f32(),
                    _ => f16::from_bits(b).to_f32(),
                };
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{kind:?} {b:#06x}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn half_rows_by_hand() {
        // bf16 0x3F80 = 1.0, 0xC000 = -2.0, 0x3EC0 = 0.375; f16 0x3C00 = 1.0, 0xB800 = -0.5.
        let w = owned(
            [0x3F80u16, 0xC000, 0x3EC0, 0x0000]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Kind::Bf16,
            vec![2, 2],
        );
        let mut out = Vec::new();
        w.rows_into(0, 2, &mut out).unwrap();
        assert_eq!(out, vec![1.0, -2.0, 0.375, 0.0]);
        w.rows_into(1, 2, &mut out).unwrap();
        assert_eq!(out, vec![0.375, 0.0]);
        let w = owned(
            [0x3C00u16, 0xB800]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            Kind::F16,
            vec![1, 2],
        );
        assert_eq!(
            w.to_tensor().unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![1.0, -0.5]]
        );
        let t = w.gather_rows(&[0, 0]).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(t, vec![vec![1.0, -0.5], vec![1.0, -0.5]]);
    }

    #[test]
    fn quantised_rows_equal_candle_dequantisation() {
        // A Q8_0 and a Q4_K matrix: any row range equals the same rows of candle's whole-tensor
        // dequantisation (what the loader did at load before).
        let dev = &Device::Cpu;
        for t in [GgmlDType::Q8_0, GgmlDType::Q4K] {
            let x = Tensor::randn(0f32, 1.0, (5, 512), dev).unwrap();
            let q = candle_core::quantized::QTensor::quantize(&x, t).unwrap();
            let want: Vec<Vec<f32>> = q.dequantize(dev).unwrap().to_vec2().unwrap();
            let w = owned(q.data().unwrap().to_vec(), Kind::Quant(t), vec![5, 512]);
            let mut out = Vec::new();
            w.rows_into(1, 4, &mut out).unwrap();
            assert_eq!(out, want[1..4].concat(), "{t:?}");
        }
    }

    #[test]
    fn quantised_gguf_blocks_kept_equal_dequantised_at_load() {
        // A Q8_0 / Q4_K model whose blocks stay in the mapped file (dequantised a tile at a time
        // in every product, as for a model too large to dequantise) against the same file
        // dequantised at load (the path small models such as SmolLM2 take): the same logits.
        use crate::arch_fixtures::{FixtureArch, Geometry};
        use crate::{ForwardOptions, Model};
        let g = Geometry {
            hidden: 256,
            intermediate: 2560,
            vocab: 3000,
            head_dim: 64,
            ..Geometry::TINY_QWEN2
        };
        let d = tempfile::tempdir().unwrap();
        for (arch, t) in [
            (FixtureArch::Qwen2, GgmlDType::Q8_0),
            (FixtureArch::Llama3, GgmlDType::Q4K),
            // Q4_1 (SmolLM2's type): the one-row products of the copy dequantised at load read
            // the blocks it keeps (block_gemv), the kept model's tiles go through gemm
            (FixtureArch::Llama3, GgmlDType::Q4_1),
        ] {
            let p = d.path().join(format!("{}.gguf", arch.name()));
            crate::fixtures_gguf::write_gguf(&p, arch, &g, 4, t).unwrap();
            let kept = crate::gguf::load_stored_with(&p, 0).unwrap();
            assert_eq!(
                kept.weights["model.layers.0.mlp.up_proj.weight"].kind(),
                Some(Kind::Quant(t))
            );
            let kept = Model::from_stored(kept, &p).unwrap();
            let now = crate::gguf::load_stored_with(&p, u64::MAX).unwrap();
            let up = &now.weights["model.layers.0.mlp.up_proj.weight"];
            assert_eq!(up.kind(), None);
            // Q4_1 and Q8_0 blocks are kept beside the copy and read by one-row products
            assert_eq!(
                up.one_row_bytes() < up.stored_bytes(),
                t != GgmlDType::Q4K && crate::block_gemv::gemm_agrees(),
                "{t:?}"
            );
            let now = Model::from_stored(now, &p).unwrap();
            let x: Vec<u32> = (0..12).map(|i| (i * 211 % 3000) as u32).collect();
            let o = ForwardOptions::default();
            assert_eq!(
                kept.forward(&x, &o).unwrap().logits,
                now.forward(&x, &o).unwrap().logits,
                "{t:?}"
            );
            // one token: one-row products throughout
            assert_eq!(
                kept.forward(&x[..1], &o).unwrap().logits,
                now.forward(&x[..1], &o).unwrap().logits,
                "{t:?}, one row"
            );
        }
    }
}
