//! The weights an OpenVINO IR declares it computes with (issue 37), read from its decompression
//! subgraphs and put in place of the checkpoint's, as OpenVINO's CPU plugin widens them.
//!
//! A compressed IR keeps a weight as a low-precision `Const` that a decompression subgraph widens
//! before its `MatMul` / `Gather` / `Multiply` (OpenVINO's `MarkDequantization` pattern,
//! `src/common/low_precision_transformations` and `transformations/…/mark_dequantization_subgraph`):
//! `Const` → `Convert` → [`Subtract` zero point] → `Multiply` scale → [`Reshape` groups] →
//! [`Convert`]. `openvino.save_model`'s default `compress_to_fp16` writes f16 values whose only
//! decompression is `Convert` to f32: f16 → f32 is exact, so the reference computes with exactly
//! the f16 values (kept as f16, widened per tile). A compressed `Const` in any other subgraph, or
//! one the reference has no counterpart for, is refused in one line naming the node.
//!
//! Which weight a `Const` holds comes from its name (the tensor's name with `_compressed`
//! appended, `.T` for a `[in, out]` copy of a `[out, in]` weight): the checkpoint's tensor names
//! (`model.layers.N.…weight`, `lm_head.weight`), and the ONNX export's `cos_cache` / `sin_cache`
//! (RoPE tables `[positions, head_dim / 2]`) and `attn_scale` (scripts/export-onnx.py).

use std::path::Path;
use std::sync::Arc;

use crate::openvino_ir::{Ir, Layer};
use crate::store::{Bytes, Kind, Weight};
use crate::stored_rope::StoredRope;
use crate::{Error, Model, Result};

/// Element types only a compressed constant uses in an LLM IR (an f32 IR's constants are f32
/// values and i32 / i64 shapes and indices).
pub const COMPRESSED: [&str; 14] = [
    "f16", "bf16", "u8", "i8", "u4", "i4", "nf4", "f4e2m1", "f8e4m3", "f8e5m2", "f8e8m0", "u1",
    "u2", "u3",
];

/// One decompressed tensor as the IR stores it.
struct Declared {
    /// The `Const` layer's name (named in errors).
    node: String,
    /// The tensor's name without `_compressed` and `.T`.
    name: String,
    /// The IR stores `[in, out]` of the checkpoint's `[out, in]`.
    transposed: bool,
    /// The IR's shape.
    dims: Vec<usize>,
    /// f16 values, little-endian, in the IR's order.
    f16: Vec<u8>,
}

fn refuse(ir: &Ir, what: String) -> Error {
    Error::Unsupported {
        path: ir.xml.clone(),
        what,
    }
}

/// Every compressed `Const` of the IR, decompressed; a subgraph the reference does not compute
/// is refused naming the node.
fn read_declared(ir: &Ir) -> Result<Vec<Declared>> {
    let mut out = Vec::new();
    for c in ir.layers.iter().filter(|l| l.ty == "Const") {
        let Some(ty) = c.attr("element_type").filter(|t| COMPRESSED.contains(t)) else {
            continue;
        };
        if ty != "f16" {
            return Err(refuse(
                ir,
                format!("Const `{}` stores {ty} weights; the precision-matched reference reads f16 weights (compress_to_fp16) only", c.name),
            ));
        }
        out.push(read_f16(ir, c)?);
    }
    Ok(out)
}

/// `Const` f16 → `Convert` f32, the whole of `compress_to_fp16`'s decompression.
fn read_f16(ir: &Ir, c: &Layer) -> Result<Declared> {
    let users = ir.consumers(c.id);
    let widened = users.len() == 1
        && users[0].0.ty == "Convert"
        && users[0].0.attr("destination_type") == Some("f32");
    if !widened {
        let seen: Vec<String> = users
            .iter()
            .map(|(l, _)| format!("{} `{}`", l.ty, l.name))
            .collect();
        return Err(refuse(
            ir,
            format!(
                "f16 Const `{}` feeds {}; the precision-matched reference computes an f16 weight only widened by one Convert to f32",
                c.name,
                if seen.is_empty() { "nothing".into() } else { seen.join(", ") }
            ),
        ));
    }
    let dims = c.shape();
    let bytes = ir.const_bytes(c)?;
    let count: usize = dims.iter().product();
    if bytes.len() != 2 * count {
        return Err(Error::Format {
            path: ir.xml.clone(),
            detail: format!(
                "Const `{}`: {} bytes for {count} f16 values of shape {dims:?}",
                c.name,
                bytes.len()
            ),
        });
    }
    let base = c.name.strip_suffix("_compressed").unwrap_or(&c.name);
    let (name, transposed) = match base.strip_suffix(".T") {
        Some(n) => (n.to_string(), true),
        None => (base.to_string(), false),
    };
    Ok(Declared {
        node: c.name.clone(),
        name,
        transposed,
        dims,
        f16: bytes,
    })
}

/// f16 bytes `[r][c]` → `[c][r]`.
fn transpose16(v: &[u8], r: usize, c: usize) -> Vec<u8> {
    let mut out = vec![0u8; v.len()];
    for i in 0..r {
        for j in 0..c {
            let (s, d) = (2 * (i * c + j), 2 * (j * r + i));
            out[d..d + 2].copy_from_slice(&v[s..s + 2]);
        }
    }
    out
}

