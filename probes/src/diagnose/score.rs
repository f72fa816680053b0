//! The healthy hypothesis competing (issue 34, docs/diagnosis.md "The rule of evidence"): when the
//! controls all pass, a fault may still hide inside the declared precision. The healthy
//! hypothesis — the precision-matched reference and the fault-free emulator built to the device's
//! description, whichever reproduces the device more closely per step — is scored like every
//! fault hypothesis, by how closely it reproduces the device's per-step logits; a mild fault is
//! named only when, on the steps the healthy hypothesis leaves by `PRECISION_RATIO` × their
//! precision (a mild fault may garble only a few), its replay reproduces the device within the
//! declared precision *and* `PRECISION_RATIO` times more closely than the healthy hypothesis
//! does, without breaking a step the healthy hypothesis accounts for (`evidence::judge_points`).
//!
//! The hypotheses scored here are the faults whose value approaches "no fault" continuously —
//! factors (`SweepValue::Factor`, tried at [`MILD_FACTORS`] and at the fitted attention scales)
//! and small shifts (`SweepValue::SmallSigned`, the fitted shift and ±1): only they can fail by
//! less than the precision. A discrete fault (a swap, a layout) is never mild.

use std::sync::Arc;

use kvprobe_npu::contract::faults::{FaultTable, FaultText, Scope, SweepValue};
use kvprobe_schema::{FaultHypothesis, FaultValue, Hypothesis, Replay, Reproducer, Verdict};

use super::evidence::{judge_points, MILD_FACTORS};
use super::fits::{hypothesis, scopes};
use super::outcome::Diagnosis;
use super::replay::{
    healthy_steps, median, points, replay_one, screen, small_shifts, Fits, Replayer, Stop,
    SCREEN_STEPS,
};
use crate::determinism::record_logits;
use crate::session::Session;
use crate::thresholds::{PRECISION_RATIO, STEP_NOISE_FLOOR};

/// Hypotheses replayed whole after the screen (a budget, not a decision).
pub(super) const FULL_REPLAYS: usize = 2;

/// Rule id the verdict carries when the scorer names a fault the rules called healthy.
pub const RULE: &str = "replay-score";

/// The mild hypotheses of `table`: factor faults at the fitted attention scales (for the
/// attention-scale faults) and [`MILD_FACTORS`], small shifts at the fitted shift and ±1, every
/// scope the fault takes, the rings the evidence names first (`fits::scopes`).
pub fn mild(table: &FaultTable, fits: &Fits) -> Vec<FaultHypothesis> {
    let mut out: Vec<FaultHypothesis> = Vec::new();
    for decl in table.faults {
        let values: Vec<f64> = match decl.sweep {
            SweepValue::Factor => {
                // the scale fits measure the attention scale, the quant infos a cache scale
                let fitted = if decl.name.ends_with("attn-scale") {
                    fits.scales.clone()
                } else if decl.name.ends_with("cache-scale") {
                    fits.cache_scales.clone()
                } else {
                    Vec::new()
                };
                fitted.into_iter().chain(MILD_FACTORS).collect()
            }
            SweepValue::SmallSigned => {
                let (fitted, small) = small_shifts(fits);
                fitted.into_iter().chain(small).collect()
            }
            _ => continue,
        };
        for v in values {
            for (scope, _) in scopes(decl, fits) {
                let h = hypothesis(decl, FaultValue::Number(v), &scope);
                // a scope the grammar refuses for this fault is no hypothesis
                let text = h.text();
                let f = FaultText::split(&text);
                let parses = table
                    .decl(&f)
                    .is_ok_and(|d| d.name == decl.name && Scope::parse(&f, d).is_ok());
                if parses && !out.iter().any(|x| x.text() == text) {
                    out.push(h);
                }
            }
        }
    }
    out
}

/// Steps of a `healthy` verdict the healthy hypothesis leaves garbled and no mild fault
/// reproduces: what the ring evidence's hypotheses are judged against next
/// (`decide::attach_unexplained`).
pub struct Unexplained {
    /// The healthy hypothesis as scored per step (the closer of the matched reference and the
    /// fault-free emulator) and the declared precision there.
    pub judged: Vec<(Option<f64>, Option<f64>)>,
    /// Garbled steps of all.
    pub garbled: usize,
}

