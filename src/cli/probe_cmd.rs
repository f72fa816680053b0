//! `kvprobe prefill|greedy|selfmask|colmap|ztap|quant|maskconv|positions|layout|inject|diagnose`.
//!
//! Exit codes (README): 0 healthy, or a single probe that ran; 1 a fault diagnosed or `unknown`;
//! 2 usage or input; 3 device.

use std::cell::{Cell, RefCell};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvprobe_npu::sim::manifest::model_identity;
use kvprobe_probes::colmap::ColmapOptions;
use kvprobe_probes::prefill::PrefillOptions;
use kvprobe_probes::{Progress, Session};
use kvprobe_reports::NamedArray;
use kvprobe_schema::{ProbeFindings, Provenance, Results, Timing, Verdict, SCHEMA_VERSION};

use super::common::{usage, EXIT_FAULT_FOUND};
use super::device_args::{probe_error, Backend, DeviceArgs, PromptTokenizer};

#[derive(Debug, Subcommand)]
pub enum ProbeCommand {
    /// Device prefill logits against the reference, per prompt prefix.
    Prefill(DeviceArgs),
    /// Greedy generation through the server's ring mask, teacher-forced comparison per step.
    Greedy(DeviceArgs),
    /// tbt steps that see only themselves: the tbt graph without the cache.
    Selfmask(DeviceArgs),
    /// Single-key column-to-token map of the first tbt window.
    Colmap(DeviceArgs),
    /// Always-zero columns of what the tbt graph read (or of the ring bytes).
    Ztap(DeviceArgs),
    /// Declared quant infos of every cache edge, the mask and the embeddings.
    Quant(DeviceArgs),
    /// The first tbt step under alternative mask conventions.
    Maskconv(DeviceArgs),
    /// The first tbt step with positions shifted by -4..4.
    Positions(DeviceArgs),
    /// Which layout and placement the prefill writer used, from the ring bytes.
    Layout(LayoutArgs),
    /// Golden reference rings written into the device, then a tbt step.
    Inject(DeviceArgs),
    /// Poison unused ring slots and rerun the tbt steps: which steps and slots see the poison.
    Stale(DeviceArgs),
    /// Replace one prompt token at a time: which earlier positions' cache entries change.
    Causality(DeviceArgs),
    /// The prompt prefilled and decoded with a split at every position, against the reference.
    Splits(DeviceArgs),
    /// Run the probes and name the root cause.
    Diagnose(DeviceArgs),
}

impl ProbeCommand {
    fn parts(&self) -> (&'static str, &DeviceArgs) {
        match self {
            ProbeCommand::Prefill(a) => ("prefill", a),
            ProbeCommand::Greedy(a) => ("greedy", a),
            ProbeCommand::Selfmask(a) => ("selfmask", a),
            ProbeCommand::Colmap(a) => ("colmap", a),
            ProbeCommand::Ztap(a) => ("ztap", a),
            ProbeCommand::Quant(a) => ("quant", a),
            ProbeCommand::Maskconv(a) => ("maskconv", a),
            ProbeCommand::Positions(a) => ("positions", a),
            ProbeCommand::Layout(a) if a.infer => ("layout --infer", &a.device),
            ProbeCommand::Layout(a) => ("layout", &a.device),
            ProbeCommand::Inject(a) => ("inject", a),
            ProbeCommand::Stale(a) => ("stale", a),
            ProbeCommand::Causality(a) => ("causality", a),
            ProbeCommand::Splits(a) => ("splits", a),
            ProbeCommand::Diagnose(a) => ("diagnose", a),
        }
    }
}

/// `kvprobe layout [--infer]`. Solving is a flag of `layout`, not a subcommand of its own: it
/// answers the same question (which order and placement did the writer use) from the same ring
/// bytes, only without a list of candidates to try, so the user finds it where the question is.
#[derive(Debug, Args)]
pub struct LayoutArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Solve the layout from the ring bytes (any strided map, per cache edge) instead of trying
    /// the named layouts.
    #[arg(long)]
    pub infer: bool,
}

/// A progress bar on stderr that appears only when stderr is a terminal and the run has lasted
/// about two seconds.
struct Bar {
    bar: ProgressBar,
    start: Instant,
    shown: Cell<bool>,
    tty: bool,
    phase: RefCell<String>,
}