fn widen(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// What the IR `xml` declares about its weights: None when it stores no compressed constant,
/// else one line for the description. Refuses (one line naming the node) a decompression
/// subgraph the reference does not compute.
pub fn declared(xml: &Path) -> Result<Option<String>> {
    let ir = Ir::read(xml)?;
    let got = read_declared(&ir)?;
    if got.is_empty() {
        return Ok(None);
    }
    let values: usize = got.iter().map(|d| d.f16.len() / 2).sum();
    Ok(Some(format!(
        "{} f16 constants ({values} values, OpenVINO's compress_to_fp16), widened to f32 exactly",
        got.len()
    )))
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
            return Err(refuse(
                &ir,
                "no compressed Const: nothing to compute but the checkpoint's weights".into(),
            ));
        }
        let mut parts = crate::model::stored_parts(&self.source)?;
        let c = parts.config.clone();
        let (mut lm_head, mut cos, mut sin) = (None, None, None);
        for d in got {
            let ir_dims = d.dims.clone();
            let dims: Vec<usize> = match d.transposed {
                true => ir_dims.iter().rev().copied().collect(),
                false => ir_dims.clone(),
            };
            let f16 = match (d.transposed, ir_dims.as_slice()) {
                (true, [r, k]) => transpose16(&d.f16, *r, *k),
                (true, _) => {
                    return Err(refuse(
                        &ir,
                        format!(
                            "Const `{}`: a transposed weight of shape {ir_dims:?}",
                            d.node
                        ),
                    ))
                }
                (false, _) => d.f16,
            };
            let owned =
                || Weight::raw(Bytes::Owned(Arc::new(f16.clone())), Kind::F16, dims.clone());
            match d.name.as_str() {
                "cos_cache" | "sin_cache" if dims.len() == 2 && 2 * dims[1] == c.head_dim => {
                    let t = Some(widen(&f16));
                    if d.name == "cos_cache" {
                        cos = t
                    } else {
                        sin = t
                    }
                }
                "attn_scale" => {
                    let v = widen(&f16);
                    let want = 1.0 / (c.head_dim as f32).sqrt();
                    if v != [want] {
                        return Err(refuse(&ir, format!("Const `{}` is {v:?}, not 1/√head_dim = {want}: the reference computes no other attention scale", d.node)));
                    }
                }
                "lm_head.weight" if !parts.weights.contains_key("lm_head.weight") => {
                    lm_head = Some((owned(), dims.clone()))
                }
                n => {
                    let Some(w) = parts.weights.get_mut(n) else {
                        return Err(refuse(&ir, format!(
                            "Const `{}`: --model {} has no tensor `{n}` for it; pass the checkpoint the IR was exported from",
                            d.node,
                            self.source.display()
                        )));
                    };
                    if w.dims() != dims {
                        return Err(refuse(&ir, format!(
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
                return Err(refuse(
                    &ir,
                    format!(
                        "lm_head is {dims:?} where --model's is {:?}",
                        m.lm_head.w.dims()
                    ),
                ));
            }
            m.lm_head.w = w;
            m.lm_head_tied = false;
        }
        m.stored_rope = match (cos, sin) {
            (Some(cos), Some(sin)) if cos.len() == sin.len() => Some(Arc::new(StoredRope { half: c.head_dim / 2, cos, sin })),
            (None, None) => None,
            _ => return Err(refuse(&ir, "cos_cache and sin_cache: one compressed without the other, or of different lengths".into())),
        };
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_transposes_and_widens_exactly() {
        let v: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        assert_eq!(
            widen(&transpose16(&v, 2, 3)),
            [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        let r = StoredRope {
            half: 1,
            cos: vec![1.0, 0.5],
            sin: vec![0.0, 0.25],
        };
        assert_eq!(r.tables(&[1.0]), Some((vec![0.5, 0.5], vec![0.25, 0.25])));
        assert_eq!(r.tables(&[2.0]), None);
    }

    #[test]
    fn a_subgraph_the_reference_does_not_compute_is_refused_naming_the_node() {
        let xml = |ty: &str, user: &str| {
            format!(
                r#"<layer id="1" name="w_compressed" type="Const" version="opset1">
<data element_type="{ty}" shape="2" offset="0" size="4" />
</layer>
<layer id="2" name="u" type="{user}" version="opset1">
<data destination_type="f32" />
</layer>
<edge from-layer="1" from-port="0" to-layer="2" to-port="0" />
"#
            )
        };
        let p = Path::new("m.xml");
        let e = |ty, user| {
            let ir = Ir::parse(xml(ty, user).as_bytes(), p).unwrap();
            read_declared(&ir).err().map(|e| e.to_string())
        };
        let got = e("f16", "Multiply").expect("refused");
        assert!(
            got.contains("f16 Const `w_compressed` feeds Multiply `u`"),
            "{got}"
        );
        let got = e("nf4", "Convert").expect("refused");
        assert!(got.contains("Const `w_compressed` stores nf4"), "{got}");
    }
}
