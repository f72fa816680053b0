//! Lint on HEFs written by the test encoder: the healthy LLM HEF is clean, and each broken
//! variant trips its check. Also the device description and sim manifest of the healthy HEF.

#[path = "hef_encoder.rs"]
mod hef_encoder;

use hef_encoder::*;
use kvprobe_npu::hef::{self, lint::CHECKS, Hef, Severity};
use std::collections::BTreeSet;

fn parse(spec: &HefSpec) -> Hef {
    Hef::parse(encode(spec)).expect("encoder output must parse")
}

fn ids(h: &Hef) -> BTreeSet<&'static str> {
    hef::lint(h).into_iter().map(|l| l.id).collect()
}

fn set_config(s: &mut HefSpec, f: impl FnOnce(&mut serde_json::Value)) {
    let r = s
        .resources
        .iter_mut()
        .find(|r| r.0 == "hailo-config.json")
        .unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&r.1).unwrap();
    f(&mut v);
    r.1 = v.to_string().into_bytes();
}

fn cache_mut(s: &mut HefSpec, group: usize, id: i32, direction: u64) -> &mut CacheSpec {
    s.groups[group]
        .caches
        .iter_mut()
        .find(|c| c.id == id && c.direction == direction)
        .unwrap()
}

#[test]
fn healthy_hef_is_clean() {
    let h = parse(&healthy());
    let lints = hef::lint(&h);
    assert!(lints.is_empty(), "healthy HEF produced lints: {lints:#?}");
    assert_eq!(h.groups.len(), 2);
    assert_eq!(h.groups[0].name, "m__prefill");
    assert_eq!(h.groups[0].inputs.len(), 6);
    assert_eq!(h.groups[0].cache_edges.len(), 8);
    assert!(h.groups[0].net_flow);
}

#[test]
fn healthy_legacy_path_and_all_container_versions_are_clean() {
    for version in [1, 2, 3] {
        let mut s = healthy();
        s.container_version = version;
        s.net_flow = false;
        let h = parse(&s);
        let got: BTreeSet<_> = ids(&h);
        let expected: BTreeSet<&str> = if version == 3 {
            BTreeSet::new()
        } else {
            ["header-version"].into()
        };
        assert_eq!(got, expected, "container v{version}, legacy path");
        assert!(!h.groups[0].net_flow);
        assert_eq!(h.groups[1].cache_edges.len(), 8);
    }
    // v3 hashing the whole residue instead of the proto only
    let mut s = healthy();
    s.proto_hash = false;
    assert!(ids(&parse(&s)).is_empty());
}

/// Each check id with a spec mutation (or a byte mutation) that must trigger it.
type MakeBytes = Box<dyn Fn() -> Vec<u8>>;

