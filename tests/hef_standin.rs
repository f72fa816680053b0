//! The `--hef` path end to end against the HailoRT stand-in (issue 11): a `--features hailo`
//! build whose shim is compiled against kvprobe's header subset and linked to the emulator-backed
//! `libhailort.so` of `scripts/build-standin.sh`. Runs only in such a build (`.ci/run` makes
//! one); the HEF comes from the project's own test encoder, written for the fixture model.
#![cfg(feature = "hailo")]

mod common;
use common::*;

#[path = "../npu/tests/hef_encoder.rs"]
mod enc;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A HEF the encoder writes for `model_dir`'s geometry, "compiled" with the quant infos the
/// emulator calibrates for this model (so that a healthy HEF runs healthy), with the model's
/// tokenizer, its embedding table quantised with the embeddings input quant and the model's
/// RoPE frequencies, so that it pairs with the model.
fn write_hef_for(model_dir: &Path, hef: &Path, l: u32, p: u32) {
    let model = std::sync::Arc::new(kvprobe_reference::Model::load(model_dir).unwrap());
    let c = model.config().clone();
    let geo = enc::Geo {
        l,
        p,
        nh: c.n_heads as u32,
        nkv: c.n_kv_heads as u32,
        d: c.head_dim as u32,
        f: c.hidden_size as u32,
        vocab: c.vocab_size as u32,
        layers: c.n_layers as u32,
    };
    let opts = kvprobe_npu::sim::options::SimOptions {
        cache_len: l as usize,
        prefill_len: p as usize,
        ..Default::default()
    };
    let calibrated = kvprobe_npu::sim::SimDevice::new(model.clone(), opts).unwrap();
    let quant = |name: &str| {
        let q = calibrated
            .manifest()
            .quant
            .iter()
            .find(|q| q.name == name)
            .unwrap_or_else(|| panic!("no calibrated quant {name}"))
            .quant;
        enc::Quant {
            zp: q.zero_point,
            scale: q.scale,
            min: q.min,
            max: q.max,
        }
    };
    let mut spec = enc::healthy_geo(&geo);
    for g in spec.groups.iter_mut() {
        let [emb, mask, pe @ ..] = g.inputs.as_mut_slice() else {
            panic!("encoder inputs")
        };
        emb.quant = quant("embeddings");
        mask.quant = quant("attention_mask");
        for x in pe {
            x.quant = quant("pe");
        }
        g.outputs[0].quant = quant("logits");
        for cs in g.caches.iter_mut() {
            let kv = if cs.id % 2 == 0 { "k" } else { "v" };
            cs.quant = quant(&format!("cache/{kv}{}", cs.id / 2));
        }
    }
    let eq = quant("embeddings");
    let table: Vec<f32> = model
        .embedding_table()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let emb: Vec<u8> = table
        .iter()
        .flat_map(|x| ((x / eq.scale + eq.zp).round().clamp(0.0, 65535.0) as u16).to_le_bytes())
        .collect();
    let tokenizer = model
        .tokenizer()
        .inner()
        .to_string(false)
        .unwrap()
        .into_bytes();
    let inv = model.rope_inv_freq().expect("a RoPE model");
    // The contract's fallback form (§2.6): first half negated. `inspect --emit-sim` reads the
    // convention off the table, so the emulated graph behind the stand-in expects it too.
    let plain: Vec<f32> = inv.iter().chain(inv.iter()).copied().collect();
    let theta: Vec<u8> = kvprobe_npu::RopeTheta::SignFolded
        .table(&plain)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    for (name, bytes) in spec.resources.iter_mut() {
        match name.as_str() {
            "tokenizer.json" => *bytes = tokenizer.clone(),
            "embeddings.bin" => *bytes = emb.clone(),
            "rope_theta_data.bin" => *bytes = theta.clone(),
            _ => {}
        }
    }
    std::fs::write(hef, enc::encode(&spec)).unwrap();
}

