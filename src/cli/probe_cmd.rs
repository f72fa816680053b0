//! `kvprobe <probe>` and `kvprobe diagnose`: open the device, run the probe (from the registry)
//! or the diagnosis, assemble `Results`, write the artefacts and print the summary.
//!
//! Exit codes (README): 0 healthy, or a single probe that ran; 1 a fault diagnosed or `unknown`;
//! 2 usage or input; 3 device.

mod args;
mod bar;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kvprobe_npu::sim::manifest::model_identity;
use kvprobe_probes::{ProbeOptions, Session};
use kvprobe_reference::Model;
use kvprobe_reports::NamedArray;
use kvprobe_schema::{ProbeFindings, Provenance, Results, RunOutcome, Timing, SCHEMA_VERSION};

use super::common::usage;
use super::device_args::{npu_error, probe_error, Backend, DeviceArgs, PromptTokenizer};
pub use args::ProbeCommand;
use bar::Bar;

pub fn run(cmd: ProbeCommand) -> anyhow::Result<()> {
    // std::env::args panics on a non-UTF-8 byte (a path); results.json records text
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let (name, args) = (cmd.name(), &cmd.args);
    check_args(name, args)?;
    let t0 = Instant::now();
    let (model_path, model) = args.load_model()?;
    // Emulator: prompt errors come before its calibration. HEF: the pairing check and the device
    // come first, then the HEF's tokenizer encodes the prompt (issue 6).
    let early_prompt = if args.hef.is_none() {
        Some(args.prompt_ids(&model, PromptTokenizer::Model)?)
    } else {
        None
    };
    let mut timings = vec![Timing {
        what: "load model".into(),
        seconds: t0.elapsed().as_secs_f64(),
    }];
    let t1 = Instant::now();
    let mut backend = args.open_device(&model)?;
    timings.push(Timing {
        what: "open device".into(),
        seconds: t1.elapsed().as_secs_f64(),
    });
    let (prompt, ids) = match early_prompt {
        Some(p) => p,
        None => args.prompt_ids(&model, backend.prompt_tokenizer(&model))?,
    };
    let limits = backend.device().limits();
    kvprobe_npu::contract::limits::check_prompt(&limits, ids.len()).map_err(npu_error)?;
    if matches!(name, "greedy" | "diagnose") {
        check_steps_fit(args.steps, ids.len(), model.config().max_position)?;
    }
    let tokens: Vec<String> = {
        let tok = match backend.prompt_tokenizer(&model) {
            PromptTokenizer::Model => model.tokenizer(),
            PromptTokenizer::Server(t) => t,
        };
        ids.iter().map(|&t| tok.token_piece(t)).collect()
    };
    let manifest = backend.sim_manifest().cloned();
    let desc = backend.describe().clone();
    let versions = backend.device().versions().into_iter().collect();
    let device_warnings = backend.device().warnings();
    let hef_path = backend.hef_path().map(Path::to_path_buf);
    let bar = Bar::new();
    let t2 = Instant::now();
    let (outcome, compared, setup, device_times) = {
        let share = name == "diagnose" && !args.no_shared_runs; // the one command that shares
        let mut dev = kvprobe_npu::SharedRuns::new(backend.device(), share);
        let mut s = Session::new(&model, &mut dev, ids.clone(), &bar).map_err(probe_error)?;
        let (replay, setup) = replayer(args, &model, &argv, &ids);
        let outcome = run_probe(&cmd, &mut s, replay);
        let compared = std::mem::take(&mut s.compared);
        (outcome, compared, setup, kvprobe_npu::Device::timings(&dev))
    };
    bar.finish();
    let mut ran = RunParts::of(outcome.map_err(probe_error)?);
    if let Some(r) = ran.reproducer.as_mut().filter(|r| !r.command.is_empty()) {
        r.setup = setup;
    }
    let warnings: Vec<String> = device_warnings.into_iter().chain(ran.warnings).collect();
    timings.extend(ran.timings);
    timings.push(Timing {
        what: "probes total".into(),
        seconds: t2.elapsed().as_secs_f64(),
    });
    let device_times = device_times.into_iter();
    timings.extend(device_times.map(|(what, seconds)| Timing { what, seconds }));
    // The emulator already hashed these weights for its manifest; hash them here only otherwise.
    let identity = match &manifest {
        Some(m) => m.model.clone(),
        None => model_identity(&model).map_err(npu_error)?,
    };
    let hef_sha256 = hef_path.as_deref().map(file_sha256).transpose()?;
    let results = Results {
        schema_version: SCHEMA_VERSION,
        command: name.to_string(),
        verdict: ran.verdict,
        confidence: ran.confidence,
        evidence: ran.evidence,
        also: ran.also,
        warnings,
        stage: ran.stage,
        hypothesis: ran.hypothesis,
        reproducer: ran.reproducer,
        incomplete: ran.incomplete,
        probes: ran.probes,
        provenance: Provenance {
            command: argv,
            kvprobe_version: env!("CARGO_PKG_VERSION").to_string(),
            git_hash: option_env!("KVPROBE_GIT_HASH").map(str::to_string),
            model_path: model_path.display().to_string(),
            model_sha256: identity.sha256,
            model_architecture: model.config().architecture.clone(),
            backend: desc.backend.clone(),
            hef_path: hef_path.map(|p| p.display().to_string()),
            hef_sha256,
            sim_manifest: manifest,
            cache_len: desc.cache_len,
            prefill_len: desc.prefill_len,
            prompt,
            prompt_tokens: tokens,
            prompt_ids: ids,
            timings,
            host: host(),
            versions,
        },
    };
    if let Some(out) = &args.out {
        let arrays: Vec<NamedArray> = compared
            .into_iter()
            .map(|c| NamedArray::f32(c.name, vec![c.rows, c.cols], c.data))
            .collect();
        write_out(out, args, &results, &arrays, &backend)?;
    }
    print_and_exit(&results, args.json)
}

