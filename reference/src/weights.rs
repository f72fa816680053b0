//! Taking weights out of a [`StoredWeights`] map by canonical name with shape checks.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::blocks::Linear;
use crate::store::Weight;
use crate::{Error, Result};

/// Weights by canonical Hugging Face name, in their storage type.
pub(crate) type StoredWeights = std::collections::HashMap<String, Weight>;

pub(crate) struct WeightGetter<'a> {
    pub weights: &'a StoredWeights,
    pub path: PathBuf,
    /// Every name a builder asked for, found or not: what is left over is a weight the forward
    /// does not compute with.
    asked: RefCell<BTreeSet<String>>,
}

impl<'a> WeightGetter<'a> {
    pub fn new(weights: &'a StoredWeights, path: &Path) -> Self {
        Self {
            weights,
            path: path.to_path_buf(),
            asked: RefCell::new(BTreeSet::new()),
        }
    }

    /// Refuse a checkpoint holding a tensor the forward never asked for (QK-norm weights under an
    /// architecture without them, biases the config does not declare, extra heads, ...): computing
    /// without it would be silently wrong. `ignorable` names tensors the original model also
    /// ignores (a stored copy of a tied lm_head, HF's recomputed `rotary_emb.inv_freq`).
    pub fn check_all_used(
        &self,
        architecture: &str,
        ignorable: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let asked = self.asked.borrow();
        let mut extra: Vec<&String> = self
            .weights
            .keys()
            .filter(|k| !asked.contains(*k) && !ignorable(k))
            .collect();
        extra.sort();
        match extra.first() {
            None => Ok(()),
            Some(name) => Err(Error::Unsupported {
                path: self.path.clone(),
                what: format!(
                    "tensor `{name}` ({} unused in all) is not part of the {architecture} forward this tool computes, and leaving it out would change the math; supported: plain Llama/Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), GPT-2 tensors",
                    extra.len()
                ),
            }),
        }
    }

    /// A weight as stored (matrices: products convert it a tile at a time).
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        self.opt(name, shape)?.ok_or_else(|| Error::MissingTensor {
            path: self.path.clone(),
            name: name.to_string(),
        })
    }

    /// A small weight (norm gains, biases, positions) as an f32 tensor.
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.get(name, shape)?.to_tensor()
    }

    pub fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<Weight>> {
        self.asked.borrow_mut().insert(name.to_string());
        let Some(t) = self.weights.get(name) else {
            return Ok(None);
        };
        if t.dims() != shape {
            return Err(Error::BadTensor {
                path: self.path.clone(),
                name: name.to_string(),
                detail: format!("has shape {:?}, expected {:?}", t.dims(), shape),
            });
        }
        Ok(Some(t.clone()))
    }

    /// HF `nn.Linear` (`[out, in]`); the bias is required when `bias_required`, else taken if present.
    pub fn linear(
        &self,
        prefix: &str,
        out: usize,
        inp: usize,
        bias_required: bool,
    ) -> Result<Linear> {
        let w = self.get(&format!("{prefix}.weight"), &[out, inp])?;
        let bname = format!("{prefix}.bias");
        let b = if bias_required {
            Some(self.get_f32(&bname, &[out])?)
        } else {
            self.opt(&bname, &[out])?
                .map(|b| b.to_tensor())
                .transpose()?
        };
        Ok(Linear {
            w,
            b,
            in_out: false,
        })
    }

    /// GPT-2 `Conv1D` (`[in, out]`, bias required).
    pub fn conv1d(&self, prefix: &str, inp: usize, out: usize) -> Result<Linear> {
        let w = self.get(&format!("{prefix}.weight"), &[inp, out])?;
        let b = Some(self.get_f32(&format!("{prefix}.bias"), &[out])?);
        Ok(Linear { w, b, in_out: true })
    }
}
