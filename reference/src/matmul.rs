//! Matrix products on row-major `f32` slices through the same `gemm` call candle's CPU backend
//! makes (same sizes, strides and parallelism, so the same bits), without building tensors per
//! product and without candle's per-call thread-count lookup, which re-reads `/proc/cpuinfo` on
//! every product (about 8 ms of a 60 ms SmolLM2 decode step; profiled with perf).

use std::sync::OnceLock;

use candle_core::{DType, Storage, Tensor};
use gemm::{gemm, Parallelism};

use crate::{Error, Result};

/// How a right-hand side `[k, n]` operand is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rhs {
    /// `[n, k]` row-major, used transposed (nn.Linear weights, keys in `q·kᵀ`).
    Transposed,
    /// `[k, n]` row-major (Conv1D weights, values in `p·v`).
    Plain,
}

impl Rhs {
    /// (column, row) strides of the `[k, n]` operand as stored, `n` its full column count.
    fn strides(self, k: usize, n: usize) -> (isize, isize) {
        match self {
            Rhs::Transposed => (k as isize, 1),
            Rhs::Plain => (1, n as isize),
        }
    }
}

/// `d (m×n, row-major) = l (m×k, row-major) · r (k×n read with `strides` = (column, row))`:
/// the one gemm call, with the bounds it relies on checked first.
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    m: usize,
    n: usize,
    k: usize,
    d: &mut [f32],
    l: &[f32],
    r: &[f32],
    (rhs_cs, rhs_rs): (isize, isize),
    par: Parallelism,
) {
    if k == 0 {
        d[..m * n].fill(0.0);
        return;
    }
    let last_rhs = (k - 1) * rhs_rs as usize + (n - 1) * rhs_cs as usize;
    assert!(m > 0 && n > 0 && d.len() >= m * n && l.len() >= m * k && last_rhs < r.len());
    // SAFETY: checked above: `d` holds m×n values written with column stride 1 and row stride
    // n, `l` m×k values read with column stride 1 and row stride k, and the last element of `r`
    // read with the strides is in bounds; `d` is borrowed mutably, so it overlaps neither.
    unsafe {
        gemm(
            m,
            n,
            k,
            d.as_mut_ptr(),
            1,
            n as isize,
            false,
            l.as_ptr(),
            1,
            k as isize,
            r.as_ptr(),
            rhs_cs,
            rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// candle's thread count (`RAYON_NUM_THREADS`, else its CPU detection), looked up once.
fn parallelism() -> Parallelism {
    static THREADS: OnceLock<usize> = OnceLock::new();
    let n = *THREADS.get_or_init(candle_core::utils::get_num_threads);
    if n > 1 {
        Parallelism::Rayon(n)
    } else {
        Parallelism::None
    }
}

/// `batch` independent products `lhs[b] (m×k) · rhs[b] (k×n)` → `[batch, m, n]`; `lhs` is
/// `[batch, m, k]` row-major, `rhs` `[batch, n, k]` (Transposed) or `[batch, k, n]` (Plain).
pub(crate) fn batched(
    lhs: &[f32],
    rhs: &[f32],
    rhs_kind: Rhs,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f32>> {
    if lhs.len() < batch * m * k || rhs.len() < batch * k * n {
        return Err(Error::InvalidInput(format!(
            "matrix product of {batch}×[{m}×{k}]·[{k}×{n}] got {} and {} values",
            lhs.len(),
            rhs.len()
        )));
    }
    let mut dst = vec![0f32; batch * m * n];
    if m == 0 || n == 0 {
        return Ok(dst);
    }
    let strides = rhs_kind.strides(k, n);
    let par = parallelism();
    if let (1, 1, Parallelism::Rayon(threads)) = (batch, m, par) {
        if threads.min(n / GEMV_PART_COLUMNS) > 1 {
            gemv_split(lhs, rhs, rhs_kind, k, n, threads, &mut dst);
            return Ok(dst);
        }
    }
    for b in 0..batch {
        let l = &lhs[b * m * k..(b + 1) * m * k];
        let r = &rhs[b * k * n..(b + 1) * k * n];
        let d = &mut dst[b * m * n..(b + 1) * m * n];
        gemm_into(m, n, k, d, l, r, strides, par);
    }
    Ok(dst)
}

/// Fewest output columns a thread of a split one-row product gets. gemm runs a product of at
/// most 16×16 outputs through other (horizontal) kernels, whose sums round differently, so every
/// part must stay above 256 columns; below a few hundred the hand-off costs more than it saves.
const SPLIT_MIN_COLUMNS: usize = 300;

/// Fewest output columns a part of a split one-row product gets: gemm runs a product of at
/// most 16×16 = 256 outputs through its horizontal kernels, whose sums round differently, and one
/// of more through its gemv, one dot product per output whatever their count. SmolLM2's q, o and
/// down projections (576 outputs) ran on one core at the 300 of `SPLIT_MIN_COLUMNS`, a third of
/// a decode step's weight bytes.
const GEMV_PART_COLUMNS: usize = 257;

/// A one-row product split by output columns over up to `threads` rayon tasks. gemm runs a one-row
/// product as a single-threaded gemv, while a decode step is almost all such products (and
/// one core leaves memory bandwidth unused: two emulator processes run side by side at the
/// speed of one). Each output is still one dot product over `k` in gemm's order, so the bits
/// equal the unsplit call's.
fn gemv_split(
    lhs: &[f32],
    rhs: &[f32],
    rhs_kind: Rhs,
    k: usize,
    n: usize,
    threads: usize,
    dst: &mut [f32],
) {
    // parts of ⌊n/parts⌋ ≥ GEMV_PART_COLUMNS columns, the last one taking the remainder
    let parts = threads.min(n / GEMV_PART_COLUMNS).max(1);
    let bounds = tile_bounds(n, n / parts);
    rayon::scope(|scope| {
        let mut rest = &mut dst[..n];
        for &(c0, c1) in &bounds {
            let cols = c1 - c0;
            let (d, tail) = rest.split_at_mut(cols);
            rest = tail;
            scope.spawn(move |_| {
                let r = match rhs_kind {
                    Rhs::Transposed => &rhs[c0 * k..(c0 + cols) * k],
                    Rhs::Plain => &rhs[c0..],
                };
                gemm_into(
                    1,
                    cols,
                    k,
                    d,
                    lhs,
                    r,
                    rhs_kind.strides(k, n),
                    Parallelism::None,
                );
            });
        }
    });
}

/// f32 values a tile of a stored weight holds when it is converted (about 1 MiB: the tile stays
/// in cache between its conversion and its product).
pub(crate) const TILE_VALUES: usize = 1 << 18;

/// `fill(r0, r1, buf)`: rows `r0..r1` of a stored weight as f32 into `buf`.
pub(crate) type FillRows<'a> = dyn Fn(usize, usize, &mut Vec<f32>) -> Result<()> + Sync + 'a;

/// `lhs (m×k) · Wᵀ` for a weight `W` of `n` rows of `k` values that is not f32 in memory
/// (bf16, f16, quantised blocks): `fill(r0, r1, buf)` converts rows `r0..r1` of `W` into `buf`,
/// a tile of rows at a time, and each tile is multiplied by the one gemm call of `batched`.
/// gemm sums every output over `k` in an order that depends on `k` alone (its k-blocking), as
/// long as a product is not small enough for its other kernels (≤ 16×16 outputs, see
/// `SPLIT_MIN_COLUMNS`): every tile keeps at least that many rows, so each output has the bits
/// of the same product on an f32 copy of `W`.
pub(crate) fn tiled_transposed(
    lhs: &[f32],
    m: usize,
    k: usize,
    n: usize,
    fill: &FillRows<'_>,
) -> Result<Vec<f32>> {
    if lhs.len() < m * k {
        return Err(Error::InvalidInput(format!(
            "matrix product of [{m}×{k}] got {} values",
            lhs.len()
        )));
    }
    let mut dst = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return Ok(dst);
    }
    let bounds = tile_bounds(n, tile_rows(m, k, n));
    let products: Vec<Result<Vec<f32>>> = {
        use rayon::prelude::*;
        bounds
            .par_iter()
            // one tile buffer per rayon job, not an allocation per tile
            .map_init(Vec::new, |w, &(r0, r1)| {
                fill(r0, r1, w)?;
                let cols = r1 - r0;
                if w.len() != cols * k {
                    return Err(Error::InvalidInput(format!(
                        "weight tile of {cols} rows of {k} holds {} values",
                        w.len()
                    )));
                }
                let mut d = vec![0f32; m * cols];
                gemm_into(
                    m,
                    cols,
                    k,
                    &mut d,
                    lhs,
                    w,
                    Rhs::Transposed.strides(k, cols),
                    Parallelism::None,
                );
                Ok(d)
            })
            .collect()
    };
    for (&(r0, r1), d) in bounds.iter().zip(products) {
        let d = d?;
        let cols = r1 - r0;
        for (row, part) in dst.chunks_exact_mut(n).zip(d.chunks_exact(cols)) {
            row[r0..r1].copy_from_slice(part);
        }
    }
    Ok(dst)
}

/// Rows per tile of [`tiled_transposed`]: about `TILE_VALUES` converted values, never fewer than
/// `SPLIT_MIN_COLUMNS` while the product is small enough for gemm's other kernels (m ≤ 16).
/// Above that, the tiles come in a multiple of the threads, so that no core waits for the
/// other's last tile: a 1536-row projection in 5 tiles kept one of two cores idle a fifth of
/// its time, and the 256-row K/V projections ran on one core (Qwen2-1.5B prefill).
fn tile_rows(m: usize, k: usize, n: usize) -> usize {
    let base = (TILE_VALUES / k.max(1)).max(SPLIT_MIN_COLUMNS);
    if m <= 16 {
        return base;
    }
    let threads = rayon::current_num_threads().max(1);
    let count = n.div_ceil(base).div_ceil(threads) * threads;
    (n / count).max(16)
}

/// `[r0, r1)` ranges covering `0..n` of `tile` rows each, the last one taking the remainder
/// (so no range is shorter than `tile` unless `n` itself is).
fn tile_bounds(n: usize, tile: usize) -> Vec<(usize, usize)> {
    let count = (n / tile.max(1)).max(1);
    (0..count)
        .map(|i| (i * tile, if i + 1 == count { n } else { (i + 1) * tile }))
        .collect()
}

/// Runs `f` on a contiguous f32 CPU tensor's values without copying them; None otherwise.
pub(crate) fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return None;
    };
    let (start, end) = layout.contiguous_offsets()?;
    let data = cpu.as_slice::<f32>().ok()?;
    Some(f(&data[start..end]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn products_by_hand_and_as_candle() {
        // [1 2; 3 4] · [5 6; 7 8] = [19 22; 43 50]; the same rhs stored transposed.
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let plain = [5.0f32, 6.0, 7.0, 8.0];
        let trans = [5.0f32, 7.0, 6.0, 8.0];
        let want = vec![19.0, 22.0, 43.0, 50.0];
        assert_eq!(batched(&a, &plain, Rhs::Plain, 1, 2, 2, 2).unwrap(), want);
        assert_eq!(
            batched(&a, &trans, Rhs::Transposed, 1, 2, 2, 2).unwrap(),
            want
        );
        // bit-identical to candle's matmul through a transposed view, odd sizes, 2 batches
        let dev = &Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (2, 5, 67), dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (2, 13, 67), dev).unwrap();
        let want: Vec<f32> = x
            .matmul(&w.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let got = with_slice(&w, |ws| batched(&xs, ws, Rhs::Transposed, 2, 5, 67, 13))
            .unwrap()
            .unwrap();
        assert_eq!(got, want);
        assert!(batched(&xs, &xs[..3], Rhs::Plain, 2, 5, 67, 13).is_err());
    }

    #[test]
    fn tiled_products_equal_candle_bits() {
        // Products on a weight handed over a tile at a time against candle's matmul on the whole
        // f32 weight: one row (decode), a few rows, a prefill block; column counts that no tile
        // divides, and k large enough to take several of gemm's k-blocks.
        let dev = &Device::Cpu;
        for (m, k, n) in [
            (1, 77, 1043),
            (3, 130, 700),
            (64, 1100, 913),
            (1, 2000, 301),
            // thread-balanced tiles (`tile_rows`): Qwen2-1.5B's q/o, K/V and down projections
            (64, 1536, 1536),
            (64, 1536, 256),
            (17, 8960, 1536),
        ] {
            let x = Tensor::randn(0f32, 1.0, (m, k), dev).unwrap();
            let w = Tensor::randn(0f32, 1.0, (n, k), dev).unwrap();
            let want: Vec<f32> = x
                .matmul(&w.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let ws: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
            let fill = |r0: usize, r1: usize, out: &mut Vec<f32>| -> Result<()> {
                out.clear();
                out.extend_from_slice(&ws[r0 * k..r1 * k]);
                Ok(())
            };
            let got = tiled_transposed(&xs, m, k, n, &fill).unwrap();
            assert_eq!(got, want, "m {m} k {k} n {n}");
        }
        assert_eq!(tile_bounds(10, 4), vec![(0, 4), (4, 10)]);
        assert_eq!(tile_bounds(3, 4), vec![(0, 3)]);
        // one row keeps SPLIT_MIN_COLUMNS; many rows split evenly over the threads
        assert_eq!(tile_rows(1, 1536, 1536), SPLIT_MIN_COLUMNS);
        let t = rayon::current_num_threads();
        let tiles = tile_bounds(1536, tile_rows(64, 1536, 1536)).len();
        assert_eq!(tiles % t, 0, "{tiles} tiles on {t} threads");
    }

    #[test]
    fn split_one_row_products_equal_gemm_bits() {
        // A one-row product wide enough to be split over threads against candle's unsplit
        // matmul, for both operand storages and a column count no thread count divides evenly.
        let dev = &Device::Cpu;
        let (k, n) = (77, 1043);
        let x = Tensor::randn(0f32, 1.0, (1, k), dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (n, k), dev).unwrap();
        let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        // candle's product and the weight's values
        let candle = |w: &Tensor| -> (Vec<f32>, Vec<f32>) {
            let y = x.matmul(&w.t().unwrap()).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1().unwrap();
            (flat(&y), flat(w))
        };
        let (want, ws) = candle(&w);
        assert_eq!(
            batched(&xs, &ws, Rhs::Transposed, 1, 1, k, n).unwrap(),
            want
        );
        let wt: Vec<f32> = w.t().unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let plain = batched(&xs, &wt, Rhs::Plain, 1, 1, k, n).unwrap();
        for (a, b) in plain.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} vs {b}");
        }
        // the narrowest splits: parts of 257 and 258 columns on 2 threads (SmolLM2's 576-wide
        // projections split 288 + 288)
        for n in [514, 515, 576] {
            let (want, ws) = candle(&Tensor::randn(0f32, 1.0, (n, k), dev).unwrap());
            let mut d = vec![0f32; n];
            gemv_split(&xs, &ws, Rhs::Transposed, k, n, 2, &mut d);
            assert_eq!(d, want, "{n} columns on 2 threads");
        }
        for threads in [2, 3, 4, 16] {
            let mut d = vec![0f32; n];
            gemv_split(&xs, &ws, Rhs::Transposed, k, n, threads, &mut d);
            assert_eq!(d, want, "{threads} threads");
            let mut d = vec![0f32; n];
            gemv_split(&xs, &wt, Rhs::Plain, k, n, threads, &mut d);
            assert_eq!(d, plain, "{threads} threads, plain");
        }
    }
}
