//! Randomised diagnosis matrix (issue 12): a seeded generator of emulator cases (every fault of
//! the README table × the scopes it accepts × values × geometries × prompts, plus healthy runs),
//! a runner that drives the `kvprobe` binary on each case, and the confusion-matrix summary.
//! Shared by `tests/diagnose_sweep.rs` (fast CI subset) and `examples/sweep.rs` (the full sweep,
//! `scripts/sweep-diagnose.sh`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvprobe_reference::Model;

/// splitmix64: small, seedable and stable across platforms and releases (the matrix must be
/// reproducible from its seed alone).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(lo <= hi);
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    pub fn coin(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.range(0, xs.len() - 1)]
    }
}

/// What the generator needs to know about a model.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Short name used in the tables ("llama-fixture", "smollm2").
    pub label: String,
    pub path: PathBuf,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Bytes per (un-expanded, uint8) cache entry.
    pub entry_bytes: usize,
    pub max_position: usize,
    /// RoPE positions (a theta table the emulator ships); false for learned positions (GPT-2).
    pub rope: bool,
    /// Token-id sequences prompts are cut from (different content per case).
    pub prompts: Vec<Vec<u32>>,
    /// Largest cache length / steps drawn for this model (SmolLM2 is slow at L = 128).
    pub max_cache_len: usize,
    pub max_steps: usize,
}

/// Natural-text prompts for real models (tokenised by the model's own tokenizer).
pub const TEXTS: &[&str] = &[
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid, and the capital of Germany is Berlin, a city on the river Spree.",
    "Once upon a time there was a little fox who lived at the edge of a dark forest. Every morning she walked to the river to drink and to watch the fish jump in the cold water.",
    "To bake bread, mix flour, water, salt and yeast, knead the dough for ten minutes, let it rise for an hour, shape the loaf and bake it in a hot oven until the crust is brown.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint([fibonacci(i) for i in range(10)])\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose and oxygen. It takes place mainly in the leaves of the plant.",
    "Q: What is the largest planet in the solar system? A: Jupiter. Q: What is the smallest planet? A: Mercury. Q: Which planet is known as the red planet? A:",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32",
    "Dear customer, thank you for your order. Your package has been shipped today and should arrive within three to five business days. Please contact us if you have any questions.",
];

impl ModelSpec {
    /// Reads the shape from the model; prompts from `texts` through its tokenizer, or random ids
    /// (fixtures: their tiny tokenizers make any id a token).
    pub fn load(
        label: &str,
        path: &Path,
        texts: Option<&[&str]>,
        max_cache_len: usize,
        max_steps: usize,
    ) -> anyhow::Result<Self> {
        let model = Model::load(path)?;
        let c = model.config();
        let prompts = match texts {
            Some(ts) => ts
                .iter()
                .map(|t| model.encode(t, None))
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let mut rng = Rng::new(c.vocab_size as u64);
                // skip the few special tokens at the start of the fixture vocabularies
                (0..8)
                    .map(|_| {
                        (0..160)
                            .map(|_| rng.range(3, c.vocab_size - 1) as u32)
                            .collect()
                    })
                    .collect()
            }
        };
        Ok(ModelSpec {
            label: label.into(),
            path: path.to_path_buf(),
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            entry_bytes: c.n_kv_heads * c.head_dim,
            max_position: c.max_position,
            rope: model.rope_inv_freq().is_some(),
            prompts,
            max_cache_len,
            max_steps,
        })
    }
}

/// One diagnose run and the verdict it should get.
#[derive(Debug, Clone)]
pub struct Case {
    pub id: usize,
    pub model: String,
    pub model_path: PathBuf,
    pub cache_len: usize,
    pub prefill_len: usize,
    pub ids: Vec<u32>,
    pub steps: usize,
    pub fault: Option<String>,
    pub expect: &'static str,
    /// Fault family (the fault name without value and scope), "healthy" for none.
    pub family: String,
}

