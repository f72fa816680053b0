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
//! (RoPE tables `[positions, head_dim / 2]`), `attn_scale` and its RMSNorm floors `/norm_floor_N`
//! (scripts/export-onnx.py).

use std::path::Path;
use std::sync::Arc;

use crate::blockquant::BlockQuant;
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
    values: Values,
}

/// The stored values, in the IR's order.
enum Values {
    /// f16, little-endian.
    F16(Vec<u8>),
    /// u8 levels with one zero point and one scale per row (`per_row`) or per column of the
    /// IR's 2-D shape, w = (level − zero point) · scale.
    U8 {
        levels: Vec<u8>,
        zero_points: Vec<f32>,
        scales: Vec<f32>,
        per_row: bool,
    },
}

impl Values {
    /// f32 values in the IR's order (`cols` the IR's last dimension), products in f32 as
    /// the CPU plugin's decompression computes them.
    fn to_f32(&self, cols: usize) -> Vec<f32> {
        match self {
            Values::F16(v) => widen(v),
            Values::U8 {
                levels,
                zero_points,
                scales,
                per_row,
            } => levels
                .iter()
                .enumerate()
                .map(|(i, &l)| {
                    let ch = if *per_row { i / cols } else { i % cols };
                    (f32::from(l) - zero_points[ch]) * scales[ch]
                })
                .collect(),
        }
    }
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
    // an NNCF u8 weight's zero point and scale are read with it
    let mut parts = std::collections::HashSet::new();
    for c in ir
        .layers
        .iter()
        .filter(|l| l.ty == "Const" && l.attr("element_type") == Some("u8"))
    {
        if let Some((d, zp, scale)) = read_u8(ir, c)? {
            parts.extend([zp, scale]);
            out.push(d);
        }
    }
    for c in ir
        .layers
        .iter()
        .filter(|l| l.ty == "Const" && !parts.contains(&l.id))
    {
        let Some(ty) = c.attr("element_type").filter(|t| COMPRESSED.contains(t)) else {
            continue;
        };
        if ty == "u8" && out.iter().any(|d| d.node == c.name) {
            continue;
        }
        if ty != "f16" {
            return Err(refuse(
                ir,
                format!("Const `{}` stores {ty} values outside a decompression subgraph the precision-matched reference computes (f16 → Convert f32; u8 → Convert → Subtract u8 zero point → Multiply f16 scale → Convert f32)", c.name),
            ));
        }
        out.push(read_f16(ir, c)?);
    }
    Ok(out)
}

/// The one user of `id`, if it has exactly one.
fn only_user(ir: &Ir, id: u64) -> Option<(&Layer, u64)> {
    let users = ir.consumers(id);
    (users.len() == 1).then(|| users[0])
}

