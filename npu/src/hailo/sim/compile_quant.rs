//! The quant infos of the emulated compile: calibrated on built-in prompts (never the probed
//! prompt), or identity for float edges, or read back from a manifest.

use std::path::Path;

use kvprobe_schema::{NamedQuant, QuantInfo};

use super::calibrate;
use crate::quant::{quant_for_range, quant_unsigned, widen};
use crate::{Error, Result};

/// Every quant info of the emulated compile (one per edge class; both groups were calibrated
/// together, so they share them).
#[derive(Debug, Clone, PartialEq)]
pub struct SimQuant {
    pub embeddings: QuantInfo,
    pub mask: QuantInfo,
    pub pe: QuantInfo,
    pub position_ids: QuantInfo,
    pub logits: QuantInfo,
    /// Indexed by cache_id (K of layer l = 2l, V = 2l + 1).
    pub cache: Vec<QuantInfo>,
}

pub(super) const EMB_BITS: u32 = 16;

pub(super) const MASK_BITS: u32 = 8;

pub(super) const PE_BITS: u32 = 8;

pub(super) const LOGIT_BITS: u32 = 16;

impl SimQuant {
    pub(super) fn float(n_layers: usize) -> SimQuant {
        SimQuant {
            embeddings: QuantInfo::IDENTITY,
            mask: QuantInfo::IDENTITY,
            pe: QuantInfo::IDENTITY,
            position_ids: QuantInfo::IDENTITY,
            logits: QuantInfo::IDENTITY,
            cache: vec![QuantInfo::IDENTITY; 2 * n_layers],
        }
    }

    pub(super) fn calibrated(r: &calibrate::Ranges, cache_bits: u32, margin: f32) -> SimQuant {
        let mut cache = Vec::with_capacity(2 * r.k.len());
        for l in 0..r.k.len() {
            for (lo, hi) in [r.k[l], r.v[l]] {
                let (lo, hi) = widen(lo, hi, margin);
                cache.push(quant_for_range(lo, hi, cache_bits));
            }
        }
        let (llo, lhi) = widen(r.logits.0, r.logits.1, margin);
        SimQuant {
            // the whole table is known at compile time: no margin needed
            embeddings: quant_for_range(r.embeddings.0, r.embeddings.1, EMB_BITS),
            // 1/0 signal: 1.0 → 255 (prior art §1.2)
            mask: quant_unsigned(1.0, MASK_BITS),
            pe: quant_for_range(-1.0, 1.0, PE_BITS),
            // integer positions: scale 1, zp 0 = HailoRT's identity shortcut (exact)
            position_ids: QuantInfo::IDENTITY,
            logits: quant_for_range(llo, lhi, LOGIT_BITS),
            cache,
        }
    }

    pub(super) fn named(&self) -> Vec<NamedQuant> {
        let mut v = vec![
            NamedQuant {
                name: "embeddings".into(),
                quant: self.embeddings,
            },
            NamedQuant {
                name: "attention_mask".into(),
                quant: self.mask,
            },
            NamedQuant {
                name: "pe".into(),
                quant: self.pe,
            },
            NamedQuant {
                name: "position_ids".into(),
                quant: self.position_ids,
            },
            NamedQuant {
                name: "logits".into(),
                quant: self.logits,
            },
        ];
        for (id, q) in self.cache.iter().enumerate() {
            v.push(NamedQuant {
                name: cache_quant_name(id as u32),
                quant: *q,
            });
        }
        v
    }

    pub(super) fn from_named(
        list: &[NamedQuant],
        n_layers: usize,
        path: &Path,
    ) -> Result<SimQuant> {
        let get = |name: &str| {
            list.iter().find(|n| n.name == name).map(|n| n.quant).ok_or_else(|| Error::Manifest {
                path: path.to_path_buf(),
                detail: format!("has no quant info `{name}`; it does not match this model (write a new one)"),
            })
        };
        let mut cache = Vec::with_capacity(2 * n_layers);
        for id in 0..2 * n_layers as u32 {
            cache.push(get(&cache_quant_name(id))?);
        }
        if list.len() != 5 + 2 * n_layers {
            return Err(Error::Manifest {
                path: path.to_path_buf(),
                detail: format!(
                    "lists {} quant infos, this model needs {}; it was made for another model",
                    list.len(),
                    5 + 2 * n_layers
                ),
            });
        }
        Ok(SimQuant {
            embeddings: get("embeddings")?,
            mask: get("attention_mask")?,
            pe: get("pe")?,
            position_ids: get("position_ids")?,
            logits: get("logits")?,
            cache,
        })
    }
}

fn cache_quant_name(id: u32) -> String {
    format!(
        "cache/{}{}",
        if id.is_multiple_of(2) { "k" } else { "v" },
        id / 2
    )
}
