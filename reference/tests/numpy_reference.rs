//! Logits of the tiny fixtures against the independent numpy implementation
//! (`scripts/np_reference.py`, float64, written from the HF modelling code without sharing code
//! with this crate). Skipped with a message when python3 + numpy are not available.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cosine, ids};
use kvprobe_reference::{mask, ForwardOptions, Model};

fn script() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/np_reference.py");
    let numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    (p.is_file() && numpy).then_some(p)
}

/// Minimal .npy reader: little-endian f4/f8, C order, 2-D.
fn read_npy(path: &Path) -> (Vec<f32>, usize, usize) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let (hlen, start) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape = &header[header.find("'shape': (").unwrap() + 10..];
    let dims: Vec<usize> = shape[..shape.find(')').unwrap()]
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let data = &b[start + hlen..];
    let v: Vec<f32> = if header.contains("'<f8'") {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect()
    } else {
        assert!(header.contains("'<f4'"), "{header}");
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    assert_eq!(v.len(), dims[0] * dims[1]);
    (v, dims[0], dims[1])
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .fold(0, |b, (i, v)| if *v > x[b] { i } else { b })
}

fn check(script: &Path, dir: &Path, name: &str) {
    let m = Model::load(dir).unwrap();
    let v = m.config().vocab_size;
    let x = ids(15, v.min(20000), 42);
    let ids_arg = x.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    for single_key in [None, Some(4usize)] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("np.npy");
        let mut cmd = Command::new("python3");
        cmd.arg(script)
            .args(["logits", "--model"])
            .arg(dir)
            .args(["--ids", &ids_arg, "--out"])
            .arg(&out);
        if let Some(k) = single_key {
            cmd.args(["--single-key", &k.to_string()]);
        }
        let st = cmd.output().unwrap();
        assert!(
            st.status.success(),
            "np_reference failed: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        let (np, rows, cols) = read_npy(&out);
        assert_eq!((rows, cols), (15, v));
        let ours = m
            .forward(
                &x,
                &ForwardOptions {
                    mask: single_key.map(|k| mask::single_key(15, k)),
                    ..Default::default()
                },
            )
            .unwrap();
        let mut min_cos = 1.0f64;
        for t in 0..15 {
            let (a, b) = (ours.row(t), &np[t * v..(t + 1) * v]);
            min_cos = min_cos.min(cosine(a, b));
            assert_eq!(
                argmax(a),
                argmax(b),
                "{name} {single_key:?} row {t}: top-1 differs"
            );
        }
        println!("{name} single_key={single_key:?}: min cosine vs numpy {min_cos:.9}");
        assert!(
            min_cos > 0.99999,
            "{name} {single_key:?}: min cosine {min_cos}"
        );
    }
}

#[test]
fn tiny_fixtures_match_numpy_reference() {
    let Some(script) = script() else {
        eprintln!("skipped: python3 with numpy or scripts/np_reference.py not available");
        return;
    };
    let a = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(a.path(), 21).unwrap();
    check(&script, a.path(), "tiny llama");
    let b = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_gpt2(b.path(), 21).unwrap();
    check(&script, b.path(), "tiny gpt2");
}

