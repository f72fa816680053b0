//! What a HEF implies for the device contract: the schema `DeviceDescription` (L, P, groups,
//! cache edges with their declared quant) and a sim manifest mirroring its geometry and layouts.

use super::error::{HefError, Result};
use super::formats;
use super::lint::Facts;
use super::model::{CacheEdge, Group, Hef, Layer};
use super::roles;
use crate::rope::RopeTheta;
use kvprobe_schema::{
    CacheEdgeDescription, DType, DeviceDescription, EdgeLayout, GroupDescription, GroupKind,
    InputRole, IoDescription, ModelIdentity, ModelShape, NamedQuant, SimManifest, SCHEMA_VERSION,
};

/// The longest ring a genai device is described with: in and out are narrowed to 16 bits
/// (contract §1.2), the same bound the emulator's `--cache-len` has.
const MAX_CACHE_LEN: usize = 65535;

fn dtype_of(data_bytes: u32) -> DType {
    if data_bytes == 2 {
        DType::U16
    } else {
        DType::U8
    }
}

fn io(layer: &Layer, role: Option<InputRole>, output: bool) -> IoDescription {
    let device_dtype = dtype_of(layer.data_bytes);
    // The server's overrides (contract §2.1): pe inputs and all outputs are FLOAT32 on the host;
    // embeddings and mask keep the hardware type.
    let host_dtype = match role {
        Some(InputRole::Embeddings) | Some(InputRole::AttentionMask) => device_dtype,
        _ if output => DType::F32,
        Some(_) => DType::F32,
        None => device_dtype,
    };
    IoDescription {
        name: layer.name.clone(),
        role,
        shape: layer.shape.map(|x| x as usize),
        host_dtype,
        device_dtype,
        quant: layer.quant,
    }
}

fn cache_edge(e: &CacheEdge) -> Result<CacheEdgeDescription> {
    let cache_id = u32::try_from(e.cache_id).map_err(|_| {
        HefError::NotDescribable(format!(
            "negative cache_id {} on edge {}",
            e.cache_id, e.name
        ))
    })?;
    Ok(CacheEdgeDescription {
        cache_id,
        direction: e.direction,
        entry_size: e.entry_size,
        padded_entry_size: e.padded_entry_size,
        length: e.length,
        data_bytes: e.data_bytes as usize,
        quant: e.quant,
        format: e.format_name.map(str::to_string),
        layer: None,
        kind: None,
    })
}

fn group_desc(g: &Group, kind: GroupKind, rows: usize, facts: &Facts) -> Result<GroupDescription> {
    let cfg = facts.config();
    Ok(GroupDescription {
        name: g.name.clone(),
        kind,
        rows,
        inputs: g
            .inputs
            .iter()
            .map(|l| io(l, roles::role_of(g, cfg, &l.name), false))
            .collect(),
        outputs: g.outputs.iter().map(|l| io(l, None, true)).collect(),
        cache_edges: g
            .cache_edges
            .iter()
            .map(cache_edge)
            .collect::<Result<_>>()?,
        taps: Vec::new(),
    })
}