impl Case {
    pub fn args(&self) -> Vec<String> {
        let ids: Vec<String> = self.ids.iter().map(u32::to_string).collect();
        let mut a: Vec<String> = [
            "diagnose",
            "--sim",
            "--model",
            &self.model_path.to_string_lossy(),
            "--cache-len",
            &self.cache_len.to_string(),
            "--prefill-len",
            &self.prefill_len.to_string(),
            "--ids",
            &ids.join(","),
            "--steps",
            &self.steps.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(f) = &self.fault {
            a.push("--fault".into());
            a.push(f.clone());
        }
        a
    }
    /// The exact command line that reproduces the case.
    pub fn command(&self) -> String {
        let args: Vec<String> = self.args().into_iter().map(|a| shell_quote(&a)).collect();
        format!("kvprobe {}", args.join(" "))
    }
    /// Prompt tokens wrap the ring during the steps.
    pub fn wraps(&self) -> bool {
        self.ids.len() + self.steps > self.cache_len
    }
    pub fn has_remainder(&self) -> bool {
        !self.ids.len().is_multiple_of(self.prefill_len)
    }
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_=+.,/@:".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Expected verdict per fault: the README table. Graph faults the user scopes to one group are
/// expected at that group's stage (`softmax=…@tbt` → `tbt-graph`; `@prefill` or both →
/// `prefill-graph`, the earliest stage).
pub fn expected(fault: &str) -> &'static str {
    let (body, scope) = fault.split_once('@').unwrap_or((fault, ""));
    let name = body.split('=').next().unwrap_or(body);
    let groups: Vec<&str> = scope
        .split(',')
        .filter(|s| *s == "prefill" || *s == "tbt")
        .collect();
    let prefill_in = |default_prefill: bool| {
        if groups.is_empty() {
            default_prefill
        } else {
            groups.contains(&"prefill")
        }
    };
    match name {
        "tbt-read-layout" | "prefill-write-layout" => "cache-layout-mismatch",
        "mask" => "mask-convention",
        "offset" => "cache-offset",
        "tbt-cache-scale" => "cache-quantization",
        "tbt-position" => "position-mismatch",
        "kv-swap" => "kv-binding",
        "gqa-repeat" | "softmax" => {
            // gqa-repeat defaults to tbt only, softmax to both groups
            if prefill_in(name == "softmax") {
                "prefill-graph"
            } else {
                "tbt-graph"
            }
        }
        "tbt-attn-scale" => "tbt-graph",
        "prefill-attn-scale" => "prefill-graph",
        "truncate-entry" => "cache-truncation",
        "rope-theta" => "position-mismatch",
        _ => "unknown",
    }
}

/// Prompt length, prefill length, cache length and steps for one case.
struct Geo {
    l: usize,
    p: usize,
    n: usize,
    steps: usize,
}

/// Draws a geometry; `multi_chunk` forces at least two prefill chunks (faults that act only on
/// cache reads inside prefill are no-ops on a single chunk).
fn draw_geometry(rng: &mut Rng, m: &ModelSpec, multi_chunk: bool) -> Geo {
    loop {
        let l = rng.range(24, m.max_cache_len.min(m.max_position / 2).max(24));
        let p = rng.range(4, 32.min(l - 2));
        let remainder = rng.coin(0.5);
        let wrap = rng.coin(0.4);
        let max_chunks = (l - 1) / p;
        if max_chunks == 0 {
            continue;
        }
        let lo_chunks = if multi_chunk { 2 } else { 1 };
        if max_chunks < lo_chunks {
            continue;
        }
        let chunks = rng.range(lo_chunks, max_chunks.min(4));
        // with a remainder the prompt is (chunks − 1) full chunks plus a partial one
        let n = if remainder {
            (chunks - 1) * p + rng.range(1, p - 1)
        } else {
            chunks * p
        };
        if n < 2 || n >= l {
            continue;
        }
        let steps = if wrap {
            // the steps must run past the end of the ring
            let need = l - n + 1;
            if need + 2 > m.max_steps {
                continue;
            }
            rng.range(need + 1, m.max_steps)
        } else {
            let room = (l - n).min(m.max_steps);
            if room < 4 {
                continue;
            }
            rng.range(4, room)
        };
        return Geo { l, p, n, steps };
    }
}

fn draw_scale(rng: &mut Rng) -> String {
    // [0.5, 2] without 1, in steps of 0.05, away from 1 by at least 0.1 on either side
    loop {
        let f = 0.5 + 0.05 * rng.range(0, 30) as f64;
        if (f - 1.0).abs() >= 0.1 - 1e-9 {
            return format!("{f:.2}").trim_end_matches('0').to_string();
        }
    }
}

/// 1-3 distinct layers, sorted.
fn draw_layers(rng: &mut Rng, n_layers: usize) -> Vec<usize> {
    let k = rng.range(1, 3.min(n_layers));
    let mut ls: Vec<usize> = Vec::new();
    while ls.len() < k {
        let l = rng.range(0, n_layers - 1);
        if !ls.contains(&l) {
            ls.push(l);
        }
    }
    ls.sort_unstable();
    ls
}

fn scope_text(parts: Vec<String>) -> String {
    if parts.is_empty() {
        String::new()
    } else {
        format!("@{}", parts.join(","))
    }
}

/// K/V and layer scope parts.
fn kv_layer_scope(rng: &mut Rng, m: &ModelSpec) -> Vec<String> {
    let mut parts = Vec::new();
    match rng.range(0, 2) {
        0 => {}
        1 => parts.push("k".into()),
        _ => parts.push("v".into()),
    }
    if rng.coin(0.4) {
        parts.extend(
            draw_layers(rng, m.n_layers)
                .into_iter()
                .map(|l| format!("layer={l}")),
        );
    }
    parts
}

fn group_scope(rng: &mut Rng) -> Vec<String> {
    match rng.range(0, 3) {
        0 => vec![],
        1 => vec!["tbt".into()],
        2 => vec!["prefill".into()],
        _ => vec!["prefill".into(), "tbt".into()],
    }
}

/// The fault names of the README table; the sweep spreads cases evenly over them.
pub const FAMILIES: &[&str] = &[
    "tbt-read-layout",
    "prefill-write-layout",
    "mask=left-valid",
    "mask=repeat",
    "offset",
    "tbt-cache-scale",
    "tbt-position",
    "kv-swap",
    "gqa-repeat",
    "tbt-attn-scale",
    "prefill-attn-scale",
    "softmax",
    "truncate-entry",
    "rope-theta",
];

/// One fault of `family` with random value and scope; `None` when the model cannot take it (the
/// emulator would refuse it as a no-op, e.g. block GQA order without grouped heads).
/// Returns the fault text and whether it needs a multi-chunk prompt.
fn draw_fault(rng: &mut Rng, family: &str, m: &ModelSpec) -> Option<(String, bool)> {
    let layouts = ["feature-major", "f8cr"];
    Some(match family {
        "tbt-read-layout" | "prefill-write-layout" => {
            let lay = if m.entry_bytes.is_multiple_of(8) {
                *rng.pick(&layouts)
            } else {
                "feature-major"
            };
            (
                format!("{family}={lay}{}", scope_text(kv_layer_scope(rng, m))),
                false,
            )
        }
        "mask=left-valid" | "mask=repeat" => {
            let g = group_scope(rng);
            // left-valid defaults to tbt; a prefill-only mask fault needs cached columns in prefill
            let prefill_only = g == ["prefill"];
            (format!("{family}{}", scope_text(g)), prefill_only)
        }
        "offset" => ("offset=after-run".into(), false),
        "tbt-cache-scale" => (
            format!(
                "tbt-cache-scale={}{}",
                draw_scale(rng),
                scope_text(kv_layer_scope(rng, m))
            ),
            false,
        ),
        "tbt-position" => {
            let n = rng.range(1, 4) as i64 * if rng.coin(0.5) { 1 } else { -1 };
            (format!("tbt-position={n:+}"), false)
        }
        "kv-swap" => {
            let parts = if rng.coin(0.5) {
                draw_layers(rng, m.n_layers)
                    .into_iter()
                    .map(|l| format!("layer={l}"))
                    .collect()
            } else {
                vec![]
            };
            (format!("kv-swap{}", scope_text(parts)), false)
        }
        "gqa-repeat" => {
            if m.n_kv_heads == m.n_heads || m.n_kv_heads == 1 {
                return None;
            }
            (
                format!("gqa-repeat=block{}", scope_text(group_scope(rng))),
                false,
            )
        }
        "tbt-attn-scale" | "prefill-attn-scale" => (format!("{family}={}", draw_scale(rng)), false),
        "softmax" => (
            format!(
                "softmax=shared-across-heads{}",
                scope_text(group_scope(rng))
            ),
            false,
        ),
        "truncate-entry" => {
            let e = m.entry_bytes;
            let n = match rng.range(0, 3) {
                0 => e / 2,
                1 => e / 4,
                2 => 3 * e / 4,
                _ => rng.range(1, e - 1),
            };
            let mut parts = kv_layer_scope(rng, m);
            match rng.range(0, 3) {
                0 => parts.insert(0, "prefill".into()),
                1 => parts.insert(0, "tbt".into()),
                _ => {}
            }
            (format!("truncate-entry={n}{}", scope_text(parts)), false)
        }
        "rope-theta" => {
            if !m.rope {
                return None;
            }
            // the sweep runs the emulator's default graph: the table ships in the other
            // convention (the same one is a no-op the emulator refuses)
            let graph = kvprobe_npu::sim::SimOptions::default().rope_theta;
            (format!("rope-theta={}", graph.other().name()), false)
        }
        _ => return None,
    })
}

/// `faulty` fault cases spread round-robin over the families and models, then `healthy` cases.
pub fn generate(seed: u64, models: &[ModelSpec], faulty: usize, healthy: usize) -> Vec<Case> {
    generate_families(seed, models, FAMILIES, faulty, healthy)
}

/// [`generate`] over some of the [`FAMILIES`] only (the sweep's `--family`). Stops early when
/// no model can take any of them (e.g. `rope-theta` on learned positions only).
pub fn generate_families(
    seed: u64,
    models: &[ModelSpec],
    families: &[&str],
    faulty: usize,
    healthy: usize,
) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut cases = Vec::new();
    let mut k = 0usize;
    let mut misses = 0usize;
    while cases.len() < faulty && misses < families.len() * models.len() {
        let family = families[k % families.len()];
        let m = &models[(k / families.len()) % models.len()];
        k += 1;
        let Some((fault, multi)) = draw_fault(&mut rng, family, m) else {
            misses += 1;
            continue;
        };
        misses = 0;
        cases.push(make_case(&mut rng, m, Some(fault), multi, cases.len()));
    }
    for i in 0..healthy {
        let m = &models[i % models.len()];
        let id = cases.len();
        cases.push(make_case(&mut rng, m, None, false, id));
    }
    cases
}

