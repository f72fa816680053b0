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
    let (rhs_cs, rhs_rs) = match rhs_kind {
        Rhs::Transposed => (k as isize, 1isize),
        Rhs::Plain => (1isize, n as isize),
    };
    let par = parallelism();
    for b in 0..batch {
        let l = &lhs[b * m * k..(b + 1) * m * k];
        let r = &rhs[b * k * n..(b + 1) * k * n];
        let d = &mut dst[b * m * n..(b + 1) * m * n];
        // SAFETY: `l` holds m×k values read with column stride 1 and row stride k, `r` holds k×n
        // values read with the strides above (both index < k·n), `d` holds m×n values written
        // with column stride 1 and row stride n; the three slices do not overlap.
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
    Ok(dst)
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
}