/// What one probe or a diagnosis gives results.json: a single probe has no verdict.
struct RunParts {
    verdict: Option<kvprobe_schema::Verdict>,
    confidence: Option<f64>,
    evidence: Vec<String>,
    also: Vec<kvprobe_schema::Verdict>,
    warnings: Vec<String>,
    probes: ProbeFindings,
    timings: Vec<Timing>,
    stage: Option<kvprobe_schema::Stage>,
    hypothesis: Option<kvprobe_schema::Hypothesis>,
    reproducer: Option<kvprobe_schema::Reproducer>,
    /// The device failure that ended a diagnosis (its findings are partial).
    incomplete: Option<String>,
}

impl RunParts {
    fn of(ran: Ran) -> RunParts {
        match ran {
            Ran::Diagnosis(d) => RunParts {
                // a diagnosis the device ended has no verdict: its findings are partial
                verdict: d.incomplete.is_none().then_some(d.verdict),
                confidence: d.incomplete.is_none().then_some(d.confidence),
                evidence: d.evidence,
                also: d.also,
                warnings: d.warnings,
                probes: d.probes,
                timings: d.timings,
                stage: d.stage,
                hypothesis: d.hypothesis,
                reproducer: d.reproducer,
                incomplete: d.incomplete,
            },
            Ran::Probe(p, t) => RunParts {
                verdict: None,
                confidence: None,
                evidence: vec![],
                also: vec![],
                warnings: vec![],
                probes: *p,
                timings: vec![t],
                stage: None,
                hypothesis: None,
                reproducer: None,
                incomplete: None,
            },
        }
    }
}

/// The emulator a diagnosis replays its hypotheses on (issue 34), and what its reproducer runs
/// before its command (`inspect --emit-sim` for a HEF).
fn replayer(
    args: &DeviceArgs,
    model: &Arc<Model>,
    argv: &[String],
    ids: &[u32],
) -> (
    Option<Arc<dyn kvprobe_probes::diagnose::replay::Replayer>>,
    Vec<String>,
) {
    let Some(r) = super::replay::EmulatorReplay::for_run(args, model, argv, ids) else {
        return (None, Vec::new());
    };
    let setup = r.setup();
    (Some(Arc::new(r)), setup)
}

/// The last generated token sits at position `prompt + steps − 2`: past the model's context the
/// run would fail late, and the reference's error would blame the prompt (issue 19). A prompt
/// past the context on its own is the prompt's fault, whatever `--steps` says (issue 38: a
/// 128 KiB prompt was told "pass --steps 0 or fewer").
fn check_steps_fit(steps: usize, prompt: usize, context: usize) -> anyhow::Result<()> {
    if prompt > context {
        return Err(usage(format!(
            "the prompt is {prompt} tokens, past the model context of {context} positions; shorten --prompt (or --ids) to at most {} tokens for --steps {steps}",
            (context + 1).saturating_sub(steps)
        )));
    }
    if prompt + steps > context + 1 {
        let most = (context + 1).saturating_sub(prompt);
        return Err(usage(format!(
            "--steps {steps}: {prompt} prompt tokens and {steps} generated ones pass the model context of {context} positions; pass --steps {most} or fewer (or a shorter prompt)"
        )));
    }
    Ok(())
}

/// Flag combinations refused before any work (and so before any partial artefact).
fn check_args(name: &str, args: &DeviceArgs) -> anyhow::Result<()> {
    if args.steps == 0 {
        return Err(usage(
            "--steps 0: a run generates at least the prefill's token; pass --steps 1 or more",
        ));
    }
    for (set, flag) in [
        (args.stage_only, "--stage-only"),
        (args.all_probes, "--all-probes"),
        (!args.leave_out.is_empty(), "--leave-out"),
        (args.no_shared_runs, "--no-shared-runs"),
    ] {
        if set && name != "diagnose" {
            return Err(usage(format!(
                "{flag} applies to `kvprobe diagnose` only; drop it from `kvprobe {name}`"
            )));
        }
    }
    check_left_out(&args.leave_out)?;
    args.check_device_flags()?;
    if let Some(out) = &args.out {
        let inputs = args.input_paths();
        let inputs: Vec<&Path> = inputs.iter().map(|p| p.as_path()).collect();
        kvprobe_reports::check_out_dir(out, args.force, &inputs)
            .map_err(|e| usage(e.to_string()))?;
    }
    Ok(())
}

