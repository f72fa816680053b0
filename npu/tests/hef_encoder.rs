//! Test-only encoder for the HEF subset the reader decodes (contract §5.1, §5.3), written
//! separately from the decoder. Included by the other `hef_*` tests with `#[path]`; its own tests
//! check the protobuf writer against hand-computed bytes.
#![allow(dead_code)]

use std::collections::BTreeMap;

/// A protobuf message under construction.
#[derive(Default, Clone)]
pub struct Msg(pub Vec<u8>);

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

impl Msg {
    pub fn new() -> Msg {
        Msg(Vec::new())
    }
    fn key(&mut self, field: u32, wire: u8) {
        put_varint(&mut self.0, (u64::from(field) << 3) | u64::from(wire));
    }
    pub fn varint(mut self, field: u32, v: u64) -> Msg {
        self.key(field, 0);
        put_varint(&mut self.0, v);
        self
    }
    /// proto3 int32: negative values sign-extended to 64 bits (10 bytes).
    pub fn int32(self, field: u32, v: i32) -> Msg {
        self.varint(field, i64::from(v) as u64)
    }
    pub fn f32(mut self, field: u32, v: f32) -> Msg {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn f64(mut self, field: u32, v: f64) -> Msg {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(mut self, field: u32, b: &[u8]) -> Msg {
        self.key(field, 2);
        put_varint(&mut self.0, b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    pub fn string(self, field: u32, s: &str) -> Msg {
        self.bytes(field, s.as_bytes())
    }
    pub fn msg(self, field: u32, m: &Msg) -> Msg {
        self.bytes(field, &m.0)
    }
    pub fn packed_varints(self, field: u32, vs: &[u64]) -> Msg {
        let mut b = Vec::new();
        for &v in vs {
            put_varint(&mut b, v);
        }
        self.bytes(field, &b)
    }
    pub fn packed_doubles(self, field: u32, vs: &[f64]) -> Msg {
        let b: Vec<u8> = vs.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.bytes(field, &b)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Quant {
    pub zp: f32,
    pub scale: f32,
    pub min: f32,
    pub max: f32,
}

#[derive(Clone, Debug)]
pub struct LayerSpec {
    pub name: String,
    pub shape: [u32; 3],
    pub padded: [u32; 3],
    pub format: u32,
    pub data_bytes: u32,
    pub quant: Quant,
    pub context: usize,
}

#[derive(Clone, Debug)]
pub struct CacheSpec {
    pub id: i32,
    /// 0 = H2D (cache read), 1 = D2H (cache write).
    pub direction: u64,
    pub name: String,
    pub padded: [u32; 3],
    pub format: u32,
    pub data_bytes: u32,
    pub edge_type: u64,
    pub quant: Quant,
    pub context: usize,
}

#[derive(Clone, Debug)]
pub struct GroupSpec {
    pub name: String,
    pub core_op_name: String,
    pub contexts: usize,
    pub inputs: Vec<LayerSpec>,
    pub outputs: Vec<LayerSpec>,
    pub caches: Vec<CacheSpec>,
    pub sorted_outputs: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct HefSpec {
    pub container_version: u32,
    /// v3: hash only the proto (`proto_xxh3 != 0`).
    pub proto_hash: bool,
    pub hw_arch: u64,
    pub proto_version: u64,
    pub extensions: Vec<u32>,
    /// Net-flow path (ops → core op) or the legacy group contexts.
    pub net_flow: bool,
    pub groups: Vec<GroupSpec>,
    pub resources: Vec<(String, Vec<u8>)>,
    /// Names of resources whose stored hash is deliberately wrong.
    pub bad_resource_hash: Vec<String>,
    /// Extra bytes appended to the resource offset of these names (to push them out of range).
    pub resource_offset_shift: BTreeMap<String, u64>,
    pub ccws: Vec<u8>,
}

/// Geometry of the healthy fixture: L = 32, P = 8, NH = 4, NKV = 2, D = head_dim = 8,
/// hidden F = 32, vocab 64, 2 layers (cache ids 0..4: K0, V0, K1, V1), uint8 caches, E = NKV·D = 16.
#[derive(Clone, Copy, Debug)]
pub struct Geo {
    pub l: u32,
    pub p: u32,
    pub nh: u32,
    pub nkv: u32,
    pub d: u32,
    pub f: u32,
    pub vocab: u32,
    pub layers: u32,
}

pub const GEO: Geo = Geo {
    l: 32,
    p: 8,
    nh: 4,
    nkv: 2,
    d: 8,
    f: 32,
    vocab: 64,
    layers: 2,
};

pub fn q(zp: f32, scale: f32) -> Quant {
    Quant {
        zp,
        scale,
        min: -(zp * scale),
        max: (255.0 - zp) * scale,
    }
}

fn layer(name: &str, shape: [u32; 3], data_bytes: u32, quant: Quant) -> LayerSpec {
    LayerSpec {
        name: name.into(),
        shape,
        padded: shape,
        format: 0,
        data_bytes,
        quant,
        context: 0,
    }
}

/// Cache quant per id (K and V differ; both groups share them).
pub fn cache_quant(id: i32) -> Quant {
    q(128.0, 0.02 + 0.01 * id as f32)
}

pub fn group(scope: &str, kind: &str, t: u32) -> GroupSpec {
    group_geo(scope, kind, t, &GEO)
}

pub fn group_geo(scope: &str, kind: &str, t: u32, geo: &Geo) -> GroupSpec {
    let g = *geo;
    let name = format!("{scope}__{kind}");
    let inp = |i: u32| format!("{name}/input_layer{i}");
    let inputs = vec![
        layer(&inp(1), [1, t, g.f], 2, q(32768.0, 0.0001)),
        layer(&inp(2), [t, g.nh, g.l], 1, q(0.0, 1.0 / 255.0)),
        layer(&inp(3), [t, g.nh, g.d], 1, q(128.0, 1.0 / 127.0)),
        layer(&inp(4), [t, g.nh, g.d], 1, q(128.0, 1.0 / 127.0)),
        layer(&inp(5), [t, g.nkv, g.d], 1, q(128.0, 1.0 / 127.0)),
        layer(&inp(6), [t, g.nkv, g.d], 1, q(128.0, 1.0 / 127.0)),
    ];
    let out_name = format!("{name}/output_layer1");
    let outputs = vec![layer(&out_name, [1, 1, g.vocab], 2, q(30000.0, 0.001))];
    let e = g.nkv * g.d;
    let (n_in, n_out) = (g.l - t, t);
    let mut caches = Vec::new();
    for id in 0..(2 * g.layers) as i32 {
        let kv = if id % 2 == 0 { "k" } else { "v" };
        let layer_ix = id / 2;
        caches.push(CacheSpec {
            id,
            direction: 0,
            name: format!("{name}/cache_in_{kv}{layer_ix}"),
            padded: [n_in, 1, e],
            format: 0,
            data_bytes: 1,
            edge_type: 0,
            quant: cache_quant(id),
            context: 0,
        });
        caches.push(CacheSpec {
            id,
            direction: 1,
            name: format!("{name}/cache_out_{kv}{layer_ix}"),
            padded: [n_out, 1, e],
            format: 0,
            data_bytes: 1,
            edge_type: 0,
            quant: cache_quant(id),
            context: 1,
        });
    }
    GroupSpec {
        name: name.clone(),
        core_op_name: name,
        contexts: 2,
        inputs,
        outputs,
        caches,
        sorted_outputs: vec![out_name],
    }
}

pub fn config_json(kv: u32, p: u32) -> Vec<u8> {
    config_json_geo(kv, p, &GEO)
}

pub fn config_json_geo(kv: u32, p: u32, geo: &Geo) -> Vec<u8> {
    serde_json::json!({
        "eos_token_id": 2,
        "chat_template": "",
        "stop_token_id": [2],
        "default_generation_params": {"max_new_tokens": 16, "temperature": 1.0, "do_sample": false},
        "pre_process_params": {
            "kv_cache_size": kv,
            "num_attention_heads": geo.nh,
            "num_key_value_heads": geo.nkv,
            "prefill_input_tokens_count": p
        },
        "input_layers_names_suffixes": {
            "embeddings": "input_layer1",
            "attention_mask": "input_layer2",
            "pe_q_cos": "input_layer3",
            "pe_q_sin": "input_layer4",
            "pe_k_cos": "input_layer5",
            "pe_k_sin": "input_layer6"
        }
    })
    .to_string()
    .into_bytes()
}

/// A WordLevel tokenizer.json over `vocab` words w0…w{vocab-1}, whitespace-split.
pub fn tokenizer_json(vocab: u32) -> Vec<u8> {
    let mut v = serde_json::Map::new();
    for i in 0..vocab {
        v.insert(format!("w{i}"), serde_json::json!(i));
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": v, "unk_token": "w0"}
    })
    .to_string()
    .into_bytes()
}

/// Row-major uint16 table: row r, column c = (r * 7 + c * 3) % 65536 pattern around 32768.
pub fn embeddings_bin(rows: u32, f: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for r in 0..rows {
        for c in 0..f {
            let v: u16 = (32768 + (r * 37 + c * 11) % 2000) as u16 - 1000;
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// HF-style inverse frequencies with the rotate-half sign folded in (contract §2.6 fallback).
pub fn theta_bin(d: u32, base: f32) -> Vec<u8> {
    let half = d / 2;
    let mut v = Vec::new();
    for sign in [-1.0f32, 1.0] {
        for i in 0..half {
            v.push(sign * base.powf(-(i as f32) / half as f32));
        }
    }
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The healthy LLM HEF of the tests.
pub fn healthy() -> HefSpec {
    healthy_geo(&GEO)
}

pub fn healthy_geo(geo: &Geo) -> HefSpec {
    let g = *geo;
    HefSpec {
        container_version: 3,
        proto_hash: true,
        hw_arch: 103,
        proto_version: 1,
        extensions: vec![13, 26, 31],
        net_flow: true,
        groups: vec![
            group_geo("m", "prefill", g.p, geo),
            group_geo("m", "tbt", 1, geo),
        ],
        resources: vec![
            ("hailo-config.json".into(), config_json_geo(g.l, g.p, geo)),
            ("tokenizer.json".into(), tokenizer_json(g.vocab)),
            ("embeddings.bin".into(), embeddings_bin(g.vocab, g.f)),
            ("rope_theta_data.bin".into(), theta_bin(g.d, 10000.0)),
        ],
        bad_resource_hash: Vec::new(),
        resource_offset_shift: BTreeMap::new(),
        ccws: (0..64u8).collect(),
    }
}

fn numeric(qt: &Quant) -> Msg {
    Msg::new()
        .f32(1, qt.zp)
        .f32(2, qt.scale)
        .f32(3, qt.min)
        .f32(4, qt.max)
}

fn base(padded: [u32; 3], shape: [u32; 3], format: u32, data_bytes: u32) -> Msg {
    Msg::new()
        .varint(1, u64::from(shape[0]))
        .varint(2, u64::from(padded[0]))
        .varint(3, u64::from(shape[1]))
        .varint(4, u64::from(padded[1]))
        .varint(5, u64::from(shape[2]))
        .varint(6, u64::from(padded[2]))
        .varint(7, u64::from(format))
        .varint(12, u64::from(data_bytes))
        .packed_varints(13, &[0, 1])
}

fn edge(direction: u64, edge_type: u64, info: Msg, conn: u64, cache_id: Option<i32>) -> Msg {
    let mut csi = Msg::new().varint(1, 0).varint(3, conn);
    if let Some(id) = cache_id {
        csi = csi.int32(9, id);
    }
    Msg::new()
        .varint(1, direction)
        .varint(2, edge_type)
        .msg(3, &info)
        .msg(5, &csi)
        .varint(6, 0)
}

fn encode_group(g: &GroupSpec, net_flow: bool) -> Msg {
    let mut contexts: Vec<Msg> = vec![Msg::new(); g.contexts.max(1)];
    let ctx_of = |c: usize| c.min(g.contexts.max(1) - 1);
    for l in &g.inputs {
        let info = Msg::new()
            .string(1, &l.name)
            .msg(2, &base(l.padded, l.shape, l.format, l.data_bytes))
            .msg(3, &numeric(&l.quant));
        let c = ctx_of(l.context);
        contexts[c] = std::mem::take(&mut contexts[c]).msg(2, &edge(0, 0, info, 0, None));
    }
    for l in &g.outputs {
        let info = Msg::new()
            .string(1, &l.name)
            .msg(2, &base(l.padded, l.shape, l.format, l.data_bytes))
            .msg(3, &numeric(&l.quant));
        let c = ctx_of(l.context);
        contexts[c] = std::mem::take(&mut contexts[c]).msg(2, &edge(1, 0, info, 0, None));
    }
    for cs in &g.caches {
        let info = Msg::new()
            .string(1, &cs.name)
            .msg(2, &base(cs.padded, cs.padded, cs.format, cs.data_bytes))
            .msg(3, &numeric(&cs.quant));
        let c = ctx_of(cs.context);
        contexts[c] = std::mem::take(&mut contexts[c])
            .msg(2, &edge(cs.direction, cs.edge_type, info, 3, Some(cs.id)));
    }
    let ctx_msgs: Vec<Msg> = contexts
        .into_iter()
        .enumerate()
        .map(|(i, meta)| {
            Msg::new()
                .varint(1, i as u64)
                .msg(3, &meta.string(1, &format!("ctx{i}")))
        })
        .collect();
    let meta = |name: &str| Msg::new().string(1, name).varint(2, 0);
    let mut m = Msg::new().msg(1, &meta(&g.name));
    for s in &g.sorted_outputs {
        m = m.string(4, s);
    }
    if net_flow {
        let mut core = Msg::new().msg(1, &meta(&g.core_op_name));
        for c in &ctx_msgs {
            core = core.msg(3, c);
        }
        let op = Msg::new().string(1, "core").msg(4, &core);
        m = m.msg(8, &op);
    } else {
        for c in &ctx_msgs {
            m = m.msg(3, c);
        }
    }
    m
}

/// The protobuf and the additional-info bytes (resources), with resource offsets relative to
/// the start of the CCWs (= the zero point).
pub fn encode_proto(spec: &HefSpec) -> (Vec<u8>, Vec<u8>) {
    let header = Msg::new()
        .varint(1, spec.hw_arch)
        .varint(2, 1_700_000_000)
        .string(3, "5.2.0")
        .varint(4, spec.proto_version);
    let mut m = Msg::new().msg(1, &header);
    for g in &spec.groups {
        m = m.msg(2, &encode_group(g, spec.net_flow));
    }
    for &e in &spec.extensions {
        m = m.msg(
            5,
            &Msg::new()
                .varint(1, u64::from(e))
                .string(2, &format!("ext{e}")),
        );
    }
    let mut info = Vec::new();
    for (name, bytes) in &spec.resources {
        let mut offset = spec.ccws.len() as u64 + info.len() as u64;
        offset += spec.resource_offset_shift.get(name).copied().unwrap_or(0);
        let mut hash = xxhash_rust::xxh3::xxh3_64(bytes);
        if spec.bad_resource_hash.contains(name) {
            hash ^= 1;
        }
        info.extend_from_slice(bytes);
        let r = Msg::new()
            .varint(1, offset)
            .varint(2, bytes.len() as u64)
            .string(3, name)
            .varint(4, hash);
        m = m.msg(7, &r);
    }
    (m.0, info)
}

/// The whole file for the spec's container version.
pub fn encode(spec: &HefSpec) -> Vec<u8> {
    let (proto, info) = encode_proto(spec);
    container(
        spec.container_version,
        spec.proto_hash,
        &proto,
        &spec.ccws,
        &info,
    )
}

pub fn container(
    version: u32,
    proto_hash: bool,
    proto: &[u8],
    ccws: &[u8],
    info: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0x0148_4546u32.to_be_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&(proto.len() as u32).to_be_bytes());
    match version {
        0 => {
            let digest: [u8; 16] = md5::Md5::digest(proto).into();
            out.extend_from_slice(&0u32.to_be_bytes());
            out.extend_from_slice(&digest);
            out.extend_from_slice(proto);
        }
        1 | 2 => {
            let mut residue = proto.to_vec();
            residue.extend_from_slice(ccws);
            residue.extend_from_slice(info);
            if version == 1 {
                out.extend_from_slice(&crc32fast::hash(&residue).to_be_bytes());
                out.extend_from_slice(&((ccws.len() + info.len()) as u64).to_be_bytes());
                out.extend_from_slice(&0u32.to_be_bytes());
            } else {
                out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&residue).to_be_bytes());
                out.extend_from_slice(&((ccws.len() + info.len()) as u64).to_be_bytes());
                out.extend_from_slice(&[0u8; 16]);
            }
            out.extend_from_slice(&residue);
        }
        _ => {
            let pad = (4096 - (56 + proto.len()) % 4096) % 4096;
            let mut residue = proto.to_vec();
            residue.extend(std::iter::repeat_n(0u8, pad));
            residue.extend_from_slice(ccws);
            residue.extend_from_slice(info);
            let whole = xxhash_rust::xxh3::xxh3_64(&residue);
            let ph = if proto_hash {
                xxhash_rust::xxh3::xxh3_64(proto)
            } else {
                0
            };
            out.extend_from_slice(&whole.to_be_bytes());
            out.extend_from_slice(&((pad + ccws.len()) as u64).to_be_bytes());
            out.extend_from_slice(&(pad as u32).to_be_bytes());
            out.extend_from_slice(&(info.len() as u64).to_be_bytes());
            out.extend_from_slice(&ph.to_be_bytes());
            out.extend_from_slice(&0u64.to_be_bytes());
            out.extend_from_slice(&residue);
        }
    }
    out
}

use md5::Digest as _;

#[cfg(test)]
mod encoder_self_tests {
    use super::*;

    /// Bytes from the protobuf encoding guide: field 1 = 150 is `08 96 01`.
    #[test]
    fn varint_matches_protobuf_guide() {
        assert_eq!(Msg::new().varint(1, 150).0, vec![0x08, 0x96, 0x01]);
    }

    /// int32 −1 is ten bytes: nine 0xff and a final 0x01.
    #[test]
    fn negative_int32_is_ten_bytes() {
        let m = Msg::new().int32(9, -1).0;
        assert_eq!(m[0], 0x48);
        assert_eq!(
            &m[1..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }
}
