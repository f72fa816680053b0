//! HailoRT's host-side quantisation (contract §4).
//!
//! Inputs: `q = (Q) rint(clip(x, min, max) / scale + zp)`, computed in f32, rounding half to even,
//! with **no saturation** after rounding (range safety relies on the limvals). Identity shortcut:
//! `scale == 1 && zp == 0` → `rint(x)` without clipping. Outputs: `y = (q − zp) · scale`.

use kvprobe_schema::QuantInfo;

/// True when HailoRT takes the identity shortcut for this quant info (contract §4).
pub fn is_identity(q: &QuantInfo) -> bool {
    q.scale == 1.0 && q.zero_point == 0.0
}

/// HailoRT's `clip`: max if `x ≥ max`, min if `x ≤ min` (contract §4).
fn clip(x: f32, q: &QuantInfo) -> f32 {
    if x >= q.max {
        q.max
    } else if x <= q.min {
        q.min
    } else {
        x
    }
}

/// The rounded, not yet narrowed value of `quantize_input` (f32 arithmetic, half-to-even).
pub fn quantize_value(x: f32, q: &QuantInfo) -> f32 {
    if is_identity(q) {
        return x.round_ties_even();
    }
    (clip(x, q) / q.scale + q.zero_point).round_ties_even()
}

/// Narrow a rounded value the way a C++ float → integer conversion does on x86 (through a 32-bit
/// signed conversion, then truncation to the target width): out-of-range codes wrap, they are not
/// saturated (contract §4: no saturation after rounding). NaN becomes 0.
fn wrap_to_bits(v: f32, bits: u32) -> u32 {
    if !v.is_finite() {
        return 0;
    }
    let wide = v as i64;
    (wide as u64 & ((1u64 << bits) - 1)) as u32
}

pub fn quantize_u8(x: f32, q: &QuantInfo) -> u8 {
    wrap_to_bits(quantize_value(x, q), 8) as u8
}

pub fn quantize_u16(x: f32, q: &QuantInfo) -> u16 {
    wrap_to_bits(quantize_value(x, q), 16) as u16
}

/// `dequantize_output`: `y = (q − zp) · scale`.
pub fn dequantize(code: f32, q: &QuantInfo) -> f32 {
    (code - q.zero_point) * q.scale
}

pub fn quantize_slice_u8(xs: &[f32], q: &QuantInfo, out: &mut Vec<u8>) {
    out.clear();
    out.extend(xs.iter().map(|&x| quantize_u8(x, q)));
}

pub fn quantize_slice_u16(xs: &[f32], q: &QuantInfo, out: &mut Vec<u16>) {
    out.clear();
    out.extend(xs.iter().map(|&x| quantize_u16(x, q)));
}

/// Quantise then dequantise in place through an integer type of `bits` (what a float value
/// suffers crossing a quantised edge). Identity infos leave values unchanged only up to `rint`,
/// so callers skip float edges themselves.
pub fn fake_quantize_in_place(xs: &mut [f32], q: &QuantInfo, bits: u32) {
    for x in xs.iter_mut() {
        let code = wrap_to_bits(quantize_value(*x, q), bits) as f32;
        *x = dequantize(code, q);
    }
}

/// Largest code of an unsigned integer of `bits` bits.
pub fn max_code(bits: u32) -> f32 {
    ((1u64 << bits) - 1) as f32
}

/// An asymmetric quant info covering `[lo, hi]` (widened to include 0, so that 0.0 is exact) with
/// `bits`-bit codes: `scale = (hi − lo) / (2^bits − 1)`, integer zero point, and limvals equal to
/// the representable range so that clipping keeps every code in range (contract §4 relies on the
/// limvals for range safety).
pub fn quant_for_range(lo: f32, hi: f32, bits: u32) -> QuantInfo {
    let lo = lo.min(0.0);
    let mut hi = hi.max(0.0);
    if hi - lo <= f32::EPSILON {
        hi = lo + 1.0;
    }
    let qmax = max_code(bits);
    let scale = (hi - lo) / qmax;
    let zero_point = (-lo / scale).round().clamp(0.0, qmax);
    QuantInfo {
        scale,
        zero_point,
        min: (0.0 - zero_point) * scale,
        max: (qmax - zero_point) * scale,
    }
}

