//! The values an OpenVINO IR's compressed constants declare, read through their decompression
//! subgraphs (issue 37) in the checkpoint's orientation (`[out, in]` for a linear weight).
//!
//! A compressed IR keeps a weight as a low-precision `Const` that a decompression subgraph widens
//! before its `MatMul` / `Gather` / `Multiply` (OpenVINO's `MarkDequantization` pattern,
//! `transformations/…/mark_dequantization_subgraph`). Three are computed:
//! - `compress_to_fp16`: `Const` f16 → `Convert` f32 (exact: the f16 values themselves);
//! - NNCF `INT8_ASYM`: `Const` u8 → `Convert` f16 → `Subtract` (`Convert` of a u8 zero point) →
//!   `Multiply` f16 scale → `Convert` f32, one zero point and scale per output channel;
//! - NNCF `INT4_SYM`: `Const` i4 `[in / g, g, out]` (or `[out, in / g, g]`) → `Convert` f16 →
//!   `Multiply` f16 scale `[in / g, 1, out]` (or `[out, in / g, 1]`) → `Reshape` to 2-D →
//!   `Convert` f32: signed levels −8..7, one scale per group of `g` input features.
//!
//! The CPU plugin fuses an integer subgraph into its FullyConnected / Gather and widens in f32
//! (level − zero point) · scale, which is exact in f32 for 8- and 4-bit levels times an f16 scale,
//! so the levels go into the generic block-quantised weight ([`BlockQuant`]) unchanged. Any other
//! compressed `Const` (int8 activations, groups along output channels, u4, nf4, …) is refused in
//! one line naming the node.
//!
//! Which weight a `Const` holds comes from its name: the tensor's name with `_compressed`
//! appended, `.T` for a `[in, out]` copy of a `[out, in]` weight.

use std::collections::HashSet;

use crate::blockquant::BlockQuant;
use crate::openvino_ir::{Ir, Layer};
use crate::{Error, Result};

/// Element types only a compressed constant uses in an LLM IR (an f32 IR's constants are f32
/// values and i32 / i64 shapes and indices).
pub const COMPRESSED: [&str; 14] = [
    "f16", "bf16", "u8", "i8", "u4", "i4", "nf4", "f4e2m1", "f8e4m3", "f8e5m2", "f8e8m0", "u1",
    "u2", "u3",
];

/// One decompressed tensor in the checkpoint's orientation.
pub struct Declared {
    /// The `Const` layer's name (named in errors).
    pub node: String,
    /// The tensor's name without `_compressed` and `.T`.
    pub name: String,
    /// The checkpoint's shape (the IR's reversed for a `.T` copy).
    pub dims: Vec<usize>,
    pub values: Values,
}

/// The stored values.
pub enum Values {
    /// f16, little-endian, in the checkpoint's order.
    F16(Vec<u8>),
    /// Integer levels with a scale and zero point per block of input features.
    Levels(BlockQuant),
}

impl Values {
    /// f32 values in the checkpoint's order, products in f32 as the CPU plugin computes them.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Values::F16(v) => widen(v),
            Values::Levels(q) => {
                let mut out = Vec::new();
                q.rows_into(0, q.rows, &mut out);
                out
            }
        }
    }
}

/// Every compressed `Const` of the IR, decompressed; a subgraph the reference does not compute
/// is refused naming the node.
pub fn read_declared(ir: &Ir) -> Result<Vec<Declared>> {
    let mut out = Vec::new();
    // an NNCF weight's zero point and scale are read with it
    let mut parts = HashSet::new();
    for c in ir.layers.iter().filter(|l| l.ty == "Const") {
        let read = match c.attr("element_type") {
            Some("u8") => read_u8(ir, c)?,
            Some("i4") => read_i4(ir, c)?,
            _ => None,
        };
        if let Some((d, used)) = read {
            parts.extend(used);
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
        if out.iter().any(|d| d.node == c.name) {
            continue;
        }
        if ty != "f16" {
            return Err(ir.refuse(format!("Const `{}` stores {ty} values outside a decompression subgraph the precision-matched reference computes (f16 → Convert f32; u8 → Convert → Subtract u8 zero point → Multiply f16 scale → Convert f32; i4 → Convert → Multiply f16 group scale → Reshape → Convert f32)", c.name)));
        }
        out.push(read_f16(ir, c)?);
    }
    Ok(out)
}

/// Follows `c`'s chain of single users through layers of the types `path` names (`Convert:f16`
/// a Convert to f16), each fed on port 0; None when the chain differs.
fn chain<'a>(ir: &'a Ir, c: &Layer, path: &[&str]) -> Option<Vec<&'a Layer>> {
    let mut at = c.id;
    let mut got = Vec::new();
    for step in path {
        let (l, 0) = ir.only_user(at)? else {
            return None;
        };
        let (ty, dest) = step.split_once(':').unwrap_or((step, ""));
        if l.ty != ty || (!dest.is_empty() && l.attr("destination_type") != Some(dest)) {
            return None;
        }
        at = l.id;
        got.push(l);
    }
    Some(got)
}