/// NNCF's asymmetric u8 weight (`INT8_ASYM`): `Const` u8 → `Convert` f16 → `Subtract`
/// (`Convert` f16 of a u8 zero point) → `Multiply` (f16 scale) → `Convert` f32, one zero point
/// and scale per row or column. None when `c` is not the levels of such a subgraph (a zero
/// point, or something else: the caller refuses it). Returns the zero point's and scale's ids.
fn read_u8(ir: &Ir, c: &Layer) -> Result<Option<(Declared, u64, u64)>> {
    let Some((conv, 0)) = only_user(ir, c.id) else {
        return Ok(None);
    };
    let Some((sub, 0)) = only_user(ir, conv.id).filter(|_| conv.ty == "Convert") else {
        return Ok(None);
    };
    let Some((mul, 0)) = only_user(ir, sub.id).filter(|_| sub.ty == "Subtract") else {
        return Ok(None);
    };
    let Some((wide, 0)) = only_user(ir, mul.id).filter(|_| mul.ty == "Multiply") else {
        return Ok(None);
    };
    let zp = ir
        .producer(sub.id, 1)
        .filter(|l| l.ty == "Convert")
        .and_then(|l| ir.producer(l.id, 0));
    let scale = ir.producer(mul.id, 1);
    let (Some(zp), Some(scale)) = (zp, scale) else {
        return Ok(None);
    };
    let dims = c.shape();
    let ok = wide.ty == "Convert"
        && wide.attr("destination_type") == Some("f32")
        && zp.ty == "Const"
        && zp.attr("element_type") == Some("u8")
        && scale.ty == "Const"
        && scale.attr("element_type") == Some("f16")
        && dims.len() == 2
        && zp.shape() == scale.shape();
    let per_row = scale.shape() == [dims[0], 1];
    if !ok || !(per_row || scale.shape() == [1, dims[1]]) {
        return Err(refuse(ir, format!(
            "u8 Const `{}`: its decompression subgraph is not the one the precision-matched reference computes (Convert → Subtract u8 zero point → Multiply f16 scale, one per row or column → Convert f32)",
            c.name
        )));
    }
    let levels = ir.const_bytes(c)?;
    let zero_points: Vec<f32> = ir.const_bytes(zp)?.into_iter().map(f32::from).collect();
    let scales = widen(&ir.const_bytes(scale)?);
    if levels.len() != dims[0] * dims[1] || zero_points.len() != scales.len() {
        return Err(Error::Format {
            path: ir.xml.clone(),
            detail: format!(
                "u8 Const `{}`: sizes do not match its shape {dims:?}",
                c.name
            ),
        });
    }
    let (name, transposed) = tensor_name(&c.name);
    Ok(Some((
        Declared {
            node: c.name.clone(),
            name,
            transposed,
            dims,
            values: Values::U8 {
                levels,
                zero_points,
                scales,
                per_row,
            },
        },
        zp.id,
        scale.id,
    )))
}