/// The genai view of the HEF. Fails when no prefill group resolves or the cache length is not
/// one value (the lint says why in detail).
pub fn to_device_description(hef: &Hef) -> Result<DeviceDescription> {
    let facts = Facts::new(hef);
    let prefill = facts.prefill.ok_or_else(|| {
        HefError::NotDescribable(format!(
            "no group ends with \"{}\"",
            facts.roles.prefill_suffix
        ))
    })?;
    let mut lengths: Vec<usize> = Vec::new();
    for g in [Some(prefill), facts.tbt].into_iter().flatten() {
        for id in g.cache_edges.iter().map(|e| e.cache_id) {
            let len = g
                .cache_edges
                .iter()
                .filter(|e| e.cache_id == id)
                .try_fold(0usize, |sum, e| sum.checked_add(e.length))
                .filter(|&l| l <= MAX_CACHE_LEN)
                .ok_or_else(|| {
                    HefError::NotDescribable(format!(
                        "group \"{}\" cache {id} is longer than {MAX_CACHE_LEN} entries (HailoRT keeps window lengths ≤ 65535, contract §1.2)",
                        g.name
                    ))
                })?;
            lengths.push(len);
        }
    }
    lengths.sort_unstable();
    lengths.dedup();
    let cache_len = match lengths.as_slice() {
        [l] => *l,
        [] => {
            return Err(HefError::NotDescribable(
                "the prefill group has no cache edges".into(),
            ))
        }
        more => {
            return Err(HefError::NotDescribable(format!(
                "cache lengths differ: {more:?}"
            )))
        }
    };
    let p = facts.p();
    let mut groups = vec![group_desc(prefill, GroupKind::Prefill, p, &facts)?];
    if let Some(t) = facts.tbt {
        groups.push(group_desc(t, GroupKind::Tbt, 1, &facts)?);
    }
    let cfg = facts.config();
    let hidden = roles::input_for(prefill, cfg, InputRole::Embeddings)
        .map(|l| l.shape[2] as usize)
        .unwrap_or(0);
    let vocab: usize = prefill.outputs.iter().map(|o| o.shape[2] as usize).sum();
    let ids: std::collections::BTreeSet<i32> =
        prefill.cache_edges.iter().map(|e| e.cache_id).collect();
    let head_dim = facts.theta.as_ref().map(Vec::len).unwrap_or(0);
    Ok(DeviceDescription {
        runtime: kvprobe_schema::RuntimeKind::GenaiRing,
        backend: "hailo".into(),
        model_name: roles::scope(&prefill.name).to_string(),
        cache_len,
        prefill_len: p,
        shape: ModelShape {
            vocab_size: vocab,
            hidden_size: hidden,
            // One K and one V cache per layer is the genai export's convention [implied].
            n_layers: ids.len() / 2,
            n_heads: facts.nh(),
            n_kv_heads: facts.nkv(),
            head_dim,
            rope_theta: facts.theta.clone(),
        },
        groups,
        weights: kvprobe_schema::DeclaredWeights::Checkpoint,
        arithmetic: kvprobe_schema::DeclaredArithmetic::Float32,
    })
}

/// The emulator's name for a cache's quant info (`npu/src/sim`): id `2·layer + (0 K, 1 V)`, the
/// genai export's convention [implied], written `cache/k3` / `cache/v3`.
fn sim_cache_name(id: u32) -> String {
    format!(
        "cache/{}{}",
        if id.is_multiple_of(2) { "k" } else { "v" },
        id / 2
    )
}

