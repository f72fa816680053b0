//! Non-finite numbers refused on load (issue 38): a NaN or infinite weight, a non-positive or
//! non-finite norm epsilon or RoPE base makes every output garbage, and a diagnosis would blame
//! the device for it. Checked once, naming the tensor or the key.

use std::path::Path;

use crate::weights::StoredWeights;
use crate::{Error, Family, ModelConfig, Result};

/// Every weight finite (issue 38): a NaN or infinite value makes every output garbage, and a
/// diagnosis would blame the device for it. One pass over the stored values at load.
pub(crate) fn check_weights(weights: &StoredWeights, path: &Path) -> Result<()> {
    use rayon::prelude::*;
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    // every tensor is read once at load, a pass over all the weights' memory: on the threads
    // (one core leaves bandwidth unused), the first bad tensor in name order still the one named
    let found: Vec<Option<usize>> = names
        .par_iter()
        .map(|name| weights[*name].first_non_finite())
        .collect::<Result<_>>()?;
    for (name, found) in names.into_iter().zip(found) {
        if let Some(i) = found {
            return Err(Error::Format {
                path: path.to_path_buf(),
                detail: format!("tensor `{name}` holds a NaN or infinite value (element {i}); the weights are corrupt, export or download them again"),
            });
        }
    }
    Ok(())
}

/// Index of the first NaN or infinity in `v`. The largest exponent field of a chunk is a
/// reduction the compiler vectorises, unlike an early-exit search (the load's pass over an f32
/// model's weights took 2× the time of llama.cpp's whole load, profiled with perf); only the chunk
/// that holds a non-finite value is searched value by value.
pub(crate) fn first_non_finite_f32(v: &[f32]) -> Option<usize> {
    const EXP: u32 = 0x7f80_0000;
    const CHUNK: usize = 4096;
    v.chunks(CHUNK).enumerate().find_map(|(c, chunk)| {
        let top = chunk.iter().map(|x| x.to_bits() & EXP).max().unwrap_or(0);
        (top == EXP)
            .then(|| chunk.iter().position(|x| !x.is_finite()))
            .flatten()
            .map(|i| c * CHUNK + i)
    })
}

/// The norm epsilon and the RoPE base, named by the key of the file they came from.
pub(crate) fn check_scalars(c: &ModelConfig, path: &Path) -> Result<()> {
    let fail = |detail: String| Error::Format {
        path: path.to_path_buf(),
        detail,
    };
    // a NaN, infinite or non-positive scalar makes every output garbage (issue 38)
    let gguf = c.architecture.strip_prefix("gguf:");
    let (eps_key, theta_key) = match (gguf, c.family) {
        (Some(a), Family::Gpt2) => (format!("{a}.attention.layer_norm_epsilon"), String::new()),
        (Some(a), _) => (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            format!("{a}.rope.freq_base"),
        ),
        (None, Family::Gpt2) => ("layer_norm_epsilon".into(), String::new()),
        (None, _) => ("rms_norm_eps".into(), "rope_theta".into()),
    };
    if !(c.norm_eps.is_finite() && c.norm_eps > 0.0) {
        return Err(fail(format!(
            "{eps_key} is {}; a norm epsilon must be a positive finite number, fix it",
            c.norm_eps
        )));
    }
    if c.family == Family::Llama && !(c.rope_theta.is_finite() && c.rope_theta > 0.0) {
        return Err(fail(format!(
            "{theta_key} is {}; the RoPE base must be a positive finite number, fix it",
            c.rope_theta
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::first_non_finite_f32;

    #[test]
    fn the_first_non_finite_value_is_found_in_any_chunk() {
        let mut v = vec![1.5f32; 3 * 4096 + 7];
        assert_eq!(first_non_finite_f32(&v), None);
        assert_eq!(first_non_finite_f32(&[]), None);
        // the largest finite values and subnormals are not flagged
        v[5] = f32::MAX;
        v[6] = -f32::MAX;
        v[7] = f32::MIN_POSITIVE / 2.0;
        assert_eq!(first_non_finite_f32(&v), None);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN] {
            for at in [0, 4095, 4096, 2 * 4096 + 1, 3 * 4096 + 6] {
                let mut w = v.clone();
                w[at] = bad;
                w[3 * 4096 + 6] = if at == 3 * 4096 + 6 { bad } else { f32::NAN };
                assert_eq!(first_non_finite_f32(&w), Some(at), "{bad} at {at}");
            }
        }
    }
}
