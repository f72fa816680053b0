//! The cache's own precision floor: the reference's first tbt step over the prompt's K/V after
//! a round trip through each ring's declared quantisation (quantise, then dequantise, as a
//! perfect writer and a perfect reader would). Its miss is what the cache's integer format
//! alone costs a step that reads it. The cache-free controls (prefill rows, self-only steps)
//! cannot show it, so a tbt miss is compared with this floor before it counts as evidence.
//! Computed from the reference alone: a faulty tbt graph does not move it (golden rings run
//! on the device's graph would).

use candle_core::Tensor;
use kvprobe_schema::{CacheKind, LogitComparison};

use crate::metrics::compare;
use crate::rings::{cache_infos, dequantize_entry, quantize_entry};
use crate::session::{window_step, Session};
use crate::Result;

pub fn quantised_first_step(s: &mut Session) -> Result<LogitComparison> {
    let infos = cache_infos(s.describe())?;
    let first = s.first_step()?;
    let prompt = s.prompt_ref()?;
    let mut state = prompt.state.clone();
    let (mut bytes, mut back) = (Vec::new(), Vec::new());
    for info in &infos {
        let Some(layer) = state.layers.get_mut(info.layer) else {
            continue;
        };
        let t = match info.kind {
            CacheKind::K => &mut layer.k,
            CacheKind::V => &mut layer.v,
        };
        let q = info.reader_quant();
        let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
        quantize_entry(&values, info.elem_bytes, &q, &mut bytes);
        dequantize_entry(&bytes, info.elem_bytes, &q, &mut back);
        *t = Tensor::from_vec(std::mem::take(&mut back), t.shape(), t.device())?;
    }
    let n = s.ids.len();
    let (logits, _) = window_step(s.model, &state, first.query, first.position, n)?;
    Ok(compare(&logits, &first.reference))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::QuantInfo;

    #[test]
    fn round_trip_moves_values_by_at_most_half_a_step() {
        // 8-bit codes with scale 0.5 around zero point 128: every in-range value comes back
        // within 0.25 of itself, values off the grid move, values on it do not.
        let q = QuantInfo {
            scale: 0.5,
            zero_point: 128.0,
            min: -64.0,
            max: 63.5,
        };
        let values = [0.0f32, 0.5, 0.3, -1.1, 10.26];
        let (mut bytes, mut back) = (Vec::new(), Vec::new());
        quantize_entry(&values, 1, &q, &mut bytes);
        dequantize_entry(&bytes, 1, &q, &mut back);
        assert_eq!(back, vec![0.0, 0.5, 0.5, -1.0, 10.5]);
    }
}