/// Every `--leave-out` names a fault of an emulator's grammar: a name the replays never
/// hypothesise would leave nothing out, and the run would say it had.
fn check_left_out(left_out: &[String]) -> anyhow::Result<()> {
    let tables = [
        kvprobe_npu::sim::FAMILY.faults,
        kvprobe_npu::ane::FAMILY.faults,
    ];
    let names = || tables.iter().flat_map(|t| t.faults.iter().map(|d| d.name));
    match left_out.iter().find(|f| !names().any(|n| n == f.as_str())) {
        None => Ok(()),
        Some(f) => {
            let mut known: Vec<&str> = Vec::new();
            names().for_each(|n| {
                if !known.contains(&n) {
                    known.push(n);
                }
            });
            Err(usage(format!(
                "--leave-out {f}: no emulator fault of that name; pass one of {} (one name per --leave-out)",
                known.join(", ")
            )))
        }
    }
}

/// `--json` or the text summary on stdout, then exit code 1 when a fault was diagnosed.
fn print_and_exit(results: &Results, json: bool) -> anyhow::Result<()> {
    let text = if json {
        format!("{}\n", serde_json::to_string(results)?)
    } else {
        kvprobe_reports::summary(results)
    };
    super::common::print_stdout(text.as_bytes())?;
    let outcome = match &results.incomplete {
        // the device ended the diagnosis: the partial results are written and printed, the
        // failure is also the one stderr line every device failure gives, the exit is its
        Some(why) => {
            eprintln!("error: {why}");
            RunOutcome::DeviceFailed
        }
        None => RunOutcome::of_verdict(results.verdict),
    };
    if outcome != RunOutcome::Done {
        // a fault diagnosed (or unknown); everything is written and flushed
        std::process::exit(outcome.exit_code().into());
    }
    Ok(())
}

/// What one command measured: a diagnosis, or one probe's findings and its time.
enum Ran {
    Diagnosis(Box<kvprobe_probes::Diagnosis>),
    Probe(Box<ProbeFindings>, Timing),
}

fn run_probe(
    cmd: &ProbeCommand,
    s: &mut Session,
    replay: Option<std::sync::Arc<dyn kvprobe_probes::diagnose::replay::Replayer>>,
) -> kvprobe_probes::Result<Ran> {
    use kvprobe_probes::{diagnose, diagnose_stateful, DiagnoseOptions, Error};
    let name = cmd.name();
    let args = &cmd.args;
    let t = Instant::now();
    let steps = args.steps;
    if s.dev.capabilities().stateful {
        if let Some((_, why)) = diagnose_stateful::NOT_APPLICABLE
            .iter()
            .find(|(n, _)| *n == name)
        {
            return Err(Error::Input(format!(
                "`{name}` is not applicable on a stateful device: {why}; run `diagnose` for the state checks"
            )));
        }
    }
    let Some(probe) = cmd.probe else {
        let opts = DiagnoseOptions {
            steps,
            stage_only: args.stage_only,
            all_probes: args.all_probes,
            replay,
            ..DiagnoseOptions::default()
        };
        return Ok(Ran::Diagnosis(Box::new(diagnose(s, &opts)?)));
    };
    let mut p = ProbeFindings::default();
    let opts = ProbeOptions {
        steps,
        second_process: Some(&super::second_process::Rerun),
    };
    probe.run(s, &opts, &mut p)?;
    let time = Timing {
        what: name.to_string(),
        seconds: t.elapsed().as_secs_f64(),
    };
    Ok(Ran::Probe(Box::new(p), time))
}

/// Hex SHA-256 of a file (the HEF in the provenance).
fn file_sha256(path: &Path) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)
        .map_err(|e| usage(format!("{}: cannot read ({e})", path.display())))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)
        .map_err(|e| usage(format!("{}: cannot read ({e})", path.display())))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn host() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{} {}, {cpus} cpus",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// The run folder with the emulator's manifest beside the artefacts (what reproduces the run).
fn write_out(
    out: &std::path::Path,
    args: &DeviceArgs,
    results: &Results,
    arrays: &[NamedArray],
    backend: &Backend,
) -> anyhow::Result<()> {
    let inputs = args.input_paths();
    let inputs: Vec<&Path> = inputs.iter().map(|p| p.as_path()).collect();
    let force = args.force;
    kvprobe_reports::write_run_folder(
        out,
        force,
        &inputs,
        results,
        arrays,
        |tmp| -> anyhow::Result<()> {
            if let Some(m) = backend.sim_manifest() {
                kvprobe_npu::contract::manifest::write(m, &tmp.join("sim-manifest.json"))
                    .map_err(npu_error)?;
            }
            Ok(())
        },
    )
    .map_err(|e| match e.downcast::<kvprobe_reports::Error>() {
        Ok(r) => usage(r.to_string()),
        Err(other) => other,
    })
}
