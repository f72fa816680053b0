//! Where ONNX Runtime's CPU execution provider holds an fp16 graph's values in fp16 (issue 35),
//! derived from the graph's own ops and element types.
//!
//! On x86-64 ONNX Runtime runs most of an fp16 graph in float32 (onnxruntime
//! `core/optimizer/insert_cast_transformer.cc`, docs/onnx-genai.md): a node with an fp16 input
//! and no fp16 CPU kernel gets Casts to float32 around it; a node that has an fp16 kernel but
//! sits between such nodes is forced to float32 too (`ForceSingleNodeCPUFloat16ToFloat32`, the
//! rule at [`Flow::assign`]); then `RemoveDuplicateCastTransformer` drops every float32 → fp16 →
//! float32 Cast pair (fp16 and float32 are one type group there). So a value is rounded to fp16
//! exactly where the node that makes it or a node that reads it runs its fp16 kernel, or where
//! it is a graph output.
//!
//! The reference's rounding sites (`kvprobe_reference::arith::SITES`) are placed on the graph by
//! the ops that make them: the norms, the projections (by the model builder's names, as the
//! MatMulNBits weights are), the RotaryEmbedding nodes, the attention op, the MLP's product and
//! the present outputs. A site is declared rounded when it is rounded at every place it occurs;
//! a site the graph does not show is computed in float32.

use std::collections::HashMap;

use kvprobe_reference::onnx_proto::{Node, OnnxGraph, FLOAT, FLOAT16};

/// Ops ONNX Runtime's CPU EP (1.31, x86-64) has an fp16 (MLFloat16) kernel for, among the ops
/// the model builder's fp16 exports hold. The data-movement ops are type-generic; the fused
/// norms and RotaryEmbedding register MLFloat16 (`contrib_ops/cpu`); MatMul, Gemm, the
/// element-wise math, Softmax, Sigmoid, QuickGelu and MultiHeadAttention do not on x86-64 (MLAS
/// has fp16 GEMM and vector kernels on ARM64 only). Checked against the optimized graph ONNX
/// Runtime itself writes for the builder's fp16 export (scripts/ort-cpu-fp16-sites.py --graph).
const FP16_KERNELS: &[&str] = &[
    "Cast",
    "Concat",
    "Expand",
    "Flatten",
    "Gather",
    "Identity",
    "Reshape",
    "Shape",
    "Slice",
    "Split",
    "Squeeze",
    "Transpose",
    "Unsqueeze",
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RotaryEmbedding",
];

/// Ops that only move values: a value passing through one is still the same site.
const MOVES: &[&str] = &[
    "Concat",
    "Expand",
    "Flatten",
    "Identity",
    "Reshape",
    "Slice",
    "Split",
    "Squeeze",
    "Transpose",
    "Unsqueeze",
];

/// Ops whose outputs are integers or booleans whatever their inputs.
const NON_FLOAT_OUT: &[&str] = &[
    "Shape",
    "Size",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "Not",
    "And",
    "Or",
    "ArgMax",
    "ArgMin",
    "NonZero",
];

const NORMS: &[&str] = &[
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
];

const ATTENTION: &[&str] = &["MultiHeadAttention", "GroupQueryAttention", "Attention"];

/// What the CPU EP computes the graph in, as the reference's sites.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct CpuFp16 {
    /// The reference's sites held in fp16 (at every place they occur).
    pub rounded: Vec<&'static str>,
    /// Every norm after a residual add is a SkipSimplifiedLayerNormalization run in fp16: it
    /// normalises the float32 sum of its fp16 inputs and rounds the sum it passes on separately.
    pub skip_sum_f32: bool,
    /// The RotaryEmbedding cos/sin caches are fp16 initializers.
    pub rope_tables_fp16: bool,
}

struct Flow<'a> {
    nodes: &'a [Node],
    types: HashMap<&'a str, i32>,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    outputs: Vec<&'a str>,
    /// Whether node i runs its fp16 kernel (after the isolated-node rule).
    fp16: Vec<bool>,
}

