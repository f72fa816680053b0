//! The weights an OpenVINO IR declares it computes with (issue 37), read from its decompression
//! subgraphs ([`crate::openvino_decompress`]) and put in place of the checkpoint's, as OpenVINO's
//! CPU plugin widens them.
//!
//! Besides the checkpoint's tensor names (`model.layers.N.…weight`, `lm_head.weight`), the ONNX
//! export's `cos_cache` / `sin_cache` (RoPE tables `[positions, head_dim / 2]`), `attn_scale` and
//! its RMSNorm floors `/norm_floor_N` (scripts/export-onnx.py) are read.

use std::path::Path;
use std::sync::Arc;

use crate::openvino_decompress::{read_declared, Values};
use crate::openvino_ir::Ir;
use crate::store::{Bytes, Kind, Weight};
use crate::stored_rope::StoredRope;
use crate::{Model, Result};

/// What the IR `xml` declares about its weights: None when it stores no compressed constant,
/// else one line for the description. Refuses (one line naming the node) a decompression
/// subgraph the reference does not compute.
pub fn declared(xml: &Path) -> Result<Option<String>> {
    let ir = Ir::read(xml)?;
    let got = read_declared(&ir)?;
    if got.is_empty() {
        return Ok(None);
    }
    // the norm floors are counted apart: they are stored f16 too but change nothing computed
    let floors = got
        .iter()
        .filter(|d| export_constant(&d.name, "norm_floor"))
        .count();
    let f16 = got
        .iter()
        .filter(|d| matches!(d.values, Values::F16(_)))
        .count()
        - floors;
    let levels = |bits: u32| {
        let of: Vec<usize> = got
            .iter()
            .filter_map(|d| match &d.values {
                Values::Levels(q) if q.bits == bits => Some(q.block),
                _ => None,
            })
            .collect();
        (of.len(), of.iter().min().copied(), of.iter().max().copied())
    };
    let mut said = Vec::new();
    if f16 > 0 {
        said.push(format!("{f16} f16 constants widened to f32 exactly"));
    }
    if floors > 0 {
        said.push(format!(
            "{floors} f16 RMSNorm floors (the norm is the same at any positive floor)"
        ));
    }
    if let (n @ 1.., ..) = levels(8) {
        said.push(format!(
            "{n} u8 weights, (level − zero point) · f16 scale per output channel in f32"
        ));
    }
    if let (n @ 1.., Some(lo), Some(hi)) = levels(4) {
        let groups = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo} to {hi}")
        };
        said.push(format!(
            "{n} i4 weights, level (−8..7) · f16 scale per group of {groups} input features in f32"
        ));
    }
    Ok(Some(said.join(", ")))
}

