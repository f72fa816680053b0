//! Running cases through a `kvprobe` binary and judging each outcome.

use std::path::Path;
use std::process::Command;

use kvprobe_schema::RunOutcome;

use super::case::Case;

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
    if body.starts_with("mask=repeat") && scope == "prefill" && prompt_len < 2 {
        return Some("a 1-token prompt gives the prefill per-head mask control nothing to vary (self-only is the causal row)");
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
    if RunOutcome::from_exit_code(code) == Some(RunOutcome::Refused) {
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
