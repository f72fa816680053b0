//! Block-quantised linear weights as a device declares them (issue 35): n-bit integer levels,
//! one scale and one zero point per block of `block` consecutive input features of an output
//! channel, w = (level − zero point) · scale. The layout is ONNX Runtime's `MatMulNBits` (contrib
//! op doc, `onnxruntime/core/graph/contrib_ops/contrib_defs.cc`): B `[N][K / block][block · bits
//! / 8]` bytes, levels packed from the low bits of each byte up, scales `[N · K / block]`, zero
//! points packed the same way per row (default 2^(bits − 1)); any source with levels, block scales
//! and zero points fits (an OpenVINO u4 / u8 compressed IR).
//!
//! `act_int8` models `accuracy_level` 4 on ONNX Runtime's CPU EP: each input row is quantised to
//! int8 per block of `block` features before the product (MLAS `SQNBIT_CompInt8`: scale = max|a|
//! / 127, level = a · (127 / max|a|) rounded to nearest even), and the products of the levels are
//! summed exactly; computing (level · scale) in f32 instead gives the same values up to the f32
//! rounding of the sums (checked against ONNX Runtime itself in `reference/tests/blockquant.rs`).

use crate::{Error, Result};

/// One block-quantised `[rows (N, output channels), cols (K, input features)]` matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockQuant {
    pub rows: usize,
    pub cols: usize,
    /// Input features per block.
    pub block: usize,
    /// Bits per level: 2, 4 or 8.
    pub bits: u32,
    /// Levels, `rows` rows of `cols · bits / 8` bytes, low bits first.
    pub data: Vec<u8>,
    /// `[rows][cols / block]`.
    pub scales: Vec<f32>,
    /// `[rows][cols / block]`, whole numbers (the levels' zero).
    pub zero_points: Vec<f32>,
    /// Input rows are quantised to int8 per block before the product (`accuracy_level` 4).
    pub act_int8: bool,
}

impl BlockQuant {
    /// Checks the sizes; `what` names the tensor in the error.
    pub fn new(mut q: BlockQuant, what: &str) -> Result<BlockQuant> {
        let bad = |detail: String| Err(Error::InvalidInput(format!("{what}: {detail}")));
        if !matches!(q.bits, 2 | 4 | 8) {
            return bad(format!(
                "{} bits per weight; kvprobe computes 2, 4 and 8",
                q.bits
            ));
        }
        if q.block == 0 || !q.cols.is_multiple_of(q.block) {
            return bad(format!(
                "block size {} does not divide the input size {}; re-export with a block size that divides it",
                q.block, q.cols
            ));
        }
        let blocks = q.rows * (q.cols / q.block);
        let row_bytes = q.cols * q.bits as usize / 8;
        if q.data.len() != q.rows * row_bytes || q.scales.len() != blocks {
            return bad(format!(
                "{} bytes of levels and {} scales for [{}, {}] in blocks of {} (want {} and {})",
                q.data.len(),
                q.scales.len(),
                q.rows,
                q.cols,
                q.block,
                q.rows * row_bytes,
                blocks
            ));
        }
        if q.zero_points.is_empty() {
            q.zero_points = vec![(1u32 << (q.bits - 1)) as f32; blocks];
        } else if q.zero_points.len() != blocks {
            return bad(format!(
                "{} zero points for {blocks} blocks",
                q.zero_points.len()
            ));
        }
        if let Some(i) = q.scales.iter().position(|s| !s.is_finite()) {
            return bad(format!("scale {i} is not finite"));
        }
        Ok(q)
    }

    /// Rows `r0..r1` as f32 (`(r1 − r0) · cols` values appended to the cleared `out`).
    pub fn rows_into(&self, r0: usize, r1: usize, out: &mut Vec<f32>) {
        out.clear();
        out.reserve((r1 - r0) * self.cols);
        if (self.block * self.bits as usize).is_multiple_of(8) {
            self.rows_by_block(r0, r1, out);
        } else {
            self.rows_by_value(r0, r1, out);
        }
    }

