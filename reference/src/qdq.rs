//! The grids a QDQ graph (issue 36: `onnxruntime.quantization`'s QuantizeLinear /
//! DequantizeLinear pairs, scripts/export-qdq.py) puts its activations on, placed on the
//! reference's own computation: a value at a site is fake-quantised, `(clamp(round(v / scale) +
//! zero, lo, hi) − zero) · scale`, in float32 as ONNX's QuantizeLinear (round half to even) and
//! DequantizeLinear compute it. Which graph tensor is which site is read off the graph
//! (`onnx_qdq.rs`); a graph's prefill and decode graphs are calibrated apart, so a run of one row
//! takes the decode graph's grids and a longer run the prefill graph's.

use std::collections::HashMap;

/// One per-tensor grid: integers `lo..=hi` (uint8 0..255, uint16 0..65535, int8, int16).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub scale: f32,
    pub zero: i32,
    pub lo: i32,
    pub hi: i32,
}

impl Grid {
    /// `v` quantised and dequantised.
    pub fn fake(&self, v: f32) -> f32 {
        if !v.is_finite() {
            return v;
        }
        let q = ((v / self.scale).round_ties_even() + self.zero as f32)
            .clamp(self.lo as f32, self.hi as f32);
        (q - self.zero as f32) * self.scale
    }
}

/// The grids of one graph, by (layer or None, site). A site's grids apply in order (the graph
/// quantises the scaled scores, then the masked ones).
pub type SiteGrids = HashMap<(Option<usize>, String), Vec<Grid>>;

/// The activation grids of a QDQ export: its prefill graph's, and its decode graph's when the
/// folder has one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QdqGrids {
    pub prefill: SiteGrids,
    pub decode: Option<SiteGrids>,
}

impl QdqGrids {
    /// The grids a run of `rows` rows computes on.
    pub fn for_rows(&self, rows: usize) -> &SiteGrids {
        match (&self.decode, rows) {
            (Some(d), 1) => d,
            _ => &self.prefill,
        }
    }
}

/// `v` fake-quantised on each of `grids` in turn.
pub fn fake_all(grids: &[Grid], v: f32) -> f32 {
    grids.iter().fold(v, |v, g| g.fake(v))
}

/// The grids inside one RoPE as a QDQ graph computes it, `x·cos + rotate_half(x)·sin`: the
/// product with cos, the negated half, the rotated vector, the product with sin.
pub type RopeGrids = [Vec<Grid>; 4];

/// Fake-quantises `xs` on each of `grids` in turn.
pub fn apply(grids: &[Grid], xs: &mut [f32]) {
    for g in grids {
        for v in xs.iter_mut() {
            *v = g.fake(*v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uint16_grid_by_hand() {
        // the fixture's o_proj output grid: scale 9.675671e-5, zero point 33981
        let g = Grid {
            scale: 9.675671e-5,
            zero: 33981,
            lo: 0,
            hi: 65535,
        };
        // 0.1 / 9.675671e-5 = 1033.52 -> 1034 -> 0.10004644
        assert!((g.fake(0.1) - 1034.0 * 9.675671e-5).abs() < 1e-9);
        // below the grid: q = 0, value -33981 * scale = -3.2879; above: (65535 - 33981) * scale
        assert_eq!(g.fake(-10.0), -33981.0 * 9.675671e-5);
        assert_eq!(g.fake(10.0), 31554.0 * 9.675671e-5);
        // a tie rounds to even: 2.5 steps -> 2, 3.5 -> 4
        let h = Grid {
            scale: 0.25,
            zero: 0,
            lo: 0,
            hi: 255,
        };
        assert_eq!((h.fake(0.625), h.fake(0.875)), (0.5, 1.0));
    }

    #[test]
    fn one_quantised_matmul_by_hand() {
        // x on a uint16 grid of step 2^-10 around 32768, W uint8 with step 2^-4 and zero point
        // 128, the product on a uint16 grid of step 2^-8 around 32768 (binary steps: exact)
        let act = Grid {
            scale: 2f32.powi(-10),
            zero: 32768,
            lo: 0,
            hi: 65535,
        };
        let out = Grid {
            scale: 2f32.powi(-8),
            zero: 32768,
            lo: 0,
            hi: 65535,
        };
        let (ws, wz) = (2f32.powi(-4), 128);
        // x = [0.3, -1.7]: 307.2 -> 307 steps, -1740.8 -> -1741 steps
        let mut x = [0.3f32, -1.7];
        apply(&[act], &mut x);
        assert_eq!(x, [307.0 / 1024.0, -1741.0 / 1024.0]);
        // W = [[150, 100], [128, 255]] (u8, row = input feature) -> [[22, -28], [0, 127]] / 16
        let w = [150, 100, 128, 255].map(|q: i32| (q - wz) as f32 * ws);
        let mut y = [x[0] * w[0] + x[1] * w[2], x[0] * w[1] + x[1] * w[3]];
        // y0 = 307·22 / 2^14 = 0.412231…, y1 = (−307·28 − 1741·127) / 2^14 = −14.0202…
        assert_eq!(y, [6754.0 / 16384.0, -229703.0 / 16384.0]);
        apply(&[out], &mut y);
        // on the output grid: 105.53 -> 106 steps; −3589.1 -> −3589 steps
        assert_eq!(y, [106.0 / 256.0, -3589.0 / 256.0]);
        // and past the grid's top (32767 steps = 127.996) a product clamps
        assert_eq!(out.fake(200.0), 32767.0 / 256.0);
    }
}
