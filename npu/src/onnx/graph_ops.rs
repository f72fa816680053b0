//! What the graph of a GenAI folder computes attention with, read off `model.onnx` itself (the
//! ONNX protobuf: ModelProto.graph = 7, GraphProto.node = 1, NodeProto.op_type = 4, and the
//! subgraphs of If/Loop/Scan nodes, AttributeProto.g = 6 / graphs = 11).
//!
//! GroupQueryAttention (onnxruntime's contrib op, the model builder's attention) takes the mask
//! only as lengths, `seqlens_k = sum(mask) − 1` and `total_sequence_length`: a mask with holes
//! (self-only, a single key) cannot be expressed through it. A request with one would make the
//! op write the new K/V at the wrong position and attend to whatever the length says, so the
//! device refuses such a mask and the probes that need one are `not_applicable`.

use std::path::Path;

use kvprobe_schema::{DeclaredArithmetic, DeclaredNorm};

use crate::hailo::hef::wire::{Reader, Value};
use crate::{Error, Result};

/// The op that reads the mask as lengths.
pub const LENGTH_MASK_OP: &str = "GroupQueryAttention";

/// Why the graph at `model` cannot take a mask with holes, or None when it applies the mask per
/// key column (no GroupQueryAttention node).
pub(super) fn mask_by_length(model: &Path) -> Result<Option<String>> {
    let bytes = std::fs::read(model).map_err(|e| Error::Io {
        path: model.to_path_buf(),
        detail: format!("cannot read the graph ({e})"),
    })?;
    let found = holds_op(&bytes, LENGTH_MASK_OP).map_err(|e| Error::Io {
        path: model.to_path_buf(),
        detail: format!("not a readable ONNX model ({e})"),
    })?;
    Ok(found.then(|| {
        format!(
            "{} computes attention with {LENGTH_MASK_OP}, which reads the mask as a length (seqlens_k = sum(mask) − 1): a self-only or single-key mask cannot be expressed",
            model.display()
        )
    }))
}

/// HTP's fp16 saturation point: an op output beyond it is clamped (measured on the simulator
/// by scripts/htp-bisect.py: `Mul` outputs stop at 131008, twice fp16's 65504; docs/qnn.md).
pub const HTP_FP16_SATURATION: f32 = 131_008.0;

/// The arithmetic the graph at `model` computes in, as the session declares it: fp16 with HTP's
/// saturation, every op output rounded, when QNN's HTP runs it with
/// `enable_htp_fp16_precision=1`; when the graph itself holds fp16 (its K/V cache is fp16: the
/// model builder's `-p fp16`) and ONNX Runtime's CPU kernels run it, fp16 with IEEE infinities
/// only where the CPU EP keeps fp16 (`ort_cpu_fp16.rs`, derived from the graph's ops and
/// types); float32 otherwise. The norm statistic is read off the graph: a fused
/// SimplifiedLayerNormalization, a ReduceMax (scripts/export-onnx.py's scaled norm) or plain
/// squares.
pub(super) fn declared_arithmetic(
    model: &Path,
    htp_fp16: bool,
    fp16_graph: bool,
) -> Result<DeclaredArithmetic> {
    if !htp_fp16 && !fp16_graph {
        return Ok(DeclaredArithmetic::Float32);
    }
    // a QDQ graph declares its precision as grids (the weights' declaration carries them), and
    // between its Q/DQ pairs HTP runs integer kernels, not fp16
    if kvprobe_reference::onnx_qdq::is_qdq_graph(&kvprobe_reference::onnx_proto::OnnxGraph::read(
        model,
    )?) {
        return Ok(DeclaredArithmetic::Float32);
    }
    let bytes = std::fs::read(model).map_err(|e| Error::Io {
        path: model.to_path_buf(),
        detail: format!("cannot read the graph ({e})"),
    })?;
    let has = |op: &str| {
        holds_op(&bytes, op).map_err(|e| Error::Io {
            path: model.to_path_buf(),
            detail: format!("not a readable ONNX model ({e})"),
        })
    };
    let norm = if has("SimplifiedLayerNormalization")? || has("SkipSimplifiedLayerNormalization")? {
        DeclaredNorm::Fused
    } else if has("ReduceMax")? {
        DeclaredNorm::MaxScaled
    } else {
        DeclaredNorm::Squares
    };
    if htp_fp16 {
        return Ok(DeclaredArithmetic::Fp16 {
            saturate_at: Some(HTP_FP16_SATURATION),
            norm,
            rounded: None,
            norm_reads_f32_sum: false,
            rope_tables_fp16: false,
            fp16_sums: false,
        });
    }
    let graph = kvprobe_reference::onnx_proto::OnnxGraph::read(model)?;
    let cpu = super::ort_cpu_fp16::derive(&graph);
    Ok(DeclaredArithmetic::Fp16 {
        saturate_at: None,
        norm,
        rounded: Some(cpu.rounded.iter().map(|s| s.to_string()).collect()),
        norm_reads_f32_sum: cpu.skip_sum_f32,
        rope_tables_fp16: cpu.rope_tables_fp16,
        fp16_sums: false,
    })
}

