//! `determinism`: the same request again in this process and in a second one, bit for bit.
//! CSV (per comparison and step: the logits' largest difference and the slots that differ) and
//! `determinism_slots.npy` `[comparisons, steps, layers]` (slots whose K or V bytes differ) are
//! pure functions of `ProbeFindings.determinism`.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{DeterminismFinding, Divergence, Results, RunComparison};
use ndarray::Array3;

use crate::cells::{csv6, yes};
use crate::error::{Error, Result};
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, num};

pub const SLOTS_NPY: &str = "determinism_slots.npy";

fn divergence(d: &Divergence) -> String {
    let mut s = format!("step {}", d.step);
    if let Some(l) = d.logit {
        let _ = write!(s, ", logit {l}");
    }
    if let (Some(id), Some(slot)) = (d.cache_id, d.slot) {
        match d.layer {
            Some(l) => {
                let _ = write!(s, ", cache {id} (layer {l}) slot {slot}");
            }
            None => {
                let _ = write!(s, ", cache {id} slot {slot}");
            }
        }
    }
    s
}

fn outcome(c: &RunComparison) -> String {
    match &c.first {
        None if c.identical => "bit-identical".into(),
        None => "differs (step counts)".into(),
        Some(d) => format!("differs first at {}", divergence(d)),
    }
}

fn csv(f: &DeterminismFinding) -> String {
    let mut s = "against,step,max_abs_diff,slots_differing\n".to_string();
    for c in &f.comparisons {
        for (step, d) in c.step_max_abs_diff.iter().enumerate() {
            let slots = c
                .slots_differing
                .get(step)
                .map_or(String::new(), |v| v.iter().sum::<usize>().to_string());
            let d = d.map_or(String::new(), csv6);
            let _ = writeln!(s, "{},{step},{d},{slots}", c.against);
        }
    }
    s
}

/// `[comparisons, steps, layers]`, or `None` when no cache was compared.
fn slots(f: &DeterminismFinding) -> Result<Option<Array3<f32>>> {
    let layers = f
        .comparisons
        .iter()
        .flat_map(|c| c.slots_differing.iter().map(Vec::len))
        .max()
        .unwrap_or(0);
    if !f.caches_compared || layers == 0 {
        return Ok(None);
    }
    let mut data = Vec::with_capacity(f.comparisons.len() * f.steps * layers);
    for c in &f.comparisons {
        for step in 0..f.steps {
            let row = c.slots_differing.get(step);
            data.extend((0..layers).map(|l| row.and_then(|r| r.get(l)).map_or(0.0, |&n| n as f32)));
        }
    }
    Array3::from_shape_vec((f.comparisons.len(), f.steps, layers), data)
        .map(Some)
        .map_err(|e| Error::BadArray {
            name: SLOTS_NPY.into(),
            reason: e.to_string(),
        })
}

pub struct Determinism;

impl ProbeSection for Determinism {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.determinism {
            Some(f) => vec![("determinism.csv".to_string(), csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.determinism.as_ref().map(slots) {
            Some(Ok(Some(_))) => vec![SLOTS_NPY.to_string()],
            _ => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        match &r.probes.determinism {
            Some(f) => match slots(f)? {
                Some(a) => write_npy(&dir.join(SLOTS_NPY), &a),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["determinism"]
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.determinism.as_ref()?;
        let mut pairs = vec![
            ("steps per run (prefill, then tbt)", f.steps.to_string()),
            ("cache bytes compared", yes(f.caches_compared)),
        ];
        if let Some(c) = f.clean_reset {
            pairs.push(("states all zero after each reset", yes(c)));
        }
        for c in &f.comparisons {
            pairs.push((c.against.as_str(), html(&outcome(c))));
        }
        if let Some(why) = &f.second_process_skipped {
            pairs.push(("second process", html(&format!("not run: {why}"))));
        }
        let rows: Vec<_> = f
            .comparisons
            .iter()
            .flat_map(|c| {
                c.step_max_abs_diff.iter().enumerate().map(|(step, d)| {
                    let slots = c.slots_differing.get(step).map(|v| v.iter().sum::<usize>());
                    (
                        vec![
                            html(&c.against),
                            step.to_string(),
                            d.map_or("non-finite".into(), |d| num(d, 6)),
                            slots.map_or("—".into(), |n| n.to_string()),
                        ],
                        Some(*d == Some(0.0) && slots.unwrap_or(0) == 0),
                    )
                })
            })
            .collect();
        Some(ProbeBlock {
            id: "determinism",
            title: "Determinism: the same request again, here and in a second process",
            summary: kv_table(&pairs),
            chart: String::new(),
            detail: fold(
                "per-step table",
                &table(
                    &[
                        "against",
                        "step",
                        "max |first − other| logit",
                        "slots differing",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.determinism else {
            return String::new();
        };
        let found: Vec<String> = f
            .comparisons
            .iter()
            .map(|c| format!("{}: {}", c.against, outcome(c)))
            .collect();
        let mut s = format!("determinism: {} steps; {}\n", f.steps, found.join("; "));
        if let Some(why) = &f.second_process_skipped {
            let _ = writeln!(s, "determinism: second process not run: {why}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use kvprobe_schema::{DeterminismFinding, Divergence, RunComparison};

    use super::*;

    fn finding() -> DeterminismFinding {
        let same = RunComparison {
            against: "same process".into(),
            identical: true,
            first: None,
            step_max_abs_diff: vec![Some(0.0), Some(0.0)],
            slots_differing: vec![vec![0, 0, 0], vec![0, 0, 0]],
        };
        let second = RunComparison {
            against: "second process".into(),
            identical: false,
            first: Some(Divergence {
                step: 1,
                logit: Some(7),
                layer: Some(2),
                cache_id: Some(5),
                slot: Some(16),
            }),
            step_max_abs_diff: vec![Some(0.0), None],
            slots_differing: vec![vec![0, 0, 0], vec![0, 1, 3]],
        };
        DeterminismFinding {
            steps: 2,
            caches_compared: true,
            clean_reset: Some(true),
            comparisons: vec![same, second],
            second_process_skipped: None,
        }
    }

    #[test]
    fn csv_array_and_summary_follow_the_finding() {
        let f = finding();
        assert_eq!(
            csv(&f),
            "against,step,max_abs_diff,slots_differing\nsame process,0,0.000000,0\nsame process,1,0.000000,0\nsecond process,0,0.000000,0\nsecond process,1,,4\n"
        );
        let a = slots(&f).expect("array").expect("caches compared");
        assert_eq!(a.shape(), [2, 2, 3]);
        assert_eq!(a[[1, 1, 2]], 3.0);
        let mut r = crate::fixtures::healthy_results();
        r.probes.determinism = Some(f);
        assert_eq!(
            Determinism.summary(&r),
            "determinism: 2 steps; same process: bit-identical; second process: differs first at step 1, logit 7, cache 5 (layer 2) slot 16\n"
        );
        let block = Determinism.block(&r, &[]).expect("block");
        assert!(block.detail.contains("non-finite"));
    }
}
