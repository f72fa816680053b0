//! A model as an ONNX graph declares it: a QDQ graph's dequantised weights, RoPE tables and
//! activation grids (issue 36; `onnx_qdq.rs` reads them), else its MatMulNBits blocks
//! (`onnx_weights.rs`, issue 35). The one entry point for both, so the two readers stay apart.

use std::path::Path;

use crate::onnx_qdq::{read, QdqGraph};
use crate::qdq::{QdqGrids, SiteGrids};
use crate::{Error, Result};

/// What the ONNX graph `path` declares about its weights, one line for the device description:
/// a QDQ graph's grids, else its MatMulNBits (None for float weights).
pub fn declared(path: &Path) -> Result<Option<String>> {
    if !crate::onnx_qdq::is_qdq_graph(&crate::onnx_proto::OnnxGraph::read(path)?) {
        return crate::onnx_weights::declared(path);
    }
    let g = read(path)?;
    Ok(Some(format!(
        "QDQ: {} constants dequantised (uint8 / uint16 weights, RoPE tables), {} of the graph's {} activation grids at the reference's sites, {} on moves that keep their input's grid, the rest ({}) computed in float32",
        g.constants.len(),
        g.placed,
        g.activations,
        g.moves,
        g.activations.saturating_sub(g.placed + g.moves)
    )))
}

impl crate::Model {
    /// The model with the weights (and a QDQ graph's grids) the graph `path` declares, made on
    /// the first call for `path` and shared afterwards (the cache of `onnx_block_weights`).
    /// The model with the weights (and a QDQ graph's grids) the graph `path` declares, made on
    /// the first call for `path` and shared afterwards (the cache of `onnx_block_weights`).
    pub fn onnx_declared_weights(&self, path: &Path) -> Result<std::sync::Arc<crate::Model>> {
        if !crate::onnx_qdq::is_qdq_graph(&crate::onnx_proto::OnnxGraph::read(path)?) {
            return self.onnx_block_weights(path);
        }
        let mut held = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, m)) = held.as_ref() {
            if p == path {
                return Ok(m.clone());
            }
        }
        let m = std::sync::Arc::new(self.with_onnx_qdq(path)?);
        *held = Some((path.to_path_buf(), m.clone()));
        Ok(m)
    }

    /// This model (reloaded from its checkpoint) as the QDQ graph `path` declares it: every
    /// quantised weight dequantised in place of the checkpoint's, the graph's RoPE tables, and
    /// the activation grids of it and of its folder's decode graph.
    pub(crate) fn with_onnx_qdq(&self, path: &Path) -> Result<crate::Model> {
        use candle_core::{Device, Tensor};
        let graph = read(path)?;
        let refuse = |what: String| Error::Unsupported {
            path: path.to_path_buf(),
            what,
        };
        let mut parts = crate::model::stored_parts(&self.source)?;
        let half = parts.config.head_dim / 2;
        let (mut lm_head, mut cos, mut sin) = (None, None, None);
        for (name, values) in &graph.constants {
            let (hf, transposed) = match name.strip_suffix(".T") {
                Some(n) => (n, true),
                None => (name.as_str(), false),
            };
            let shaped = |dims: &[usize]| -> Result<crate::store::Weight> {
                if dims.iter().product::<usize>() != values.len() {
                    return Err(refuse(format!(
                        "`{name}` holds {} values where --model's `{hf}` is {dims:?}; the graph was exported from another model",
                        values.len()
                    )));
                }
                let v = match (transposed, dims) {
                    (true, [rows, cols]) => {
                        let mut t = vec![0f32; values.len()];
                        for (i, row) in values.chunks_exact(*rows).enumerate() {
                            for (o, &x) in row.iter().enumerate() {
                                t[o * cols + i] = x;
                            }
                        }
                        t
                    }
                    _ => values.clone(),
                };
                crate::store::Weight::from_tensor(Tensor::from_vec(v, dims, &Device::Cpu)?)
            };
            match hf {
                "cos_cache" => cos = Some(values.clone()),
                "sin_cache" => sin = Some(values.clone()),
                "lm_head.weight" if !parts.weights.contains_key(hf) => lm_head = Some(hf),
                n => {
                    if let Some(w) = parts.weights.get_mut(n) {
                        *w = shaped(w.dims())?;
                    }
                    // else one of the graph's scalar constants (eps, the norm floor, the score
                    // scale): computed at its float value
                }
            }
        }
        let mut m = crate::Model::from_stored(parts, &self.source)?;
        if lm_head.is_some() {
            let dims = m.lm_head.w.dims().to_vec();
            let values = &graph
                .constants
                .iter()
                .find(|(n, _)| n == "lm_head.weight.T" || n == "lm_head.weight")
                .ok_or_else(|| refuse("lm_head: no values".into()))?;
            let (rows, cols) = (dims[0], dims[1]);
            if values.1.len() != rows * cols {
                return Err(refuse(format!(
                    "lm_head holds {} values where --model's is {dims:?}",
                    values.1.len()
                )));
            }
            let mut t = values.1.clone();
            if values.0.ends_with(".T") {
                for (i, row) in values.1.chunks_exact(rows).enumerate() {
                    for (o, &x) in row.iter().enumerate() {
                        t[o * cols + i] = x;
                    }
                }
            }
            m.lm_head.w = crate::store::Weight::from_tensor(Tensor::from_vec(
                t,
                (rows, cols),
                &Device::Cpu,
            )?)?;
            m.lm_head_tied = false;
        }
        m.stored_rope = match (cos, sin) {
            (Some(cos), Some(sin)) if cos.len() == sin.len() && half > 0 => {
                Some(std::sync::Arc::new(crate::stored_rope::StoredRope {
                    half,
                    cos,
                    sin,
                }))
            }
            (None, None) => None,
            _ => {
                return Err(refuse(
                    "cos_cache and sin_cache: one quantised without the other".into(),
                ))
            }
        };
        m.qdq = Some(std::sync::Arc::new(grids(path, &graph)?));
        Ok(m)
    }
}

/// The decode graph's grids of a static folder (`static_graphs.json` beside `prefill`), when it
/// is another file.
fn decode_grids(prefill: &Path) -> Result<Option<SiteGrids>> {
    let dir = prefill.parent().unwrap_or(Path::new("."));
    let Ok(text) = std::fs::read_to_string(dir.join("static_graphs.json")) else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Unsupported {
        path: dir.join("static_graphs.json"),
        what: format!("not JSON ({e}); export the folder again"),
    })?;
    let Some(file) = v["decode"]["filename"].as_str() else {
        return Ok(None);
    };
    let decode = dir.join(file);
    if decode == prefill {
        return Ok(None);
    }
    Ok(Some(read(&decode)?.grids))
}

/// Both graphs' grids.
fn grids(prefill: &Path, graph: &QdqGraph) -> Result<QdqGrids> {
    Ok(QdqGrids {
        prefill: graph.grids.clone(),
        decode: decode_grids(prefill)?,
    })
}