impl Model {
    /// [`Model::with_openvino_weights`], computed on the first call for `xml` and shared
    /// afterwards (the cache [`Model::onnx_block_weights`] uses: one device file a run).
    pub fn openvino_weights(&self, xml: &Path) -> Result<Arc<Model>> {
        let mut held = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, m)) = held.as_ref() {
            if p == xml {
                return Ok(m.clone());
            }
        }
        let m = Arc::new(self.with_openvino_weights(xml)?);
        *held = Some((xml.to_path_buf(), m.clone()));
        Ok(m)
    }

    /// This model (reloaded from its checkpoint) with every weight the IR `xml` stores
    /// compressed in its place, as the IR's decompression subgraph computes it.
    pub fn with_openvino_weights(&self, xml: &Path) -> Result<Model> {
        let ir = Ir::read(xml)?;
        let got = read_declared(&ir)?;
        if got.is_empty() {
            return Err(ir.refuse(
                "no compressed Const: nothing to compute but the checkpoint's weights".into(),
            ));
        }
        let mut parts = crate::model::stored_parts(&self.source)?;
        let c = parts.config.clone();
        let (mut lm_head, mut cos, mut sin) = (None, None, None);
        for d in got {
            let dims = d.dims.clone();
            let as_f32 = || d.values.to_f32();
            let owned = || -> Weight {
                match &d.values {
                    Values::F16(v) => {
                        Weight::raw(Bytes::Owned(Arc::new(v.clone())), Kind::F16, dims.clone())
                    }
                    Values::Levels(q) => Weight::blocks(q.clone()),
                }
            };
            match d.name.as_str() {
                "cos_cache" | "sin_cache" if dims.len() == 2 && 2 * dims[1] == c.head_dim => {
                    let t = Some(as_f32());
                    if d.name == "cos_cache" {
                        cos = t
                    } else {
                        sin = t
                    }
                }
                "attn_scale" => {
                    let v = as_f32();
                    let want = 1.0 / (c.head_dim as f32).sqrt();
                    if v != [want] {
                        return Err(ir.refuse(format!("Const `{}` is {v:?}, not 1/√head_dim = {want}: the reference computes no other attention scale", d.node)));
                    }
                }
                // The export's scaled RMSNorm floors the row's max |x| at this (fp16's smallest
                // normal, 2^-14); the floor cancels out of the norm it computes (x / √m' ·
                // √(mean(x²)/m' + ε/m') = x / √(mean(x²) + ε) for any m' > 0), so the reference's
                // RMSNorm is that function at any positive finite floor, and only such a value is
                // one the reference computes.
                n if export_constant(n, "norm_floor") => {
                    let v = as_f32();
                    if !v.iter().all(|x| x.is_finite() && *x > 0.0) || v.len() != 1 {
                        return Err(ir.refuse(format!("Const `{}` is {v:?}: the RMSNorm floor the reference computes is one positive finite number", d.node)));
                    }
                }
                "lm_head.weight" if !parts.weights.contains_key("lm_head.weight") => {
                    lm_head = Some((owned(), dims.clone()))
                }
                n => {
                    let Some(w) = parts.weights.get_mut(n) else {
                        return Err(ir.refuse(format!(
                            "Const `{}`: --model {} has no tensor `{n}` for it; pass the checkpoint the IR was exported from",
                            d.node,
                            self.source.display()
                        )));
                    };
                    if w.dims() != dims {
                        return Err(ir.refuse(format!(
                            "Const `{}` is {dims:?} (as [out, in]) where --model's `{n}` is {:?}; the IR was exported from another model",
                            d.node,
                            w.dims()
                        )));
                    }
                    *w = owned();
                }
            }
        }
        let mut m = Model::from_stored(parts, &self.source)?;
        if let Some((w, dims)) = lm_head {
            if m.lm_head.w.dims() != dims {
                return Err(ir.refuse(format!(
                    "lm_head is {dims:?} where --model's is {:?}",
                    m.lm_head.w.dims()
                )));
            }
            m.lm_head.w = w;
            m.lm_head_tied = false;
        }
        m.stored_rope = match (cos, sin) {
            (Some(cos), Some(sin)) if cos.len() == sin.len() => Some(Arc::new(StoredRope { half: c.head_dim / 2, cos, sin })),
            (None, None) => None,
            _ => return Err(ir.refuse("cos_cache and sin_cache: one compressed without the other, or of different lengths".into())),
        };
        Ok(m)
    }
}

/// `name` is scripts/export-onnx.py's constant `base`: `/base_N`, its name with the counter the
/// exporter appends.
fn export_constant(name: &str, base: &str) -> bool {
    name.strip_prefix('/')
        .and_then(|n| n.strip_prefix(base))
        .and_then(|n| n.strip_prefix('_'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exporters_numbered_constant_is_one() {
        assert!(export_constant("/norm_floor_130", "norm_floor"));
        for other in [
            "norm_floor_130",
            "/norm_floor_",
            "/norm_floor_1x",
            "/norm_floor",
            "/norm_floorx_1",
            "/eps_3",
        ] {
            assert!(!export_constant(other, "norm_floor"), "{other}");
        }
    }
}