/// A symmetric-free quant info for values known to lie in `[0, hi]` with code 0 = 0.0 (masks).
pub fn quant_unsigned(hi: f32, bits: u32) -> QuantInfo {
    let qmax = max_code(bits);
    QuantInfo {
        scale: hi / qmax,
        zero_point: 0.0,
        min: 0.0,
        max: hi,
    }
}

/// Widen a calibrated range by `margin` of its width on each side (dependency notes: clipping,
/// not resolution, dominates the edge error, so leave headroom for unseen prompts).
pub fn widen(lo: f32, hi: f32, margin: f32) -> (f32, f32) {
    let w = (hi - lo).abs().max(f32::EPSILON);
    (lo - margin * w, hi + margin * w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qi(scale: f32, zp: f32, min: f32, max: f32) -> QuantInfo {
        QuantInfo {
            scale,
            zero_point: zp,
            min,
            max,
        }
    }

    #[test]
    fn input_rounding_is_half_to_even() {
        // scale 1, zp 0.5 is not the identity shortcut: 0.0/1 + 0.5 = 0.5 → 0, 1.0 + 0.5 = 1.5 → 2.
        let q = qi(1.0, 0.5, -10.0, 10.0);
        assert_eq!(quantize_u8(0.0, &q), 0);
        assert_eq!(quantize_u8(1.0, &q), 2);
        assert_eq!(quantize_u8(2.0, &q), 2);
    }

    #[test]
    fn clipping_uses_limvals() {
        let q = qi(0.5, 10.0, -1.0, 2.0);
        // 5.0 clips to 2.0 → 2/0.5 + 10 = 14
        assert_eq!(quantize_u8(5.0, &q), 14);
        // -7 clips to -1 → -2 + 10 = 8
        assert_eq!(quantize_u8(-7.0, &q), 8);
        assert_eq!(quantize_u8(1.0, &q), 12);
    }

    #[test]
    fn no_saturation_after_rounding() {
        // limvals wider than the uint8 range: 300 is not saturated to 255, it wraps as a C cast on x86.
        let q = qi(1.0, 0.5, -1000.0, 1000.0);
        assert_eq!(quantize_value(299.6, &q), 300.0);
        assert_eq!(quantize_u8(299.6, &q), 44);
    }

    #[test]
    fn identity_shortcut_skips_clipping() {
        // limvals say [0, 1] but the shortcut ignores them.
        let q = qi(1.0, 0.0, 0.0, 1.0);
        assert_eq!(quantize_u16(300.4, &q), 300);
        assert_eq!(quantize_u16(2.5, &q), 2);
        assert_eq!(quantize_u16(3.5, &q), 4);
    }

    #[test]
    fn mask_one_with_scale_1_over_255_is_255() {
        let q = quant_unsigned(1.0, 8);
        assert_eq!(quantize_u8(1.0, &q), 255);
        assert_eq!(quantize_u8(0.0, &q), 0);
    }

    #[test]
    fn dequantize_formula() {
        let q = qi(0.25, 8.0, -2.0, 2.0);
        assert_eq!(dequantize(12.0, &q), 1.0);
        assert_eq!(dequantize(0.0, &q), -2.0);
    }

    #[test]
    fn range_quant_round_trips_ends_and_zero() {
        let q = quant_for_range(-2.0, 6.0, 8);
        assert!((q.scale - 8.0 / 255.0).abs() < 1e-7);
        assert_eq!(q.zero_point, 64.0);
        let code0 = quantize_u8(0.0, &q);
        assert_eq!(dequantize(code0 as f32, &q), 0.0);
        assert_eq!(quantize_u8(1e9, &q), 255);
        assert_eq!(quantize_u8(-1e9, &q), 0);
        // error within half a step inside the range
        for i in 0..100 {
            let x = -2.0 + 8.0 * i as f32 / 99.0;
            let y = dequantize(quantize_u8(x, &q) as f32, &q);
            assert!((x - y).abs() <= q.scale * 0.5 + 1e-6, "{x} {y}");
        }
    }

    #[test]
    fn widen_adds_margin_each_side() {
        assert_eq!(widen(-1.0, 3.0, 0.25), (-2.0, 4.0));
    }
}