fn variants() -> Vec<(&'static str, MakeBytes)> {
    fn spec(f: impl Fn(&mut HefSpec) + 'static) -> MakeBytes {
        Box::new(move || {
            let mut s = healthy();
            f(&mut s);
            encode(&s)
        })
    }
    fn bytes(f: impl Fn(&mut Vec<u8>) + 'static) -> MakeBytes {
        Box::new(move || {
            let mut b = encode(&healthy());
            f(&mut b);
            b
        })
    }
    vec![
        ("header-size", bytes(|b| b.extend_from_slice(&[0; 8]))),
        // v3 header bytes 28..32 hold hef_padding_size; beyond ccws_size_with_padding
        (
            "header-padding",
            bytes(|b| b[28..32].copy_from_slice(&0x7fff_0000u32.to_be_bytes())),
        ),
        (
            "header-file-hash",
            bytes(|b| {
                let n = b.len();
                b[n - 1] ^= 0x55;
            }),
        ),
        ("header-version", spec(|s| s.container_version = 2)),
        ("hw-arch", spec(|s| s.hw_arch = 0)),
        ("extension-unsupported", spec(|s| s.extensions.push(40))),
        (
            "extension-periph",
            spec(|s| s.extensions.retain(|&e| e != 26)),
        ),
        (
            "resource-range",
            spec(|s| {
                s.resource_offset_shift
                    .insert("embeddings.bin".into(), 1 << 20);
            }),
        ),
        (
            "resource-hash",
            spec(|s| s.bad_resource_hash.push("tokenizer.json".into())),
        ),
        (
            "resource-missing",
            spec(|s| s.resources.retain(|r| r.0 != "rope_theta_data.bin")),
        ),
        ("group-naming", spec(|s| s.groups[0].name = "m__pre".into())),
        (
            "group-ambiguous",
            spec(|s| s.groups[1].name = "x_prefill".into()),
        ),
        (
            "group-no-tbt",
            spec(|s| {
                s.groups.pop();
            }),
        ),
        ("group-scope", spec(|s| s.groups[1].name = "n__tbt".into())),
        (
            "core-op-duplicate",
            spec(|s| s.groups[1].core_op_name = "m__prefill".into()),
        ),
        (
            "core-op-name",
            spec(|s| s.groups[1].core_op_name = "other".into()),
        ),
        ("group-single-context", spec(|s| s.groups[1].contexts = 1)),
        ("cache-missing", spec(|s| s.groups[1].caches.clear())),
        // a corrupt (negative) scale on a cache edge that declares its quantisation
        (
            "quant-scale",
            spec(|s| s.groups[1].caches[0].quant.scale = -0.5),
        ),
        (
            "cache-pairing",
            spec(|s| {
                s.groups[1]
                    .caches
                    .retain(|c| !(c.id == 1 && c.direction == 1))
            }),
        ),
        (
            "cache-negative-id",
            spec(|s| {
                for g in 0..2 {
                    for c in s.groups[g].caches.iter_mut().filter(|c| c.id == 3) {
                        c.id = -1;
                    }
                }
            }),
        ),
        (
            "cache-edge-invalid",
            spec(|s| cache_mut(s, 0, 0, 0).data_bytes = 4),
        ),
        (
            "cache-entry-size",
            spec(|s| cache_mut(s, 1, 0, 1).padded[2] = 32),
        ),
        (
            "cache-window",
            spec(|s| cache_mut(s, 0, 2, 0).padded = [70000, 1, 16]),
        ),
        (
            "cache-stride",
            spec(|s| {
                for g in 0..2 {
                    for c in s.groups[g].caches.iter_mut() {
                        c.padded[2] = 1536;
                    }
                }
                cache_mut(s, 0, 0, 0).padded[0] = 16384;
            }),
        ),
        (
            "cache-length",
            spec(|s| cache_mut(s, 1, 2, 0).padded[0] = 30),
        ),
        (
            "cache-id-set",
            spec(|s| {
                for c in s.groups[1].caches.iter_mut().filter(|c| c.id == 3) {
                    c.id = 7;
                }
            }),
        ),
        (
            "cache-kv-size",
            spec(|s| set_config(s, |v| v["pre_process_params"]["kv_cache_size"] = 64.into())),
        ),
        (
            "cache-prefill-out",
            spec(|s| {
                for c in s.groups[0].caches.iter_mut() {
                    c.padded[0] = if c.direction == 0 { 28 } else { 4 };
                }
            }),
        ),
        (
            "cache-tbt-out",
            spec(|s| {
                for c in s.groups[1].caches.iter_mut() {
                    c.padded[0] = if c.direction == 0 { 30 } else { 2 };
                }
            }),
        ),
        (
            "layout-mismatch",
            spec(|s| cache_mut(s, 1, 0, 0).format = 3),
        ),
        // finding 9: the tbt read side streams feature-major with tokens on the width axis
        (
            "layout-not-ring-safe",
            spec(|s| {
                for g in 0..2 {
                    let c = cache_mut(s, g, 1, 0);
                    c.format = 1;
                    c.padded = [1, c.padded[0], 16];
                }
            }),
        ),
        (
            "cache-quant-mismatch",
            spec(|s| cache_mut(s, 1, 2, 0).quant = q(120.0, 0.5)),
        ),
        (
            "config-invalid",
            spec(|s| s.resources[0].1 = b"{not json".to_vec()),
        ),
        (
            "config-key-size",
            spec(|s| {
                set_config(s, |v| {
                    let p = v["pre_process_params"].as_object_mut().unwrap();
                    let n = p.remove("prefill_input_tokens_count").unwrap();
                    p.insert("prefill_input_tokens_size".into(), n);
                })
            }),
        ),
        (
            "config-unknown-key",
            spec(|s| set_config(s, |v| v["eos_token"] = 2.into())),
        ),
        (
            "config-missing-key",
            spec(|s| {
                set_config(s, |v| {
                    v.as_object_mut().unwrap().remove("eos_token_id");
                })
            }),
        ),
        (
            "input-suffix",
            spec(|s| s.groups[1].inputs[5].name = "m__tbt/input_layer7".into()),
        ),
        // finding 1: the graph stops at the hidden state
        (
            "output-width",
            spec(|s| {
                for g in s.groups.iter_mut() {
                    g.outputs[0].shape[2] = GEO.f;
                    g.outputs[0].padded[2] = GEO.f;
                }
            }),
        ),
        // finding 2: full-sequence logits
        (
            "output-shape",
            spec(|s| s.groups[0].outputs[0].shape = [1, GEO.p, GEO.vocab]),
        ),
        // finding 12: unequal lm_head shards
        (
            "output-shards",
            spec(|s| {
                for g in s.groups.iter_mut() {
                    let mut a = g.outputs[0].clone();
                    let mut b = a.clone();
                    a.shape[2] = 40;
                    b.shape[2] = 24;
                    b.name = format!("{}/output_layer2", g.name);
                    g.sorted_outputs.push(b.name.clone());
                    g.outputs = vec![a, b];
                }
            }),
        ),
        (
            "output-order",
            spec(|s| s.groups[0].sorted_outputs = vec!["m__prefill/other".into()]),
        ),
        // finding 3: pe_q declared with head_dim width instead of NH·head_dim
        (
            "rope-width",
            spec(|s| s.groups[0].inputs[2].shape = [GEO.p, 1, GEO.d]),
        ),
        ("rope-theta", spec(|s| s.resources[3].1.truncate(7 * 4))),
        (
            "mask-shape",
            spec(|s| s.groups[1].inputs[1].shape = [1, GEO.nh, 24]),
        ),
        (
            "embeddings-input",
            spec(|s| s.groups[1].inputs[0].data_bytes = 1),
        ),
        (
            "embeddings-table",
            spec(|s| {
                let n = s.resources[2].1.len();
                s.resources[2].1.truncate(n - 2);
            }),
        ),
    ]
}

