//! Per-output-channel symmetric int8 fake quantisation (what a Hailo-style compiler does to linear
//! weights): scale = max|w| / 127 per output channel, w' = clamp(round(w / scale), -127, 127) * scale.

use std::sync::Arc;

use candle_core::Tensor;

use crate::{Model, Result};

/// `in_out` = the weight is `[in, out]` (GPT-2 Conv1D: channels are columns), else `[out, in]`.
pub fn fake_quant_per_output(w: &Tensor, in_out: bool) -> Result<Tensor> {
    let (r, c) = w.dims2()?;
    let mut v = w.flatten_all()?.to_vec1::<f32>()?;
    let (channels, per) = if in_out { (c, r) } else { (r, c) };
    let idx = |ch: usize, k: usize| if in_out { k * c + ch } else { ch * c + k };
    for ch in 0..channels {
        let amax = (0..per).map(|k| v[idx(ch, k)].abs()).fold(0f32, f32::max);
        let scale = scale_of(amax);
        if scale == 0.0 {
            continue;
        }
        for k in 0..per {
            let i = idx(ch, k);
            v[i] = fake_quant_value(v[i], scale);
        }
    }
    Ok(Tensor::from_vec(v, (r, c), w.device())?)
}

/// The channel's step: `max|w| / 127` (0 for an all-zero channel, left as it is).
pub(crate) fn scale_of(amax: f32) -> f32 {
    amax / 127.0
}

/// One value on the channel's int8 grid.
pub(crate) fn fake_quant_value(v: f32, scale: f32) -> f32 {
    (v / scale).round().clamp(-127.0, 127.0) * scale
}

/// The int8 level of `v` (`fake_quant_value` = `level · scale`, the level a whole number in
/// −127..=127, so exact in i8 and back in f32).
pub(crate) fn level(v: f32, scale: f32) -> i8 {
    (v / scale).round().clamp(-127.0, 127.0) as i8
}

impl Model {
    /// Per-output-channel symmetric int8 fake quantisation of every linear weight (sim
    /// `--sim-weights int8`), held as int8 values and channel steps (one byte per value, the
    /// device's storage type; no f32 copy) and widened a tile at a time like any stored weight.
    /// Embeddings, norms, biases and a tied lm_head stay shared with this model.
    pub fn with_int8_weights(&self) -> Result<Model> {
        let mut m = self.clone();
        m.int8 = Arc::default();
        for b in &mut m.blocks {
            for lin in b.linears_mut() {
                lin.w = lin.w.to_int8(lin.in_out)?;
            }
        }
        if !m.lm_head_tied {
            m.lm_head.w = m.lm_head.w.to_int8(m.lm_head.in_out)?;
        }
        Ok(m)
    }

    /// [`Model::with_int8_weights`], computed on the first call and shared afterwards by this
    /// model and its clones (the emulator computing with it and the precision-matched reference
    /// modelling it hold one copy).
    pub fn int8_weights(&self) -> Result<Arc<Model>> {
        if let Some(m) = self.int8.get() {
            return Ok(m.clone());
        }
        let m = Arc::new(self.with_int8_weights()?);
        // two threads may both compute it; the first one stored is the one every caller gets
        Ok(self.int8.get_or_init(|| m).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn per_row_and_per_column_by_hand() {
        // Row max 1.0 → scale 1/127: 0.5 → 63.5 → 64 (round half away from zero) → 64/127.
        let w = Tensor::new(
            &[[1.0f32, -0.5, 0.25, 0.001], [0.0, 0.0, 0.0, 0.0]],
            &Device::Cpu,
        )
        .unwrap();
        let q: Vec<Vec<f32>> = fake_quant_per_output(&w, false).unwrap().to_vec2().unwrap();
        let s = 1.0 / 127.0;
        let want = [1.0, -64.0 * s, 32.0 * s, 0.0];
        for (a, b) in q[0].iter().zip(want) {
            assert!((a - b).abs() < 1e-7, "{:?}", q[0]);
        }
        assert_eq!(q[1], vec![0.0; 4]);
        // Same matrix as [in, out]: channels are columns, column 0 has max 1.0, column 1 max 0.5.
        let q: Vec<Vec<f32>> = fake_quant_per_output(&w, true).unwrap().to_vec2().unwrap();
        assert_eq!(q[0][1], -0.5); // its own channel max → exactly ±127 steps
        assert!((q[0][3] - 0.001).abs() < 1e-7); // column 3 holds only 0.001 and 0.0
    }
}