impl Bar {
    fn new() -> Bar {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ETA {eta}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar {
            bar,
            start: Instant::now(),
            shown: Cell::new(false),
            tty: std::io::stderr().is_terminal(),
            phase: RefCell::new(String::new()),
        }
    }
    fn maybe_show(&self) {
        if self.tty && !self.shown.get() && self.start.elapsed() > Duration::from_secs(2) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown.set(true);
        }
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn phase(&self, name: &str, total: u64) {
        *self.phase.borrow_mut() = name.to_string();
        self.bar.set_message(name.to_string());
        self.bar.set_length(total);
        self.bar.set_position(0);
        self.bar.reset_eta();
        self.maybe_show();
    }
    fn inc(&self, n: u64) {
        self.bar.inc(n);
        self.maybe_show();
    }
}

pub fn run(cmd: ProbeCommand) -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    let (name, args) = cmd.parts();
    for (set, flag) in [
        (args.stage_only, "--stage-only"),
        (args.all_probes, "--all-probes"),
    ] {
        if set && name != "diagnose" {
            return Err(usage(format!(
                "{flag} applies to `kvprobe diagnose` only; drop it from `kvprobe {name}`"
            )));
        }
    }
    args.check_device_flags()?;
    // Refuse a bad --out before any work (and so before any partial artefact).
    if let Some(out) = &args.out {
        check_out_dir(out, args.force)?;
    }
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
    let tokens: Vec<String> = {
        let tok = match backend.prompt_tokenizer(&model) {
            PromptTokenizer::Model => model.tokenizer(),
            PromptTokenizer::Server(t) => t,
        };
        ids.iter().map(|&t| tok.token_piece(t)).collect()
    };
    let manifest = backend.sim_manifest().cloned();
    let desc = backend.describe().clone();
    let hef_path = backend.hef_path().map(Path::to_path_buf);
    let bar = Bar::new();
    let t2 = Instant::now();
    let (outcome, compared) = {
        let mut s =
            Session::new(&model, backend.device(), ids.clone(), &bar).map_err(probe_error)?;
        let outcome = run_probe(name, args, &mut s);
        (outcome, std::mem::take(&mut s.compared))
    };
    bar.finish();
    let (verdict, confidence, evidence, also, warnings, probes, probe_timings, stage) =
        outcome.map_err(probe_error)?;
    timings.extend(probe_timings);
    timings.push(Timing {
        what: "probes total".into(),
        seconds: t2.elapsed().as_secs_f64(),
    });
    // The emulator already hashed these weights for its manifest; hash them here only otherwise.
    let identity = match &manifest {
        Some(m) => m.model.clone(),
        None => model_identity(&model).map_err(super::device_args::npu_error)?,
    };
    let hef_sha256 = hef_path.as_deref().map(file_sha256).transpose()?;
    let results = Results {
        schema_version: SCHEMA_VERSION,
        command: name.to_string(),
        verdict,
        confidence,
        evidence,
        also,
        warnings,
        stage,
        probes,
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
        },
    };
    if let Some(out) = &args.out {
        let arrays: Vec<NamedArray> = compared
            .into_iter()
            .map(|c| NamedArray::f32(c.name, vec![c.rows, c.cols], c.data))
            .collect();
        write_out(out, args.force, &results, &arrays, &backend)?;
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{}", serde_json::to_string(&results)?)?;
    } else {
        write!(stdout, "{}", summary(&results))?;
    }
    stdout.flush()?;
    drop(stdout);
    let fault = matches!(results.verdict, Some(v) if v != Verdict::Healthy);
    if fault {
        // exit code 1 = a fault diagnosed (or unknown); everything is written and flushed
        std::process::exit(EXIT_FAULT_FOUND as i32);
    }
    Ok(())
}

type Outcome = (
    Option<Verdict>,
    Option<f64>,
    Vec<String>,
    Vec<Verdict>,
    Vec<String>,
    ProbeFindings,
    Vec<Timing>,
    Option<kvprobe_schema::Stage>,
);