    /// [`BlockQuant::rows_into`] a block at a time, when every block starts on a byte: the
    /// block's zero point and scale read once, then each byte once for the levels it packs. The
    /// same f32 operations on the same operands as [`BlockQuant::rows_by_value`], so the same
    /// bits (unit test); the int4 matched reference converts every weight on every forward, and
    /// the value-by-value loop's index arithmetic was 67 % of `diagnose --onnx` on the builder's
    /// int4 SmolLM2 (perf; 37 s median).
    fn rows_by_block(&self, r0: usize, r1: usize, out: &mut Vec<f32>) {
        let per_row = self.cols / self.block;
        let bits = self.bits as usize;
        let per_byte = 8 / bits;
        let mask = ((1u16 << bits) - 1) as u8;
        let block_bytes = self.block * bits / 8;
        let row_bytes = self.cols * bits / 8;
        out.resize((r1 - r0) * self.cols, 0.0);
        let levels = self.data[r0 * row_bytes..r1 * row_bytes].chunks_exact(block_bytes);
        let dst = out.chunks_exact_mut(self.block);
        for (i, (src, dst)) in levels.zip(dst).enumerate() {
            let b = r0 * per_row + i;
            let (zp, scale) = (self.zero_points[b], self.scales[b]);
            if bits == 4 {
                // the int4 exports' width, spelled out so that the loop vectorises
                for (&byte, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                    d[0] = (f32::from(byte & 15) - zp) * scale;
                    d[1] = (f32::from(byte >> 4) - zp) * scale;
                }
                continue;
            }
            for (&byte, d) in src.iter().zip(dst.chunks_exact_mut(per_byte)) {
                for (j, v) in d.iter_mut().enumerate() {
                    *v = (f32::from((byte >> (j * bits)) & mask) - zp) * scale;
                }
            }
        }
    }

    /// [`BlockQuant::rows_into`] value by value (blocks that do not start on a byte).
    fn rows_by_value(&self, r0: usize, r1: usize, out: &mut Vec<f32>) {
        let per_row = self.cols / self.block;
        let bits = self.bits as usize;
        let row_bytes = self.cols * bits / 8;
        let mask = (1u32 << bits) - 1;
        for r in r0..r1 {
            let bytes = &self.data[r * row_bytes..(r + 1) * row_bytes];
            for k in 0..self.cols {
                let bit = k * bits;
                let level = (u32::from(bytes[bit / 8]) >> (bit % 8)) & mask;
                let b = r * per_row + k / self.block;
                out.push((level as f32 - self.zero_points[b]) * self.scales[b]);
            }
        }
    }

    /// The rows `r0..r1` alone (a fused projection split into its parts).
    pub fn slice_rows(&self, r0: usize, r1: usize) -> BlockQuant {
        let per_row = self.cols / self.block;
        let row_bytes = self.cols * self.bits as usize / 8;
        BlockQuant {
            rows: r1 - r0,
            data: self.data[r0 * row_bytes..r1 * row_bytes].to_vec(),
            scales: self.scales[r0 * per_row..r1 * per_row].to_vec(),
            zero_points: self.zero_points[r0 * per_row..r1 * per_row].to_vec(),
            ..self.clone()
        }
    }

    /// Bytes held (levels, scales, zero points).
    pub fn stored_bytes(&self) -> usize {
        self.data.len() + 4 * (self.scales.len() + self.zero_points.len())
    }
}

