//! Rounding f32 values to the fp16 grid in place, as the ANE's fp16 weight storage does. The
//! bit arithmetic below has no calls and no per-value branches, so it vectorises; the `half`
//! crate's conversion (two calls through a staging buffer per 1024 values) cost the emulator
//! about a fifth of its `diagnose` time.

/// f16's largest finite value, 65504, as f32 bits.
const F16_MAX_BITS: u32 = 0x477f_e000;
/// f16's smallest normal value, 2⁻¹⁴, as f32 bits: below it the fp16 step is 2⁻²⁴.
const F16_MIN_NORMAL_BITS: u32 = 0x3880_0000;
const F32_INF_BITS: u32 = 0x7f80_0000;

/// Every value to the nearest fp16 value (ties to even, ±inf past 65519.99, NaN stays NaN),
/// kept as f32.
pub(crate) fn round_to_f16(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has both features, checked just above.
        unsafe { round_f16c(v) };
        return;
    }
    round_portable(v);
}

fn round_portable(v: &mut [f32]) {
    for x in v {
        *x = nearest_f16(*x);
    }
}

/// The CPU's own conversion to fp16 and back, eight values per instruction pair (IEEE round to
/// nearest even, as [`nearest_f16`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn round_f16c(v: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps,
        _MM_FROUND_TO_NEAREST_INT,
    };
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 8 f32 values; unaligned loads and stores.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    round_portable(chunks.into_remainder());
}

#[inline(always)]
fn nearest_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    let abs = bits & 0x7fff_ffff;
    // normal range: keep 10 of f32's 23 mantissa bits, adding just under half a step plus the
    // kept last bit so that ties go to the even neighbour; a carry moves into the exponent.
    let normal = (abs + 0x0fff + ((abs >> 13) & 1)) & !0x1fff;
    let normal = if normal > F16_MAX_BITS {
        F32_INF_BITS
    } else {
        normal
    };
    // subnormal range: the sum |x| + 0.5 has an f32 step of 2⁻²⁴, f16's step there, so the
    // f32 addition rounds |x| onto the fp16 grid (ties to even); subtracting 0.5 is exact.
    let small = ((f32::from_bits(abs) + 0.5) - 0.5).to_bits();
    let r = if abs < F16_MIN_NORMAL_BITS {
        small
    } else if abs > F32_INF_BITS {
        abs | 0x0040_0000
    } else {
        normal
    };
    f32::from_bits(sign | r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// The portable arithmetic and the dispatched path (the CPU's conversion where it has one,
    /// run over a slice longer than one vector) both agree with `half`'s software rounding.
    fn assert_both_paths(x: f32) {
        let want = half::f16::from_f32_const(x).to_f32_const();
        let mut one = [x];
        round_portable(&mut one);
        assert!(
            same(one[0], want),
            "portable {x:e} ({:#x}): {} vs {want}",
            x.to_bits(),
            one[0]
        );
        let mut many = [x; 11];
        round_to_f16(&mut many);
        assert!(
            many.iter().all(|&m| same(m, want)),
            "dispatched {x:e} ({:#x})",
            x.to_bits()
        );
    }

    #[test]
    fn every_fp16_value_its_neighbours_and_midpoints_round_as_ieee() {
        let mut checked = 0usize;
        for h in 0..=u16::MAX {
            let v = half::f16::from_bits(h).to_f32();
            let b = v.to_bits();
            // the value, the f32 values either side, and the midpoints to both fp16 neighbours
            // (ties) with their f32 neighbours
            let next = half::f16::from_bits(h.wrapping_add(1)).to_f32();
            let mid = ((v as f64 + next as f64) / 2.0) as f32;
            for x in [
                v,
                f32::from_bits(b.wrapping_add(1)),
                f32::from_bits(b.wrapping_sub(1)),
                mid,
                f32::from_bits(mid.to_bits().wrapping_add(1)),
                f32::from_bits(mid.to_bits().wrapping_sub(1)),
            ] {
                assert_both_paths(x);
                checked += 1;
            }
        }
        assert_eq!(checked, 6 * 65536);
    }

    #[test]
    fn random_bit_patterns_round_as_ieee() {
        // xorshift over the whole f32 bit space, and over the range weights live in
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..2_000_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = if i % 2 == 0 {
                f32::from_bits(s as u32)
            } else {
                (s >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
            };
            assert_both_paths(x);
        }
    }

    #[test]
    fn overflow_boundary_by_hand() {
        // 65504 is f16's largest; 65519 rounds to it, 65520 (the midpoint to 65536) is a tie
        // whose even neighbour is the overflow, so it becomes inf.
        let mut v = [
            65504.0f32,
            65519.0,
            65520.0,
            -65520.0,
            1e6,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
        ];
        round_to_f16(&mut v);
        assert_eq!(
            v[..6],
            [
                65504.0,
                65504.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::INFINITY,
                f32::NEG_INFINITY
            ]
        );
        assert_eq!(v[6].to_bits(), 0);
        assert_eq!(v[7].to_bits(), 0x8000_0000);
    }
}