fn run_probe(name: &str, args: &DeviceArgs, s: &mut Session) -> kvprobe_probes::Result<Outcome> {
    use kvprobe_probes::*;
    let mut p = ProbeFindings::default();
    let t = Instant::now();
    let steps = args.steps.max(1);
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
    match name {
        "diagnose" => {
            let opts = DiagnoseOptions {
                steps,
                stage_only: args.stage_only,
                all_probes: args.all_probes,
                ..DiagnoseOptions::default()
            };
            let d = diagnose(s, &opts)?;
            return Ok((
                Some(d.verdict),
                Some(d.confidence),
                d.evidence,
                d.also,
                d.warnings,
                d.probes,
                d.timings,
                d.stage,
            ));
        }
        "prefill" => p.prefill = Some(prefill::run(s, &PrefillOptions::default())?),
        "greedy" => p.greedy = Some(greedy::run(s, steps)?),
        "selfmask" => p.selfmask = Some(selfmask::run(s, steps.min(16))?),
        "colmap" => p.colmap = Some(colmap::run(s, &ColmapOptions::default())?),
        "ztap" => p.ztap = Some(ztap::run(s)?),
        "quant" => p.quant = Some(quant::run(s.describe())?),
        "maskconv" => p.maskconv = Some(maskconv::run(s)?),
        "positions" => {
            p.positions = Some(positions::run(s)?);
            p.theta = positions::theta_check(s)?;
        }
        "layout" => p.layout = Some(layout::run(s)?),
        "layout --infer" => p.layout_infer = Some(layout_infer::run(s)?),
        "inject" => p.inject = Some(inject::run(s)?),
        "stale" => {
            let opts = stale::StaleOptions {
                steps: steps.min(64),
                ..Default::default()
            };
            p.stale = Some(stale::run(s, &opts)?)
        }
        "causality" => p.causality = Some(causality::run(s, &Default::default())?),
        "splits" => p.splits = Some(splits::run(s, &Default::default())?),
        other => return Err(Error::Input(format!("unknown probe `{other}`"))),
    }
    let timings = vec![Timing {
        what: name.to_string(),
        seconds: t.elapsed().as_secs_f64(),
    }];
    Ok((
        None,
        None,
        Vec::new(),
        Vec::new(),
        Vec::new(),
        p,
        timings,
        None,
    ))
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

fn check_out_dir(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.exists() {
        if !out.is_dir() {
            return Err(usage(format!(
                "{}: exists and is not a folder; choose another --out",
                out.display()
            )));
        }
        let non_empty = std::fs::read_dir(out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true);
        if non_empty && !force {
            return Err(usage(format!(
                "{}: folder exists and is not empty; pass --force to replace it or choose another --out",
                out.display()
            )));
        }
    }
    // Missing parents are created only once the run has succeeded (write_out), so a failed run
    // leaves nothing behind; here we only check that they can be.
    let parent = parent_of(out);
    let existing = parent
        .ancestors()
        .find(|a| a.as_os_str().is_empty() || a.exists());
    if let Some(a) = existing {
        if !a.as_os_str().is_empty() && !a.is_dir() {
            return Err(usage(format!(
                "{}: is not a folder, so {} cannot be created; choose another --out",
                a.display(),
                out.display()
            )));
        }
    }
    Ok(())
}

fn parent_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Artefacts into a temporary sibling folder, renamed into place only when complete.
fn write_out(
    out: &Path,
    force: bool,
    results: &Results,
    arrays: &[NamedArray],
    backend: &Backend,
) -> anyhow::Result<()> {
    check_out_dir(out, force)?;
    std::fs::create_dir_all(parent_of(out)).map_err(|e| {
        usage(format!(
            "{}: cannot create its parent folder ({e}); choose another --out",
            out.display()
        ))
    })?;
    let tmp = tempfile::Builder::new()
        .prefix(".kvprobe-out-")
        .tempdir_in(parent_of(out))
        .map_err(|e| {
            usage(format!(
                "{}: cannot create a folder next to it ({e}); choose another --out",
                out.display()
            ))
        })?;
    kvprobe_reports::write_artifacts(results, arrays, tmp.path())
        .map_err(|e| usage(format!("{}: {e}", out.display())))?;
    if let Some(sim) = backend.sim() {
        sim.write_manifest(&tmp.path().join("sim-manifest.json"))
            .map_err(super::device_args::npu_error)?;
    }
    if let super::device_args::Backend::Ane(ane) = backend {
        ane.write_manifest(&tmp.path().join("sim-manifest.json"))
            .map_err(super::device_args::npu_error)?;
    }
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| {
            usage(format!(
                "{}: cannot replace it ({e}); choose another --out",
                out.display()
            ))
        })?;
    }
    let tmp_path = tmp.keep();
    std::fs::rename(&tmp_path, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp_path);
        usage(format!(
            "{}: cannot move the artefacts into place ({e})",
            out.display()
        ))
    })?;
    Ok(())
}