fn make_case(rng: &mut Rng, m: &ModelSpec, fault: Option<String>, multi: bool, id: usize) -> Case {
    let g = draw_geometry(rng, m, multi);
    let prompt = rng.pick(&m.prompts);
    let start = rng.range(0, prompt.len().saturating_sub(g.n));
    let ids: Vec<u32> = prompt[start..]
        .iter()
        .chain(prompt.iter().cycle())
        .take(g.n)
        .copied()
        .collect();
    let (expect, family) = match &fault {
        Some(f) => {
            let name = f.split(['=', '@']).next().unwrap_or(f);
            let family = if name == "mask" {
                f.split('@').next().unwrap_or(f).to_string()
            } else {
                name.to_string()
            };
            (expected(f), family)
        }
        None => ("healthy", "healthy".to_string()),
    };
    Case {
        id,
        model: m.label.clone(),
        model_path: m.path.clone(),
        cache_len: g.l,
        prefill_len: g.p,
        ids,
        steps: g.steps,
        fault,
        expect,
        family,
    }
}

/// What one run gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub case: Case,
    /// Verdict, or "refused" when the emulator refused the case (exit 2: not a case).
    pub verdict: String,
    pub also: Vec<String>,
    pub confidence: f64,
    pub seconds: f64,
    /// The evidence lines (kept for the misses).
    pub evidence: Vec<String>,
    pub error: Option<String>,
}