/// A sim manifest mirroring the HEF, in the emulator's vocabulary: geometry, cache
/// quantisation, declared layouts (prefill then tbt, ids ascending, input then output) and the
/// quant infos the emulator names `embeddings`, `attention_mask`, `pe`, `position_ids`, `logits`
/// and `cache/kN` / `cache/vN` (the writer's declared quant), and the theta table's RoPE sign
/// convention. Model identity is the caller's.
pub fn to_sim_manifest(hef: &Hef, model: ModelIdentity) -> Result<SimManifest> {
    let desc = to_device_description(hef)?;
    let facts = Facts::new(hef);
    let prefill = facts
        .prefill
        .ok_or_else(|| HefError::NotDescribable("no prefill group".into()))?;
    let cfg = facts.config();
    let input_quant = |role: InputRole| roles::input_for(prefill, cfg, role).map(|l| l.quant);
    let missing =
        |what: &str| HefError::NotDescribable(format!("the prefill group has no {what} input"));
    let mut quant = vec![
        NamedQuant {
            name: "embeddings".into(),
            quant: input_quant(InputRole::Embeddings).ok_or_else(|| missing("embeddings"))?,
        },
        NamedQuant {
            name: "attention_mask".into(),
            quant: input_quant(InputRole::AttentionMask)
                .ok_or_else(|| missing("attention_mask"))?,
        },
        NamedQuant {
            name: "pe".into(),
            quant: input_quant(InputRole::PeQCos).ok_or_else(|| missing("pe_q_cos"))?,
        },
        NamedQuant {
            name: "position_ids".into(),
            quant: kvprobe_schema::QuantInfo::IDENTITY,
        },
        NamedQuant {
            name: "logits".into(),
            quant: prefill.outputs.first().map(|o| o.quant).ok_or_else(|| {
                HefError::NotDescribable("the prefill group has no output".into())
            })?,
        },
    ];
    let ids: std::collections::BTreeSet<u32> = prefill
        .cache_edges
        .iter()
        .filter_map(|e| u32::try_from(e.cache_id).ok())
        .collect();
    for &id in &ids {
        let writer = prefill
            .cache_edges
            .iter()
            .find(|e| {
                e.cache_id == id as i32 && e.direction == kvprobe_schema::CacheDirection::Output
            })
            .or_else(|| prefill.cache_edges.iter().find(|e| e.cache_id == id as i32));
        if let Some(e) = writer {
            quant.push(NamedQuant {
                name: sim_cache_name(id),
                quant: e.quant,
            });
        }
    }
    let (layouts, widths) = declared_layouts(hef, &desc, &ids);
    let cache_quant = match widths.iter().copied().max() {
        Some(2) => "uint16",
        Some(_) => "uint8",
        None => "none",
    };
    // Expanded caches hold NH heads per entry, un-expanded NKV (E in bytes, §1.2 [not visible]).
    let bytes = widths.iter().copied().max().unwrap_or(1) as usize;
    let e = prefill
        .cache_edges
        .first()
        .map(|c| c.entry_size)
        .unwrap_or(0);
    let expanded = desc.shape.n_heads != desc.shape.n_kv_heads
        && e == desc
            .shape
            .n_heads
            .saturating_mul(desc.shape.head_dim)
            .saturating_mul(bytes);
    Ok(SimManifest {
        device: "hailo-sim".into(),
        schema_version: SCHEMA_VERSION,
        model,
        cache_len: desc.cache_len,
        prefill_len: desc.prefill_len,
        cache_quant: cache_quant.into(),
        cache_heads: if expanded { "expanded" } else { "un-expanded" }.into(),
        weights: "f32".into(),
        taps: false,
        // the compiled graph follows its own table (§2.6: the embedded theta decides)
        rope_theta: facts
            .theta
            .as_deref()
            .map_or(RopeTheta::Plain, RopeTheta::of_table)
            .name()
            .into(),
        layouts,
        calibration_prompts: Vec::new(),
        quant,
        faults: Vec::new(),
    })
}

/// The layouts the cache edges of both groups declare (by format code), and the element widths
/// they use.
fn declared_layouts(
    hef: &Hef,
    desc: &DeviceDescription,
    ids: &std::collections::BTreeSet<u32>,
) -> (Vec<EdgeLayout>, std::collections::BTreeSet<u32>) {
    let mut layouts = Vec::new();
    let mut widths = std::collections::BTreeSet::new();
    for gd in [desc.group(GroupKind::Prefill), desc.group(GroupKind::Tbt)]
        .into_iter()
        .flatten()
    {
        let Some(g) = hef.group(&gd.name) else {
            continue;
        };
        for &id in ids {
            for dir in [
                kvprobe_schema::CacheDirection::Input,
                kvprobe_schema::CacheDirection::Output,
            ] {
                let Some(e) = g
                    .cache_edges
                    .iter()
                    .find(|e| e.cache_id == id as i32 && e.direction == dir)
                else {
                    continue;
                };
                widths.insert(e.data_bytes);
                if let Some(layout) = formats::declared_layout(e.format_code, e.padded_shape[1]) {
                    let direction = if dir == kvprobe_schema::CacheDirection::Input {
                        "input"
                    } else {
                        "output"
                    };
                    layouts.push(EdgeLayout {
                        group: gd.kind,
                        cache_id: id,
                        direction: direction.into(),
                        layout,
                    });
                }
            }
        }
    }
    (layouts, widths)
}