/// Greedy ids of ours (KV-state decoding) against numpy's (full recompute per token), 20 tokens,
/// EOS ignored on both sides so that all 20 are compared.
fn check_greedy(script: &Path, path: &Path, name: &str) {
    let m = Model::load(path).unwrap();
    let prompt = ids(6, m.config().vocab_size.min(20000), 7);
    let mut ours = Vec::new();
    let mut state = m.empty_state().unwrap();
    let mut tok = prompt[0];
    for (i, &next) in prompt.iter().enumerate().skip(1) {
        m.decode_step(&mut state, tok, i - 1).unwrap();
        tok = next;
    }
    for step in 0..20 {
        let logits = m
            .decode_step(&mut state, tok, prompt.len() - 1 + step)
            .unwrap();
        tok = kvprobe_reference::generate::argmax(&logits);
        ours.push(tok);
    }
    let ids_arg = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new("python3")
        .arg(script)
        .args(["greedy", "--model"])
        .arg(path)
        .args(["--ids", &ids_arg, "--max-new", "20"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let np: Vec<u32> = v["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    println!("{name}: greedy 20 ids equal: {}", ours == np);
    assert_eq!(ours, np, "{name}: greedy ids differ");
}

/// Qwen2, Qwen3 and Llama-3 (rope_scaling llama3) fixtures, each as an HF folder and as a GGUF
/// file written the converter's way: prompt logits (causal and single-key) and 20 greedy ids
/// against numpy, which reads both formats and the RoPE scaling on its own.
#[test]
fn architecture_fixtures_match_numpy_reference() {
    use kvprobe_reference::arch_fixtures::{write_hf, FixtureArch, Geometry};
    use kvprobe_reference::fixtures::FixtureOptions;
    let Some(script) = script() else {
        eprintln!("skipped: python3 with numpy or scripts/np_reference.py not available");
        return;
    };
    for arch in FixtureArch::ALL {
        let (_, g) = Geometry::named(&format!("tiny-{}", arch.name())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let hf = dir.path().join("hf");
        write_hf(&hf, arch, &g, 5, &FixtureOptions::default()).unwrap();
        check(&script, &hf, &format!("{} HF", arch.name()));
        check_greedy(&script, &hf, &format!("{} HF", arch.name()));
        let gguf = dir.path().join("m.gguf");
        kvprobe_reference::fixtures_gguf::write_gguf(
            &gguf,
            arch,
            &g,
            5,
            candle_core::quantized::GgmlDType::F32,
        )
        .unwrap();
        check(&script, &gguf, &format!("{} GGUF", arch.name()));
        check_greedy(&script, &gguf, &format!("{} GGUF", arch.name()));
    }
}

/// `KVPROBE_NP_MODEL=path cargo test -p kvprobe-reference --test numpy_reference -- --ignored
/// --nocapture`: the same check on a real model (HF folder or GGUF).
#[test]
#[ignore = "needs a real model in KVPROBE_NP_MODEL; slow"]
fn model_from_env_matches_numpy_reference() {
    let (Some(script), Ok(model)) = (script(), std::env::var("KVPROBE_NP_MODEL")) else {
        eprintln!("skipped: set KVPROBE_NP_MODEL and install numpy");
        return;
    };
    let p = PathBuf::from(model);
    check(&script, &p, &p.display().to_string());
}

/// The fixture folder's embedding table multiplied so that its largest value is `max` (a
/// residual stream whose squares leave fp16's range in the first norm).
fn scale_embeddings(dir: &Path, max: f32) {
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
        let mut data = view.data().to_vec();
        if name == "model.embed_tokens.weight" {
            let vals: Vec<f32> = data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let k = max / vals.iter().fold(0f32, |a, v| a.max(v.abs()));
            data = vals.iter().flat_map(|v| (v * k).to_le_bytes()).collect();
        }
        owned.push((name, view.shape().to_vec(), data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, s, d)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d);
            (n.clone(), v.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &file).unwrap();
}

/// numpy's fp16 forward (`scripts/np_fp16_reference.py`): its logits and its first overflow.
fn numpy_fp16(dir: &Path, ids: &str, overflow: &str, norm: &str) -> (Vec<f32>, serde_json::Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/np_fp16_reference.py");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("np.npy");
    let run = Command::new("python3")
        .arg(&script)
        .args(["logits", "--model"])
        .arg(dir)
        .args([
            "--ids",
            ids,
            "--overflow",
            overflow,
            "--norm",
            norm,
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("python3 runs scripts/np_fp16_reference.py (numpy is installed by .ci/run)");
    assert!(
        run.status.success(),
        "np_fp16_reference failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    (read_npy(&out).0, v["overflow"].clone())
}

/// The fp16 reference (every op output rounded, fp16 weights) against numpy's own fp16 forward:
/// far closer to it than the float32 reference is, for each norm statistic; and on a fixture
/// whose first norm's squares leave fp16's range, the same first overflow (layer, op, value)
/// under IEEE infinities and under HTP's saturation.
#[test]
fn the_fp16_reference_matches_numpy_fp16() {
    use kvprobe_reference::{Arithmetic, Fp16, GraphOptions, NormStatistic, Overflow};
    let dir = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 21).unwrap();
    let run = |dir: &Path, f: Option<Fp16>| {
        let m = Model::load(dir).unwrap();
        let m = if f.is_some() {
            m.with_fp16_weights().unwrap()
        } else {
            m
        };
        let x = ids(12, m.config().vocab_size, 42);
        let graph = GraphOptions {
            arithmetic: f.map_or(Arithmetic::F32, Arithmetic::Fp16),
            ..Default::default()
        };
        let out = m
            .forward(
                &x,
                &ForwardOptions {
                    graph,
                    ..Default::default()
                },
            )
            .unwrap();
        (out.logits, out.overflow, x)
    };
    let arg = |x: &[u32]| x.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let max_diff =
        |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
    // relative L2: fp16's last-place flips (one step of the logits' own rounding) dominate a max
    let rel = |a: &[f32], b: &[f32]| {
        let d: f64 = a.iter().zip(b).map(|(p, q)| ((p - q) as f64).powi(2)).sum();
        (d / b.iter().map(|q| (*q as f64).powi(2)).sum::<f64>()).sqrt()
    };
    for (norm, form) in [
        ("squares", NormStatistic::Squares),
        ("max-scaled", NormStatistic::MaxScaled),
        ("fused", NormStatistic::Fused),
    ] {
        let f = Fp16::every_op(Overflow::Infinite, form);
        let (ours, over, x) = run(dir.path(), Some(f));
        let (f32_logits, _, _) = run(dir.path(), None);
        let (np, np_over) = numpy_fp16(dir.path(), &arg(&x), "inf", norm);
        let (d16, d32) = (rel(&ours, &np), rel(&f32_logits, &np));
        let same = ours.iter().zip(&np).filter(|(p, q)| p == q).count();
        println!(
            "{norm}: relative L2 to numpy fp16: fp16 ref {d16:.3e} ({same} of {} logits equal, max |Δ| {:.2e}), f32 ref {d32:.3e}",
            np.len(),
            max_diff(&ours, &np)
        );
        assert!(over.is_none() && np_over.is_null(), "{over:?} {np_over}");
        assert!(d16 * 2.0 < d32, "{norm}: fp16 {d16} vs f32 {d32}");
    }
    scale_embeddings(dir.path(), 1000.0);
    for (flag, overflow) in [
        ("inf", Overflow::Infinite),
        ("saturate:131008", Overflow::Saturate(131_008.0)),
    ] {
        let f = Fp16::every_op(overflow, NormStatistic::Squares);
        let (ours, over, x) = run(dir.path(), Some(f));
        let (np, np_over) = numpy_fp16(dir.path(), &arg(&x), flag, "squares");
        let over = over.expect("the first norm's squares overflow");
        println!("{flag}: ours {over:?}, numpy {np_over}");
        assert_eq!(
            (over.layer, over.within, over.op),
            (Some(0), Some("input_layernorm"), "x·x")
        );
        assert_eq!(np_over["layer"], 0);
        assert_eq!(np_over["within"], "input_layernorm");
        assert_eq!(np_over["op"], "x·x");
        assert_eq!(over.value as f64, np_over["value"].as_f64().unwrap());
        if flag != "inf" {
            let (f32_logits, f32_over, _) = run(dir.path(), None);
            assert!(f32_over.is_none());
            let (d16, d32) = (rel(&ours, &np), rel(&f32_logits, &np));
            println!("{flag}: relative L2 to numpy fp16: fp16 ref {d16:.3e}, f32 ref {d32:.3e}");
            assert!(d16 * 20.0 < d32, "saturated: fp16 {d16} vs f32 {d32}");
        }
    }
}