/// Fault variants the probes cannot tell from another cause (docs/diagnosis.md, known limits):
/// for these the verdict must list the expected cause in `also`.
pub fn known_limit(fault: &str, prompt_len: usize) -> Option<&'static str> {
    let (body, scope) = fault.split_once('@').unwrap_or((fault, ""));
    if let Some(k) = body
        .strip_prefix("tbt-position=+")
        .and_then(|k| k.parse::<usize>().ok())
    {
        if prompt_len < k {
            return Some("the repairing shift −k would send a negative position at the first tbt step (pos = prompt length < k)");
        }
    }
    if body.starts_with("mask=repeat") && scope == "prefill" {
        return Some("a prefill-only mask convention breaks the same rows as a prefill graph fault; maskconv varies only the tbt step");
    }
    None
}

impl Outcome {
    pub fn right(&self) -> bool {
        self.verdict == self.case.expect
    }
    /// A miss on a documented known limit whose verdict lists the expected cause in `also`.
    pub fn explained(&self) -> bool {
        !self.right()
            && self.also.iter().any(|a| a == self.case.expect)
            && self
                .case
                .fault
                .as_deref()
                .and_then(|f| known_limit(f, self.case.ids.len()))
                .is_some()
    }
    pub fn refused(&self) -> bool {
        self.verdict == "refused"
    }
}

