//! One row of activations times a weight that was dequantised at load from GGUF Q4_1 / Q8_0
//! blocks, read from the blocks instead of the f32 copy: each output has the bits of the one-row
//! product gemm computes on the f32 copy (`matmul::batched`), a fifth of the bytes read.
//!
//! Why: a decode step is almost all one-row products, and a one-row product is bound by the
//! bytes it reads. SmolLM2's f32 copy is 540 MB a step; its Q4_1 / Q8_0 blocks are 96 MB. The
//! diagnosis runs hundreds of decode steps (every replay is a greedy run), so this is most of
//! its time (perf: gemm's gemv was 58 % of a layout fault's `diagnose`).
//!
//! Why the bits are gemm's: gemm 0.19 runs a one-row product of more than 16 × 16 outputs and
//! more than two inner values as a row-major gemv (`gemm_common::gemv::mixed_gemv_rowmajor`), on
//! AVX2 + FMA (its `V3`, which also asks for F16C) one dot product per output: eight 8-lane FMA
//! accumulators over blocks of 64 values, summed pairwise (0+1, 2+3, 4+5, 6+7, then 01+23,
//! 45+67, then the two), one 8-lane FMA per remaining 8 values, the lanes added in order, the
//! rest by scalar FMA. This module sums in that order on the values candle's dequantisation
//! gives (`q · d + m` and `q · d`, a product then a sum, never fused). Where that cannot be
//! guaranteed (another CPU, a gemm that picks another kernel) the caller keeps the f32 product:
//! [`gemm_agrees`] compares both on a fixed matrix once per process and switches this off on
//! any difference.

use std::sync::OnceLock;

use candle_core::quantized::GgmlDType;
use half::f16;
use rayon::prelude::*;

/// Fewest outputs for which gemm takes its gemv (it runs at most 16 × 16 outputs through its
/// horizontal kernels, which round differently).
const GEMV_MIN_OUTPUTS: usize = 257;

/// The block types read here: values per block and bytes per block.
fn layout(kind: GgmlDType) -> Option<(usize, usize)> {
    match kind {
        // f16 scale, f16 minimum, 16 bytes of two 4-bit levels
        GgmlDType::Q4_1 => Some((32, 20)),
        // f16 scale, 32 signed 8-bit levels
        GgmlDType::Q8_0 => Some((32, 34)),
        _ => None,
    }
}

/// Whether blocks of `kind` are read here (a weight keeps them beside its f32 copy only then).
pub(crate) fn reads(kind: GgmlDType) -> bool {
    layout(kind).is_some()
}

/// Whether [`one_row`] can stand in for gemm on a `k`-value row times `n` outputs of `kind`.
pub(crate) fn applies(kind: GgmlDType, k: usize, n: usize) -> bool {
    layout(kind).is_some_and(|(block, _)| k > 2 && k.is_multiple_of(block))
        && n >= GEMV_MIN_OUTPUTS
        && gemm_agrees()
}

/// `x · Wᵀ` for `W` = `n` rows of `k` values stored as `kind` blocks in `bytes` (row-major, whole
/// blocks per row); None when [`applies`] does not hold or the sizes do not match.
pub(crate) fn one_row(
    x: &[f32],
    k: usize,
    n: usize,
    bytes: &[u8],
    kind: GgmlDType,
) -> Option<Vec<f32>> {
    if !applies(kind, k, n) {
        return None;
    }
    products(x, k, n, bytes, kind)
}

/// The products, without the check that gemm would agree (the check itself calls this).
fn products(x: &[f32], k: usize, n: usize, bytes: &[u8], kind: GgmlDType) -> Option<Vec<f32>> {
    let (block, block_bytes) = layout(kind)?;
    let row_bytes = k / block * block_bytes;
    let x = x.get(..k)?;
    if bytes.len() != n * row_bytes {
        return None;
    }
    let mut out = vec![0f32; n];
    // a few rows per task so that both cores stay busy to the end
    let per_task = (n / (8 * rayon::current_num_threads()).max(1)).max(16);
    out.par_chunks_mut(per_task)
        .zip(bytes.par_chunks(per_task * row_bytes))
        .for_each(|(dst, rows)| {
            for (o, row) in dst.iter_mut().zip(rows.chunks_exact(row_bytes)) {
                *o = dot_row(row, kind, x);
            }
        });
    Some(out)
}

