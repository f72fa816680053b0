//! The sweep's counts and its Markdown report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::run::Outcome;

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