/// Runs one case through the binary with `--json`.
pub fn run_case(bin: &Path, case: &Case) -> Outcome {
    let t = std::time::Instant::now();
    let out = Command::new(bin).args(case.args()).arg("--json").output();
    let seconds = t.elapsed().as_secs_f64();
    let mut o = Outcome {
        case: case.clone(),
        verdict: "error".into(),
        also: Vec::new(),
        confidence: 0.0,
        seconds,
        evidence: Vec::new(),
        error: None,
    };
    let out = match out {
        Ok(x) => x,
        Err(e) => {
            o.error = Some(format!("could not run {}: {e}", bin.display()));
            return o;
        }
    };
    let code = out.status.code().unwrap_or(-1);
    if code == 2 {
        o.verdict = "refused".into();
        o.error = Some(String::from_utf8_lossy(&out.stderr).trim().to_string());
        return o;
    }
    match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
        Ok(v) => {
            o.verdict = v["verdict"].as_str().unwrap_or("null").to_string();
            o.confidence = v["confidence"].as_f64().unwrap_or(0.0);
            o.also = strings(&v["also"]);
            o.evidence = strings(&v["evidence"]);
        }
        Err(e) => {
            o.error = Some(format!(
                "exit {code}, stdout is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    o
}

/// Runs every case on `jobs` threads, in case order in the result.
pub fn run_all(
    bin: &Path,
    cases: &[Case],
    jobs: usize,
    progress: impl Fn(&Outcome) + Sync,
) -> Vec<Outcome> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::with_capacity(cases.len()));
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(c) = cases.get(i) else { break };
                let o = run_case(bin, c);
                progress(&o);
                results.lock().unwrap_or_else(|e| e.into_inner()).push(o);
            });
        }
    });
    let mut r = results.into_inner().unwrap_or_else(|e| e.into_inner());
    r.sort_by_key(|o| o.case.id);
    r
}

/// Counts of a sweep.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub faulty: usize,
    pub faulty_right: usize,
    /// Misses on a documented known limit with the expected cause in `also`.
    pub explained: usize,
    pub healthy: usize,
    pub false_alarms: usize,
    pub refused: usize,
    pub errors: usize,
}

impl Summary {
    pub fn of(outcomes: &[Outcome]) -> Self {
        let mut s = Summary::default();
        for o in outcomes {
            if o.refused() {
                s.refused += 1;
                continue;
            }
            if o.error.is_some() {
                s.errors += 1;
            }
            if o.case.fault.is_some() {
                s.faulty += 1;
                s.faulty_right += o.right() as usize;
                s.explained += o.explained() as usize;
            } else {
                s.healthy += 1;
                s.false_alarms += (!o.right()) as usize;
            }
        }
        s
    }
    pub fn accuracy(&self) -> f64 {
        if self.faulty == 0 {
            1.0
        } else {
            self.faulty_right as f64 / self.faulty as f64
        }
    }
}