/// One output: the row's blocks widened and summed against `x` in gemm's order.
fn dot_row(row: &[u8], kind: GgmlDType, x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_gemm_v3() {
            // SAFETY: the CPU has every feature the function is compiled for (checked above)
            return unsafe { x86::dot_blocks(row, kind, x) };
        }
    }
    // never reached through `one_row`: `applies` is false without the features
    let mut w = vec![0f32; x.len()];
    dequantise_row(row, kind, &mut w);
    w.iter().zip(x).fold(0.0, |s, (a, b)| a.mul_add(*b, s))
}

/// One row's values as candle's `to_float` gives them.
fn dequantise_row(row: &[u8], kind: GgmlDType, w: &mut [f32]) {
    let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    match kind {
        GgmlDType::Q4_1 => {
            for (b, v) in row.chunks_exact(20).zip(w.chunks_exact_mut(32)) {
                let (d, m) = (half(&b[0..2]), half(&b[2..4]));
                let (lo, hi) = v.split_at_mut(16);
                for ((q, l), h) in b[4..20].iter().zip(lo).zip(hi) {
                    *l = f32::from(q & 0x0F) * d + m;
                    *h = f32::from(q >> 4) * d + m;
                }
            }
        }
        GgmlDType::Q8_0 => {
            for (b, v) in row.chunks_exact(34).zip(w.chunks_exact_mut(32)) {
                let d = half(&b[0..2]);
                for (q, o) in b[2..34].iter().zip(v) {
                    *o = f32::from(*q as i8) * d;
                }
            }
        }
        _ => {}
    }
}

/// The features gemm's `V3` asks of the CPU before it takes its AVX2 kernels.
fn has_gemm_v3() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static V3: OnceLock<bool> = OnceLock::new();
        *V3.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this process's gemm gives the bits of [`products`] on a fixed Q4_1 and Q8_0 matrix
/// (inner lengths with and without a remainder past the 64-value blocks), checked once.
pub(crate) fn gemm_agrees() -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| {
        has_gemm_v3()
            && [GgmlDType::Q4_1, GgmlDType::Q8_0]
                .into_iter()
                .all(|kind| [96, 160, 576].into_iter().all(|k| agrees_on(kind, k, 300)))
    })
}

/// One comparison of [`gemm_agrees`]: blocks from a fixed generator, gemm on their f32 values.
fn agrees_on(kind: GgmlDType, k: usize, n: usize) -> bool {
    let Some((block, block_bytes)) = layout(kind) else {
        return false;
    };
    let bytes = test_blocks(kind, k / block * n, 0x9E37_79B9);
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect();
    let mut w = vec![0f32; n * k];
    for (row, v) in bytes
        .chunks_exact(k / block * block_bytes)
        .zip(w.chunks_exact_mut(k))
    {
        dequantise_row(row, kind, v);
    }
    let want = crate::matmul::batched(&x, &w, crate::matmul::Rhs::Transposed, 1, 1, k, n);
    let got = products(&x, k, n, &bytes, kind);
    match (want, got) {
        (Ok(want), Some(got)) => want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        _ => false,
    }
}