/// Lets the mild fault hypotheses compete with the healthy one on a `healthy` verdict; a fault
/// that beats it becomes the verdict, with its replay as the reproducer. Garbled steps none of
/// them reproduces are returned.
pub fn compete(
    s: &mut Session,
    replayer: Option<&Arc<dyn Replayer>>,
    d: &mut Diagnosis,
) -> Option<Unexplained> {
    if d.verdict != Verdict::Healthy {
        return None;
    }
    let (Some(replayer), Some(greedy)) = (replayer, d.probes.greedy.as_ref()) else {
        return None;
    };
    let healthy = healthy_steps(greedy);
    let matched = median(healthy.iter().filter_map(|h| h.0).collect()).unwrap_or(0.0);
    // No fault can beat a healthy hypothesis that garbles no step: nothing to replay (every
    // fault-free emulator run, where the matched reference reproduces the emulator exactly).
    if !points(&healthy).iter().any(|p| p.garbled) {
        return None;
    }
    let t = std::time::Instant::now();
    let tokens = greedy.device_ids.clone();
    let n = greedy.steps.len();
    // from a fresh start (a new process' host window), as the replays and the reproducer run
    let Ok(device) = record_logits(s, n, &tokens) else {
        return None;
    };
    let none = FaultHypothesis {
        name: String::new(),
        value: FaultValue::None,
        groups: vec![],
        kinds: vec![],
        layers: vec![],
    };
    // the healthy hypothesis per step: the closer of the matched reference and the fault-free
    // emulator
    let recorded = |i: usize| {
        device
            .get(i)
            .cloned()
            .ok_or_else(|| format!("the device's request has no step {i}"))
    };
    let free = replay_one(
        (s.model, &s.ids),
        replayer.as_ref(),
        &none,
        &mut { recorded },
        (device.len(), Stop::Whole),
        &tokens,
        &healthy,
    )
    .ok();
    let per_step = closer(&healthy, free.as_ref());
    // what every fault replay is judged against: the healthy hypothesis as scored
    let judged: Vec<(Option<f64>, Option<f64>)> = per_step
        .iter()
        .zip(&healthy)
        .map(|(&m, h)| (Some(m), h.1))
        .collect();
    let replay = |s: &Session, h: &FaultHypothesis, k: usize| {
        replay_one(
            (s.model, &s.ids),
            replayer.as_ref(),
            h,
            &mut { recorded },
            (k, Stop::Whole),
            &tokens,
            &judged,
        )
    };
    // the steps the device garbled, as the healthy hypothesis scored here accounts for them
    let judged_points = points(&judged);
    let garbled = judged_points.iter().filter(|p| p.garbled).count();
    let bar = judge_points(&[], &judged_points);
    let healthy_miss = bar.healthy_miss.unwrap_or(1.0);
    let precision = bar.precision.unwrap_or(0.0);
    let mut tried = vec![("healthy".to_string(), healthy_miss)];
    let mut decisive = None;
    if garbled > 0 {
        decisive = score(s, replayer, d, n, &mut tried, &replay);
    }
    d.timings.push(kvprobe_schema::Timing {
        what: "replay score".into(),
        seconds: t.elapsed().as_secs_f64(),
    });
    let line = format!(
        "replay score: the healthy hypothesis misses the device by {healthy_miss:.2e} (median \
         over the {garbled} of {n} steps it leaves by {PRECISION_RATIO}× their precision, every \
         step when none; over every step: matched reference {matched:.2e}, fault-free emulator \
         {}), declared precision {precision:.2e} there",
        free.as_ref()
            .and_then(|f| median(f.steps.iter().map(|x| x.replay_miss).collect()))
            .map_or("not run".into(), |m| format!("{m:.2e}"))
    );
    let Some(best) = decisive else {
        // the closest fault hypothesis and its miss: what the threshold's healthy distribution
        // is measured from (scripts/derive-replay-margin.sh)
        let closest = tried[1..]
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("none replayed".into(), |(h, m)| {
                format!("closest {h} {m:.2e}")
            });
        d.evidence.push(format!(
            "{line}; no mild fault hypothesis reproduces it {PRECISION_RATIO}× more closely ({} tried; {closest})",
            tried.len() - 1
        ));
        return (garbled > 0).then_some(Unexplained { judged, garbled });
    };
    name_mild_fault(d, replayer, best, (healthy_miss, line), tried, n);
    None
}

