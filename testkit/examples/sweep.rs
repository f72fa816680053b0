//! The full randomised diagnosis sweep (issue 12), driven by `scripts/sweep-diagnose.sh`:
//! generates seeded cases on the fixtures and SmolLM2, runs them through a `kvprobe` binary
//! (the release one by default) and prints the confusion matrix, accuracy, false alarms and the
//! misses with their commands.
//!
//! `cargo run --release -p kvprobe-testkit --example sweep -- [--seed N] [--fixture-faulty N] [--fixture-healthy N]
//!  [--smollm2-faulty N] [--smollm2-healthy N] [--jobs N] [--bin PATH] [--out FILE] [--list]
//!  [--family NAME]…` (`--family`, repeatable: draw faults of these `sweep::families()` only)

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use kvprobe_testkit::sweep::{self, ModelSpec, TEXTS};

struct Args {
    seed: u64,
    fixture_faulty: usize,
    fixture_healthy: usize,
    smollm2_faulty: usize,
    smollm2_healthy: usize,
    jobs: usize,
    bin: PathBuf,
    out: Option<PathBuf>,
    /// Print the cases' commands instead of running them.
    list: bool,
    /// Fault families to draw (all of `sweep::families()` when empty).
    families: Vec<String>,
}

/// The workspace folder (this example lives in `testkit/`).
fn workspace_root() -> &'static Path {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here)
}

fn parse() -> anyhow::Result<Args> {
    let root = workspace_root();
    let mut a = Args {
        seed: 12,
        fixture_faulty: 240,
        fixture_healthy: 45,
        smollm2_faulty: 80,
        smollm2_healthy: 20,
        jobs: 2,
        bin: root.join("target/release/kvprobe"),
        out: None,
        list: false,
        families: Vec::new(),
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
            "--fixture-faulty" => a.fixture_faulty = num()?,
            "--fixture-healthy" => a.fixture_healthy = num()?,
            "--smollm2-faulty" => a.smollm2_faulty = num()?,
            "--smollm2-healthy" => a.smollm2_healthy = num()?,
            "--jobs" => a.jobs = num()?,
            "--bin" => a.bin = PathBuf::from(&val),
            "--out" => a.out = Some(PathBuf::from(&val)),
            "--family" if sweep::families().contains(&val) => a.families.push(val),
            "--family" => bail!(
                "--family {val}: unknown; one of {}",
                sweep::families().join(", ")
            ),
            _ => bail!("unknown flag {flag}; see the header of examples/sweep.rs"),
        }
    }
    if !a.bin.is_file() {
        bail!(
            "{}: no kvprobe binary; run cargo build --release or pass --bin",
            a.bin.display()
        );
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let root = workspace_root();
    let fx = root.join("target/sweep-fixtures");
    let llama = fx.join("llama-7");
    let gpt2 = fx.join("gpt2-5");
    if !llama.join("tokenizer.json").is_file() {
        kvprobe_reference::fixtures::write_tiny_llama(&llama, 7)?;
    }
    if !gpt2.join("tokenizer.json").is_file() {
        kvprobe_reference::fixtures::write_tiny_gpt2(&gpt2, 5)?;
    }
    let fixtures = [
        ModelSpec::load("llama-fixture", &llama, None, 128, 32)?,
        ModelSpec::load("gpt2-fixture", &gpt2, None, 64, 32)?,
    ];
    let all = sweep::families();
    let families: Vec<&str> = if a.families.is_empty() {
        all.iter().map(String::as_str).collect()
    } else {
        a.families.iter().map(String::as_str).collect()
    };
    let mut cases = sweep::generate_families(
        a.seed,
        &fixtures,
        &families,
        a.fixture_faulty,
        a.fixture_healthy,
    );
    let smol = root.join(".cache/models/smollm2-135m-instruct-q4_1.gguf");
    if a.smollm2_faulty + a.smollm2_healthy > 0 {
        if !smol.is_file() {
            bail!(
                "{}: SmolLM2 missing; run scripts/fetch-model.sh",
                smol.display()
            );
        }
        // SmolLM2 diagnose costs ~10 s at L = 128: most cases use smaller caches and fewer steps
        let spec = ModelSpec::load("smollm2", &smol, Some(TEXTS), 64, 16)?;
        let base = cases.len();
        for mut c in sweep::generate_families(
            a.seed ^ 0x5eed,
            std::slice::from_ref(&spec),
            &families,
            a.smollm2_faulty,
            a.smollm2_healthy,
        ) {
            c.id += base;
            cases.push(c);
        }
    }
    if a.list {
        for c in &cases {
            println!("#{} want {}: {}", c.id, c.expect, c.command());
        }
        return Ok(());
    }
    eprintln!(
        "{} cases, {} jobs, binary {}",
        cases.len(),
        a.jobs,
        a.bin.display()
    );
    let done = std::sync::atomic::AtomicUsize::new(0);
    let total = cases.len();
    let outcomes = sweep::run_all(&a.bin, &cases, a.jobs, |o| {
        let k = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        eprintln!(
            "[{k}/{total}] #{} {} {}: {} (want {}) {:.1}s",
            o.case.id,
            o.case.model,
            o.case.fault.as_deref().unwrap_or("healthy"),
            o.verdict,
            o.case.expect,
            o.seconds
        );
    });
    let text = sweep::report(&outcomes, a.seed);
    println!("{text}");
    if let Some(p) = &a.out {
        std::fs::write(p, &text).with_context(|| format!("{}: cannot write", p.display()))?;
        // every case's verdict and evidence, one JSON object a line, for calibrating the rules
        let lines: Vec<String> = outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "id": o.case.id, "model": o.case.model, "fault": o.case.fault,
                    "expect": o.case.expect, "verdict": o.verdict, "also": o.also,
                    "confidence": o.confidence, "seconds": o.seconds, "evidence": o.evidence,
                    "command": o.case.command(),
                })
                .to_string()
            })
            .collect();
        let jl = p.with_extension("jsonl");
        std::fs::write(&jl, lines.join("\n") + "\n")
            .with_context(|| format!("{}: cannot write", jl.display()))?;
    }
    Ok(())
}
