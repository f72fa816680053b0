//! `inspect --model` pairing: a HEF built from the tiny reference Llama pairs cleanly with it,
//! and each mismatch (tokenizer, embeddings, theta, heads, vocabulary, hidden, layers, head_dim,
//! context) is reported.

#[path = "hef_encoder.rs"]
mod hef_encoder;

use hef_encoder::*;
use kvprobe_npu::hef::{self, pairing, Hef, Severity};
use kvprobe_reference::{fixtures, Model};
use std::collections::BTreeSet;

const SCALE: f32 = 1.0 / 4096.0;

/// Geometry of `fixtures::write_tiny_llama`.
fn tiny_geo() -> Geo {
    Geo {
        l: 32,
        p: 8,
        nh: fixtures::LLAMA_HEADS as u32,
        nkv: fixtures::LLAMA_KV_HEADS as u32,
        d: fixtures::LLAMA_HEAD_DIM as u32,
        f: fixtures::LLAMA_HIDDEN as u32,
        vocab: fixtures::LLAMA_VOCAB as u32,
        layers: fixtures::LLAMA_LAYERS as u32,
    }
}

fn model(seed: u64) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    fixtures::write_tiny_llama(dir.path(), seed).unwrap();
    let m = Model::load(dir.path()).unwrap();
    (dir, m)
}

/// The model's table quantised as uint16 with zero point 32768 and `SCALE`.
fn quantised_table(m: &Model) -> Vec<u8> {
    let t = m.embedding_table().to_vec2::<f32>().unwrap();
    t.iter()
        .flatten()
        .flat_map(|x| (((x / SCALE).round() + 32768.0).clamp(0.0, 65535.0) as u16).to_le_bytes())
        .collect()
}

/// A HEF spec matching the model in `dir`.
fn paired_spec(dir: &std::path::Path, m: &Model, geo: Geo) -> HefSpec {
    let mut s = healthy_geo(&geo);
    for g in s.groups.iter_mut() {
        g.inputs[0].quant = Quant {
            zp: 32768.0,
            scale: SCALE,
            min: -8.0,
            max: 8.0,
        };
    }
    s.resources[1].1 = std::fs::read(dir.join("tokenizer.json")).unwrap();
    s.resources[2].1 = quantised_table(m);
    s.resources[3].1 = theta_bin(geo.d, 10000.0);
    s
}

fn pair_ids(s: &HefSpec, m: &Model) -> (BTreeSet<&'static str>, Vec<hef::Lint>) {
    let h = Hef::parse(encode(s)).unwrap();
    let lints = pairing::pair(&h, m);
    (
        lints
            .iter()
            .filter(|l| l.severity == Severity::Error)
            .map(|l| l.id)
            .collect(),
        lints,
    )
}

#[test]
fn matching_model_pairs_cleanly() {
    let (dir, m) = model(1);
    let s = paired_spec(dir.path(), &m, tiny_geo());
    let h = Hef::parse(encode(&s)).unwrap();
    let structural: Vec<_> = hef::lint(&h)
        .into_iter()
        .filter(|l| l.severity == Severity::Error)
        .collect();
    assert!(structural.is_empty(), "{structural:#?}");
    let (errors, all) = pair_ids(&s, &m);
    assert!(errors.is_empty(), "{all:#?}");
    // the tiny Llama's tokenizer adds BOS by default; the server never does
    assert_eq!(all.iter().any(|l| l.id == "pair-bos"), m.config().add_bos);
}

#[test]
fn each_mismatch_is_reported() {
    let (dir, m) = model(1);
    let (_dir2, other) = model(2);
    let geo = tiny_geo();
    let base = || paired_spec(dir.path(), &m, geo);
    let mut cases: Vec<(&str, HefSpec)> = Vec::new();

    let mut s = base();
    s.resources[1].1 = tokenizer_json(geo.vocab);
    cases.push(("pair-tokenizer", s));

    let mut s = base();
    s.resources[2].1 = quantised_table(&other);
    cases.push(("pair-embeddings", s));

    // right table, wrong declared zero point
    let mut s = base();
    for g in s.groups.iter_mut() {
        g.inputs[0].quant.zp = 30000.0;
    }
    cases.push(("pair-embeddings", s));

    let mut s = base();
    s.resources[3].1 = theta_bin(geo.d, 100000.0);
    cases.push(("pair-rope-theta", s));

    let mut s = base();
    s.resources[3].1 = theta_bin(geo.d / 2, 10000.0);
    cases.push(("pair-head-dim", s));

    let mut s = paired_spec(dir.path(), &m, Geo { nh: 8, ..geo });
    s.resources[3].1 = theta_bin(geo.d, 10000.0);
    cases.push(("pair-heads", s));

    let mut s = paired_spec(dir.path(), &m, Geo { vocab: 256, ..geo });
    s.resources[2].1.truncate(256 * 2 * geo.f as usize);
    cases.push(("pair-vocab", s));

    cases.push((
        "pair-hidden",
        paired_spec(dir.path(), &m, Geo { f: 32, ..geo }),
    ));
    cases.push((
        "pair-layers",
        paired_spec(dir.path(), &m, Geo { layers: 3, ..geo }),
    ));

    let mut failures = Vec::new();
    for (id, s) in &cases {
        let (errors, all) = pair_ids(s, &m);
        if !errors.contains(id) {
            failures.push(format!(
                "{id}: got {:?}",
                all.iter()
                    .map(|l| (l.id, l.message.clone()))
                    .collect::<Vec<_>>()
            ));
        }
    }
    // a cache longer than the model's 256 positions
    let g = Geo { l: 512, ..geo };
    let mut s = paired_spec(dir.path(), &m, g);
    s.resources[3].1 = theta_bin(geo.d, 10000.0);
    let h = Hef::parse(encode(&s)).unwrap();
    if !pairing::pair(&h, &m).iter().any(|l| l.id == "pair-context") {
        failures.push("pair-context: not reported".into());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let tested: BTreeSet<&str> = cases
        .iter()
        .map(|c| c.0)
        .chain(["pair-context", "pair-bos"])
        .collect();
    let registered: BTreeSet<&str> = pairing::CHECKS.iter().map(|c| c.id).collect();
    assert_eq!(tested, registered);
}

/// `--emit-sim`: the manifest written from a HEF paired with the tiny Llama loads into the
/// emulator, which then mirrors the HEF's geometry and declared quant infos.
#[test]
fn emitted_sim_manifest_loads_into_the_emulator() {
    use kvprobe_npu::sim::{manifest::model_identity, SimDevice, SimFlags, SimOptions};
    use kvprobe_npu::Device;
    let (dir, m) = model(1);
    let s = paired_spec(dir.path(), &m, tiny_geo());
    let h = Hef::parse(encode(&s)).unwrap();
    let manifest = hef::describe::to_sim_manifest(&h, model_identity(&m).unwrap()).unwrap();
    let path = dir.path().join("sim.json");
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let flags = SimFlags {
        sim_manifest: Some(path),
        ..SimFlags::default()
    };
    let opts = SimOptions::from_flags(&flags).unwrap();
    let dev = SimDevice::new(std::sync::Arc::new(m), opts).unwrap();
    let d = dev.describe();
    assert_eq!((d.cache_len, d.prefill_len), (32, 8));
    let k1 = cache_quant(2);
    let edge = d.groups[0]
        .cache_edges
        .iter()
        .find(|e| e.cache_id == 2)
        .unwrap();
    assert_eq!((edge.quant.scale, edge.quant.zero_point), (k1.scale, k1.zp));
}