/// `count` blocks of `kind` with levels and scales from a small linear congruential generator
/// (finite scales of both signs and magnitudes).
pub(crate) fn test_blocks(kind: GgmlDType, count: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        s >> 8
    };
    let scale = |r: u32| f16::from_f32(((r % 2000) as f32 / 1000.0 - 1.0) * 0.03);
    let mut out = Vec::new();
    for _ in 0..count {
        match kind {
            GgmlDType::Q4_1 => {
                out.extend(scale(next()).to_le_bytes());
                out.extend(scale(next()).to_le_bytes());
                out.extend((0..16).map(|_| (next() & 0xFF) as u8));
            }
            _ => {
                out.extend(scale(next()).to_le_bytes());
                out.extend((0..32).map(|_| (next() & 0xFF) as u8));
            }
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use candle_core::quantized::GgmlDType;

    /// The 32 values of one block as four 8-lane vectors, as candle's `to_float` computes them
    /// (`q · d + m` for Q4_1, `q · d` for Q8_0: a product, then a sum, never fused).
    ///
    /// # Safety
    /// The CPU must have AVX, AVX2, FMA and F16C; `b` must hold one whole block of `kind`.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    unsafe fn widen(b: &[u8], kind: GgmlDType) -> [__m256; 4] {
        // an f16 scale widened by the CPU's F16C conversion (exact)
        let half = |lo: u8, hi: u8| {
            let h = _mm_cvtsi32_si128(i32::from(u16::from_le_bytes([lo, hi])));
            _mm256_broadcastss_ps(_mm_cvtph_ps(h))
        };
        let d = half(b[0], b[1]);
        let to_f32 = |v: __m256i| _mm256_cvtepi32_ps(v);
        if kind == GgmlDType::Q4_1 {
            let m = half(b[2], b[3]);
            // SAFETY: bytes 4..20 of a 20-byte block, unaligned load
            let q = unsafe { _mm_loadu_si128(b[4..20].as_ptr().cast()) };
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
            let level =
                |v: __m128i| _mm256_add_ps(_mm256_mul_ps(to_f32(_mm256_cvtepu8_epi32(v)), d), m);
            [
                level(lo),
                level(_mm_srli_si128::<8>(lo)),
                level(hi),
                level(_mm_srli_si128::<8>(hi)),
            ]
        } else {
            // SAFETY: bytes 2..34 of a 34-byte block, unaligned loads
            let (q0, q1) = unsafe {
                (
                    _mm_loadu_si128(b[2..18].as_ptr().cast()),
                    _mm_loadu_si128(b[18..34].as_ptr().cast()),
                )
            };
            let level = |v: __m128i| _mm256_mul_ps(to_f32(_mm256_cvtepi8_epi32(v)), d);
            [
                level(q0),
                level(_mm_srli_si128::<8>(q0)),
                level(q1),
                level(_mm_srli_si128::<8>(q1)),
            ]
        }
    }

    /// One output of gemm's row-major gemv (module docs) on a row of 32-value blocks: the blocks
    /// are widened in registers as the sum reaches them.
    ///
    /// # Safety
    /// The CPU must have AVX, AVX2, FMA and F16C; `row` must hold `x.len() / 32` whole blocks of
    /// `kind` (Q4_1 or Q8_0) and `x.len()` must be a multiple of 32.
    #[target_feature(enable = "avx,avx2,fma,f16c")]
    pub(super) unsafe fn dot_blocks(row: &[u8], kind: GgmlDType, x: &[f32]) -> f32 {
        let block_bytes = if kind == GgmlDType::Q4_1 { 20 } else { 34 };
        let k = x.len();
        let xp = x.as_ptr();
        // SAFETY (every load of x): offsets below k, 8 at a time, k a multiple of 32
        let lane = |i: usize| unsafe { _mm256_loadu_ps(xp.add(i)) };
        let mut blocks = row.chunks_exact(block_bytes);
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut d = 0;
        // 64 values (two blocks) per round, value d + 8i into accumulator i
        while d + 64 <= k {
            for half in 0..2 {
                let Some(b) = blocks.next() else { break };
                // SAFETY: a whole block, features as this function's
                let w = unsafe { widen(b, kind) };
                for (i, v) in w.into_iter().enumerate() {
                    let a = &mut acc[4 * half + i];
                    *a = _mm256_fmadd_ps(v, lane(d + 32 * half + 8 * i), *a);
                }
            }
            d += 64;
        }
        let a0 = _mm256_add_ps(acc[0], acc[1]);
        let a2 = _mm256_add_ps(acc[2], acc[3]);
        let a4 = _mm256_add_ps(acc[4], acc[5]);
        let a6 = _mm256_add_ps(acc[6], acc[7]);
        let a0 = _mm256_add_ps(a0, a2);
        let a4 = _mm256_add_ps(a4, a6);
        let mut a0 = _mm256_add_ps(a0, a4);
        // the remaining block (k mod 64 = 32), 8 values at a time into the one accumulator
        for b in blocks {
            // SAFETY: a whole block, features as this function's
            for v in unsafe { widen(b, kind) } {
                if d + 8 > k {
                    break;
                }
                a0 = _mm256_fmadd_ps(v, lane(d), a0);
                d += 8;
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: 8 f32 of room, unaligned store
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a0) };
        let mut s = lanes[0];
        for l in &lanes[1..] {
            s += *l;
        }
        // k is a multiple of 32: no scalar remainder
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{batched, Rhs};

    /// Every output's bits against gemm on the f32 values (what the products used before).
    fn check(kind: GgmlDType, k: usize, n: usize, seed: u32) {
        let (block, block_bytes) = layout(kind).unwrap();
        let bytes = test_blocks(kind, k / block * n, seed);
        let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.731).sin() * 3.0).collect();
        let mut w = vec![0f32; n * k];
        for (row, v) in bytes
            .chunks_exact(k / block * block_bytes)
            .zip(w.chunks_exact_mut(k))
        {
            dequantise_row(row, kind, v);
        }
        let want = batched(&x, &w, Rhs::Transposed, 1, 1, k, n).unwrap();
        let got = one_row(&x, k, n, &bytes, kind).expect("applies on this CPU");
        let differ = want
            .iter()
            .zip(&got)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{kind:?} k={k} n={n}: {differ} outputs differ");
    }

    #[test]
    fn one_row_products_have_gemm_bits() {
        if !has_gemm_v3() {
            // the product is not taken here (applies() is false): nothing to compare
            assert!(!gemm_agrees());
            return;
        }
        assert!(gemm_agrees());
        for kind in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            // SmolLM2's q/o (576 × 576), up (1536 × 576), down (576 × 1536), a remainder of
            // 32 past the 64-blocks, the smallest gemv size and an odd one
            for (k, n, seed) in [
                (576, 576, 1),
                (576, 1536, 2),
                (1536, 576, 3),
                (544, 300, 4),
                (32, 257, 5),
                (96, 1031, 6),
            ] {
                check(kind, k, n, seed);
            }
        }
    }

    #[test]
    fn dequantisation_by_hand_and_as_candle() {
        // Q4_1: d = 0.5, m = -1: levels 0..15 → -1, -0.5, ...; byte 0x21 → low 1, high 2
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend([0x21u8; 16]);
        let mut w = vec![0f32; 32];
        dequantise_row(&b, GgmlDType::Q4_1, &mut w);
        assert_eq!(w[..16], [-0.5; 16]);
        assert_eq!(w[16..], [0.0; 16]);
        // Q8_0: d = 0.25, levels -4 and 7
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.25).to_le_bytes());
        b.extend([0xFCu8, 7].repeat(16));
        dequantise_row(&b, GgmlDType::Q8_0, &mut w);
        assert_eq!(w[..2], [-1.0, 1.75]);
        // candle's own dequantisation of the same random blocks
        for kind in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let bytes = test_blocks(kind, 6, 11);
            let stored = crate::store::Weight::raw(
                crate::store::Bytes::Owned(std::sync::Arc::new(bytes.clone())),
                crate::store::Kind::Quant(kind),
                vec![2, 96],
            );
            let mut want = Vec::new();
            stored.rows_into(0, 2, &mut want).unwrap();
            let mut got = vec![0f32; 192];
            let rb = layout(kind).unwrap().1 * 3;
            for (row, v) in bytes.chunks_exact(rb).zip(got.chunks_exact_mut(96)) {
                dequantise_row(row, kind, v);
            }
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn refused_where_gemm_takes_another_kernel_or_sizes_differ() {
        let bytes = test_blocks(GgmlDType::Q4_1, 256, 7);
        let x = vec![1f32; 32];
        // 256 outputs: gemm's horizontal kernels
        assert!(one_row(&x, 32, 256, &bytes, GgmlDType::Q4_1).is_none());
        // a row that is not whole blocks, a type not read here, a short buffer
        assert!(one_row(&x, 30, 300, &bytes, GgmlDType::Q4_1).is_none());
        assert!(one_row(&x, 32, 300, &bytes, GgmlDType::Q4K).is_none());
        assert!(one_row(&x, 32, 300, &bytes, GgmlDType::Q4_1).is_none());
    }
}
