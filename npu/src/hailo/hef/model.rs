//! The inspector's view of a HEF: groups, their boundary inputs/outputs, cache edges and the
//! embedded genai resources, built from the decoded protobuf (contract §5.2, §5.5, §5.6).

use super::error::Result;
use super::formats::{self, CONNECTION_BOUNDARY, CONNECTION_CACHE, DIRECTION_H2D};
use super::geometry;
use super::header::{self, ContainerHeader, HeaderChecks};
use super::proto::{self, Context, EdgeLayer, HefProto, NetworkGroup, NumericInfo};
use kvprobe_schema::{CacheDirection, QuantInfo};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct Layer {
    pub name: String,
    pub context_index: u32,
    /// Host shape (height, width, features), H and W swapped for transposed layers (§5.5).
    pub shape: [u32; 3],
    /// Padded (hardware) shape (padded_height, padded_width, padded_features).
    pub padded_shape: [u32; 3],
    pub format_code: u32,
    pub format_name: Option<&'static str>,
    pub data_bytes: u32,
    pub quant: QuantInfo,
    /// The HEF carries per-feature scales/zero points (`qp_scales` / `qp_zps` non-empty).
    pub per_feature_quant: bool,
}

impl Layer {
    pub fn rows(&self) -> usize {
        (self.shape[0] as usize).saturating_mul(self.shape[1] as usize)
    }
    pub fn elements(&self) -> usize {
        self.rows().saturating_mul(self.shape[2] as usize)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CacheEdge {
    pub cache_id: i32,
    pub direction: CacheDirection,
    pub name: String,
    pub context_index: u32,
    pub edge_layer_type: u64,
    /// `E = padded_features` (bytes, contract §1.2).
    pub entry_size: usize,
    /// `Ep` with the default 512-byte page.
    pub padded_entry_size: usize,
    /// Entries per run: `padded_height · padded_width`.
    pub length: usize,
    pub padded_shape: [u32; 3],
    pub format_code: u32,
    pub format_name: Option<&'static str>,
    pub data_bytes: u32,
    pub quant: QuantInfo,
    #[serde(skip)]
    pub numeric: Option<NumericInfo>,
    pub host_argmax: bool,
    pub sys_index: u32,
    pub engine_id: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub name: String,
    pub index: usize,
    /// Name of the core op (net-flow) or the group itself (legacy).
    pub core_op_name: String,
    pub net_flow: bool,
    pub contexts: usize,
    pub inputs: Vec<Layer>,
    pub outputs: Vec<Layer>,
    pub cache_edges: Vec<CacheEdge>,
    /// Order of `InferModel::outputs()` (§5.2) and where it came from.
    pub sorted_output_names: Vec<String>,
    pub sorted_output_source: &'static str,
    /// Edge layers the inspector does not model (MUX/PLANES boundary layers, layers without base).
    pub unmodelled_edges: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resource {
    pub name: String,
    /// Offset relative to the zero point (§5.6).
    pub offset: u64,
    pub size: u64,
    pub xxhash: u64,
    /// Absolute byte range, when it lies inside the file.
    pub range: Option<(u64, u64)>,
    /// `Some(ok)` when the HEF gives a hash and the range is readable.
    pub hash_ok: Option<bool>,
}

/// The largest HEF read (it is read whole for its checksums): a compiled LLM for the
/// Hailo-10H is one to two gigabytes, and a larger file is refused before memory grows.
pub const MAX_HEF_BYTES: u64 = 4 << 30;

#[derive(Debug, Clone, Serialize)]
pub struct Hef {
    pub file_len: u64,
    pub header: ContainerHeader,
    pub header_checks: HeaderChecks,
    pub proto_version: u64,
    pub hw_arch: u64,
    pub hw_arch_name: String,
    pub sdk_version: String,
    pub extensions: Vec<u32>,
    pub optional_extensions: Vec<u32>,
    /// `included_features.is_multi_context` for proto header version 0.
    pub included_multi_context: Option<bool>,
    pub groups: Vec<Group>,
    pub resources: Vec<Resource>,
    #[serde(skip)]
    bytes: Vec<u8>,
}

impl Hef {
    pub fn open(path: &Path) -> Result<Hef> {
        let bytes =
            crate::contract::manifest::read_capped(path, MAX_HEF_BYTES).map_err(|reason| {
                super::HefError::Read {
                    path: path.to_path_buf(),
                    reason,
                }
            })?;
        Hef::parse(bytes)
    }

    pub fn parse(bytes: Vec<u8>) -> Result<Hef> {
        let (header, header_checks, proto_bytes) = header::parse(&bytes)?;
        let proto = proto::decode_hef(proto_bytes)?;
        let groups = build_groups(&proto);
        let zero = header.zero_point();
        let resources = proto
            .external_resources
            .iter()
            .map(|r| {
                let range = zero
                    .checked_add(r.offset)
                    .and_then(|s| s.checked_add(r.size).map(|e| (s, e)))
                    .filter(|&(_, e)| e <= bytes.len() as u64);
                let hash_ok = match range {
                    Some((s, e)) if r.xxhash != 0 => {
                        Some(xxhash_rust::xxh3::xxh3_64(&bytes[s as usize..e as usize]) == r.xxhash)
                    }
                    _ => None,
                };
                Resource {
                    name: r.name.clone(),
                    offset: r.offset,
                    size: r.size,
                    xxhash: r.xxhash,
                    range,
                    hash_ok,
                }
            })
            .collect();
        let sdk_version = match proto.header.sdk_version {
            Some((a, b, c)) if proto.header.sdk_version_str.is_empty() => format!("{a}.{b}.{c}"),
            _ => proto.header.sdk_version_str.clone(),
        };
        Ok(Hef {
            file_len: bytes.len() as u64,
            header,
            header_checks,
            proto_version: proto.header.version,
            hw_arch: proto.header.hw_arch,
            hw_arch_name: formats::hw_arch_name(proto.header.hw_arch),
            sdk_version,
            extensions: proto.extensions.iter().map(|e| e.type_index).collect(),
            optional_extensions: proto
                .optional_extensions
                .iter()
                .map(|e| e.type_index)
                .collect(),
            included_multi_context: proto.included_features.as_ref().map(|f| f.is_multi_context),
            groups,
            resources,
            bytes,
        })
    }

    /// Bytes of a named external resource, if present and inside the file.
    pub fn resource(&self, name: &str) -> Option<&[u8]> {
        let r = self.resources.iter().find(|r| r.name == name)?;
        let (s, e) = r.range?;
        Some(&self.bytes[s as usize..e as usize])
    }

    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.name == name)
    }
}

/// Group name as `Hef::get_network_groups_names()` reports it (§5.2).
fn group_name(g: &NetworkGroup, arch: u64) -> String {
    if formats::is_multi_layout_arch(arch) {
        if let Some(p) = g.partial_network_groups.first() {
            if let Some(m) = &p.metadata {
                return m.network_group_name.clone();
            }
        }
    }
    g.metadata
        .as_ref()
        .map(|m| m.network_group_name.clone())
        .unwrap_or_default()
}

fn quant_of(n: Option<&NumericInfo>) -> (QuantInfo, bool) {
    match n {
        Some(n) => (
            QuantInfo {
                scale: n.qp_scale,
                zero_point: n.qp_zp,
                min: n.limvals_min,
                max: n.limvals_max,
            },
            !n.qp_scales.is_empty() || !n.qp_zps.is_empty(),
        ),
        None => (
            QuantInfo {
                scale: 0.0,
                zero_point: 0.0,
                min: 0.0,
                max: 0.0,
            },
            false,
        ),
    }
}

fn build_groups(proto: &HefProto) -> Vec<Group> {
    let arch = proto.header.hw_arch;
    let net_flow_ext = proto
        .extensions
        .iter()
        .any(|e| e.type_index == formats::EXT_HAILO_NET_FLOW);
    proto
        .network_groups
        .iter()
        .enumerate()
        .map(|(index, g)| {
            let name = group_name(g, arch);
            // Net-flow path: the first op with a core op; legacy: the group's own contexts.
            let core = g.ops.iter().find_map(|op| op.core_op.as_ref());
            let (contexts, core_meta, fused, net_flow) = match core {
                Some(c) if net_flow_ext || g.contexts.is_empty() => {
                    (&c.contexts, c.metadata.as_ref(), c.fused.as_ref(), true)
                }
                _ => (&g.contexts, g.metadata.as_ref(), g.fused.as_ref(), false),
            };
            let core_op_name = core_meta
                .map(|m| m.network_group_name.clone())
                .unwrap_or_else(|| name.clone());
            let transposed_net = core_meta.is_some_and(|m| m.transposed_net);
            let mut group = Group {
                name,
                index,
                core_op_name,
                net_flow,
                contexts: contexts.len(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                cache_edges: Vec::new(),
                sorted_output_names: Vec::new(),
                sorted_output_source: "",
                unmodelled_edges: Vec::new(),
            };
            for ctx in contexts {
                collect_edges(ctx, transposed_net, &mut group);
            }
            let (names, source) = sorted_outputs(g, net_flow, fused, contexts);
            // InferModel::outputs() follows the sorted list (§2.1); unknown names go last.
            let pos = |n: &str| names.iter().position(|x| x == n).unwrap_or(usize::MAX);
            group.outputs.sort_by_key(|o| pos(&o.name));
            group.sorted_output_names = names;
            group.sorted_output_source = source;
            group
        })
        .collect()
}

/// The order of `InferModel::outputs()` (contract §5.2): the fused-layers list when the core op
/// has fused layers; else the group's list (a legacy HEF with partials tries the first partial's
/// list first); else the last context's list.
fn sorted_outputs(
    g: &NetworkGroup,
    net_flow: bool,
    fused: Option<&proto::FusedLayers>,
    contexts: &[Context],
) -> (Vec<String>, &'static str) {
    if let Some(f) = fused.filter(|f| f.network_has_fused_layers) {
        return (
            f.updated_sorted_output_names.clone(),
            "fused_layers_metadata",
        );
    }
    if !net_flow {
        if let Some(p) = g.partial_network_groups.first() {
            if !p.sorted_outputs_order.is_empty() {
                return (p.sorted_outputs_order.clone(), "partial network group");
            }
        }
    }
    if !g.sorted_outputs_order.is_empty() {
        return (
            g.sorted_outputs_order.clone(),
            "network_group.sorted_outputs_order",
        );
    }
    if let Some(m) = contexts.last().and_then(|c| c.metadata.as_ref()) {
        if !m.sorted_outputs_order.is_empty() {
            return (m.sorted_outputs_order.clone(), "last context metadata");
        }
    }
    (Vec::new(), "none")
}

fn collect_edges(ctx: &Context, transposed_net: bool, group: &mut Group) {
    let Some(meta) = &ctx.metadata else { return };
    for e in &meta.edge_layers {
        let conn = e
            .context_switch_info
            .as_ref()
            .map(|c| c.edge_connection_type)
            .unwrap_or(0);
        if conn != CONNECTION_BOUNDARY && conn != CONNECTION_CACHE {
            continue;
        }
        let (Some(info), Some(base)) = (
            e.layer_info.as_ref(),
            e.layer_info.as_ref().and_then(|i| i.base.as_ref()),
        ) else {
            group.unmodelled_edges.push(edge_label(e));
            continue;
        };
        let (quant, per_feature) = quant_of(info.numeric_info.as_ref());
        let padded = [base.padded_height, base.padded_width, base.padded_features];
        if conn == CONNECTION_CACHE {
            let e_size = base.padded_features as usize;
            group.cache_edges.push(CacheEdge {
                cache_id: e
                    .context_switch_info
                    .as_ref()
                    .map(|c| c.cache_id)
                    .unwrap_or(0),
                direction: if e.direction == DIRECTION_H2D {
                    CacheDirection::Input
                } else {
                    CacheDirection::Output
                },
                name: info.name.clone(),
                context_index: ctx.context_index,
                edge_layer_type: e.edge_layer_type,
                entry_size: e_size,
                padded_entry_size: geometry::padded_entry_size(e_size),
                length: (base.padded_height as usize).saturating_mul(base.padded_width as usize),
                padded_shape: padded,
                format_code: base.format,
                format_name: formats::compiler_format_name(base.format),
                data_bytes: base.data_bytes,
                quant,
                numeric: info.numeric_info.clone(),
                host_argmax: base.host_argmax,
                sys_index: base.sys_index,
                engine_id: base.engine_id,
            });
            continue;
        }
        let mut shape = [base.height, base.width, base.features];
        if (info.transposed || transposed_net) && base.format != 2 {
            shape.swap(0, 1);
        }
        let layer = Layer {
            name: info.name.clone(),
            context_index: ctx.context_index,
            shape,
            padded_shape: padded,
            format_code: base.format,
            format_name: formats::compiler_format_name(base.format),
            data_bytes: base.data_bytes,
            quant,
            per_feature_quant: per_feature,
        };
        if e.direction == DIRECTION_H2D {
            group.inputs.push(layer);
        } else {
            group.outputs.push(layer);
        }
    }
}

fn edge_label(e: &EdgeLayer) -> String {
    let name = e
        .layer_info
        .as_ref()
        .map(|i| i.name.clone())
        .or_else(|| e.other_layer_name.clone())
        .unwrap_or_default();
    format!("{name} (edge type {})", e.edge_layer_type)
}
