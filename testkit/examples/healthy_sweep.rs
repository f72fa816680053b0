//! The healthy sweep (issue 18), driven by `scripts/sweep-healthy.sh`: fault-free diagnose runs on
//! the HailoRT emulator and the ANE emulator, SmolLM2 on the everyday prompts of
//! `sweep::PROMPTS` and the fixtures on random ids of 1 to 64 tokens, in every geometry class;
//! with `--onnx N`, also N cases per ONNX GenAI folder (default decoder and the uint8 windowed
//! cache, exported from the Llama fixture and SmolLM2) on the real ONNX Runtime (the binary
//! must be built with `--features onnx`).
//! Prints the false alarms (every verdict that is not `healthy`) with their commands and a table
//! per model × device × geometry class.
//!
//! `cargo run --release -p kvprobe-testkit --example healthy_sweep -- [--seed N] [--smollm2 N]
//!  [--fixture N] [--onnx N] [--jobs N] [--bin PATH] [--list]` (N = cases per model and device
//!  family; `--onnx`: per exported folder, default 0)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use kvprobe_testkit::sweep::{self, GeometryClass, ModelSpec, Rng, PROMPTS};

fn workspace_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here)
}

struct Args {
    seed: u64,
    smollm2: usize,
    fixture: usize,
    onnx: usize,
    jobs: usize,
    bin: PathBuf,
    list: bool,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        seed: 18,
        smollm2: 60,
        fixture: 45,
        onnx: 0,
        jobs: 2,
        bin: workspace_root().join("target/release/kvprobe"),
        list: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--list" {
            a.list = true;
            continue;
        }
        let val = it.next().with_context(|| format!("{flag} needs a value"))?;
        let num = || -> anyhow::Result<usize> {
            val.parse()
                .with_context(|| format!("{flag} {val}: not a whole number"))
        };
        match flag.as_str() {
            "--seed" => a.seed = num()? as u64,
            "--smollm2" => a.smollm2 = num()?,
            "--fixture" => a.fixture = num()?,
            "--onnx" => a.onnx = num()?,
            "--jobs" => a.jobs = num()?,
            "--bin" => a.bin = PathBuf::from(&val),
            _ => bail!("unknown flag {flag}; see the header of examples/healthy_sweep.rs"),
        }
    }
    Ok(a)
}

/// Random-id prompts of 1 to 64 tokens for a fixture (its tiny tokenizer makes any id a token).
fn random_prompts(seed: u64, vocab_hi: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed);
    (0..48)
        .map(|i| {
            let n = [1, 2, 3, 5, 8, 13, 21, 34, 55, 64][i % 10];
            let repeated = i % 7 == 3;
            let first = rng.range(3, vocab_hi) as u32;
            (0..n)
                .map(|_| {
                    if repeated {
                        first
                    } else {
                        rng.range(3, vocab_hi) as u32
                    }
                })
                .collect()
        })
        .collect()
}

