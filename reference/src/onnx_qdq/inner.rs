//! The grids inside a QDQ graph's norms and RoPEs, placed op by op, and its dequantised
//! constants (onnx_qdq.rs reads the rest).

use std::collections::HashSet;

use super::{Reader, SiteGrids};
use crate::onnx_proto::OnnxGraph;
use crate::onnx_qdq_names::at_layer;

/// Places the inner ops of each norm and each RoPE whose output is a site; returns the nodes
/// whose grids that placed, or the line refusing one.
pub(super) fn place_inner(
    r: &Reader,
    g: &OnnxGraph,
    grids: &mut SiteGrids,
) -> std::result::Result<Vec<usize>, String> {
    // the nodes whose grids were placed
    let mut placed = Vec::new();
    // the inner ops of each norm whose output is a site
    let norms: Vec<(usize, (Option<usize>, String))> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].op_type == "Mul")
        .filter_map(|i| Some((i, r.site(i)?)))
        .filter(|(_, (_, s))| s.ends_with("layernorm") || s == "norm")
        .collect();
    for (i, (layer, name)) in norms {
        let ops = r.norm_ops(i).ok_or_else(|| {
            format!(
                "`{}` ends a norm ({}) that is not the max-scaled RMSNorm the reference computes op by op (x / (√max|x| · √(mean((x/√max)²) + ε/max)), arith.rs); its inner grids cannot be placed: quantise the float static folder with scripts/export-qdq.py",
                g.nodes[i].name,
                at_layer(layer, &name)
            )
        })?;
        for (op, node) in ops {
            if let Some(&q) = g.nodes[node]
                .outputs
                .first()
                .and_then(|o| r.q_of.get(o.as_str()))
            {
                let key = (layer, format!("{name} {op}"));
                grids.entry(key).or_default().push(r.grid(q)?);
                placed.push(node);
            }
        }
    }
    // the inner ops of each RoPE and its tables
    let ropes: Vec<(usize, (Option<usize>, String))> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].op_type == "Add")
        .filter_map(|i| Some((i, r.site(i)?)))
        .filter(|(_, (_, s))| s.starts_with("rope "))
        .collect();
    // every layer's q and k reach attention through a RoPE the reference can place
    for (l, proj) in (0..g.nodes.len()).filter_map(|i| match r.site(i)? {
        (Some(l), p) if p == "q_proj" || p == "k_proj" => Some((l, p)),
        _ => None,
    }) {
        let want = format!("rope {}", &proj[..1]);
        if !ropes.iter().any(|(_, s)| s == &(Some(l), want.clone())) {
            return Err(format!(
                "layer {l}'s {proj} output reaches attention through no `x·cos + rotate_half(x)·sin` (an Add of two Muls, rotate_half a Concat of a Neg) that the reference computes op by op; the RoPE's grids cannot be placed: quantise the float static folder with scripts/export-qdq.py"
            ));
        }
    }
    for (i, (layer, name)) in ropes {
        let ops = r.rope_ops(i).ok_or_else(|| {
            format!(
                "`{}` ends a RoPE ({}) whose inner ops are not `x·cos + Concat(Neg(x₂), x₁)·sin` with Gather → Concat → Unsqueeze tables, as the reference computes it op by op; its grids cannot be placed: quantise the float static folder with scripts/export-qdq.py",
                g.nodes[i].name,
                at_layer(layer, &name)
            )
        })?;
        for (key, node) in ops {
            let Some(&q) = g.nodes[node]
                .outputs
                .first()
                .and_then(|o| r.q_of.get(o.as_str()))
            else {
                continue;
            };
            let grid = r.grid(q)?;
            if let Some(table) = key.strip_prefix("table ") {
                // shared by every layer: kept once, in graph order (gather, concat, unsqueeze)
                let at = grids.entry((None, format!("rope {table}"))).or_default();
                if at.len() == 3 {
                    continue;
                }
                at.push(grid);
            } else {
                grids
                    .entry((layer, format!("{name} {key}")))
                    .or_default()
                    .push(grid);
            }
            placed.push(node);
        }
    }
    Ok(placed)
}

/// Every initializer behind a DequantizeLinear, dequantised, by its name without `_quantized`.
pub(super) fn dequantised(
    r: &Reader,
    g: &OnnxGraph,
) -> std::result::Result<Vec<(String, Vec<f32>)>, String> {
    let mut constants = Vec::new();
    let mut seen = HashSet::new();
    for n in g.nodes.iter().filter(|n| n.op_type == "DequantizeLinear") {
        let Some(name) = n.outputs.first().and_then(|o| r.constant.get(o.as_str())) else {
            continue;
        };
        if !seen.insert(*name) {
            continue;
        }
        let init = &n.inputs[0];
        let grid = r.grid(r.producer[n.outputs[0].as_str()])?;
        let width = if grid.hi > 255 { 2 } else { 1 };
        let count = g.byte_len(init).unwrap_or(0) as usize / width;
        let b = g.bytes(init, count, width).map_err(|e| e.to_string())?;
        let values = b
            .chunks_exact(width)
            .map(|c| {
                let q = match (width, grid.lo) {
                    (1, 0) => i32::from(c[0]),
                    (1, _) => i32::from(c[0] as i8),
                    (_, 0) => i32::from(u16::from_le_bytes([c[0], c[1]])),
                    _ => i32::from(i16::from_le_bytes([c[0], c[1]])),
                };
                (q - grid.zero) as f32 * grid.scale
            })
            .collect();
        constants.push((name.to_string(), values));
    }
    Ok(constants)
}