impl<'a> Flow<'a> {
    fn new(g: &'a OnnxGraph) -> Flow<'a> {
        let nodes = &g.nodes[..];
        let mut types: HashMap<&str, i32> = g
            .declared_types
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        for (k, i) in &g.inits {
            types.insert(k.as_str(), i.data_type);
        }
        let (mut producer, mut consumers) = (HashMap::new(), HashMap::<&str, Vec<usize>>::new());
        for (i, n) in nodes.iter().enumerate() {
            for inp in n.inputs.iter().filter(|s| !s.is_empty()) {
                consumers.entry(inp.as_str()).or_default().push(i);
            }
            // an output without a declared type: a Cast's `to`, an integer op's integer, else
            // the float type of its inputs (the builder's ops keep their input's type)
            let float_in = n
                .inputs
                .iter()
                .filter_map(|s| types.get(s.as_str()).copied())
                .find(|t| *t == FLOAT16 || *t == FLOAT);
            for o in &n.outputs {
                producer.insert(o.as_str(), i);
                if types.contains_key(o.as_str()) {
                    continue;
                }
                let t = if n.op_type == "Cast" {
                    n.ints.get("to").map(|&t| t as i32)
                } else if NON_FLOAT_OUT.contains(&n.op_type.as_str()) {
                    None
                } else {
                    float_in
                };
                if let Some(t) = t {
                    types.insert(o.as_str(), t);
                }
            }
        }
        let mut f = Flow {
            nodes,
            types,
            producer,
            consumers,
            outputs: g.outputs.iter().map(String::as_str).collect(),
            fp16: Vec::new(),
        };
        f.fp16 = f.assign();
        f
    }

    fn is_fp16(&self, v: &str) -> bool {
        self.types.get(v) == Some(&FLOAT16)
    }

    fn has_fp16_input(&self, n: &Node) -> bool {
        n.inputs.iter().any(|s| self.is_fp16(s))
    }

    /// InsertCastTransformer's placement: nodes with fp16 inputs run fp16 where a kernel
    /// exists; then an isolated one runs in float32 (in node order, as ONNX Runtime walks them,
    /// each decision seeing the earlier ones): it writes no graph output, its fp16 inputs that
    /// come from nodes all come from nodes cast to float32 (initializers and graph inputs do not
    /// count), and every reader of its fp16 outputs is cast to float32. That is the rule ONNX
    /// Runtime 1.32's optimized graph of the builder's fp16 export shows (the q path's
    /// RotaryEmbedding, between two MatMul-fed float32 nodes, runs in float32 though its cos/sin
    /// caches are fp16 initializers; the k path's, read by the fp16 present's Reshape, in fp16).
    fn assign(&self) -> Vec<bool> {
        let mut fp16: Vec<bool> = self
            .nodes
            .iter()
            .map(|n| self.has_fp16_input(n) && FP16_KERNELS.contains(&n.op_type.as_str()))
            .collect();
        if self.nodes.len() <= 1 {
            return fp16;
        }
        let needs_cast = |fp16: &[bool], i: usize| !fp16[i] && self.has_fp16_input(&self.nodes[i]);
        for i in 0..self.nodes.len() {
            let n = &self.nodes[i];
            if !fp16[i] || n.outputs.iter().any(|o| self.outputs.contains(&o.as_str())) {
                continue;
            }
            let makers: Vec<usize> = n
                .inputs
                .iter()
                .filter(|s| self.is_fp16(s))
                .filter_map(|s| self.producer.get(s.as_str()).copied())
                .collect();
            let readers: Vec<usize> = n
                .outputs
                .iter()
                .filter(|o| self.is_fp16(o))
                .filter_map(|o| self.consumers.get(o.as_str()))
                .flatten()
                .copied()
                .collect();
            let cast_around =
                |xs: &[usize]| !xs.is_empty() && xs.iter().all(|&p| needs_cast(&fp16, p));
            if cast_around(&makers) && cast_around(&readers) {
                fp16[i] = false;
            }
        }
        fp16
    }

    /// Whether output `slot` of node `i` is held in fp16 where it is read: it is fp16 in the
    /// graph and the node that makes it or one that reads it runs fp16, or it is a graph output;
    /// through a node that only moves it, the question goes on to that node's readers.
    fn read_rounded(&self, i: usize, slot: usize) -> bool {
        let Some(v) = self.nodes[i].outputs.get(slot).map(String::as_str) else {
            return false;
        };
        if !self.is_fp16(v) {
            return false;
        }
        if self.fp16[i] || self.outputs.contains(&v) {
            return true;
        }
        self.consumers.get(v).is_some_and(|cs| {
            cs.iter().any(|&c| {
                self.fp16[c]
                    || (MOVES.contains(&self.nodes[c].op_type.as_str())
                        && (0..self.nodes[c].outputs.len()).any(|s| self.read_rounded(c, s)))
            })
        })
    }

    /// The node making `v`, looked for upstream through nodes that only move values.
    fn maker(&self, v: &str) -> Option<usize> {
        let mut p = *self.producer.get(v)?;
        while MOVES.contains(&self.nodes[p].op_type.as_str()) {
            p = *self.producer.get(self.nodes[p].inputs.first()?.as_str())?;
        }
        Some(p)
    }
}

/// Places every site on the graph and keeps the ones rounded wherever they occur.
pub(super) fn derive(g: &OnnxGraph) -> CpuFp16 {
    let f = Flow::new(g);
    // per site: was it found, is it rounded at every place
    let mut seen: HashMap<&'static str, bool> = HashMap::new();
    let mut mark = |site: &'static str, rounded: bool| {
        let e = seen.entry(site).or_insert(true);
        *e &= rounded;
    };
    let mut skip_norms = (0, 0);
    let mut rope_fp16 = (0, 0);
    for (i, n) in f.nodes.iter().enumerate() {
        let op = n.op_type.as_str();
        if op == "Gather" && n.name.contains("embed_tokens") {
            mark("embeddings", f.read_rounded(i, 0));
        } else if NORMS.contains(&op) {
            mark("norm output", f.read_rounded(i, 0));
            if op.starts_with("Skip") {
                skip_norms.0 += 1;
                skip_norms.1 += usize::from(op == "SkipSimplifiedLayerNormalization" && f.fp16[i]);
                // output 3 is the residual sum the next block carries on
                if n.outputs.get(3).is_some_and(|o| !o.is_empty()) {
                    mark("residual add", f.read_rounded(i, 3));
                }
            }
        } else if op == "RotaryEmbedding" {
            let site = if n.name.contains("q_rot") {
                "rope q"
            } else if n.name.contains("k_rot") {
                "rope k"
            } else {
                continue;
            };
            mark(site, f.read_rounded(i, 0));
            rope_fp16.0 += 1;
            rope_fp16.1 += usize::from(
                n.inputs
                    .get(2..4)
                    .is_some_and(|cs| cs.iter().all(|c| f.is_fp16(c))),
            );
        } else if ATTENTION.contains(&op) {
            mark("scores", f.fp16[i]);
            mark("softmax", f.fp16[i]);
            mark("attention output", f.read_rounded(i, 0));
        } else if op.starts_with("MatMul") {
            let weight = n.inputs.get(1).map_or("", String::as_str);
            match kvprobe_reference::onnx_weights::target(&n.name, weight) {
                Some((None, _)) => mark("logits", f.read_rounded(i, 0)),
                Some((Some(_), "qkv_proj")) => {
                    let r = f.read_rounded(i, 0);
                    for s in ["q_proj", "k_proj", "v_proj"] {
                        mark(s, r);
                    }
                }
                Some((Some(_), proj)) => {
                    mark(proj, f.read_rounded(i, 0));
                    if proj == "down_proj" {
                        // the MLP's product feeds down_proj; SiLU is its other factor
                        if let Some(p) = n.inputs.first().and_then(|s| f.maker(s)) {
                            mark("silu·up", f.read_rounded(p, 0));
                            let up = f.nodes[p].inputs.iter().find_map(|s| {
                                let m = f.maker(s)?;
                                let is_up = f.nodes[m].name.contains("up_proj");
                                (!is_up).then_some(m)
                            });
                            if let Some(s) = up {
                                mark("silu", f.read_rounded(s, 0));
                            }
                        }
                    }
                }
                None => {}
            }
        }
    }
    for o in &f.outputs {
        if o.starts_with("present") {
            let site = if o.ends_with("key") {
                "present k"
            } else {
                "present v"
            };
            mark(site, f.is_fp16(o));
        }
    }
    let sites = kvprobe_reference::arith::SITES;
    CpuFp16 {
        rounded: sites
            .iter()
            .copied()
            .filter(|s| seen.get(s) == Some(&true))
            .collect(),
        skip_sum_f32: skip_norms.0 > 0 && skip_norms.0 == skip_norms.1,
        rope_tables_fp16: rope_fp16.0 > 0 && rope_fp16.0 == rope_fp16.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> Node {
        Node {
            op_type: op.into(),
            name: name.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            ..Node::default()
        }
    }

    /// One layer as the model builder writes it for `-p fp16 -e cpu` (MultiHeadAttention, the
    /// present made by Concat and read back through repeat_kv's Reshape, Sigmoid·Mul SiLU), the
    /// weights and graph I/O typed `elem`.
    fn builder_layer(elem: i32) -> OnnxGraph {
        let l = "/model/layers.0";
        let nodes = vec![
            node(
                "Gather",
                "/model/embed_tokens/Gather",
                &["W_emb", "input_ids"],
                &["e"],
            ),
            node(
                "SimplifiedLayerNormalization",
                &format!("{l}/input_layernorm/LayerNorm"),
                &["e", "W_n1"],
                &["h"],
            ),
            node(
                "MatMul",
                &format!("{l}/attn/q_proj/MatMul"),
                &["h", "W_q"],
                &["q"],
            ),
            node(
                "MatMul",
                &format!("{l}/attn/k_proj/MatMul"),
                &["h", "W_k"],
                &["k"],
            ),
            node(
                "MatMul",
                &format!("{l}/attn/v_proj/MatMul"),
                &["h", "W_v"],
                &["v"],
            ),
            node(
                "RotaryEmbedding",
                &format!("{l}/attn/q_rotary/RotaryEmbedding"),
                &["q", "position_ids", "cos_cache", "sin_cache"],
                &["qr"],
            ),
            node(
                "RotaryEmbedding",
                &format!("{l}/attn/k_rotary/RotaryEmbedding"),
                &["k", "position_ids", "cos_cache", "sin_cache"],
                &["kr"],
            ),
            node(
                "Reshape",
                &format!("{l}/attn/k_proj/repeat_kv/Reshape_1"),
                &["kr", "shape"],
                &["kr4"],
            ),
            node(
                "Concat",
                &format!("{l}/attn/k_proj/repeat_kv/Concat_1"),
                &["past_key_values.0.key", "kr4"],
                &["present.0.key"],
            ),
            node(
                "Reshape",
                &format!("{l}/attn/k_proj/repeat_kv/Reshape_4"),
                &["present.0.key", "shape"],
                &["kk"],
            ),
            node(
                "Reshape",
                &format!("{l}/attn/v_proj/repeat_kv/Reshape_1"),
                &["v", "shape"],
                &["v4"],
            ),
            node(
                "Concat",
                &format!("{l}/attn/v_proj/repeat_kv/Concat_1"),
                &["past_key_values.0.value", "v4"],
                &["present.0.value"],
            ),
            node(
                "Reshape",
                &format!("{l}/attn/v_proj/repeat_kv/Reshape_4"),
                &["present.0.value", "shape"],
                &["vv"],
            ),
            node(
                "MultiHeadAttention",
                &format!("{l}/attn/MultiHeadAttention"),
                &["qr", "kk", "vv"],
                &["a"],
            ),
            node(
                "MatMul",
                &format!("{l}/attn/o_proj/MatMul"),
                &["a", "W_o"],
                &["o"],
            ),
            node(
                "SkipSimplifiedLayerNormalization",
                &format!("{l}/post_attention_layernorm/SkipLayerNorm"),
                &["e", "o", "W_n2"],
                &["h2", "", "", "s"],
            ),
            node(
                "MatMul",
                &format!("{l}/mlp/gate_proj/MatMul"),
                &["h2", "W_g"],
                &["g"],
            ),
            node(
                "MatMul",
                &format!("{l}/mlp/up_proj/MatMul"),
                &["h2", "W_u"],
                &["u"],
            ),
            node(
                "Sigmoid",
                &format!("{l}/mlp/act_fn/Sigmoid"),
                &["g"],
                &["sg"],
            ),
            node("Mul", &format!("{l}/mlp/act_fn/Mul"), &["g", "sg"], &["si"]),
            node("Mul", &format!("{l}/mlp/Mul"), &["si", "u"], &["p"]),
            node(
                "MatMul",
                &format!("{l}/mlp/down_proj/MatMul"),
                &["p", "W_d"],
                &["d"],
            ),
            node(
                "SkipSimplifiedLayerNormalization",
                "/model/layers.1/final_norm_layernorm/SkipLayerNorm",
                &["s", "d", "W_n"],
                &["hn"],
            ),
            node("MatMul", "/lm_head/MatMul", &["hn", "W_lm"], &["logits"]),
        ];
        let mut declared_types: HashMap<String, i32> = [
            "W_emb",
            "W_n1",
            "W_q",
            "W_k",
            "W_v",
            "cos_cache",
            "sin_cache",
            "W_o",
            "W_n2",
            "W_g",
            "W_u",
            "W_d",
            "W_n",
            "W_lm",
            "past_key_values.0.key",
            "past_key_values.0.value",
            "logits",
            "present.0.key",
            "present.0.value",
        ]
        .into_iter()
        .map(|s| (s.to_string(), elem))
        .collect();
        for s in ["input_ids", "position_ids", "shape"] {
            declared_types.insert(s.into(), 7);
        }
        OnnxGraph {
            path: "model.onnx".into(),
            nodes,
            inits: HashMap::new(),
            outputs: ["logits", "present.0.key", "present.0.value"]
                .map(String::from)
                .to_vec(),
            declared_types,
        }
    }

    #[test]
    fn the_builder_fp16_layer_keeps_fp16_where_onnx_runtime_does() {
        let cpu = derive(&builder_layer(FLOAT16));
        // what ONNX Runtime 1.32's optimized graph of the builder's fp16 export shows
        // (scripts/ort-cpu-fp16-sites.py --graph): MatMul, MultiHeadAttention, the SiLU and
        // the q RotaryEmbedding in float32; the norms, the k RotaryEmbedding and the present's
        // moves in fp16; Casts to fp16 before each fp16 reader and graph output
        assert_eq!(
            cpu.rounded,
            [
                "embeddings",
                "norm output",
                "k_proj",
                "v_proj",
                "rope k",
                "o_proj",
                "residual add",
                "down_proj",
                "logits",
                "present k",
                "present v"
            ]
        );
        assert!(cpu.skip_sum_f32 && cpu.rope_tables_fp16);
        // the same graph in float32 holds no fp16 anywhere
        let f32 = derive(&builder_layer(FLOAT));
        assert!(f32.rounded.is_empty(), "{:?}", f32.rounded);
        assert!(!f32.skip_sum_f32 && !f32.rope_tables_fp16);
    }

    #[test]
    fn an_isolated_fp16_node_runs_in_float32_and_a_graph_output_stays_fp16() {
        // MatMul → RotaryEmbedding → MultiHeadAttention: the rotary node is between two nodes
        // cast to float32, so it runs in float32 too; feeding a graph output keeps it fp16
        let mut g = builder_layer(FLOAT16);
        let f = Flow::new(&g);
        let rope_q = g
            .nodes
            .iter()
            .position(|n| n.name.contains("q_rotary"))
            .unwrap();
        let rope_k = g
            .nodes
            .iter()
            .position(|n| n.name.contains("k_rotary"))
            .unwrap();
        assert!(!f.fp16[rope_q] && f.fp16[rope_k]);
        g.nodes[rope_q].outputs = vec!["qr_out".into()];
        g.outputs.push("qr_out".into());
        g.declared_types.insert("qr_out".into(), FLOAT16);
        let f = Flow::new(&g);
        assert!(f.fp16[rope_q]);
    }
}