/// A constant's tensor name without `_compressed`, and whether it ends in `.T` (transposed).
fn tensor_name(node: &str) -> (String, bool) {
    let base = node.strip_suffix("_compressed").unwrap_or(node);
    match base.strip_suffix(".T") {
        Some(n) => (n.to_string(), true),
        None => (base.to_string(), false),
    }
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
    let (name, transposed) = tensor_name(&c.name);
    Ok(Declared {
        node: c.name.clone(),
        name,
        transposed,
        dims,
        values: Values::F16(bytes),
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

/// u8 `[r][c]` → `[c][r]`.
fn transpose8(v: &[u8], r: usize, c: usize) -> Vec<u8> {
    let mut out = vec![0u8; v.len()];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = v[i * c + j];
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
    let u8s = got.len() - f16 - floors;
    let mut said = Vec::new();
    if f16 > 0 {
        said.push(format!("{f16} f16 constants widened to f32 exactly"));
    }
    if floors > 0 {
        said.push(format!(
            "{floors} f16 RMSNorm floors (the norm is the same at any positive floor)"
        ));
    }
    if u8s > 0 {
        said.push(format!(
            "{u8s} u8 weights, (level − zero point) · f16 scale per output channel in f32"
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
            let cols = ir_dims.last().copied().unwrap_or(1);
            let as_f32 = || d.values.to_f32(cols);
            let node = d.node.clone();
            let owned = || -> Result<Weight> {
                match (&d.values, d.transposed, ir_dims.as_slice()) {
                    (Values::F16(v), true, [r, k]) => Ok(Weight::raw(Bytes::Owned(Arc::new(transpose16(v, *r, *k))), Kind::F16, dims.clone())),
                    (Values::F16(v), false, _) => Ok(Weight::raw(Bytes::Owned(Arc::new(v.clone())), Kind::F16, dims.clone())),
                    // one zero point and scale per output channel: a block-quantised weight
                    // whose block is the whole row
                    (Values::U8 { levels, zero_points, scales, per_row }, t, [r, k]) if t != *per_row => {
                        let (rows, cols) = (dims[0], dims[1]);
                        let data = if t { transpose8(levels, *r, *k) } else { levels.clone() };
                        Ok(Weight::blocks(BlockQuant::new(BlockQuant { rows, cols, block: cols, bits: 8, data, scales: scales.clone(), zero_points: zero_points.clone(), act_int8: false }, &node)?))
                    }
                    _ => Err(refuse(&ir, format!("Const `{node}` of shape {ir_dims:?}: its scales are not one per output channel, or it is transposed and not 2-D"))),
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
                        return Err(refuse(&ir, format!("Const `{}` is {v:?}, not 1/√head_dim = {want}: the reference computes no other attention scale", d.node)));
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
                        return Err(refuse(&ir, format!("Const `{}` is {v:?}: the RMSNorm floor the reference computes is one positive finite number", d.node)));
                    }
                }
                "lm_head.weight" if !parts.weights.contains_key("lm_head.weight") => {
                    lm_head = Some((owned()?, dims.clone()))
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
                    *w = owned()?;
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

    #[test]
    fn an_nncf_u8_weight_is_widened_per_output_channel_in_f32() {
        // levels [[0, 255], [10, 20]], zero points [1, 2] and scales [0.5, 2] per column
        let dir = tempfile::tempdir().unwrap();
        let xml = dir.path().join("m.xml");
        let mut bin = vec![0u8, 255, 10, 20, 1, 2];
        bin.extend(half::f16::from_f32(0.5).to_le_bytes());
        bin.extend(half::f16::from_f32(2.0).to_le_bytes());
        std::fs::write(xml.with_extension("bin"), bin).unwrap();
        let layer = |id: u64, name: &str, ty: &str, data: &str| {
            format!("<layer id=\"{id}\" name=\"{name}\" type=\"{ty}\" version=\"opset1\">\n<data {data} />\n</layer>\n")
        };
        let edge = |f: u64, t: u64, port: u64| {
            format!(
                "<edge from-layer=\"{f}\" from-port=\"0\" to-layer=\"{t}\" to-port=\"{port}\" />\n"
            )
        };
        let text = [
            layer(
                1,
                "w.T",
                "Const",
                r#"element_type="u8" shape="2, 2" offset="0" size="4""#,
            ),
            layer(2, "c", "Convert", r#"destination_type="f16""#),
            layer(
                3,
                "w.T/zero_point",
                "Const",
                r#"element_type="u8" shape="1, 2" offset="4" size="2""#,
            ),
            layer(4, "cz", "Convert", r#"destination_type="f16""#),
            layer(5, "s", "Subtract", r#"auto_broadcast="numpy""#),
            layer(
                6,
                "w.T/scale",
                "Const",
                r#"element_type="f16" shape="1, 2" offset="6" size="4""#,
            ),
            layer(7, "m", "Multiply", r#"auto_broadcast="numpy""#),
            layer(8, "f", "Convert", r#"destination_type="f32""#),
            edge(1, 2, 0),
            edge(3, 4, 0),
            edge(2, 5, 0),
            edge(4, 5, 1),
            edge(5, 7, 0),
            edge(6, 7, 1),
            edge(7, 8, 0),
        ]
        .concat();
        std::fs::write(&xml, &text).unwrap();
        let ir = Ir::read(&xml).unwrap();
        let got = read_declared(&ir).unwrap();
        assert_eq!(
            got.len(),
            1,
            "the zero point and scale belong to the weight"
        );
        assert_eq!((got[0].name.as_str(), got[0].transposed), ("w", true));
        assert_eq!(got[0].values.to_f32(2), [-0.5, 506.0, 4.5, 36.0]);
        // a Multiply by an f32 scale is not NNCF's subgraph: refused naming the weight
        std::fs::write(
            &xml,
            text.replace(
                r#"element_type="f16" shape="1, 2""#,
                r#"element_type="f32" shape="1, 2""#,
            ),
        )
        .unwrap();
        let e = read_declared(&Ir::read(&xml).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("u8 Const `w.T`"), "{e}");
    }
}