struct Case {
    _dir: tempfile::TempDir,
    model: PathBuf,
    hef: PathBuf,
    manifest: PathBuf,
}

impl Case {
    fn new(l: u32, p: u32) -> Case {
        Case::for_model(fixture("llama", 11), l, p)
    }

    fn for_model(model: PathBuf, l: u32, p: u32) -> Case {
        let dir = tempfile::tempdir().unwrap();
        let hef = dir.path().join("fixture.hef");
        write_hef_for(&model, &hef, l, p);
        let manifest = dir.path().join("sim.json");
        let out = kvprobe(&[
            "inspect",
            hef.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--emit-sim",
            manifest.to_str().unwrap(),
        ]);
        assert!(
            manifest.is_file(),
            "inspect --emit-sim: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        Case {
            _dir: dir,
            model,
            hef,
            manifest,
        }
    }

    /// The manifest with `faults` set (faults reach the stand-in through its manifest), and the
    /// edge layouts those faults imply, taken from an emulator built with them.
    fn with_faults(&self, faults: &[&str]) -> PathBuf {
        let mut m: kvprobe_schema::SimManifest =
            serde_json::from_slice(&std::fs::read(&self.manifest).unwrap()).unwrap();
        let model = std::sync::Arc::new(kvprobe_reference::Model::load(&self.model).unwrap());
        let opts = kvprobe_npu::sim::options::SimOptions {
            cache_len: m.cache_len,
            prefill_len: m.prefill_len,
            faults: faults.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        };
        let dev = kvprobe_npu::sim::SimDevice::new(model, opts).unwrap();
        m.layouts = dev.manifest().layouts.clone();
        m.faults = faults.iter().map(|f| f.to_string()).collect();
        let path = self.manifest.with_file_name(format!(
            "sim-{}.json",
            faults.join("_").replace(['/', '=', '@'], "-")
        ));
        std::fs::write(&path, serde_json::to_string(&m).unwrap()).unwrap();
        path
    }

    fn hef_run(&self, manifest: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut a: Vec<&str> = args.to_vec();
        a.extend([
            "--hef",
            self.hef.to_str().unwrap(),
            "--model",
            self.model.to_str().unwrap(),
        ]);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvprobe"));
        cmd.args(&a).env("KVPROBE_STANDIN_MANIFEST", manifest);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run kvprobe")
    }

    fn sim_run(&self, manifest: &Path, args: &[&str]) -> Output {
        let mut a: Vec<&str> = args.to_vec();
        a.extend([
            "--sim",
            "--sim-manifest",
            manifest.to_str().unwrap(),
            "--model",
            self.model.to_str().unwrap(),
        ]);
        kvprobe(&a)
    }