/// Why the reference cannot compute the QDQ graph at `model` (one line, without the path): a
/// QuantizeLinear / DequantizeLinear whose scale or zero point is not a constant of the graph (a
/// QDQ model without scales). Activations quantised inside the graph are computed
/// (kvprobe_reference::onnx_qdq places their grids on the reference), and what that reader does
/// not compute (per-channel or blocked scales, other integer types) it refuses itself.
pub(super) fn qdq_refusal(model: &Path) -> Result<Option<String>> {
    let g = kvprobe_reference::onnx_proto::OnnxGraph::read(model)?;
    let constants: std::collections::HashSet<&str> = g
        .inits
        .keys()
        .map(String::as_str)
        .chain(
            g.nodes
                .iter()
                .filter(|n| n.op_type == "Constant")
                .flat_map(|n| n.outputs.iter().map(String::as_str)),
        )
        .collect();
    let qdq = g
        .nodes
        .iter()
        .filter(|n| n.op_type == "QuantizeLinear" || n.op_type == "DequantizeLinear");
    for n in qdq {
        let scale = n.inputs.get(1).map(String::as_str).unwrap_or("");
        let zero = n.inputs.get(2).map(String::as_str).unwrap_or("");
        if !constants.contains(scale) || !(zero.is_empty() || constants.contains(zero)) {
            return Ok(Some(format!(
                "{} `{}` takes its scale / zero point from `{scale}` / `{zero}`, not from a constant of the graph (a QDQ model without scales); re-quantise it with static scales (onnxruntime.quantization)",
                n.op_type,
                n.name
            )));
        }
    }
    Ok(None)
}