/// The compact human summary.
pub fn summary(r: &Results) -> String {
    let mut s = String::new();
    let p = &r.probes;
    if let Some(v) = r.verdict {
        s += &format!(
            "verdict: {} (confidence {:.2})\n",
            v.name(),
            r.confidence.unwrap_or(0.0)
        );
        if !r.also.is_empty() {
            let also: Vec<&str> = r.also.iter().map(|v| v.name()).collect();
            s += &format!("also: {}\n", also.join(", "));
        }
        if let Some(st) = r.stage {
            s += &format!("stage (stale, causality, splits): {}\n", st.name());
        }
        for e in &r.evidence {
            s += &format!("  - {e}\n");
        }
    }
    if r.verdict.is_none() {
        if let Some(f) = &p.prefill {
            s += &format!(
                "prefill: {} prefixes, mean cosine {:.4}, min {:.4}, top-1 {:.0}%, re-run {}\n",
                f.rows.len(),
                f.mean_cosine,
                f.min_cosine,
                100.0 * f.top1_agreement,
                if f.rerun_identical {
                    "identical"
                } else {
                    "DIFFERS"
                }
            );
            for row in &f.rows {
                s += &format!(
                    "  pos {:>4}: cosine {:.4} top-1 {}\n",
                    row.position, row.comparison.cosine, row.comparison.top1_match
                );
            }
        }
        if let Some(f) = &p.greedy {
            s += &format!(
                "greedy: {} steps, mean cosine {:.4} (tbt {:.4}), top-1 {:.0}%, first divergence {:?}\n  device:    {:?}\n  reference: {:?}\n",
                f.steps.len(),
                f.mean_cosine,
                f.tbt_mean_cosine.unwrap_or(f64::NAN),
                100.0 * f.top1_agreement,
                f.first_divergence,
                f.device_text,
                f.reference_text
            );
        }
        if let Some(f) = &p.selfmask {
            s += &format!(
                "selfmask: {} steps, mean cosine {:.4}, min {:.4}, top-1 {:.0}%\n",
                f.steps.len(),
                f.mean_cosine,
                f.min_cosine,
                100.0 * f.top1_agreement
            );
        }
        if let Some(f) = &p.colmap {
            s += &format!(
                "colmap: {} entries × {} positions, diagonal {:.3}, best off-diagonal {:.3}, best shift {:+} ({:.3}), permutation {:.3}, {} clean / {} mixture, never-written rows identical: {:?}\n",
                f.entries.len(),
                f.positions.len(),
                f.diagonal_strength,
                f.best_off_diagonal,
                f.best_shift,
                f.best_shift_score,
                f.best_permutation_score,
                f.clean_rows,
                f.mixture_rows,
                f.empty_rows_identical
            );
        }
        if let Some(f) = &p.ztap {
            let z: usize = f.caches.iter().map(|c| c.zero_columns).sum();
            s += &format!(
                "ztap ({}): {} — {} zero columns over {} caches\n",
                f.source,
                f.interpretation,
                z,
                f.caches.len()
            );
        }
        if let Some(f) = &p.quant {
            s += &format!(
                "quant: {} caches, {} inconsistent; mask allowed value {:?}\n",
                f.caches.len(),
                f.inconsistent_caches,
                f.mask_allowed_value
            );
        }
        if let Some(f) = &p.maskconv {
            for v in &f.variants {
                s += &format!(
                    "maskconv {:>10}: cosine {:.4}{}\n",
                    v.name,
                    v.comparison.cosine,
                    if v.reproduces { "  reproduces" } else { "" }
                );
            }
            if let Some(c) = f.other_heads_ignored_cosine {
                s += &format!("maskconv: other heads' rows changed → output cosine {c:.6} to the ring output\n");
            }
        }
        if let Some(f) = &p.positions {
            s += &format!(
                "positions: baseline cosine {:.4}, best {:.4} at δ = {:+}\n",
                f.baseline_cosine, f.best_cosine, f.best_delta
            );
        }
        if let Some(t) = &p.theta {
            s += &format!(
                "theta: table {} → single-chunk prefill cosine {:.4}; the other sign convention {:.4} ({} rows)\n",
                t.declared, t.declared_cosine, t.other_cosine, t.rows
            );
        }
        if let Some(f) = &p.layout {
            s += &format!(
                "layout: writer {} at shift {:+}, mean correlation {:.3}\n",
                f.writer_layout.name(),
                f.writer_shift,
                f.writer_score
            );
        }
        if let Some(f) = &p.layout_infer {
            s += &layout_infer_summary(f);
        }
        if let Some(f) = &p.inject {
            s += &format!(
                "inject: device rings {:.4}, golden {:.4}, golden swapped {:.4} → blame {}\n",
                f.device_rings.cosine, f.golden.cosine, f.golden_swapped.cosine, f.blame
            );
        }
    }
    if r.verdict.is_none() {
        s += &new_probe_summary(p);
    }
    for w in &r.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}

