//! Per-output-channel symmetric int8 fake quantisation (what a Hailo-style compiler does to linear
//! weights): scale = max|w| / 127 per output channel, w' = clamp(round(w / scale), -127, 127) * scale.

use candle_core::Tensor;

use crate::Result;

/// `in_out` = the weight is `[in, out]` (GPT-2 Conv1D: channels are columns), else `[out, in]`.
pub fn fake_quant_per_output(w: &Tensor, in_out: bool) -> Result<Tensor> {
    let (r, c) = w.dims2()?;
    let mut v = w.flatten_all()?.to_vec1::<f32>()?;
    let (channels, per) = if in_out { (c, r) } else { (r, c) };
    let idx = |ch: usize, k: usize| if in_out { k * c + ch } else { ch * c + k };
    for ch in 0..channels {
        let amax = (0..per).map(|k| v[idx(ch, k)].abs()).fold(0f32, f32::max);
        if amax == 0.0 {
            continue;
        }
        let scale = amax / 127.0;
        for k in 0..per {
            let i = idx(ch, k);
            v[i] = (v[i] / scale).round().clamp(-127.0, 127.0) * scale;
        }
    }
    Ok(Tensor::from_vec(v, (r, c), w.device())?)
}