    /// `args` through the stand-in and through `--sim` with the same manifest: same exit code,
    /// same JSON numbers.
    fn assert_hef_equals_sim(&self, args: &[&str]) {
        let sim = self.sim_run(&self.manifest, args);
        let hef = self.hef_run(&self.manifest, &[], args);
        assert_eq!(
            hef.status.code(),
            sim.status.code(),
            "{}",
            String::from_utf8_lossy(&hef.stderr)
        );
        assert_same_numbers(&json(&sim), &json(&hef), "");
    }
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}); exit {:?}; stderr: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Every number in two JSON documents, paired by path; strings and structure must be equal
/// except for fields that name the backend or the files.
fn assert_same_numbers(a: &serde_json::Value, b: &serde_json::Value, path: &str) {
    use serde_json::Value as V;
    const BACKEND_FIELDS: &[&str] = &[
        "device",
        "backend",
        "hef",
        "sim_manifest",
        "manifest",
        "provenance",
        "command",
        "model_hash",
        "run",
    ];
    match (a, b) {
        (V::Number(x), V::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            // The emulator runs a probe's batched trials (colmap, maskconv, positions) as one
            // N-row graph run; the HailoRT backend loops them, so float sums are ordered
            // differently there (measured: up to 1.6e-6 on cosines, 6e-6 relative on KL). Everything else must agree to 1e-6.
            let batched = [".colmap", ".maskconv", ".positions"]
                .iter()
                .any(|p| path.contains(p));
            let tol = if batched {
                5e-5 * x.abs().max(1.0)
            } else {
                1e-6
            };
            assert!((x - y).abs() <= tol, "{path}: --sim {x} vs --hef {y}");
        }
        (V::Object(x), V::Object(y)) => {
            for (k, v) in x {
                if BACKEND_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                let w = y
                    .get(k)
                    .unwrap_or_else(|| panic!("{path}.{k} missing with --hef"));
                assert_same_numbers(v, w, &format!("{path}.{k}"));
            }
        }
        (V::Array(x), V::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: lengths");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                assert_same_numbers(v, w, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

const IDS: &str = "5,17,42,99,7,3,250,64,12";

#[test]
fn greedy_through_the_standin_equals_the_emulator() {
    let c = Case::new(32, 8);
    let args = ["greedy", "--ids", IDS, "--steps", "12", "--json"];
    c.assert_hef_equals_sim(&args);
}

/// Each failure HailoRT reports becomes one stderr line with the status name and exit 3.
#[test]
fn device_failures_are_one_line_and_exit_3() {
    let c = Case::new(32, 8);
    let args = ["greedy", "--ids", IDS, "--steps", "2"];
    let missing = c.manifest.with_file_name("no-such.json");
    type Failure<'a> = (PathBuf, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Failure> = vec![
        (missing, vec![], "HAILO_OUT_OF_PHYSICAL_DEVICES"),
        (
            c.manifest.clone(),
            vec![("KVPROBE_STANDIN_LATENCY_MS", "20000")],
            "HAILO_TIMEOUT",
        ),
        (
            c.manifest.clone(),
            vec![("KVPROBE_STANDIN_VERSION", "6.0.0")],
            "HailoRT 6.0.0",
        ),
    ];
    for (manifest, env, expect) in cases {
        let o = c.hef_run(&manifest, &env, &args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{expect}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{expect}: {stderr}");
        assert!(stderr.contains(expect), "{expect}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A HEF whose cache edges disagree with the device (the stand-in's manifest made for L = 48,
/// the HEF declares L = 32): HailoRT refuses the configure, exit 3.
#[test]
fn a_hef_that_disagrees_with_the_device_is_refused() {
    let c = Case::new(32, 8);
    let other = Case::new(48, 8);
    let o = c.hef_run(
        &other.manifest,
        &[],
        &["greedy", "--ids", IDS, "--steps", "2"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE"),
        "{stderr}"
    );
}

#[test]
fn colmap_through_the_standin_equals_the_emulator() {
    let c = Case::new(32, 8);
    let args = ["colmap", "--ids", IDS, "--json"];
    c.assert_hef_equals_sim(&args);
}

/// `diagnose` reaches the same verdict through the stand-in as the emulator, healthy and under
/// three faults the stand-in's emulator injects (layout, offset, mask): a `--hef` run replays
/// its hypotheses on the emulator the HEF describes (`inspect --emit-sim`'s manifest, faults
/// replaced by the hypothesis), as the manifest run does on its manifest, so everything but the
/// reproducer's command agrees number for number; that command, run as a user would (its
/// `inspect --emit-sim` first), gives the device's tokens.
#[test]
fn diagnose_verdicts_match_under_faults() {
    let c = Case::new(32, 8);
    let args = ["diagnose", "--ids", IDS, "--json"];
    for faults in [
        &[][..],
        &["tbt-read-layout=feature-major"][..],
        &["offset=after-run"][..],
        &["mask=left-valid"][..],
    ] {
        let m = c.with_faults(faults);
        let sim = json(&c.sim_run(&m, &args));
        let hef = json(&c.hef_run(&m, &[], &args));
        eprintln!(
            "{faults:?}: --sim {} / --hef {}; replay {} s / {} s",
            verdict(&sim),
            verdict(&hef),
            replay_seconds(&sim),
            replay_seconds(&hef)
        );
        assert_eq!(verdict(&sim), verdict(&hef), "{faults:?}");
        assert_same_numbers(&sim, &hef, &format!("{faults:?}"));
        if !faults.is_empty() {
            c.assert_reproducer_gives_the_device_tokens(&hef, &m);
        }
    }
}

/// The diagnosis' replay phase, in seconds (0 when none ran).
fn replay_seconds(v: &serde_json::Value) -> f64 {
    v["provenance"]["timings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["what"].as_str().is_some_and(|w| w.contains("replay")))
        .filter_map(|t| t["seconds"].as_f64())
        .sum()
}

impl Case {
    /// A `--hef` verdict's reproducer: `inspect --emit-sim` then a `--sim-manifest` greedy run
    /// with the hypothesis, run in the case's folder; its tokens are those of the same greedy
    /// run on the device (`device`: the stand-in's manifest), both fresh processes (the
    /// diagnosis' own greedy probe runs after other probes, from another ring state).
    fn assert_reproducer_gives_the_device_tokens(&self, hef: &serde_json::Value, device: &Path) {
        let rep = &hef["reproducer"];
        let argv = |key: &str| -> Vec<String> {
            rep[key]
                .as_array()
                .unwrap_or_else(|| panic!("no reproducer {key}: {rep}"))
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        };
        let (setup, command) = (argv("setup"), argv("command"));
        assert_eq!(&setup[..2], ["kvprobe", "inspect"], "{rep}");
        assert_eq!(&command[..2], ["kvprobe", "greedy"], "{rep}");
        let fault = rep["replay"]["fault"].to_string();
        eprintln!(
            "reproducer: {} && {} ({fault})",
            setup.join(" "),
            command.join(" ")
        );
        let run = |a: &[String]| {
            Command::new(env!("CARGO_BIN_EXE_kvprobe"))
                .args(&a[1..])
                .current_dir(self.hef.parent().unwrap())
                .output()
                .expect("run kvprobe")
        };
        let o = run(&setup);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut greedy = command.clone();
        greedy.push("--json".into());
        let g = json(&run(&greedy));
        let at = command
            .iter()
            .position(|a| a == "--steps")
            .expect("--steps");
        let on_device = json(&self.hef_run(
            device,
            &[],
            &[
                "greedy",
                "--ids",
                IDS,
                "--steps",
                &command[at + 1],
                "--json",
            ],
        ));
        let ids = &g["probes"]["greedy"]["device_ids"];
        assert!(ids.as_array().is_some_and(|a| !a.is_empty()), "{g}");
        assert_eq!(
            ids, &on_device["probes"]["greedy"]["device_ids"],
            "{command:?}"
        );
    }
}

/// Valgrind over one `--hef` run (CI sets KVPROBE_STANDIN_VALGRIND=1): no invalid read or write
/// and no definite leak anywhere in the process, the shim and the RAII handles included.
#[test]
fn valgrind_finds_no_error_in_one_hef_run() {
    if std::env::var_os("KVPROBE_STANDIN_VALGRIND").is_none() {
        eprintln!("skipped: set KVPROBE_STANDIN_VALGRIND=1 (needs valgrind on PATH)");
        return;
    }
    let c = Case::new(32, 8);
    let log = c.manifest.with_file_name("valgrind.log");
    let o = Command::new("valgrind")
        .args([
            "--error-exitcode=99",
            "--leak-check=full",
            "--show-leak-kinds=definite",
            "--errors-for-leak-kinds=definite",
            &format!("--log-file={}", log.display()),
            env!("CARGO_BIN_EXE_kvprobe"),
            "greedy",
            "--ids",
            IDS,
            "--steps",
            "3",
            "--hef",
            c.hef.to_str().unwrap(),
            "--model",
            c.model.to_str().unwrap(),
        ])
        .env("KVPROBE_STANDIN_MANIFEST", &c.manifest)
        .output()
        .expect("run valgrind");
    let report = std::fs::read_to_string(&log).unwrap_or_default();
    let summary: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("ERROR SUMMARY") || l.contains("definitely lost"))
        .collect();
    eprintln!("{}", summary.join("\n"));
    assert_eq!(o.status.code(), Some(0), "valgrind found errors:\n{report}");
}

/// Without libhailort.so on the library path the dynamic loader stops the binary before `main`:
/// one line naming the library, exit 127. kvprobe cannot word it (the library is linked, not
/// loaded with dlopen); docs/hardware.md gives the fix.
#[test]
fn a_missing_libhailort_is_one_loader_line() {
    let o = Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(["greedy", "--hef", "x.hef", "--model", "m"])
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run kvprobe");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(127), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("libhailort.so"), "{stderr}");
}

/// The real model: a SmolLM2 HEF (30 layers, vocab 49152) through the stand-in.
#[test]
fn smollm2_greedy_through_the_standin_equals_the_emulator() {
    let Some(model) = smollm2() else { return };
    let c = Case::for_model(model, 32, 8);
    let args = [
        "greedy",
        "--prompt",
        "Once upon a time",
        "--steps",
        "8",
        "--json",
    ];
    c.assert_hef_equals_sim(&args);
}

/// Through the backend itself: an unknown stream name and a cache buffer of the wrong size are
/// refused by HailoRT (the stand-in) with their status, mapped to device errors (exit 3).
#[test]
fn unknown_stream_and_wrong_buffer_size_are_device_errors() {
    use kvprobe_npu::{Buffer, Device};
    let c = Case::new(32, 8);
    // Only this test opens a device in this process; the others pass the manifest per command.
    std::env::set_var("KVPROBE_STANDIN_MANIFEST", &c.manifest);
    let mut dev = kvprobe_npu::hailo::HailoDevice::open(&c.hef).expect("open through the stand-in");
    let e = dev
        .run(
            kvprobe_schema::GroupKind::Prefill,
            &[("m__prefill/no_such_input".into(), Buffer::U8(vec![0; 4]))],
        )
        .unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(e.to_string().contains("HAILO_NOT_FOUND"), "{e}");
    let sizes: Vec<usize> = dev
        .cache_buffers()
        .unwrap()
        .values()
        .map(Vec::len)
        .collect();
    assert_eq!(
        sizes.len(),
        2 * kvprobe_reference::fixtures::LLAMA_LAYERS,
        "K and V per layer"
    );
    let e = dev
        .write_cache_buffer(0, &vec![0u8; sizes[0] - 1])
        .unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(e.to_string().contains("HAILO_INVALID_ARGUMENT"), "{e}");
}

/// The run's provenance carries what a bug write-up needs of the runtime: HailoRT's version and
/// the device's firmware (both the stand-in's `KVPROBE_STANDIN_VERSION`, its firmware being its
/// library), the board it identifies as, and the HEF's architecture (the encoder writes 103).
#[test]
fn provenance_names_runtime_firmware_and_hef() {
    let c = Case::new(32, 8);
    let out = c.hef_run(
        &c.manifest,
        &[("KVPROBE_STANDIN_VERSION", "5.3.1")],
        &["greedy", "--ids", IDS, "--steps", "2", "--json"],
    );
    let v = &json(&out)["provenance"]["versions"];
    assert_eq!(v["hailort"], "5.3.1", "{v}");
    assert_eq!(v["firmware"], "5.3.1", "{v}");
    assert_eq!(v["board"], "kvprobe-standin", "{v}");
    assert_eq!(
        v["hef architecture"], "HAILO1XH (Hailo-15H / Hailo-10H)",
        "{v}"
    );
    // the emulator names itself instead
    let sim = json(&c.sim_run(
        &c.manifest,
        &["greedy", "--ids", IDS, "--steps", "2", "--json"],
    ));
    let e = sim["provenance"]["versions"]["emulator"]
        .as_str()
        .unwrap_or_default();
    assert!(e.contains("HailoRT genai emulator"), "{e}");
}