/// The solved layout: the one-line evidence, then one line per group of edges sharing a map and
/// shift outside the majority.
fn layout_infer_summary(f: &kvprobe_schema::LayoutInferFinding) -> String {
    use kvprobe_probes::layout_infer::edge_name;
    let mut s = format!("{}\n", kvprobe_probes::layout_infer::evidence(f));
    let mut groups: Vec<(&kvprobe_schema::InferredCache, Vec<String>)> = Vec::new();
    for c in &f.caches {
        let majority = c.explained
            && f.writer_formula.as_deref() == Some(c.formula.as_str())
            && f.writer_shift == Some(c.shift);
        if majority {
            continue;
        }
        let name = edge_name(c.layer, c.kind, c.cache_id);
        match groups.iter_mut().find(|(g, _)| {
            g.formula == c.formula && g.shift == c.shift && g.explained == c.explained
        }) {
            Some((_, names)) => names.push(name),
            None => groups.push((c, vec![name])),
        }
    }
    for (c, names) in groups {
        s += &format!(
            "  {}: {} [{}] at shift {:+}, {:.2} explained{}\n",
            names.join(", "),
            c.description,
            c.formula,
            c.shift,
            c.fraction_explained,
            if c.explained { "" } else { " (UNEXPLAINED)" }
        );
    }
    s
}

/// Summary lines of the stale, causality and splits probes.
fn new_probe_summary(p: &ProbeFindings) -> String {
    let mut s = String::new();
    if let Some(f) = &p.stale {
        let moved: Vec<String> = f
            .steps
            .iter()
            .filter(|x| x.moved)
            .map(|x| x.step.to_string())
            .collect();
        s += &format!(
            "stale: {} never-written + {} previously-written slots poisoned (|value| {:.3}); steps moved: {}\n",
            f.never_written_slots.len(),
            f.previously_written_slots.len(),
            f.poison_magnitude,
            if moved.is_empty() { "none".to_string() } else { moved.join(", ") }
        );
        for l in &f.leaks {
            s += &format!(
                "  leak: step {} sees slot {} ({}, {} slots from the valid window)\n",
                l.step, l.slot, l.class, l.distance_to_valid
            );
        }
        if !f.leak_search_complete {
            s += &format!("  slot search stopped after {} trials\n", f.leak_trials);
        }
        if let Some(b) = &f.back_to_back {
            s += &format!(
                "stale: second request after the first: with reset min cosine {:.6} ({}), without reset {:.6} ({})\n",
                b.with_reset_cosine,
                if b.depends_with_reset { "DEPENDS on the first" } else { "independent" },
                b.without_reset_cosine,
                if b.depends_without_reset { "depends, as a continuation should" } else { "independent" }
            );
        }
    }
    if let Some(f) = &p.causality {
        s += &format!(
            "causality: {} perturbed positions; {} leak cells above the diagonal ({} in the first layer), {} stray cells, first-layer shift {:?}\n",
            f.perturbed.len(),
            f.leak_cells,
            f.first_layer_leak_cells,
            f.stray_cells,
            f.first_layer_shift
        );
        for l in f.leaks.iter().take(8) {
            s += &format!(
                "  leak: position {} changed by {:.4} when position {} was replaced{}\n",
                l.position,
                l.change,
                l.perturbed,
                if l.first_layer { " (first layer)" } else { "" }
            );
        }
    }
    if let Some(f) = &p.splits {
        s += &format!(
            "splits: whole prefill {:.4}; prefill-continue min {:.4}; pure decode min {:.4}; decode after prefill min {:.4}; failing splits {:?}\n",
            f.whole_prefill.cosine,
            f.prefill_continue_min,
            f.pure_decode_min,
            f.mixed_decode_min,
            f.failing_splits
        );
    }
    s
}