/// Markdown tables: summary, confusion matrix (true class → verdict), per-family accuracy, and
/// the misses with the command that reproduces each.
pub fn report(outcomes: &[Outcome], seed: u64) -> String {
    let s = Summary::of(outcomes);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "seed {seed}: {} faulty cases, {} right ({:.1} %), {} more misses on a known limit with the right cause in `also`; {} healthy cases, {} false alarms; {} refused by the emulator (not cases); {} errors",
        s.faulty,
        s.faulty_right,
        100.0 * s.accuracy(),
        s.explained,
        s.healthy,
        s.false_alarms,
        s.refused,
        s.errors
    );
    let counted: Vec<&Outcome> = outcomes.iter().filter(|o| !o.refused()).collect();
    let mut verdicts: Vec<String> = counted.iter().map(|o| o.verdict.clone()).collect();
    verdicts.sort();
    verdicts.dedup();
    let mut matrix: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for o in &counted {
        *matrix
            .entry(o.case.expect)
            .or_default()
            .entry(o.verdict.clone())
            .or_default() += 1;
    }
    let _ = writeln!(
        out,
        "\nconfusion matrix (rows: true class, columns: verdict)\n"
    );
    let _ = writeln!(out, "| true class | {} |", verdicts.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(verdicts.len()));
    for (class, row) in &matrix {
        let cells: Vec<String> = verdicts
            .iter()
            .map(|v| row.get(v).map_or(".".into(), |n| n.to_string()))
            .collect();
        let _ = writeln!(out, "| {class} | {} |", cells.join(" | "));
    }
    let mut fam: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for o in &counted {
        let e = fam
            .entry((o.case.family.clone(), o.case.model.clone()))
            .or_default();
        e.0 += o.right() as usize;
        e.1 += 1;
    }
    let _ = writeln!(out, "\nper fault family and model (right / cases)\n");
    let _ = writeln!(out, "| family | model | right |");
    let _ = writeln!(out, "|---|---|---|");
    for ((f, m), (r, n)) in &fam {
        let _ = writeln!(out, "| {f} | {m} | {r}/{n} |");
    }
    let misses: Vec<&&Outcome> = counted.iter().filter(|o| !o.right()).collect();
    let _ = writeln!(out, "\nmisses: {}", misses.len());
    for o in misses {
        let c = &o.case;
        let _ = writeln!(
            out,
            "- #{} {} [{}; L={} P={} n={} steps={}{}{}]: want {}, got {} (also [{}], confidence {:.2}){}{}\n  {}",
            c.id,
            c.fault.as_deref().unwrap_or("healthy"),
            c.model,
            c.cache_len,
            c.prefill_len,
            c.ids.len(),
            c.steps,
            if c.has_remainder() { ", remainder" } else { "" },
            if c.wraps() { ", wraps" } else { "" },
            c.expect,
            o.verdict,
            o.also.join(", "),
            o.confidence,
            o.error.as_deref().map_or(String::new(), |e| format!(" error: {e}")),
            if o.explained() { " [known limit]" } else { "" },
            c.command()
        );
    }
    out
}

/// The strings of a JSON array (non-strings skipped; not an array = none).
fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_follows_the_readme_table() {
        assert_eq!(expected("softmax=shared-across-heads@tbt"), "tbt-graph");
        assert_eq!(expected("softmax=shared-across-heads"), "prefill-graph");
        assert_eq!(expected("gqa-repeat=block"), "tbt-graph");
        assert_eq!(expected("gqa-repeat=block@prefill,tbt"), "prefill-graph");
        assert_eq!(
            expected("tbt-read-layout=f8cr@v,layer=2"),
            "cache-layout-mismatch"
        );
        assert_eq!(expected("truncate-entry=16@tbt,k"), "cache-truncation");
        assert_eq!(expected("mask=repeat@prefill"), "mask-convention");
        assert_eq!(expected("rope-theta=sign-folded"), "position-mismatch");
        assert_eq!(expected("rope-theta=plain"), "position-mismatch");
    }

    fn spec(label: &str, rope: bool) -> ModelSpec {
        ModelSpec {
            label: label.into(),
            path: PathBuf::from(label),
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            entry_bytes: 32,
            max_position: 256,
            rope,
            prompts: vec![(3..100).collect()],
            max_cache_len: 64,
            max_steps: 16,
        }
    }

    #[test]
    fn rope_theta_cases_ship_the_other_table_on_rope_models_only() {
        // the emulator's default graph is plain (README: `--sim-rope-theta sign-folded` is the
        // other one), so the shipped table must be sign-folded
        let models = [spec("learned", false), spec("rope", true)];
        let cases = generate_families(5, &models, &["rope-theta"], 4, 0);
        assert_eq!(cases.len(), 4);
        for c in &cases {
            assert_eq!(c.model, "rope");
            assert_eq!(c.fault.as_deref(), Some("rope-theta=sign-folded"));
            assert_eq!(
                (c.expect, c.family.as_str()),
                ("position-mismatch", "rope-theta")
            );
        }
        // no model takes it: no case, and the generator stops
        assert!(generate_families(5, &models[..1], &["rope-theta"], 4, 0).is_empty());
    }

    #[test]
    fn rng_is_stable_for_a_seed() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Rng::new(42);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn scales_stay_in_range_and_away_from_one() {
        let mut r = Rng::new(3);
        for _ in 0..200 {
            let f: f64 = draw_scale(&mut r).parse().unwrap();
            assert!((0.5..=2.0).contains(&f) && (f - 1.0).abs() >= 0.099, "{f}");
        }
    }
}
