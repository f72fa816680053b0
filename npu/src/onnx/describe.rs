//! The [`DeviceDescription`] an ONNX GenAI folder presents to the generic driver: one prefill
//! group of `ctx - 1` rows and one tbt group, embedding rows in, fp16 mask rows, and the past
//! K/V per layer as cache edges (uint8 with its scale for a quantised windowed cache).

use kvprobe_schema::{
    CacheDirection, CacheEdgeDescription, DType, DeviceDescription, GroupKind, ModelShape,
    QuantInfo, RuntimeKind,
};

use super::config::GenaiConfig;
use super::wcache::{WindowCache, ZERO_POINT};
use super::FAMILY;
use crate::contract::describe::{state_edges, StatefulGraph};

/// Names of the driver-side inputs in the description. The embeddings row input carries the
/// rows the generic driver reads from the reference's table; the device turns them back into
/// `input_ids` (host::TokenLookup).
pub const ROWS: &str = "input_ids (as embedding rows)";
pub const POSITIONS: &str = "position_ids";
pub const MASK: &str = "attention_mask (as fp16 rows)";

#[cfg_attr(not(feature = "onnx"), allow(dead_code))]
pub(super) fn description(
    name: String,
    cfg: &GenaiConfig,
    kv_format: &str,
    ctx: usize,
    win: Option<&WindowCache>,
    u16_runner: bool,
) -> DeviceDescription {
    let edges = cache_edges(cfg, kv_format, ctx, win, u16_runner);
    let graph = StatefulGraph {
        model: &name,
        hidden: cfg.hidden_size,
        ctx,
        vocab: cfg.vocab_size,
        names: [ROWS, POSITIONS, MASK],
        embeddings_dtype: DType::F32,
        logits_dtype: DType::F32,
        edges: &edges,
    };
    // GenAI's default decoder runs the whole prompt in one run: one prefill group of ctx − 1 rows
    let groups = vec![
        graph.group(GroupKind::Prefill, ctx - 1),
        graph.group(GroupKind::Tbt, 1),
    ];
    DeviceDescription {
        backend: FAMILY.name.into(),
        runtime: RuntimeKind::HostCache,
        model_name: name,
        cache_len: ctx,
        prefill_len: ctx - 1,
        shape: ModelShape {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            n_layers: cfg.n_layers,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_size,
            rope_theta: None,
        },
        groups,
        weights: kvprobe_schema::DeclaredWeights::Checkpoint,
        arithmetic: kvprobe_schema::DeclaredArithmetic::Float32,
    }
}

/// One input edge per layer's K and V (cache id 2l, 2l+1); with the uint16 runner fault, the
/// runner's past inputs disagree with the graph's presents, declared as outputs.
fn cache_edges(
    cfg: &GenaiConfig,
    kv_format: &str,
    ctx: usize,
    win: Option<&WindowCache>,
    u16_runner: bool,
) -> Vec<CacheEdgeDescription> {
    let entry = cfg.n_kv_heads * cfg.head_size * 2;
    let format = match (&cfg.window, win) {
        (Some(w), Some(c)) => format!(
            "GenAI windowed cache (W {}, C {}): K [H, 1, D, T], V [H, 1, T, D] {}, right-aligned, shown as [kv_heads, max_ctx, head_dim] fp16",
            w.window_size,
            cfg.context_length,
            if c.u8 { "uint8 (zero point 128)" } else { "f32" }
        ),
        // the past is [1, H, S, D]; cache_buffers shows it as the stateful contract's fp16
        _ => kv_format.to_string(),
    };
    let quant = |id: u32| match win {
        Some(c) if c.u8 => QuantInfo {
            scale: c.scales[id as usize],
            zero_point: ZERO_POINT,
            min: -ZERO_POINT * c.scales[id as usize],
            max: (255.0 - ZERO_POINT) * c.scales[id as usize],
        },
        _ => QuantInfo::IDENTITY,
    };
    let mut edges = state_edges(cfg.n_layers, entry, ctx, &format, quant);
    if u16_runner {
        // win-u16-runner: the runner declares the past inputs it fills as uint16 (zero point
        // 32768) while the graph's presents are uint8 (zero point 128)
        let outputs: Vec<CacheEdgeDescription> = edges
            .iter()
            .map(|e| CacheEdgeDescription {
                direction: CacheDirection::Output,
                data_bytes: 1,
                format: Some("the graph's present: uint8, zero point 128".into()),
                ..e.clone()
            })
            .collect();
        for e in &mut edges {
            e.quant.zero_point = 32768.0;
            e.format = Some("the runner's past input: uint16, zero point 32768".into());
        }
        edges.extend(outputs);
    }
    edges
}

/// The default decoder's limits (the stateful defaults: the context refuses); a windowed cache
/// (`win`) also has GenAI's capacity: `search.max_length` L, pads counted (W6), so the longest
/// prompt is L rounded down to whole windows (a longer one is refused, as a step past the
/// context).
pub(super) fn limits(
    desc: &DeviceDescription,
    win: Option<super::window::WindowGeom>,
) -> Vec<kvprobe_schema::DeviceLimit> {
    use kvprobe_schema::{LimitKind, PastLimit};
    let mut out = crate::contract::limits::declared(desc, super::CAPABILITIES.stateful);
    if let Some(g) = win {
        // GenAI ends the request at search.max_length whatever context the runner set up
        // (W6): that is the context a step may not pass
        for l in &mut out {
            if l.kind == LimitKind::MaxContext {
                l.value = l.value.min(g.max_length);
            }
        }
        out.push(crate::contract::limits::limit(
            LimitKind::PromptLen,
            g.max_length / g.window * g.window + 1,
            Some(PastLimit::Refused),
            None,
            "GenAI's windowed cache: the prompt is padded to whole windows of W and the request ends at search.max_length, pads counted (docs/onnx-genai.md W1, W6; contract doc §3 Full context)",
        ));
    }
    out
}