/// The GenAI folders of a model, exported once (scripts/export-onnx.sh for SmolLM2, as CI does;
/// scripts/export-onnx.py for the Llama fixture). GPT-2 has no GenAI export here.
fn onnx_folders(root: &Path, m: &ModelSpec) -> anyhow::Result<Vec<sweep::OnnxFolder>> {
    let export = |cmd: &mut std::process::Command, out: &Path| -> anyhow::Result<()> {
        if out.join("genai_config.json").is_file() {
            return Ok(());
        }
        eprintln!("exporting {}", out.display());
        let st = cmd.current_dir(root).status().context("python3 / bash")?;
        if !st.success() {
            bail!("export of {} failed", out.display());
        }
        Ok(())
    };
    let folder = |dir: PathBuf, window: Option<usize>, max_length: usize| sweep::OnnxFolder {
        dir,
        window,
        max_length,
    };
    match m.label.as_str() {
        "smollm2" => {
            let d = root.join(".cache/onnx/smollm2-135m-genai");
            // the folder the tests and CI export (max_length 2048); the cases draw --max-ctx
            export(
                &mut std::process::Command::new("scripts/export-onnx.sh"),
                &d,
            )?;
            let w = root.join(".cache/onnx/smollm2-135m-genai-w16-c128-u8");
            export(
                std::process::Command::new("scripts/export-onnx.sh").args([
                    "--window",
                    "16",
                    "--kv-dtype",
                    "uint8",
                ]),
                &w,
            )?;
            Ok(vec![folder(d, None, 128), folder(w, Some(16), 128)])
        }
        "llama-fixture" => {
            let fx = root.join("target/sweep-fixtures");
            let (d, w) = (fx.join("onnx-llama-7"), fx.join("onnx-llama-7-w8c64u8"));
            let py = |out: &Path, extra: &[&str]| {
                let mut c = std::process::Command::new("python3");
                c.arg("scripts/export-onnx.py")
                    .arg(&m.path)
                    .arg(out)
                    .args(extra);
                c
            };
            export(&mut py(&d, &["--max-length", "128"]), &d)?;
            export(
                &mut py(
                    &w,
                    &["--window", "8", "--max-length", "64", "--kv-dtype", "uint8"],
                ),
                &w,
            )?;
            Ok(vec![folder(d, None, 128), folder(w, Some(8), 64)])
        }
        _ => Ok(Vec::new()),
    }
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let root = workspace_root();
    let fx = root.join("target/sweep-fixtures");
    let (llama, gpt2) = (fx.join("llama-7"), fx.join("gpt2-5"));
    if !llama.join("tokenizer.json").is_file() {
        kvprobe_reference::fixtures::write_tiny_llama(&llama, 7)?;
    }
    if !gpt2.join("tokenizer.json").is_file() {
        kvprobe_reference::fixtures::write_tiny_gpt2(&gpt2, 5)?;
    }
    let mut models = Vec::new();
    if a.fixture > 0 {
        for (label, path, l) in [("llama-fixture", &llama, 128), ("gpt2-fixture", &gpt2, 64)] {
            let spec = ModelSpec::load(label, path, None, l, 32)?;
            let prompts = random_prompts(a.seed ^ l as u64, 250);
            models.push((spec, prompts, a.fixture));
        }
    }
    let smol = root.join(".cache/models/smollm2-135m-instruct-q4_1.gguf");
    if a.smollm2 > 0 {
        if !smol.is_file() {
            bail!(
                "{}: SmolLM2 missing; run scripts/fetch-model.sh",
                smol.display()
            );
        }
        // SmolLM2 costs ~10 s a case at L = 128 and 32 steps: smaller caches and fewer steps
        let spec = ModelSpec::load("smollm2", &smol, Some(PROMPTS), 96, 16)?;
        let prompts = spec.prompts.clone();
        models.push((spec, prompts, a.smollm2));
    }
    let mut cases = Vec::new();
    for (spec, prompts, n) in &models {
        for mut c in sweep::healthy_cases(a.seed, &[(spec.clone(), prompts.clone())], *n, true) {
            c.id = cases.len();
            cases.push(c);
        }
    }
    if a.onnx > 0 {
        for (spec, prompts, _) in &models {
            for folder in onnx_folders(root, spec)? {
                for mut c in sweep::onnx_healthy_cases(a.seed, spec, prompts, &folder, a.onnx) {
                    c.id = cases.len();
                    cases.push(c);
                }
            }
        }
    }
    if a.list {
        for c in &cases {
            println!(
                "#{} [{}]: {}",
                c.id,
                GeometryClass::of(c).name(),
                c.command()
            );
        }
        return Ok(());
    }
    if !a.bin.is_file() {
        bail!(
            "{}: no kvprobe binary; run cargo build --release or pass --bin",
            a.bin.display()
        );
    }
    let total = cases.len();
    eprintln!(
        "{total} healthy cases, {} jobs, binary {}",
        a.jobs,
        a.bin.display()
    );
    let done = std::sync::atomic::AtomicUsize::new(0);
    let outcomes = sweep::run_all(&a.bin, &cases, a.jobs, |o| {
        let k = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        eprintln!(
            "[{k}/{total}] #{} {} {} n={}: {} {:.1}s",
            o.case.id,
            o.case.model,
            o.case.device.unwrap_or("hailo-sim"),
            o.case.ids.len(),
            o.verdict,
            o.seconds
        );
    });
    let mut table: BTreeMap<(String, &str, &str), (usize, usize)> = BTreeMap::new();
    let mut alarms = Vec::new();
    for o in &outcomes {
        let key = (
            o.case.model.clone(),
            o.case.device.unwrap_or("hailo-sim"),
            GeometryClass::of(&o.case).name(),
        );
        let e = table.entry(key).or_default();
        e.0 += 1;
        if o.verdict != "healthy" {
            e.1 += 1;
            alarms.push(format!(
                "- #{} {} (confidence {:.2}){}: {}",
                o.case.id,
                o.verdict,
                o.confidence,
                o.error
                    .as_deref()
                    .map_or(String::new(), |e| format!(" [{e}]")),
                o.case.command()
            ));
        }
    }
    println!(
        "healthy sweep, seed {}: {} cases, {} false alarms\n",
        a.seed,
        total,
        alarms.len()
    );
    println!(
        "| model | device | prompt vs geometry | cases | false alarms |\n|---|---|---|---|---|"
    );
    for ((m, d, g), (n, f)) in &table {
        println!("| {m} | {d} | {g} | {n} | {f} |");
    }
    let prompt_lens: Vec<usize> = cases.iter().map(|c| c.ids.len()).collect();
    println!(
        "\nprompt lengths {}-{} tokens",
        prompt_lens.iter().min().unwrap_or(&0),
        prompt_lens.iter().max().unwrap_or(&0)
    );
    for l in &alarms {
        println!("{l}");
    }
    Ok(())
}
