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
}
