//! The weights an ONNX model declares it computes with (issue 35), read from the model file and
//! put in place of the checkpoint's: every `MatMulNBits` node (onnxruntime-genai's model builder
//! `-p int4`: `bits` 4, `block_size` 32, `accuracy_level` 4) becomes a block-quantised weight
//! ([`crate::blockquant`]) of the linear map it implements. A node kvprobe cannot place on a
//! weight of the model, or an attribute it does not compute, is refused in one line.
//!
//! Which weight a node implements comes from the builder's names (G:b, `make_matmul_int4`):
//! `…layers.N…{q,k,v,qkv,o,gate,up,down}_proj…` and `lm_head`; a fused `qkv_proj` is split by
//! output rows into q | k | v (the builder concatenates them in that order).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::blockquant::BlockQuant;
use crate::blocks::{Mlp, Qkv};
use crate::onnx_proto::{OnnxGraph, FLOAT, UINT8};
use crate::store::Weight;
use crate::{Error, Model, Result};

/// The attributes of MatMulNBits kvprobe computes; another one is refused.
const READ_ATTRS: [&str; 5] = ["K", "N", "bits", "block_size", "accuracy_level"];

/// What one MatMulNBits (or MatMul) node of the model builder computes, by its node and weight
/// names: (layer or None for lm_head, projection name).
pub fn target(node: &str, weight: &str) -> Option<(Option<usize>, &'static str)> {
    let hay = format!("{node} {weight}");
    if hay.contains("lm_head") {
        return Some((None, "lm_head"));
    }
    let at = hay.find("layers.")? + "layers.".len();
    let digits: String = hay[at..].chars().take_while(char::is_ascii_digit).collect();
    let layer = digits.parse().ok()?;
    let proj = [
        "qkv_proj",
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    .into_iter()
    .find(|p| {
        hay.match_indices(p)
            // "qkv_proj" also contains "kv_proj"; q/k/v must not match inside it
            .any(|(i, _)| i == 0 || !hay.as_bytes()[i - 1].is_ascii_alphanumeric())
    })?;
    Some((Some(layer), proj))
}

/// Every MatMulNBits node of `path` as (layer, projection, weight).
fn read_nodes(path: &Path) -> Result<Vec<(Option<usize>, &'static str, BlockQuant)>> {
    let g = OnnxGraph::read(path)?;
    let refuse = |what: String| Error::Unsupported {
        path: path.to_path_buf(),
        what,
    };
    let mut out = Vec::new();
    for n in g.nodes.iter().filter(|n| n.op_type == "MatMulNBits") {
        let attr = |k: &str| n.ints.get(k).copied();
        if let Some(a) = n
            .ints
            .keys()
            .chain(&n.other_attrs)
            .find(|a| !READ_ATTRS.contains(&a.as_str()))
        {
            return Err(refuse(format!(
                "MatMulNBits `{}` attribute `{a}`: the precision-matched reference does not compute it",
                n.name
            )));
        }
        if n.inputs.len() > 4
            || n.inputs
                .get(4..)
                .is_some_and(|r| r.iter().any(|s| !s.is_empty()))
        {
            return Err(refuse(format!(
                "MatMulNBits `{}` with g_idx or bias inputs: the precision-matched reference does not compute them",
                n.name
            )));
        }
        let b_name = n.inputs.get(1).cloned().unwrap_or_default();
        let Some((layer, proj)) = target(&n.name, &b_name) else {
            return Err(refuse(format!(
                "MatMulNBits `{}` is no projection of a layer or the lm_head kvprobe knows by name",
                n.name
            )));
        };
        let (Some(k), Some(nn), Some(bits), Some(block)) =
            (attr("K"), attr("N"), attr("bits"), attr("block_size"))
        else {
            return Err(refuse(format!(
                "MatMulNBits `{}` without K, N, bits or block_size",
                n.name
            )));
        };
        let (rows, cols, block) = (nn.max(0) as usize, k.max(0) as usize, block.max(0) as usize);
        let bits = bits.clamp(0, 32) as u32;
        let what = format!("{}: MatMulNBits `{}`", path.display(), n.name);
        if block == 0 || !cols.is_multiple_of(block) {
            return Err(Error::InvalidInput(format!(
                "{what}: block size {block} does not divide the input size {cols}; re-export with a block size that divides it"
            )));
        }
        let row_bytes = cols * bits as usize / 8;
        let blocks = rows * (cols / block);
        let scale_init = n.inputs.get(2).cloned().unwrap_or_default();
        if g.inits.get(&scale_init).map(|i| i.data_type) != Some(FLOAT) {
            return Err(refuse(format!(
                "MatMulNBits `{}`: scales that are not float32 initializers",
                n.name
            )));
        }
        let scales: Vec<f32> = g
            .bytes(&scale_init, blocks, 4)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let zero_points = match n.inputs.get(3).filter(|s| !s.is_empty()) {
            None => Vec::new(),
            Some(z) if g.inits.get(z).map(|i| i.data_type) == Some(UINT8) => {
                // packed like the levels, each row's blocks padded to whole bytes
                let per_row = (cols / block * bits as usize).div_ceil(8);
                let raw = g.bytes(z, rows * per_row, 1)?;
                let mask = (1u32 << bits) - 1;
                (0..blocks)
                    .map(|b| {
                        let (r, j) = (b / (cols / block), b % (cols / block));
                        let bit = j * bits as usize;
                        ((u32::from(raw[r * per_row + bit / 8]) >> (bit % 8)) & mask) as f32
                    })
                    .collect()
            }
            Some(_) => {
                return Err(refuse(format!(
                    "MatMulNBits `{}`: zero points that are not uint8 initializers",
                    n.name
                )))
            }
        };
        let data = g.bytes(&b_name, rows * row_bytes, 1)?;
        let q = BlockQuant::new(
            BlockQuant {
                rows,
                cols,
                block,
                bits,
                data,
                scales,
                zero_points,
                act_int8: attr("accuracy_level") == Some(4),
            },
            &what,
        )?;
        out.push((layer, proj, q));
    }
    Ok(out)
}

/// What the model file `path` declares about its weights: None for float weights (no
/// MatMulNBits), else one line (nodes, bits, block size, input path) for the description.
pub fn declared(path: &Path) -> Result<Option<String>> {
    let g = OnnxGraph::read(path)?;
    let nodes: Vec<_> = g
        .nodes
        .iter()
        .filter(|n| n.op_type == "MatMulNBits")
        .collect();
    let Some(first) = nodes.first() else {
        return Ok(None);
    };
    let attr = |n: &crate::onnx_proto::Node, k: &str| n.ints.get(k).copied().unwrap_or(-1);
    let same = |k: &str| nodes.iter().all(|n| attr(n, k) == attr(first, k));
    let each = |k: &str| match same(k) {
        true => attr(first, k).to_string(),
        false => "mixed".to_string(),
    };
    Ok(Some(format!(
        "{} MatMulNBits, {} bits, blocks of {}, accuracy_level {}{}",
        nodes.len(),
        each("bits"),
        each("block_size"),
        each("accuracy_level"),
        if same("accuracy_level") && attr(first, "accuracy_level") == 4 {
            ": inputs quantised to int8 per block"
        } else {
            ""
        }
    )))
}

/// The model with a file's declared weights, made once per file and shared by clones.
pub(crate) type DeclaredCache = Arc<Mutex<Option<(PathBuf, Arc<Model>)>>>;

impl Model {
    /// [`Model::with_onnx_block_weights`], computed on the first call for `path` and shared
    /// afterwards (every probe's precision-matched reference of one run computes with one copy).
    pub fn onnx_block_weights(&self, path: &Path) -> Result<Arc<Model>> {
        let mut held = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, m)) = held.as_ref() {
            if p == path {
                return Ok(m.clone());
            }
        }
        let m = Arc::new(self.with_onnx_block_weights(path)?);
        *held = Some((path.to_path_buf(), m.clone()));
        Ok(m)
    }

    /// This model with every linear weight `path` holds as MatMulNBits in its place (the rest,
    /// embeddings and norms included, stays the checkpoint's). Refuses a node it cannot place,
    /// a shape that disagrees with the model, or a model without any MatMulNBits.
    pub fn with_onnx_block_weights(&self, path: &Path) -> Result<Model> {
        let nodes = read_nodes(path)?;
        if nodes.is_empty() {
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: "no MatMulNBits node: no block-quantised weights to compute".into(),
            });
        }
        let c = self.config.clone();
        let (q_dim, kv_dim) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let mut m = self.clone();
        m.int8 = Default::default();
        m.declared = Default::default();
        let bad = |what: String| Error::Unsupported {
            path: path.to_path_buf(),
            what,
        };
        for (layer, proj, q) in nodes {
            let Some(l) = layer else {
                m.lm_head.w = fitted(&m.lm_head.w, q, "lm_head", path)?;
                m.lm_head_tied = false;
                continue;
            };
            let block = m.blocks.get_mut(l).ok_or_else(|| {
                bad(format!(
                    "MatMulNBits of layer {l}: the model has {} layers",
                    c.n_layers
                ))
            })?;
            let name = format!("layer {l} {proj}");
            match (proj, &mut block.qkv, &mut block.mlp) {
                (
                    "qkv_proj",
                    Qkv::Separate {
                        q: wq,
                        k: wk,
                        v: wv,
                    },
                    _,
                ) => {
                    if q.rows != q_dim + 2 * kv_dim {
                        return Err(bad(format!(
                            "{name}: {} rows, q + k + v is {}",
                            q.rows,
                            q_dim + 2 * kv_dim
                        )));
                    }
                    wq.w = fitted(&wq.w, q.slice_rows(0, q_dim), &name, path)?;
                    wk.w = fitted(&wk.w, q.slice_rows(q_dim, q_dim + kv_dim), &name, path)?;
                    wv.w = fitted(&wv.w, q.slice_rows(q_dim + kv_dim, q.rows), &name, path)?;
                }
                ("q_proj", Qkv::Separate { q: w, .. }, _)
                | ("k_proj", Qkv::Separate { k: w, .. }, _)
                | ("v_proj", Qkv::Separate { v: w, .. }, _)
                | ("gate_proj", _, Mlp::SwiGlu { gate: w, .. })
                | ("up_proj", _, Mlp::SwiGlu { up: w, .. })
                | ("down_proj", _, Mlp::SwiGlu { down: w, .. }) => {
                    w.w = fitted(&w.w, q, &name, path)?;
                }
                ("o_proj", _, _) => block.o.w = fitted(&block.o.w, q, &name, path)?,
                _ => {
                    return Err(bad(format!(
                        "{name}: not a projection of this model's layers"
                    )))
                }
            }
        }
        Ok(m)
    }
}

/// `q` in place of `old` when the shapes agree (`[out, in]`).
fn fitted(old: &Weight, q: BlockQuant, name: &str, path: &Path) -> Result<Weight> {
    if old.dims() != [q.rows, q.cols] {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "{name}: MatMulNBits [{}, {}] where the model's weight is {:?}; the ONNX model was exported from another model than --model",
                q.rows,
                q.cols,
                old.dims()
            ),
        });
    }
    Ok(Weight::blocks(q))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_names_map_to_projections() {
        let t = |n| target(n, "");
        assert_eq!(
            t("/model/layers.12/attn/qkv_proj/MatMul_Q4"),
            Some((Some(12), "qkv_proj"))
        );
        assert_eq!(
            t("/model/layers.0/attn/k_proj/MatMul_Q4"),
            Some((Some(0), "k_proj"))
        );
        assert_eq!(
            t("/model/layers.3/mlp/down_proj/MatMul_Q4"),
            Some((Some(3), "down_proj"))
        );
        assert_eq!(t("/lm_head/MatMul_Q4"), Some((None, "lm_head")));
        assert_eq!(t("/model/embed/MatMul_Q4"), None);
    }
}
