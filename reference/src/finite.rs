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
