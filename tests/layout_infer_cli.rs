//! `kvprobe layout --infer` through the binary: each layout the emulator can write is recovered
//! per cache edge with no hint, quantised and float, scoped faults give per-edge answers, and an
//! offset fault shows as a slot shift. Expected maps come from the emulator's own layout
//! functions (npu/src/layout.rs) for the injected fault, never from the solver.

use crate::common;
use common::*;

use kvprobe_npu::layout::{position_table, StreamShape};
use kvprobe_schema::Layout;

/// Llama fixture: 2 KV heads × 16 dims (C = 32), 2 layers. P = 32 with a 13-token prompt: one
/// padded prefill run whose 32-token window gives tile16 two tiles.
const GEO: [&str; 6] = [
    "--cache-len",
    "64",
    "--prefill-len",
    "32",
    "--ids",
    "1,5,9,22,41,17,3,99,150,200,12,7,8",
];
const N: usize = 32;
const C: usize = 32;
const HEAD_DIM: usize = 16;

/// `layout --infer --sim --model MODEL EXTRA... --json` → the finding (exit 0 required).
fn infer_on(model: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut a = vec![
        "layout",
        "--infer",
        "--sim",
        "--model",
        model.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    let (code, v, stderr) = kvprobe_json(&a);
    assert_eq!(code, 0, "{extra:?}: {stderr}");
    v["probes"]["layout_infer"].clone()
}

/// The Llama fixture in the test geometry.
fn infer(extra: &[&str]) -> serde_json::Value {
    let mut a = GEO.to_vec();
    a.extend_from_slice(extra);
    infer_on(&fixture("llama", 7), &a)
}

/// The whole command line of `infer`, for runs that read stdout or write --out.
fn llama_cmd(extra: &[&str]) -> Vec<String> {
    let f = fixture("llama", 7);
    let head = ["layout", "--infer", "--sim", "--model", f.to_str().unwrap()];
    head.iter()
        .chain(&GEO)
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

fn run(cmd: &[String]) -> std::process::Output {
    kvprobe(&cmd.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Element positions of the map a cache reports (digits outer → inner, full tiles).
fn reported_positions(c: &serde_json::Value) -> Vec<usize> {
    let digits = c["digits"].as_array().expect("digits");
    let mut out = Vec::with_capacity(N * C);
    for t in 0..N {
        for f in 0..C {
            let mut p = 0;
            for d in digits {
                let x = if d["axis"] == "token" { t } else { f };
                let div = d["divisor"].as_u64().unwrap() as usize;
                let size = d["size"].as_u64().unwrap() as usize;
                let stride = d["stride"].as_u64().unwrap() as usize;
                p += (x / div) % size * stride;
            }
            out.push(p);
        }
    }
    out
}

fn emulator_positions(l: Layout) -> Vec<usize> {
    let sh = StreamShape {
        tokens: N,
        features: C,
        elem_bytes: 1,
        head_dim: HEAD_DIM,
    };
    position_table(l, sh)
}

fn assert_edge(c: &serde_json::Value, want: Layout, shift: i64, ctx: &str) {
    assert_eq!(c["explained"], true, "{ctx}: {c}");
    assert_eq!(c["shift"], shift, "{ctx}: {c}");
    assert!(
        reported_positions(c) == emulator_positions(want),
        "{ctx}: cache {} is {} , expected {}",
        c["cache_id"],
        c["formula"],
        want.name()
    );
}

#[test]
fn recovers_every_writer_layout_quantised_and_float() {
    for quant in [&[][..], &["--sim-quant", "none"][..]] {
        for layout in Layout::ALL.into_iter().chain(Layout::TEST) {
            let fault = format!("prefill-write-layout={}", layout.name());
            let mut extra: Vec<&str> = quant.to_vec();
            if layout != Layout::TokenMajor {
                extra.extend_from_slice(&["--fault", &fault]);
            }
            let f = infer(&extra);
            assert_eq!(f["unexplained"], 0, "{extra:?}");
            for c in f["caches"].as_array().unwrap() {
                assert_edge(c, layout, 0, &format!("{extra:?}"));
            }
        }
    }
}

#[test]
fn healthy_is_token_major_at_shift_zero() {
    // 16-bit cache edges are explained too (SmolLM2 below shows why the 8-bit floor is needed)
    let f = infer(&["--sim-cache-bits", "16"]);
    assert_eq!(f["unexplained"], 0, "{f}");
    assert_eq!(f["writer_formula"], "ℓ(t, c) = 32·t + c");
    let f = infer(&[]);
    assert_eq!(f["writer_formula"], "ℓ(t, c) = 32·t + c");
    assert_eq!(f["writer_shift"], 0);
    assert!(f["outlier_edges"].as_array().unwrap().is_empty());
    for c in f["caches"].as_array().unwrap() {
        assert_eq!(c["named"], "token-major");
        // the 13 prompt tokens sit in slots 0..12, every element explained; no other slot is used
        let slots = c["slot_fraction"].as_array().unwrap();
        for (s, x) in slots.iter().enumerate() {
            let x = x.as_f64().unwrap();
            if s < 13 {
                assert!(x > 0.95, "slot {s}: {x}");
            } else {
                assert_eq!(x, -1.0, "slot {s}");
            }
        }
    }
}

#[test]
fn scoped_layout_faults_give_per_edge_results() {
    let f = infer(&["--fault", "prefill-write-layout=head-major@k"]);
    for c in f["caches"].as_array().unwrap() {
        let want = if c["kind"] == "k" {
            Layout::HeadMajor
        } else {
            Layout::TokenMajor
        };
        assert_edge(c, want, 0, "head-major@k");
    }
    let f = infer(&["--fault", "prefill-write-layout=tile16@layer=1"]);
    for c in f["caches"].as_array().unwrap() {
        let want = if c["layer"] == 1 {
            Layout::Tile16
        } else {
            Layout::TokenMajor
        };
        assert_edge(c, want, 0, "tile16@layer=1");
    }
    // the majority is a tie of two edges each; the others are named as differing
    assert_eq!(f["outlier_edges"].as_array().unwrap().len(), 2, "{f}");
}

#[test]
fn an_offset_fault_is_a_slot_shift() {
    // offset=after-run: the driver's update_cache_offset(+13) before the only prefill run
    // (contract §2.3) lands after it, so the run writes its window [R − 32, R) at R = 0 instead
    // of R = 13: every token 13 slots early.
    let f = infer(&["--fault", "offset=after-run"]);
    for c in f["caches"].as_array().unwrap() {
        assert_edge(c, Layout::TokenMajor, -13, "offset=after-run");
    }
}

#[test]
fn smollm2_head_major_through_the_binary() {
    let Some(model) = smollm2() else { return };
    let f = infer_on(&model, &["--fault", "prefill-write-layout=head-major@v"]);
    assert_eq!(f["unexplained"], 0);
    // SmolLM2: 3 KV heads × 64 (C = 192), P = 32: head-major = ⌊c/64⌋·32·64 + 64t + c mod 64
    for c in f["caches"].as_array().unwrap() {
        let want = if c["kind"] == "v" {
            "ℓ(t, c) = 2048·⌊c/64⌋ + 64·t + c mod 64"
        } else {
            "ℓ(t, c) = 192·t + c"
        };
        assert_eq!(c["formula"], want, "{c}");
        assert_eq!(c["shift"], 0);
    }
    // 16-bit cache edges: a u16 step is ~1/257 of a u8 step, far below the error the uint16
    // embeddings and other edges already put into SmolLM2's K/V; the 8-bit floor explains them
    let f = infer_on(&model, &["--sim-cache-bits", "16"]);
    assert_eq!(f["unexplained"], 0, "{}", f["outlier_edges"]);
    assert_eq!(f["writer_formula"], "ℓ(t, c) = 192·t + c");
}

#[test]
fn artefacts_report_section_and_rerender() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let o = out.to_str().unwrap();
    let done = run(&llama_cmd(&["--fault", "truncate-entry=16@v", "--out", o]));
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(0), "{stderr}");
    for file in [
        "results.json",
        "report.html",
        "layout_infer.csv",
        "layout_infer_slots.npy",
        "layout_infer_columns.npy",
        "layout_infer_slots.svg",
        "layout_infer_columns.svg",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let csv = std::fs::read_to_string(out.join("layout_infer.csv")).unwrap();
    // header + one row per edge (2 layers × K/V); V edges keep 16 of 32 bytes: unexplained
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert_eq!(
        csv.lines().filter(|l| l.contains(",V,false,")).count(),
        2,
        "{csv}"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("id=\"layout-infer\""));
    let before = std::fs::read(out.join("report.html")).unwrap();
    let r = kvprobe(&["report", o]);
    assert_eq!(
        r.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(std::fs::read(out.join("report.html")).unwrap(), before);
}

#[test]
fn tile16_with_a_narrower_last_tile_on_gpt2() {
    // GPT-2 fixture: 4 heads × 16 (C = 64), P = 24: tile16 = 16-token tile then an 8-token tile,
    // each feature-major: ⌊t/16⌋·16·64 + c·w + t mod 16 with w = 16, then 8 (npu layout.rs)
    let f = infer_on(
        &fixture("gpt2", 7),
        &[
            "--cache-len",
            "40",
            "--prefill-len",
            "24",
            "--ids",
            "1,5,9,22,41,17,3,99,150,200,12,7,8,40,41,42,43,44,45,46",
            "--fault",
            "prefill-write-layout=tile16",
        ],
    );
    assert_eq!(f["unexplained"], 0, "{f}");
    assert_eq!(
        f["writer_formula"],
        "ℓ(t, c) = 1024·⌊t/16⌋ + 16·c + t mod 16 (last tile of 8 tokens narrower)"
    );
    assert_eq!(f["writer_shift"], 0);
}

#[test]
fn text_summary_names_the_edges_that_differ() {
    let out = run(&llama_cmd(&[
        "--fault",
        "prefill-write-layout=f8cr@v,layer=0",
    ]));
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    // 3 of 4 edges token-major; V0 written f8cr: ⌊c/8⌋·8N + 8t + c mod 8 with N = 32
    assert!(
        text.starts_with("layout --infer: 3/4 cache edges follow token-major"),
        "{text}"
    );
    assert!(
        text.contains("V0: tokens on the width axis, 8-channel groups [ℓ(t, c) = 256·⌊c/8⌋ + 8·t + c mod 8] at shift +0"),
        "{text}"
    );
}
