//! What a QDQ graph declares (issue 36; `onnxruntime.quantization`'s QDQ format as
//! scripts/export-qdq.py writes it for QNN): per-tensor uint8 / uint16 grids on its weights and
//! on every activation, read off the graph and placed on the reference's computation.
//!
//! - Weights: every DequantizeLinear of an initializer `<name>_quantized` is the weight `<name>`
//!   of the checkpoint (`….weight.T` transposed back), computed dequantised; `cos_cache` /
//!   `sin_cache` become the RoPE tables.
//! - Activations: the grid of a QuantizeLinear reading a node's output is that node's site when
//!   the node is one the reference computes as one step (qdq.rs names them): a projection (by
//!   its weight), the embedding Gather, a norm's product with its weight, a residual add (an
//!   `Add` reading an o_proj / down_proj output), RoPE's final `Add`, the raw, scaled and masked
//!   scores, softmax and its masked product, SiLU's product and the gate·up product, attention's
//!   output MatMul, and the present outputs; each max-scaled norm and each RoPE op by op (their
//!   inner nodes found from the weight product / the final Add). The layer is the deepest layer
//!   whose weights the node depends on.
//! - The rest is computed in float32: pure moves (counted apart when they keep their input's
//!   grid), SiLU's sigmoid, the past inputs' and their concatenation's grids (a placement of those
//!   moved the decode steps away from the CPU EP device: docs/qnn.md), the mask's cast, the
//!   graph's scalar constants. The declaration says how many grids that leaves.
//!
//! Refused in one line: a per-channel or blocked scale, an integer type other than (u)int8 /
//! (u)int16 (int4 blocks), and weights of another model.

use std::collections::HashMap;
use std::path::Path;

use crate::onnx_proto::{OnnxGraph, INT16, INT8, UINT16, UINT8};
use crate::onnx_qdq_names::norm_site;
use crate::qdq::{Grid, SiteGrids};
use crate::{Error, Result};

mod inner;
use inner::{dequantised, place_inner};

/// One QDQ graph read: its activation grids, its dequantised constants by name, and how many of
/// its activation grids sit at the reference's sites.
pub(crate) struct QdqGraph {
    pub grids: SiteGrids,
    pub constants: Vec<(String, Vec<f32>)>,
    pub placed: usize,
    /// Grids of pure moves (Reshape, Transpose, …) equal to their input's: nothing to compute.
    pub moves: usize,
    pub activations: usize,
}

struct Reader<'a> {
    g: &'a OnnxGraph,
    /// QuantizeLinear by the tensor it reads.
    q_of: HashMap<&'a str, usize>,
    /// The node making each tensor.
    producer: HashMap<&'a str, usize>,
    /// DequantizeLinear outputs of initializers: the initializer's name without `_quantized`.
    constant: HashMap<&'a str, &'a str>,
    /// Per node, the deepest layer whose weights it depends on.
    layer: Vec<Option<usize>>,
}

fn is_qdq(op: &str) -> bool {
    op == "QuantizeLinear" || op == "DequantizeLinear"
}

/// Whether the graph quantises activations (a QuantizeLinear reading a tensor no initializer
/// holds), i.e. is a QDQ graph this module reads.
pub fn is_qdq_graph(g: &OnnxGraph) -> bool {
    g.nodes.iter().any(|n| {
        n.op_type == "QuantizeLinear"
            && n.inputs.first().is_some_and(|i| !g.inits.contains_key(i))
            && n.outputs.iter().any(|o| !g.outputs.contains(o))
    })
}

