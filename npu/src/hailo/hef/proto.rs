//! The HEF protobuf subset, decoded by field number (contract §5.3). Names follow the contract's
//! table; only the fields the inspector uses are kept, everything else is skipped.

use super::error::Result;
use super::wire::{
    as_bool, as_bytes, as_f32, as_i32, as_string, as_u32, as_u64, push_doubles, push_varints,
    Reader,
};

/// Nested messages deeper than this are refused, so hostile input cannot recurse without bound
/// (the schema itself nests partial groups at most once).
const MAX_PARTIAL_DEPTH: usize = 2;

#[derive(Debug, Clone, Default)]
pub struct HefProto {
    pub header: ProtoHeader,
    pub network_groups: Vec<NetworkGroup>,
    pub included_features: Option<IncludedFeatures>,
    pub extensions: Vec<Extension>,
    pub optional_extensions: Vec<Extension>,
    pub external_resources: Vec<ExternalResource>,
}

#[derive(Debug, Clone, Default)]
pub struct ProtoHeader {
    pub hw_arch: u64,
    pub timestamp: u64,
    pub sdk_version_str: String,
    pub version: u64,
    pub sdk_version: Option<(u32, u32, u32)>,
}

#[derive(Debug, Clone, Default)]
pub struct IncludedFeatures {
    pub is_multi_context: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Extension {
    pub type_index: u32,
    pub name: String,
}

#[derive(Debug, Clone, Default)]
pub struct ExternalResource {
    pub offset: u64,
    pub size: u64,
    pub name: String,
    pub xxhash: u64,
}

#[derive(Debug, Clone, Default)]
pub struct GroupMetadata {
    pub network_group_name: String,
    pub network_group_index: u32,
    pub transposed_net: bool,
}

#[derive(Debug, Clone, Default)]
pub struct FusedLayers {
    pub network_has_fused_layers: bool,
    pub updated_sorted_output_names: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct NetworkGroup {
    pub metadata: Option<GroupMetadata>,
    pub contexts: Vec<Context>,
    pub sorted_outputs_order: Vec<String>,
    pub fused: Option<FusedLayers>,
    pub networks_names: Vec<String>,
    pub partial_network_groups: Vec<NetworkGroup>,
    pub ops: Vec<Op>,
    pub network_group_name: String,
}

#[derive(Debug, Clone, Default)]
pub struct Op {
    pub name: String,
    pub core_op: Option<CoreOp>,
}

#[derive(Debug, Clone, Default)]
pub struct CoreOp {
    pub metadata: Option<GroupMetadata>,
    pub contexts: Vec<Context>,
    pub sorted_outputs_order: Vec<String>,
    pub fused: Option<FusedLayers>,
    pub networks_names: Vec<String>,
    pub partial_core_ops: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Context {
    pub context_index: u32,
    pub metadata: Option<ContextMetadata>,
}

#[derive(Debug, Clone, Default)]
pub struct ContextMetadata {
    pub name: String,
    pub edge_layers: Vec<EdgeLayer>,
    pub sorted_outputs_order: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct EdgeLayer {
    pub direction: u64,
    pub edge_layer_type: u64,
    pub layer_info: Option<EdgeLayerInfo>,
    /// Name of a MUX or PLANES layer (its contents are not decoded).
    pub other_layer_name: Option<String>,
    pub context_switch_info: Option<ContextSwitchInfo>,
    pub network_index: u32,
}

#[derive(Debug, Clone, Default)]
pub struct EdgeLayerInfo {
    pub name: String,
    pub base: Option<EdgeLayerBase>,
    pub numeric_info: Option<NumericInfo>,
    pub hn_output_layer_name: String,
    pub transposed: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeLayerBase {
    pub height: u32,
    pub padded_height: u32,
    pub width: u32,
    pub padded_width: u32,
    pub features: u32,
    pub padded_features: u32,
    pub format: u32,
    pub sys_index: u32,
    pub data_bytes: u32,
    pub host_argmax: bool,
    pub engine_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NumericInfo {
    pub qp_zp: f32,
    pub qp_scale: f32,
    pub limvals_min: f32,
    pub limvals_max: f32,
    pub qp_zps: Vec<f64>,
    pub qp_scales: Vec<f64>,
}

#[derive(Debug, Clone, Default)]
pub struct ContextSwitchInfo {
    pub context_index: u32,
    pub edge_connection_type: u64,
    pub cache_id: i32,
}

fn strings(
    v: super::wire::Value,
    out: &mut Vec<String>,
    msg: &'static str,
    at: usize,
) -> Result<()> {
    out.push(as_string(v, msg, at)?);
    Ok(())
}

pub fn decode_hef(buf: &[u8]) -> Result<HefProto> {
    const M: &str = "ProtoHEFHef";
    let mut out = HefProto::default();
    let mut r = Reader::new(buf, 0, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.header = decode_header(as_bytes(v, M, at)?, at)?,
            2 => out
                .network_groups
                .push(decode_group(as_bytes(v, M, at)?, at, 0)?),
            4 => out.included_features = Some(decode_included(as_bytes(v, M, at)?, at)?),
            5 => out
                .extensions
                .push(decode_extension(as_bytes(v, M, at)?, at)?),
            6 => out
                .optional_extensions
                .push(decode_extension(as_bytes(v, M, at)?, at)?),
            7 => out
                .external_resources
                .push(decode_resource(as_bytes(v, M, at)?, at)?),
            _ => {}
        }
    }
    Ok(out)
}

fn decode_header(buf: &[u8], base: usize) -> Result<ProtoHeader> {
    const M: &str = "Header";
    let mut out = ProtoHeader::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.hw_arch = as_u64(v, M, at)?,
            2 => out.timestamp = as_u64(v, M, at)?,
            3 => out.sdk_version_str = as_string(v, M, at)?,
            4 => out.version = as_u64(v, M, at)?,
            5 => {
                const S: &str = "SdkVersion";
                let mut sv = (0, 0, 0);
                let mut r2 = Reader::new(as_bytes(v, M, at)?, at, S);
                while let Some((f2, v2, at2)) = r2.next_field()? {
                    match f2 {
                        1 => sv.0 = as_u32(v2, S, at2)?,
                        2 => sv.1 = as_u32(v2, S, at2)?,
                        3 => sv.2 = as_u32(v2, S, at2)?,
                        _ => {}
                    }
                }
                out.sdk_version = Some(sv);
            }
            _ => {}
        }
    }
    Ok(out)
}

fn decode_included(buf: &[u8], base: usize) -> Result<IncludedFeatures> {
    const M: &str = "IncludedFeatures";
    let mut out = IncludedFeatures::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        if f == 4 {
            out.is_multi_context = as_bool(v, M, at)?;
        }
    }
    Ok(out)
}

fn decode_extension(buf: &[u8], base: usize) -> Result<Extension> {
    const M: &str = "Extension";
    let mut out = Extension::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.type_index = as_u32(v, M, at)?,
            2 => out.name = as_string(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_resource(buf: &[u8], base: usize) -> Result<ExternalResource> {
    const M: &str = "ExternalResource";
    let mut out = ExternalResource::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.offset = as_u64(v, M, at)?,
            2 => out.size = as_u64(v, M, at)?,
            3 => out.name = as_string(v, M, at)?,
            4 => out.xxhash = as_u64(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_metadata(buf: &[u8], base: usize) -> Result<GroupMetadata> {
    const M: &str = "NetworkGroupMetadata";
    let mut out = GroupMetadata::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.network_group_name = as_string(v, M, at)?,
            2 => out.network_group_index = as_u32(v, M, at)?,
            3 => out.transposed_net = as_bool(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_fused(buf: &[u8], base: usize) -> Result<FusedLayers> {
    const M: &str = "FusedLayersMetadata";
    let mut out = FusedLayers::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.network_has_fused_layers = as_bool(v, M, at)?,
            2 => strings(v, &mut out.updated_sorted_output_names, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_group(buf: &[u8], base: usize, depth: usize) -> Result<NetworkGroup> {
    const M: &str = "NetworkGroup";
    let mut out = NetworkGroup::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.metadata = Some(decode_metadata(as_bytes(v, M, at)?, at)?),
            3 => out.contexts.push(decode_context(as_bytes(v, M, at)?, at)?),
            4 => strings(v, &mut out.sorted_outputs_order, M, at)?,
            5 => out.fused = Some(decode_fused(as_bytes(v, M, at)?, at)?),
            6 => strings(v, &mut out.networks_names, M, at)?,
            7 => {
                if depth >= MAX_PARTIAL_DEPTH {
                    return Err(super::wire::err(
                        M,
                        at,
                        "partial network groups nested too deep",
                    ));
                }
                const P: &str = "PartialNetworkGroup";
                let mut r2 = Reader::new(as_bytes(v, M, at)?, at, P);
                while let Some((f2, v2, at2)) = r2.next_field()? {
                    if f2 == 1 {
                        out.partial_network_groups.push(decode_group(
                            as_bytes(v2, P, at2)?,
                            at2,
                            depth + 1,
                        )?);
                    }
                }
            }
            8 => out.ops.push(decode_op(as_bytes(v, M, at)?, at)?),
            10 => out.network_group_name = as_string(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_op(buf: &[u8], base: usize) -> Result<Op> {
    const M: &str = "Op";
    let mut out = Op::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.name = as_string(v, M, at)?,
            4 => out.core_op = Some(decode_core_op(as_bytes(v, M, at)?, at)?),
            _ => {}
        }
    }
    Ok(out)
}

fn decode_core_op(buf: &[u8], base: usize) -> Result<CoreOp> {
    const M: &str = "CoreOp";
    let mut out = CoreOp::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.metadata = Some(decode_metadata(as_bytes(v, M, at)?, at)?),
            3 => out.contexts.push(decode_context(as_bytes(v, M, at)?, at)?),
            4 => strings(v, &mut out.sorted_outputs_order, M, at)?,
            5 => out.fused = Some(decode_fused(as_bytes(v, M, at)?, at)?),
            6 => strings(v, &mut out.networks_names, M, at)?,
            7 => {
                as_bytes(v, M, at)?;
                out.partial_core_ops += 1;
            }
            _ => {}
        }
    }
    Ok(out)
}

fn decode_context(buf: &[u8], base: usize) -> Result<Context> {
    const M: &str = "Context";
    let mut out = Context::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.context_index = as_u32(v, M, at)?,
            3 => out.metadata = Some(decode_context_metadata(as_bytes(v, M, at)?, at)?),
            _ => {}
        }
    }
    Ok(out)
}

fn decode_context_metadata(buf: &[u8], base: usize) -> Result<ContextMetadata> {
    const M: &str = "ContextMetadata";
    let mut out = ContextMetadata::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.name = as_string(v, M, at)?,
            2 => out
                .edge_layers
                .push(decode_edge_layer(as_bytes(v, M, at)?, at)?),
            5 => strings(v, &mut out.sorted_outputs_order, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_edge_layer(buf: &[u8], base: usize) -> Result<EdgeLayer> {
    const M: &str = "EdgeLayer";
    let mut out = EdgeLayer::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.direction = as_u64(v, M, at)?,
            2 => out.edge_layer_type = as_u64(v, M, at)?,
            3 => out.layer_info = Some(decode_layer_info(as_bytes(v, M, at)?, at)?),
            4 | 8 => out.other_layer_name = Some(first_string_field(as_bytes(v, M, at)?, at)?),
            5 => out.context_switch_info = Some(decode_csi(as_bytes(v, M, at)?, at)?),
            6 => out.network_index = as_u32(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

/// Field 1 (`name`) of a MUX or PLANES layer; the rest is not needed.
fn first_string_field(buf: &[u8], base: usize) -> Result<String> {
    const M: &str = "EdgeLayerMux";
    let mut r = Reader::new(buf, base, M);
    let mut name = String::new();
    while let Some((f, v, at)) = r.next_field()? {
        if f == 1 {
            if let super::wire::Value::Bytes(b) = v {
                name = String::from_utf8_lossy(b).into_owned();
            } else {
                return Err(super::wire::err(M, at, "expected a string name"));
            }
        }
    }
    Ok(name)
}

fn decode_layer_info(buf: &[u8], base: usize) -> Result<EdgeLayerInfo> {
    const M: &str = "EdgeLayerInfo";
    let mut out = EdgeLayerInfo::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.name = as_string(v, M, at)?,
            2 => out.base = Some(decode_base(as_bytes(v, M, at)?, at)?),
            3 => out.numeric_info = Some(decode_numeric(as_bytes(v, M, at)?, at)?),
            4 => out.hn_output_layer_name = as_string(v, M, at)?,
            6 => out.transposed = as_bool(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_base(buf: &[u8], base: usize) -> Result<EdgeLayerBase> {
    const M: &str = "EdgeLayerBase";
    let mut out = EdgeLayerBase::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.height = as_u32(v, M, at)?,
            2 => out.padded_height = as_u32(v, M, at)?,
            3 => out.width = as_u32(v, M, at)?,
            4 => out.padded_width = as_u32(v, M, at)?,
            5 => out.features = as_u32(v, M, at)?,
            6 => out.padded_features = as_u32(v, M, at)?,
            7 => out.format = as_u32(v, M, at)?,
            8 => out.sys_index = as_u32(v, M, at)?,
            12 => out.data_bytes = as_u32(v, M, at)?,
            13 => {
                // repeated buffer_indices: validate the encoding, values unused
                let mut sink = Vec::new();
                push_varints(v, &mut sink, M, at)?;
            }
            14 => out.host_argmax = as_bool(v, M, at)?,
            16 => out.engine_id = as_u32(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_numeric(buf: &[u8], base: usize) -> Result<NumericInfo> {
    const M: &str = "EdgeLayerNumericInfo";
    let mut out = NumericInfo::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.qp_zp = as_f32(v, M, at)?,
            2 => out.qp_scale = as_f32(v, M, at)?,
            3 => out.limvals_min = as_f32(v, M, at)?,
            4 => out.limvals_max = as_f32(v, M, at)?,
            5 => push_doubles(v, &mut out.qp_zps, M, at)?,
            6 => push_doubles(v, &mut out.qp_scales, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}

fn decode_csi(buf: &[u8], base: usize) -> Result<ContextSwitchInfo> {
    const M: &str = "ContextSwitchInformation";
    let mut out = ContextSwitchInfo::default();
    let mut r = Reader::new(buf, base, M);
    while let Some((f, v, at)) = r.next_field()? {
        match f {
            1 => out.context_index = as_u32(v, M, at)?,
            3 => out.edge_connection_type = as_u64(v, M, at)?,
            9 => out.cache_id = as_i32(v, M, at)?,
            _ => {}
        }
    }
    Ok(out)
}