/// Whether a node of the model's graph (or of a subgraph) has `op` as its op_type.
fn holds_op(model: &[u8], op: &str) -> std::result::Result<bool, String> {
    let mut r = Reader::new(model, 0, "ModelProto");
    while let Some((field, v, _)) = r.next_field().map_err(|e| e.to_string())? {
        if let (7, Value::Bytes(g)) = (field, v) {
            if graph_holds(g, op, 0)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Subgraphs nest through attributes; a graph deeper than this is refused, not recursed into.
const MAX_DEPTH: usize = 16;

fn graph_holds(g: &[u8], op: &str, depth: usize) -> std::result::Result<bool, String> {
    if depth > MAX_DEPTH {
        return Err(format!("subgraphs nested deeper than {MAX_DEPTH}"));
    }
    let mut r = Reader::new(g, 0, "GraphProto");
    while let Some((field, v, _)) = r.next_field().map_err(|e| e.to_string())? {
        let (1, Value::Bytes(node)) = (field, v) else {
            continue;
        };
        let mut n = Reader::new(node, 0, "NodeProto");
        while let Some((f, v, _)) = n.next_field().map_err(|e| e.to_string())? {
            match (f, v) {
                (4, Value::Bytes(t)) if t == op.as_bytes() => return Ok(true),
                (5, Value::Bytes(attr)) if attribute_holds(attr, op, depth)? => return Ok(true),
                _ => {}
            }
        }
    }
    Ok(false)
}

fn attribute_holds(a: &[u8], op: &str, depth: usize) -> std::result::Result<bool, String> {
    let mut r = Reader::new(a, 0, "AttributeProto");
    while let Some((f, v, _)) = r.next_field().map_err(|e| e.to_string())? {
        if let (6 | 11, Value::Bytes(g)) = (f, v) {
            if graph_holds(g, op, depth + 1)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length-delimited field.
    fn field(n: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![n << 3 | 2, body.len() as u8];
        v.extend_from_slice(body);
        v
    }

    fn node(op: &str) -> Vec<u8> {
        field(1, &[field(3, b"n0"), field(4, op.as_bytes())].concat())
    }

    #[test]
    fn finds_the_op_at_the_top_and_inside_a_subgraph_only() {
        let top = field(7, &[node("MatMul"), node("GroupQueryAttention")].concat());
        assert_eq!(holds_op(&top, LENGTH_MASK_OP), Ok(true));
        let plain = field(7, &[node("MatMul"), node("Softmax")].concat());
        assert_eq!(holds_op(&plain, LENGTH_MASK_OP), Ok(false));
        // an If node whose then-branch (attribute g) holds it
        let branch = field(6, &node("GroupQueryAttention"));
        let if_node = field(1, &[field(4, b"If"), field(5, &branch)].concat());
        assert_eq!(holds_op(&field(7, &if_node), LENGTH_MASK_OP), Ok(true));
        // the name alone is not the op
        let named = field(
            7,
            &field(
                1,
                &[field(3, b"GroupQueryAttention"), field(4, b"Add")].concat(),
            ),
        );
        assert_eq!(holds_op(&named, LENGTH_MASK_OP), Ok(false));
        assert!(holds_op(&[0x3a, 0x7f], LENGTH_MASK_OP).is_err());
    }

    /// A length-delimited field of any length (varint length).
    fn fld(n: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![n << 3 | 2];
        let mut len = body.len();
        while len >= 0x80 {
            v.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        v.push(len as u8);
        v.extend_from_slice(body);
        v
    }

    /// A node with inputs `ins`, outputs `outs`.
    fn node_io(op: &str, ins: &[&str], outs: &[&str]) -> Vec<u8> {
        let mut b: Vec<u8> = Vec::new();
        for i in ins {
            b.extend(fld(1, i.as_bytes()));
        }
        for o in outs {
            b.extend(fld(2, o.as_bytes()));
        }
        b.extend(fld(3, format!("{op}_{}", outs[0]).as_bytes()));
        b.extend(fld(4, op.as_bytes()));
        fld(1, &b)
    }

    fn qdq_line(graph: &[u8]) -> Option<String> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.onnx");
        std::fs::write(&p, fld(7, graph)).unwrap();
        qdq_refusal(&p).unwrap()
    }

    #[test]
    fn qdq_graphs_without_constant_scales_are_named() {
        // a float scale and a uint8 zero point as initializers (TensorProto: name 8, raw 9)
        let init = |name: &str| fld(5, &[fld(8, name.as_bytes()), fld(9, &[0; 4])].concat());
        let inits = [init("s"), init("z")].concat();
        let output = |name: &str| fld(12, &fld(1, name.as_bytes()));
        // the uint8 cache: only the present output is quantised
        let cache = [
            node_io("QuantizeLinear", &["k", "s", "z"], &["present.0.key"]),
            node_io("DequantizeLinear", &["present.0.key", "s", "z"], &["k2"]),
            inits.clone(),
            output("present.0.key"),
        ]
        .concat();
        assert_eq!(qdq_line(&cache), None);
        // an activation quantised inside the graph
        let inside = [
            node_io("QuantizeLinear", &["h", "s", "z"], &["hq"]),
            node_io("DequantizeLinear", &["hq", "s", "z"], &["h2"]),
            inits.clone(),
        ]
        .concat();
        // (the reference computes its grid: kvprobe_reference::onnx_qdq)
        assert_eq!(qdq_line(&inside), None);
        // a scale that is a graph input, not a constant: a QDQ model without scales
        let no_scale = [
            node_io("DequantizeLinear", &["w", "scale_in", "z"], &["w2"]),
            inits,
        ]
        .concat();
        let line = qdq_line(&no_scale).unwrap();
        assert!(
            line.contains(
                "`scale_in` / `z`, not from a constant of the graph (a QDQ model without scales)"
            ),
            "{line}"
        );
        // a graph without Q/DQ nodes
        assert_eq!(qdq_line(&node_io("MatMul", &["a", "b"], &["c"])), None);
    }
}