/// NNCF's asymmetric u8 weight (`INT8_ASYM`), one zero point and scale per output channel. None
/// when `c` is not the levels of such a subgraph (a zero point, or something else: the caller
/// refuses it). Returns the zero point's and scale's ids.
fn read_u8(ir: &Ir, c: &Layer) -> Result<Option<(Declared, Vec<u64>)>> {
    let Some(got) = chain(ir, c, &["Convert", "Subtract", "Multiply"]) else {
        return Ok(None);
    };
    let (sub, mul) = (got[1], got[2]);
    let zp = ir
        .producer(sub.id, 1)
        .filter(|l| l.ty == "Convert")
        .and_then(|l| ir.producer(l.id, 0));
    let (Some(zp), Some(scale)) = (zp, ir.producer(mul.id, 1)) else {
        return Ok(None);
    };
    let dims = c.shape();
    let (name, transposed) = tensor_name(&c.name);
    let wide = ir.only_user(mul.id).map(|(l, _)| l);
    let ok = wide.is_some_and(|l| l.ty == "Convert" && l.attr("destination_type") == Some("f32"))
        && zp.ty == "Const"
        && zp.attr("element_type") == Some("u8")
        && scale.ty == "Const"
        && scale.attr("element_type") == Some("f16")
        && dims.len() == 2
        && zp.shape() == scale.shape();
    // one per output channel: per row of [out, in], per column of a `.T` copy [in, out]
    let per_out = ok
        && match transposed {
            false => scale.shape() == [dims[0], 1],
            true => scale.shape() == [1, dims[1]],
        };
    if !per_out {
        return Err(ir.refuse(format!(
            "u8 Const `{}`: its decompression subgraph is not the one the precision-matched reference computes (Convert → Subtract u8 zero point → Multiply f16 scale, one per output channel → Convert f32)",
            c.name
        )));
    }
    let levels = ir.const_bytes(c)?;
    let zero_points: Vec<f32> = ir.const_bytes(zp)?.into_iter().map(f32::from).collect();
    let scales = widen(&ir.const_bytes(scale)?);
    let (rows, cols) = if transposed {
        (dims[1], dims[0])
    } else {
        (dims[0], dims[1])
    };
    if levels.len() != rows * cols || zero_points.len() != rows || scales.len() != rows {
        return Err(sizes(ir, c, &dims));
    }
    let data = if transposed {
        transpose8(&levels, dims[0], dims[1])
    } else {
        levels
    };
    let q = BlockQuant {
        rows,
        cols,
        block: cols,
        bits: 8,
        data,
        scales,
        zero_points,
        act_int8: false,
    };
    let d = Declared {
        node: c.name.clone(),
        name,
        dims: vec![rows, cols],
        values: Values::Levels(BlockQuant::new(q, &c.name)?),
    };
    Ok(Some((d, vec![zp.id, scale.id])))
}