#[test]
fn each_broken_variant_trips_its_check() {
    let mut failures = Vec::new();
    for (id, make) in variants() {
        let h = match Hef::parse(make()) {
            Ok(h) => h,
            Err(e) => {
                failures.push(format!("{id}: variant unreadable: {e}"));
                continue;
            }
        };
        let lints = hef::lint(&h);
        let hit = lints.iter().find(|l| l.id == id);
        match hit {
            None => failures.push(format!(
                "{id}: not reported; got {:?}",
                lints.iter().map(|l| l.id).collect::<Vec<_>>()
            )),
            Some(l) => {
                assert!(
                    !l.message.is_empty() && !l.fix.is_empty() && !l.message.contains('\n'),
                    "{id}: {l:?}"
                );
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_registered_check_has_a_variant() {
    let tested: BTreeSet<&str> = variants().iter().map(|v| v.0).collect();
    let registered: BTreeSet<&str> = CHECKS.iter().map(|c| c.id).collect();
    assert_eq!(tested, registered);
    // error-level findings from the prior art carry their finding reference
    for (id, f) in [
        ("output-width", "F1"),
        ("output-shape", "F2"),
        ("rope-width", "F3"),
        ("config-key-size", "F5"),
        ("layout-not-ring-safe", "F9"),
        ("output-shards", "F12"),
    ] {
        let c = CHECKS.iter().find(|c| c.id == id).unwrap();
        assert!(c.refs.contains(&f), "{id} should cite {f}");
        assert_eq!(c.severity, Severity::Error);
    }
}

#[test]
fn device_description_of_healthy_hef() {
    let h = parse(&healthy());
    let d = hef::describe::to_device_description(&h).unwrap();
    assert_eq!(d.backend, "hailo");
    assert_eq!(d.model_name, "m");
    assert_eq!((d.cache_len, d.prefill_len), (32, 8));
    assert_eq!(
        (d.shape.vocab_size, d.shape.hidden_size, d.shape.n_layers),
        (64, 32, 2)
    );
    assert_eq!(
        (d.shape.n_heads, d.shape.n_kv_heads, d.shape.head_dim),
        (4, 2, 8)
    );
    let p = d.group(kvprobe_schema::GroupKind::Prefill).unwrap();
    assert_eq!(p.rows, 8);
    let t = d.group(kvprobe_schema::GroupKind::Tbt).unwrap();
    assert_eq!(t.rows, 1);
    // E = NKV·D = 16 bytes → page 64 → Ep 64 (contract §1.2 table rule)
    for e in &p.cache_edges {
        assert_eq!(
            (e.entry_size, e.padded_entry_size, e.data_bytes),
            (16, 64, 1)
        );
        let expected_len = if e.direction == kvprobe_schema::CacheDirection::Input {
            24
        } else {
            8
        };
        assert_eq!(e.length, expected_len);
        assert_eq!(e.quant.zero_point, 128.0);
    }
    use kvprobe_schema::{DType, InputRole};
    let roles: Vec<_> = p.inputs.iter().map(|i| (i.role, i.host_dtype)).collect();
    assert_eq!(roles[0], (Some(InputRole::Embeddings), DType::U16));
    assert_eq!(roles[1], (Some(InputRole::AttentionMask), DType::U8));
    assert_eq!(roles[2], (Some(InputRole::PeQCos), DType::F32));
    assert_eq!(p.outputs[0].host_dtype, DType::F32);
    let theta = d.shape.rope_theta.unwrap();
    assert_eq!(theta.len(), 8);
    assert!((theta[1] + 10000f32.powf(-0.25)).abs() < 1e-6);
}

#[test]
fn sim_manifest_of_healthy_hef() {
    let h = parse(&healthy());
    let id = kvprobe_schema::ModelIdentity {
        path: "x".into(),
        sha256: "y".into(),
        architecture: "z".into(),
    };
    let m = hef::describe::to_sim_manifest(&h, id).unwrap();
    assert_eq!((m.cache_len, m.prefill_len), (32, 8));
    assert_eq!(m.cache_quant, "uint8");
    assert_eq!(m.cache_heads, "un-expanded");
    // 2 groups × 4 ids × 2 directions, all token-major
    assert_eq!(m.layouts.len(), 16);
    assert!(m
        .layouts
        .iter()
        .all(|l| l.layout == kvprobe_schema::Layout::TokenMajor));
    // the emulator's names: 5 graph quants + cache/k0, cache/v0, cache/k1, cache/v1
    let names: Vec<&str> = m.quant.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "embeddings",
            "attention_mask",
            "pe",
            "position_ids",
            "logits",
            "cache/k0",
            "cache/v0",
            "cache/k1",
            "cache/v1"
        ]
    );
    assert_eq!(m.quant[5].quant.scale, 0.02);
    assert_eq!(m.quant[8].quant.scale, 0.02 + 0.01 * 3.0);
    assert_eq!(m.quant[0].quant.zero_point, 32768.0);
    // layout order: prefill then tbt, ids ascending, input then output
    assert_eq!(
        (m.layouts[0].cache_id, m.layouts[0].direction.as_str()),
        (0, "input")
    );
    assert_eq!(
        (m.layouts[1].cache_id, m.layouts[1].direction.as_str()),
        (0, "output")
    );
    assert_eq!(m.layouts[8].group, kvprobe_schema::GroupKind::Tbt);
    let json = serde_json::to_string(&m).unwrap();
    let back: kvprobe_schema::SimManifest = serde_json::from_str(&json).unwrap();
    assert_eq!(back, m);
}

#[test]
fn extract_writes_each_resource() {
    let s = healthy();
    let h = parse(&s);
    let dir = tempfile::tempdir().unwrap();
    let written = h.extract(dir.path(), false).unwrap();
    assert_eq!(written.len(), 4);
    for (name, bytes) in &s.resources {
        assert_eq!(
            &std::fs::read(dir.path().join(name)).unwrap(),
            bytes,
            "{name}"
        );
    }
}

/// The binary HEFs the CLI tests read (tests/inspect_cli.rs cannot link the encoder's hash
/// crates). Regenerate with `KVPROBE_REGEN_HEF_FIXTURES=1 cargo test -p kvprobe-npu --test hef_lint`.
#[test]
fn committed_cli_fixtures_match_the_encoder() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hef");
    let mut broken = healthy();
    for g in broken.groups.iter_mut() {
        g.outputs[0].shape[2] = GEO.f;
        g.outputs[0].padded[2] = GEO.f;
    }
    for (name, spec) in [
        ("healthy.hef", healthy()),
        ("broken_output_width.hef", broken),
    ] {
        let bytes = encode(&spec);
        let path = dir.join(name);
        if std::env::var_os("KVPROBE_REGEN_HEF_FIXTURES").is_some() {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == bytes,
            "{name} differs from the encoder; regenerate it"
        );
    }
}