/// `best`, a replay that reproduced the device more closely than the healthy hypothesis, becomes
/// the verdict, its replay the reproducer.
fn name_mild_fault(
    d: &mut Diagnosis,
    replayer: &Arc<dyn Replayer>,
    best: Replay,
    (healthy_miss, line): (f64, String),
    tried: Vec<(String, f64)>,
    n: usize,
) {
    let table = replayer.table();
    let Ok(verdict) = table.expected(&best.fault.text()) else {
        return;
    };
    let head = format!(
        "{} replayed reproduces the device by {:.2e} (median), {:.1}× more closely than the healthy \
         hypothesis",
        best.fault.text(),
        best.replay_miss,
        healthy_miss / best.replay_miss.max(STEP_NOISE_FLOOR)
    );
    d.evidence.insert(0, head.clone());
    d.evidence.insert(1, line.clone());
    d.verdict = verdict;
    d.confidence = 0.75;
    d.hypothesis = Some(Hypothesis {
        rule: RULE.into(),
        decisive: vec![head, line],
        fault: Some(best.fault.clone()),
    });
    d.reproducer = Some(Reproducer {
        setup: Vec::new(),
        command: replayer.command(&best.fault.text(), n),
        replay: Some(best),
        tried,
        note: None,
    });
}

/// The healthy hypothesis per step: the closer to the device of the matched reference
/// (`healthy[i].0`) and the fault-free emulator's replay.
fn closer(healthy: &[(Option<f64>, Option<f64>)], free: Option<&Replay>) -> Vec<f64> {
    healthy
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let r = free.and_then(|f| f.steps.get(i)).map(|x| x.replay_miss);
            match (h.0, r) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(1.0),
            }
        })
        .collect()
}

/// Screens every mild hypothesis on the first steps, replays the best whole and returns the
/// closest that beats the healthy hypothesis.
fn score(
    s: &Session,
    replayer: &Arc<dyn Replayer>,
    d: &Diagnosis,
    n: usize,
    tried: &mut Vec<(String, f64)>,
    replay: &dyn Fn(&Session, &FaultHypothesis, usize) -> Result<Replay, String>,
) -> Option<Replay> {
    let fits = Fits::of_session(s, &d.probes);
    let k = SCREEN_STEPS.min(n);
    let run = |h: &FaultHypothesis, k: usize| replay(s, h, k);
    let mut refused = Vec::new();
    let mut hyps = mild(&replayer.table(), &fits);
    hyps.retain(|h| !replayer.leaves_out(&h.name));
    let screened = screen(hyps, k, &run, &mut refused);
    let mut best: Option<Replay> = None;
    for h in screened.into_iter().take(FULL_REPLAYS) {
        let Ok(r) = replay(s, &h, n) else { continue };
        tried.push((h.text(), r.replay_miss));
        // judged against the healthy hypothesis as scored here (`judged` in `compete`)
        if r.reproduces && best.as_ref().is_none_or(|b| r.replay_miss < b.replay_miss) {
            best = Some(r);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mild_hypotheses_are_the_continuous_faults_near_no_fault() {
        let table = kvprobe_npu::sim::FAMILY.faults;
        let fits = Fits {
            scales: vec![1.18],
            entry_bytes: 64,
            head_dim: 64,
            ..Fits::default()
        };
        let m: Vec<String> = mild(&table, &fits).iter().map(|h| h.text()).collect();
        for want in [
            "tbt-attn-scale=1.18",
            "tbt-attn-scale=0.85",
            "tbt-cache-scale=0.9",
            "tbt-cache-scale=0.9@k",
            "tbt-position=+1",
            "tbt-position=-1",
        ] {
            assert!(m.contains(&want.to_string()), "{want} missing from {m:?}");
        }
        // the attention fit is no cache-scale value; a discrete fault is never mild
        assert!(!m.contains(&"tbt-cache-scale=1.18".to_string()), "{m:?}");
        assert!(m.iter().all(|t| !t.starts_with("kv-swap")), "{m:?}");
    }
}