/// NNCF's symmetric int4 weight (`INT4_SYM`) in groups of `g` input features. None when `c` is
/// not followed by Convert → Multiply; refused when the rest is not NNCF's layout.
fn read_i4(ir: &Ir, c: &Layer) -> Result<Option<(Declared, Vec<u64>)>> {
    let Some(got) = chain(ir, c, &["Convert", "Multiply"]) else {
        return Ok(None);
    };
    let mul = got[1];
    let (name, transposed) = tensor_name(&c.name);
    let dims = c.shape();
    let scale = ir
        .producer(mul.id, 1)
        .filter(|s| s.ty == "Const" && s.attr("element_type") == Some("f16") && dims.len() == 3);
    let reshape = chain(ir, mul, &["Reshape", "Convert:f32"]);
    let refuse = |why: &str| {
        Err(ir.refuse(format!(
            "i4 Const `{}` {dims:?}: {why}; the precision-matched reference computes NNCF's INT4_SYM groups along input features (Convert → Multiply f16 scale [in/g, 1, out] or [out, in/g, 1] → Reshape → Convert f32)",
            c.name
        )))
    };
    let (Some(scale), Some(reshape)) = (scale, reshape) else {
        return refuse("its decompression subgraph is another");
    };
    let [a, b, n] = dims[..] else {
        return refuse("not 3-D");
    };
    // the IR's 2-D matrix after the Reshape, and the block (group) size along its grouped axis
    let s = scale.shape();
    let (ir_rows, ir_cols, grouped_rows, block) = if s == [a, 1, n] {
        (a * b, n, true, b)
    } else if s == [a, b, 1] {
        (a, b * n, false, n)
    } else {
        return refuse(&format!("scales {s:?} are not one per group"));
    };
    let target = ir.producer(reshape[0].id, 1).map(|t| ir.const_i64(t));
    if !matches!(target, Some(Ok(ref t)) if *t == [ir_rows as i64, ir_cols as i64]) {
        return refuse("its Reshape is not to the 2-D weight");
    }
    // input features run along the IR's rows of a `.T` copy, along its columns otherwise
    if grouped_rows != transposed {
        return refuse("the groups run along output channels");
    }
    let packed = ir.const_bytes(c)?;
    let scales_ir = widen(&ir.const_bytes(scale)?);
    let (rows, cols) = if transposed {
        (ir_cols, ir_rows)
    } else {
        (ir_rows, ir_cols)
    };
    if packed.len() != rows * cols / 2 || scales_ir.len() != rows * cols / block {
        return Err(sizes(ir, c, &dims));
    }
    let groups = cols / block;
    let mut data = vec![0u8; rows * cols / 2];
    let mut scales = vec![0f32; rows * groups];
    for o in 0..rows {
        for k in 0..cols {
            let (r, col) = if transposed { (k, o) } else { (o, k) };
            let i = r * ir_cols + col;
            // OpenVINO packs two 4-bit elements a byte, the first in the low bits; −8..7 is
            // stored as level + 8 under BlockQuant's default zero point 8
            let level = (packed[i / 2] >> (4 * (i % 2))) & 0xf;
            let offset = (level ^ 8) & 0xf;
            let j = o * cols + k;
            data[j / 2] |= offset << (4 * (j % 2));
        }
        for g in 0..groups {
            scales[o * groups + g] = match transposed {
                true => scales_ir[g * ir_cols + o],
                false => scales_ir[o * groups + g],
            };
        }
    }
    let q = BlockQuant {
        rows,
        cols,
        block,
        bits: 4,
        data,
        scales,
        zero_points: Vec::new(),
        act_int8: false,
    };
    let d = Declared {
        node: c.name.clone(),
        name,
        dims: vec![rows, cols],
        values: Values::Levels(BlockQuant::new(q, &c.name)?),
    };
    Ok(Some((d, vec![scale.id])))
}