impl<'a> Reader<'a> {
    fn new(g: &'a OnnxGraph) -> Reader<'a> {
        let mut r = Reader {
            g,
            q_of: HashMap::new(),
            producer: HashMap::new(),
            constant: HashMap::new(),
            layer: vec![None; g.nodes.len()],
        };
        for (i, n) in g.nodes.iter().enumerate() {
            for o in &n.outputs {
                r.producer.insert(o.as_str(), i);
            }
            let first = n.inputs.first().map_or("", String::as_str);
            match n.op_type.as_str() {
                "QuantizeLinear" => {
                    r.q_of.insert(first, i);
                }
                "DequantizeLinear" if g.inits.contains_key(first) => {
                    if let Some(o) = n.outputs.first() {
                        let name = first.strip_suffix("_quantized").unwrap_or(first);
                        r.constant.insert(o.as_str(), name);
                    }
                }
                _ => {}
            }
        }
        for i in 0..g.nodes.len() {
            let mut deepest = None;
            for t in &g.nodes[i].inputs {
                let own = r
                    .constant
                    .get(t.as_str())
                    .and_then(|w| crate::onnx_weights::target("", w))
                    .and_then(|(l, _)| l);
                let up = r.producer.get(t.as_str()).and_then(|&p| r.layer[p]);
                deepest = deepest.max(own).max(up);
            }
            r.layer[i] = deepest;
        }
        r
    }

    /// The tensor `t` was quantised from (through DequantizeLinear / QuantizeLinear pairs).
    fn origin(&self, mut t: &'a str) -> &'a str {
        while let Some(&d) = self.producer.get(t) {
            let n = &self.g.nodes[d];
            if n.op_type != "DequantizeLinear" {
                break;
            }
            let Some(&q) = n.inputs.first().and_then(|i| self.producer.get(i.as_str())) else {
                break;
            };
            if self.g.nodes[q].op_type != "QuantizeLinear" {
                break;
            }
            t = self.g.nodes[q].inputs.first().map_or(t, String::as_str);
        }
        t
    }

    /// The non-Q/DQ node making the value `t` carries.
    fn maker(&self, t: &str) -> Option<usize> {
        self.producer.get(self.origin(t)).copied()
    }

    fn op(&self, t: &str) -> &str {
        self.maker(t)
            .map_or("", |m| self.g.nodes[m].op_type.as_str())
    }

    /// The checkpoint weight a MatMul input is (layer, projection), through its DequantizeLinear.
    fn weight(&self, t: &str) -> Option<(Option<usize>, &'static str)> {
        crate::onnx_weights::target("", self.constant.get(t)?)
    }

    /// The projection of the MatMul node `m` makes, if it multiplies by a weight.
    fn proj_of(&self, m: usize) -> Option<(Option<usize>, &'static str)> {
        let n = &self.g.nodes[m];
        (n.op_type == "MatMul")
            .then(|| self.weight(n.inputs.get(1)?))
            .flatten()
    }

    /// The projection upstream of `t`, following each node's first input.
    fn upstream_proj(&self, t: &str) -> Option<&'static str> {
        let mut m = self.maker(t)?;
        for _ in 0..32 {
            if let Some((_, p)) = self.proj_of(m) {
                return Some(p);
            }
            m = self.maker(self.g.nodes[m].inputs.first()?)?;
        }
        None
    }

    /// The reference's site node `i` computes, if it is one.
    fn site(&self, i: usize) -> Option<(Option<usize>, String)> {
        let n = &self.g.nodes[i];
        let ins: Vec<&str> = n.inputs.iter().map(String::as_str).collect();
        let layer = self.layer[i];
        let at = |s: &str| Some((layer, s.to_string()));
        let made_by = |op: &str| ins.iter().any(|t| self.op(t) == op);
        match n.op_type.as_str() {
            "MatMul" => match self.proj_of(i) {
                Some((None, _)) => Some((None, "logits".into())),
                Some((l, p)) => Some((l, p.into())),
                None if made_by("Softmax") || ins.iter().any(|t| self.is_softmax_mask(t)) => {
                    at("attention output")
                }
                // q · kᵀ before the score scale: the reference's `scores`
                None => at("scores"),
            },
            "Gather" => {
                let w = self.constant.get(*ins.first()?)?;
                w.contains("embed_tokens")
                    .then(|| (None, "embeddings".into()))
            }
            "Mul" => {
                if let Some(norm) = ins
                    .iter()
                    .find_map(|t| self.constant.get(t).and_then(|w| norm_site(w)))
                {
                    return Some(norm);
                }
                if ins.iter().any(|t| self.is_raw_scores(t)) {
                    return at("scores");
                }
                if made_by("Softmax") {
                    return at("softmax");
                }
                if made_by("Sigmoid") {
                    return at("silu");
                }
                let up = ins.iter().any(|t| {
                    self.maker(t)
                        .and_then(|m| self.proj_of(m))
                        .is_some_and(|(_, p)| p == "up_proj")
                });
                up.then(|| (layer, "silu·up".into()))
            }
            "Where" if ins.get(1).is_some_and(|t| self.site_is(t, "scores")) => at("scores"),
            "Softmax" => at("softmax"),
            "Add" => {
                let after = ins.iter().find_map(|t| {
                    let (_, p) = self.proj_of(self.maker(t)?)?;
                    ["o_proj", "down_proj"].contains(&p).then_some(p)
                });
                if let Some(p) = after {
                    return at(&format!("residual add after {p}"));
                }
                if ins.len() == 2 && ins.iter().all(|t| self.op(t) == "Mul") {
                    return match self.upstream_proj(ins[0])? {
                        "q_proj" => at("rope q"),
                        "k_proj" => at("rope k"),
                        _ => None,
                    };
                }
                None
            }
            _ => None,
        }
    }

    /// The value of the one-value constant `t` (through its DequantizeLinear).
    fn scalar(&self, t: &str) -> Option<f32> {
        self.constant.get(t)?;
        let d = *self.producer.get(t)?;
        let init = self.g.nodes[d].inputs.first()?;
        let grid = self.grid(d).ok()?;
        let width = if grid.hi > 255 { 2 } else { 1 };
        let b = self.g.bytes(init, 1, width).ok()?;
        let q = match width {
            1 => i32::from(b[0]),
            _ => i32::from(u16::from_le_bytes([b[0], b[1]])),
        };
        Some((q - grid.zero) as f32 * grid.scale)
    }

    /// The inner ops of the RoPE whose final Add is node `add`: `x·cos + rotate_half(x)·sin`
    /// with rotate_half(x) = Concat(Neg(x₂), x₁), and the tables' Gather → Concat → Unsqueeze
    /// (`table cos` / `table sin`); None if its graph is another.
    fn rope_ops(&self, add: usize) -> Option<Vec<(&'static str, usize)>> {
        let node = |i: usize| &self.g.nodes[i];
        let step = |t: &str, op: &str| self.maker(t).filter(|&m| node(m).op_type == op);
        let input = |i: usize, k: usize| node(i).inputs.get(k).map(String::as_str);
        let x_cos = step(input(add, 0)?, "Mul")?;
        let x_sin = step(input(add, 1)?, "Mul")?;
        let rotated = step(input(x_sin, 0)?, "Concat")?;
        let neg = step(input(rotated, 0)?, "Neg")?;
        let mut out = vec![
            ("x·cos", x_cos),
            ("−x₂", neg),
            ("rotated", rotated),
            ("x·sin", x_sin),
        ];
        for (mul, table) in [(x_cos, "table cos"), (x_sin, "table sin")] {
            let un = step(input(mul, 1)?, "Unsqueeze")?;
            let cat = step(input(un, 0)?, "Concat")?;
            let gather = step(input(cat, 0)?, "Gather")?;
            out.extend([(table, gather), (table, cat), (table, un)]);
        }
        Some(out)
    }

    /// The inner ops of the max-scaled norm whose weight product is node `mul`, as the
    /// reference names them (arith.rs `rms_norm`), in graph order; None if its graph is another.
    fn norm_ops(&self, mul: usize) -> Option<Vec<(&'static str, usize)>> {
        let node = |i: usize| &self.g.nodes[i];
        let step = |t: &str, op: &str| self.maker(t).filter(|&m| node(m).op_type == op);
        let input = |i: usize, k: usize| node(i).inputs.get(k).map(String::as_str);
        let x_den = node(mul).inputs.iter().find_map(|t| step(t, "Div"))?;
        let den = step(input(x_den, 1)?, "Mul")?;
        let r = step(input(den, 0)?, "Sqrt")?;
        let mx = step(input(r, 0)?, "Max")?;
        let rmx = step(input(mx, 0)?, "ReduceMax")?;
        let abs = step(input(rmx, 0)?, "Abs")?;
        let s = step(input(den, 1)?, "Sqrt")?;
        let add = step(input(s, 0)?, "Add")?;
        let mean = step(input(add, 0)?, "ReduceMean")?;
        let e = step(input(add, 1)?, "Div")?;
        let sq = step(input(mean, 0)?, "Mul")?;
        let y = step(input(sq, 0)?, "Div")?;
        Some(vec![
            ("max", abs),
            ("max", rmx),
            ("max", mx),
            ("sqrt(max)", r),
            ("eps/m", e),
            ("x/√m", y),
            ("y·y", sq),
            ("mean(y·y)", mean),
            ("mean + eps", add),
            ("sqrt", s),
            ("denominator", den),
            ("x/den", x_den),
        ])
    }

    /// Node `i` only moves values (Reshape, Transpose, Slice, Expand, (Un)squeeze) and its
    /// QuantizeLinear `q` keeps its input's grid.
    fn keeps_grid(&self, i: usize, q: usize) -> bool {
        let n = &self.g.nodes[i];
        let moves = [
            "Reshape",
            "Transpose",
            "Slice",
            "Expand",
            "Unsqueeze",
            "Squeeze",
        ];
        let d = n.inputs.first().and_then(|t| self.producer.get(t.as_str()));
        moves.contains(&n.op_type.as_str())
            && d.is_some_and(|&d| {
                self.g.nodes[d].op_type == "DequantizeLinear"
                    && self.grid(d).ok() == self.grid(q).ok()
            })
    }

    /// `t` is a weightless MatMul's output (q · kᵀ before its scale).
    fn is_raw_scores(&self, t: &str) -> bool {
        self.maker(t)
            .is_some_and(|m| self.g.nodes[m].op_type == "MatMul" && self.proj_of(m).is_none())
    }

    /// `t` is softmax's output times the mask (a Mul reading a Softmax).
    fn is_softmax_mask(&self, t: &str) -> bool {
        self.maker(t).is_some_and(|m| {
            let n = &self.g.nodes[m];
            n.op_type == "Mul" && n.inputs.iter().any(|u| self.op(u) == "Softmax")
        })
    }

    fn site_is(&self, t: &str, site: &str) -> bool {
        self.maker(t)
            .and_then(|m| self.site(m))
            .is_some_and(|(_, s)| s == site)
    }

    /// The per-tensor grid of QuantizeLinear `q`, or the one line refusing it.
    fn grid(&self, q: usize) -> std::result::Result<Grid, String> {
        let n = &self.g.nodes[q];
        let name = |i: usize| n.inputs.get(i).map_or("", String::as_str);
        if n.ints.contains_key("block_size") || n.other_attrs.iter().any(|a| a == "block_size") {
            return Err(format!("{} `{}` quantises in blocks", n.op_type, n.name));
        }
        let scale = self.g.bytes(name(1), 1, 4).map_err(|_| {
            format!(
                "{} `{}` has a per-channel scale (`{}` is not one value)",
                n.op_type,
                n.name,
                name(1)
            )
        })?;
        let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
        let zp = name(2);
        let dt = self.g.inits.get(zp).map_or(UINT8, |i| i.data_type);
        let (lo, hi, width) = match dt {
            UINT8 => (0, 255, 1),
            INT8 => (-128, 127, 1),
            UINT16 => (0, 65535, 2),
            INT16 => (-32768, 32767, 2),
            t => return Err(format!("{} `{}` quantises to ONNX type {t} (the reference computes uint8, int8, uint16 and int16 grids)", n.op_type, n.name)),
        };
        let zero = if zp.is_empty() {
            0
        } else {
            let b = self
                .g
                .bytes(zp, 1, width)
                .map_err(|_| format!("{} `{}` has a per-channel zero point", n.op_type, n.name))?;
            match dt {
                UINT8 => i32::from(b[0]),
                INT8 => i32::from(b[0] as i8),
                UINT16 => i32::from(u16::from_le_bytes([b[0], b[1]])),
                _ => i32::from(i16::from_le_bytes([b[0], b[1]])),
            }
        };
        if !(scale.is_finite() && scale > 0.0) {
            return Err(format!("{} `{}` has the scale {scale}", n.op_type, n.name));
        }
        Ok(Grid {
            scale,
            zero,
            lo,
            hi,
        })
    }
}

/// Reads the QDQ graph at `path`; `Error::Unsupported` (one line) for what the reference does
/// not compute.
pub(crate) fn read(path: &Path) -> Result<QdqGraph> {
    let g = OnnxGraph::read(path)?;
    let refuse = |what: String| Error::Unsupported {
        path: path.to_path_buf(),
        what,
    };
    let r = Reader::new(&g);
    let mut grids = SiteGrids::new();
    let (mut placed, mut moves, mut activations) = (0, Vec::new(), 0);
    let mut score_scale = None;
    for (i, n) in g.nodes.iter().enumerate() {
        if is_qdq(&n.op_type) {
            if n.op_type == "QuantizeLinear" && !g.inits.contains_key(&n.inputs[0]) {
                activations += 1;
            }
            continue;
        }
        let Some(&q) = n.outputs.first().and_then(|o| r.q_of.get(o.as_str())) else {
            continue;
        };
        if let Some(site) = r.site(i) {
            let mut grid = r.grid(q).map_err(refuse)?;
            if site.1 == "scores" && n.op_type != "MatMul" {
                // the scaled (Mul) and masked (Where) scores: the reference holds the scores
                // before the scale, so the grid's step is taken back by the graph's scale
                if n.op_type == "Mul" {
                    score_scale = n.inputs.iter().find_map(|t| r.scalar(t));
                }
                let a = score_scale.ok_or_else(|| {
                    refuse(format!(
                        "`{}` scales the scores by no constant the reference reads",
                        n.name
                    ))
                })?;
                grid.scale /= a;
            }
            grids.entry(site).or_default().push(grid);
            placed += 1;
        } else if r.keeps_grid(i, q) {
            moves.push(i);
        }
    }
    let inner = place_inner(&r, &g, &mut grids).map_err(refuse)?;
    placed += inner.len();
    // a move placed as a norm's or RoPE's inner op (the tables' Unsqueeze) counts once
    let moves = moves.iter().filter(|i| !inner.contains(i)).count();
    // the presents as the graph writes them: the grid in front of each output
    for o in &g.outputs {
        let Some(rest) = o.strip_prefix("present.") else {
            continue;
        };
        let (l, kind) = rest.split_once('.').unwrap_or(("", ""));
        let site = if kind == "key" {
            "present k"
        } else {
            "present v"
        };
        let q = r
            .producer
            .get(o.as_str())
            .and_then(|&d| g.nodes[d].inputs.first())
            .and_then(|t| r.producer.get(t.as_str()).copied())
            .filter(|&q| g.nodes[q].op_type == "QuantizeLinear");
        if let (Some(q), Ok(l)) = (q, l.parse::<usize>()) {
            grids.insert((Some(l), site.into()), vec![r.grid(q).map_err(refuse)?]);
            placed += 1;
        }
    }
    let constants = dequantised(&r, &g).map_err(refuse)?;
    Ok(QdqGraph {
        grids,
        constants,
        placed,
        moves,
        activations,
    })
}
