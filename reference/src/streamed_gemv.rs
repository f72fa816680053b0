//! One row of activations times a stored weight whose values a device changes before the
//! product (the fp16 emulator's rounding): the weight is converted a few rows at a time into a
//! buffer that stays in L1 and each row is summed against the activations there, so a decode
//! step reads the weight once and writes nothing the size of a tile. The tiled gemm path
//! (`matmul::tiled_transposed`) copied every tile out to L2/L3 before its product: on the ANE
//! emulator's SmolLM2 `diagnose`, 44 decode steps spent about 4 s in that copy.
//!
//! The sums run in f32 in a fixed order (16 lanes, then the lanes in order, then the tail):
//! deterministic, and not gemm's order, so a one-row product can differ from the same row of a
//! many-row product by an f32 rounding — as two kernels of a real device do.

use rayon::prelude::*;

use crate::matmul::FillRows;
use crate::{Error, Result};

/// f32 values of weight rows converted at once (32 KiB: half an L1 data cache).
const BLOCK_VALUES: usize = 8192;

/// `x · Wᵀ` for one row `x` of `k` values and a weight of `n` rows of `k`, `fill(r0, r1, buf)`
/// giving rows `r0..r1` as f32.
pub(crate) fn streamed_gemv(
    x: &[f32],
    k: usize,
    n: usize,
    fill: &FillRows<'_>,
) -> Result<Vec<f32>> {
    let Some(x) = x.get(..k) else {
        return Err(Error::InvalidInput(format!(
            "one-row product over {k} values got {}",
            x.len()
        )));
    };
    let mut out = vec![0f32; n];
    if n == 0 {
        return Ok(out);
    }
    let block = (BLOCK_VALUES / k.max(1)).max(1);
    // a few blocks per task so that both cores stay busy to the end without a task per block
    let per_task = block * (n / (block * 4 * rayon::current_num_threads()).max(1)).max(1);
    out.par_chunks_mut(per_task)
        .enumerate()
        .try_for_each(|(t, dst)| -> Result<()> {
            let mut buf = Vec::with_capacity(block * k);
            for (b, d) in dst.chunks_mut(block).enumerate() {
                let r0 = t * per_task + b * block;
                fill(r0, r0 + d.len(), &mut buf)?;
                if buf.len() != d.len() * k {
                    return Err(Error::InvalidInput(format!(
                        "weight rows {r0}..{} of {k} values hold {}",
                        r0 + d.len(),
                        buf.len()
                    )));
                }
                for (o, w) in d.iter_mut().zip(buf.chunks_exact(k)) {
                    *o = dot(w, x);
                }
            }
            Ok(())
        })?;
    Ok(out)
}

/// Σ a·b in f32: 16 running sums (vectorised lanes), added in order, then the tail.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            lanes[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(n: usize, k: usize) -> Vec<f32> {
        (0..n * k)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 317.0)
            .collect()
    }

    #[test]
    fn products_by_hand() {
        // [1 2 3] · [[1 0 0], [0 1 0], [1 1 1], [2 -1 0.5]]ᵀ = [1, 2, 6, 1.5]
        let w = [
            1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 2.0, -1.0, 0.5,
        ];
        let fill = |r0: usize, r1: usize, buf: &mut Vec<f32>| -> Result<()> {
            buf.clear();
            buf.extend_from_slice(&w[r0 * 3..r1 * 3]);
            Ok(())
        };
        let y = streamed_gemv(&[1.0, 2.0, 3.0], 3, 4, &fill).unwrap();
        assert_eq!(y, vec![1.0, 2.0, 6.0, 1.5]);
    }

    #[test]
    fn every_row_matches_an_f64_product_at_real_geometries() {
        // SmolLM2's shapes (k 576 and 1536, one k not a multiple of 16) and row counts that do
        // not divide into blocks or tasks
        for (n, k) in [(1536, 576), (576, 1536), (333, 581), (1, 7)] {
            let w = weight(n, k);
            let x: Vec<f32> = (0..k).map(|i| ((i % 13) as f32 - 6.0) / 5.0).collect();
            let fill = |r0: usize, r1: usize, buf: &mut Vec<f32>| -> Result<()> {
                buf.clear();
                buf.extend_from_slice(&w[r0 * k..r1 * k]);
                Ok(())
            };
            let y = streamed_gemv(&x, k, n, &fill).unwrap();
            assert_eq!(y.len(), n);
            for (r, got) in y.iter().enumerate() {
                let want: f64 = (0..k).map(|i| w[r * k + i] as f64 * x[i] as f64).sum();
                let scale: f64 = (0..k)
                    .map(|i| (w[r * k + i] as f64 * x[i] as f64).abs())
                    .sum();
                assert!(
                    (*got as f64 - want).abs() <= 1e-6 * scale.max(1.0),
                    "{n}x{k} row {r}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn a_short_fill_is_an_error_not_a_wrong_answer() {
        let fill = |_: usize, _: usize, buf: &mut Vec<f32>| -> Result<()> {
            buf.clear();
            buf.push(1.0);
            Ok(())
        };
        assert!(streamed_gemv(&[1.0, 2.0], 2, 3, &fill).is_err());
        assert!(streamed_gemv(&[1.0], 2, 3, &fill).is_err());
    }
}