fn sizes(ir: &Ir, c: &Layer, dims: &[usize]) -> Error {
    Error::Format {
        path: ir.xml.clone(),
        detail: format!(
            "{} Const `{}`: sizes do not match its shape {dims:?}",
            c.attr("element_type").unwrap_or("?"),
            c.name
        ),
    }
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
        return Err(ir.refuse(format!(
            "f16 Const `{}` feeds {}; the precision-matched reference computes an f16 weight only widened by one Convert to f32",
            c.name,
            if seen.is_empty() { "nothing".into() } else { seen.join(", ") }
        )));
    }
    let ir_dims = c.shape();
    let bytes = ir.const_bytes(c)?;
    let count: usize = ir_dims.iter().product();
    if bytes.len() != 2 * count {
        return Err(Error::Format {
            path: ir.xml.clone(),
            detail: format!(
                "Const `{}`: {} bytes for {count} f16 values of shape {ir_dims:?}",
                c.name,
                bytes.len()
            ),
        });
    }
    let (name, transposed) = tensor_name(&c.name);
    let (dims, values) = match (transposed, ir_dims.as_slice()) {
        (false, _) => (ir_dims.clone(), bytes),
        (true, &[r, k]) => (vec![k, r], transpose16(&bytes, r, k)),
        (true, _) => {
            return Err(ir.refuse(format!(
                "f16 Const `{}` is a transposed copy (.T) of shape {ir_dims:?}, not 2-D",
                c.name
            )))
        }
    };
    Ok(Declared {
        node: c.name.clone(),
        name,
        dims,
        values: Values::F16(values),
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

pub fn widen(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn layer(id: u64, name: &str, ty: &str, data: &str) -> String {
        format!("<layer id=\"{id}\" name=\"{name}\" type=\"{ty}\" version=\"opset1\">\n<data {data} />\n</layer>\n")
    }

    fn edge(f: u64, t: u64, port: u64) -> String {
        format!("<edge from-layer=\"{f}\" from-port=\"0\" to-layer=\"{t}\" to-port=\"{port}\" />\n")
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
        // the `.T` copy [in, out] read as the checkpoint's [out, in], one channel a row
        assert_eq!(
            (got[0].name.as_str(), got[0].dims.as_slice()),
            ("w", &[2, 2][..])
        );
        assert_eq!(got[0].values.to_f32(), [-0.5, 4.5, 506.0, 36.0]);
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

    /// NNCF's INT4_SYM subgraph for a `.T` weight of 4 input features × 3 output channels in
    /// groups of 2: w[o][k] = level[k][o] · scale[k / 2][o], levels packed low nibble first.
    #[test]
    fn an_nncf_i4_weight_is_widened_per_group_of_input_features() {
        let dir = tempfile::tempdir().unwrap();
        let xml = dir.path().join("m.xml");
        let levels: [i8; 12] = [-8, 7, 1, 0, -1, 2, 3, -3, 5, -2, 4, -7];
        let mut bin: Vec<u8> = levels
            .chunks_exact(2)
            .map(|p| (p[0] as u8 & 0xf) | ((p[1] as u8 & 0xf) << 4))
            .collect();
        for s in [0.5f32, 1.0, 2.0, 0.25, 3.0, -1.0] {
            bin.extend(half::f16::from_f32(s).to_le_bytes());
        }
        for d in [4i64, 3, 2, 6] {
            bin.extend(d.to_le_bytes());
        }
        std::fs::write(xml.with_extension("bin"), bin).unwrap();
        let text = |scale_shape: &str| {
            [
                layer(
                    1,
                    "w.T",
                    "Const",
                    r#"element_type="i4" shape="2, 2, 3" offset="0" size="6""#,
                ),
                layer(2, "c", "Convert", r#"destination_type="f16""#),
                layer(
                    3,
                    "w.T/scale",
                    "Const",
                    &format!(r#"element_type="f16" shape="{scale_shape}" offset="6" size="12""#),
                ),
                layer(4, "m", "Multiply", r#"auto_broadcast="numpy""#),
                layer(
                    5,
                    "to2d",
                    "Const",
                    r#"element_type="i64" shape="2" offset="18" size="16""#,
                ),
                layer(6, "r", "Reshape", r#"special_zero="false""#),
                layer(7, "f", "Convert", r#"destination_type="f32""#),
                edge(1, 2, 0),
                edge(2, 4, 0),
                edge(3, 4, 1),
                edge(4, 6, 0),
                edge(5, 6, 1),
                edge(6, 7, 0),
            ]
            .concat()
        };
        std::fs::write(&xml, text("2, 1, 3")).unwrap();
        let got = read_declared(&Ir::read(&xml).unwrap()).unwrap();
        assert_eq!(got.len(), 1, "the scale belongs to the weight");
        assert_eq!(
            (got[0].name.as_str(), got[0].dims.as_slice()),
            ("w", &[3, 4][..])
        );
        assert_eq!(
            got[0].values.to_f32(),
            [-4.0, 0.0, 0.75, -0.5, 7.0, -1.0, -9.0, 12.0, 2.0, 4.0, -5.0, 7.0]
        );
        // scales [2, 2, 1] with a Reshape to [2, 6]: groups along the IR's last axis, the output
        // channels of a `.T` copy, a layout the reference does not compute
        let other = text("2, 2, 1")
            .replace(r#"size="12""#, r#"size="8""#)
            .replace(r#"offset="18""#, r#"offset="34""#);
        std::fs::write(&xml, other).unwrap();
        let e = read_declared(&Ir::read(&xml).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("i4 Const `w.T` [2, 2, 3]: the groups run along output channels"),
            "{e}"
        );
    }
}