/// Input rows of `cols` features as the int8 path reads them: each block of `block` features
/// replaced by its int8 levels times the block's step (max|a| / 127; an all-zero block stays 0).
pub fn quantise_input_rows(x: &[f32], cols: usize, block: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(cols) {
        for blk in row.chunks_mut(block) {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 || !amax.is_finite() {
                continue;
            }
            let scale = amax / 127.0;
            let inv = 127.0 / amax;
            for v in blk.iter_mut() {
                *v = (*v * inv).round_ties_even().clamp(-127.0, 127.0) * scale;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q4(rows: usize, cols: usize, block: usize, levels: &[u8], zp: Vec<f32>) -> BlockQuant {
        let data = levels.chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect();
        BlockQuant::new(
            BlockQuant {
                rows,
                cols,
                block,
                bits: 4,
                data,
                scales: (0..rows * cols / block).map(|i| 0.5 + i as f32).collect(),
                zero_points: zp,
                act_int8: false,
            },
            "test",
        )
        .unwrap()
    }

    #[test]
    fn levels_unpack_low_nibble_first_with_the_default_zero_point() {
        // one row, two blocks of 2: scales 0.5 and 1.5, zero point 8
        let q = q4(1, 4, 2, &[0, 15, 8, 9], vec![]);
        let mut out = Vec::new();
        q.rows_into(0, 1, &mut out);
        assert_eq!(out, vec![-4.0, 3.5, 0.0, 1.5]);
        let q = q4(1, 4, 2, &[0, 15, 8, 9], vec![0.0, 8.0]);
        q.rows_into(0, 1, &mut out);
        assert_eq!(out, vec![0.0, 7.5, 0.0, 1.5]);
    }

    #[test]
    fn block_by_block_gives_the_value_by_value_bits() {
        // every width, blocks of whole bytes, rows ranges that start past the first row
        for (bits, block) in [(2u32, 4usize), (4, 32), (4, 2), (8, 16)] {
            let (rows, cols) = (5, 4 * block);
            let bytes = rows * cols * bits as usize / 8;
            let blocks = rows * cols / block;
            let q = BlockQuant::new(
                BlockQuant {
                    rows,
                    cols,
                    block,
                    bits,
                    data: (0..bytes).map(|i| (i * 151 % 256) as u8).collect(),
                    scales: (0..blocks).map(|i| 0.013 * (i as f32 + 0.7)).collect(),
                    zero_points: (0..blocks).map(|i| (i % (1 << bits)) as f32).collect(),
                    act_int8: false,
                },
                "test",
            )
            .unwrap();
            for (r0, r1) in [(0, rows), (2, 4), (4, 5)] {
                let (mut fast, mut slow) = (vec![9.0], Vec::new());
                q.rows_into(r0, r1, &mut fast);
                q.rows_by_value(r0, r1, &mut slow);
                assert_eq!(fast.len(), (r1 - r0) * cols);
                let bits_of = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits_of(&fast),
                    bits_of(&slow),
                    "{bits} bits, rows {r0}..{r1}"
                );
            }
        }
    }

    #[test]
    fn a_fused_matrix_splits_by_rows() {
        let q = q4(2, 2, 2, &[1, 2, 3, 4], vec![]);
        let mut all = Vec::new();
        q.rows_into(0, 2, &mut all);
        let mut second = Vec::new();
        q.slice_rows(1, 2).rows_into(0, 1, &mut second);
        assert_eq!(second, all[2..]);
    }

    #[test]
    fn sizes_that_do_not_fit_are_refused() {
        let mut q = q4(1, 4, 2, &[0, 1, 2, 3], vec![]);
        q.block = 3;
        let e = BlockQuant::new(q, "w").unwrap_err().to_string();
        assert!(
            e.contains("block size 3 does not divide the input size 4"),
            "{e}"
        );
    }

    #[test]
    fn input_rows_land_on_the_int8_grid_of_their_block() {
        let x = [1.0f32, -0.5, 0.25, 0.001, 0.0, 0.0];
        let q = quantise_input_rows(&x, 6, 4);
        let s = 1.0 / 127.0;
        // 0.5 · 127 = 63.5 → 64 (ties to even), 0.25 · 127 = 31.75 → 32, 0.127 → 0
        assert_eq!(q[..4], [127.0 * s, -64.0 * s, 32.0 * s, 0.0]);
        assert_eq!(q[4..], [0.0, 0.0]);
    }
}
