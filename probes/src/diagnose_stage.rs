//! Stage from the stale, causality and splits probes alone (issue 10), kept apart from the named
//! rules in `diagnose.rs`: `diagnose` runs them on an `unknown` verdict, and with
//! `DiagnoseOptions::stage_only` (a test/research switch) they alone decide.
//!
//! Order of the rules = how direct the evidence is:
//! 0. `layout --infer` solved the prefill writer's bytes: an explained edge whose map is not
//!    token-major → prefill writer; every explained edge token-major but at one non-zero slot
//!    shift → offset (the bytes are right, their place is not);
//! 1. first-layer causality leaks: a later token's bytes were written into an earlier slot (the
//!    first layer's K/V depend on the token alone) → offset when each token's entry moved whole
//!    to one other slot, prefill writer when its bytes scattered over several slots;
//! 2. a frozen entry tail (columns no token ever changes) → prefill writer (bytes kept);
//! 3. later-layer causality leaks → mask;
//! 4. stale poison seen by a step → mask when the leaking slots are read as whole entries
//!    (permuting their contents changes nothing), tbt reader when not (bytes of other slots);
//! 5. pure decode clean but decode after a prefill fails → tbt reader (tbt disagrees with what
//!    prefill wrote);
//! 6. pure decode fails too → graph;
//! 7. decode clean everywhere but the prefill's own logits fail → graph (the prefill graph).

use kvprobe_schema::{
    CausalityFinding, Layout, LayoutInferFinding, ProbeFindings, SplitsFinding, Stage,
    StaleFinding, Timing, Verdict,
};

use crate::diagnose::{finish, timed, DiagnoseOptions, Diagnosis};
use crate::session::Session;
use crate::thresholds::STAGE_MEAN_COSINE;
use crate::{causality, layout_infer, splits, stale, Result};

/// A path through the cache fails when its lowest cosine to the reference falls below the stage
/// floor (healthy emulator runs: ≥ 0.995 on SmolLM2, ≈ 1 on the fixtures).
const FAILS: f64 = STAGE_MEAN_COSINE;

/// Rule 0: the writer's solved layout. Unexplained edges say nothing here (zeroed bytes or a
/// map outside the family are left to the causality rules).
pub fn stage_from_layout(f: &LayoutInferFinding) -> Option<Stage> {
    let explained: Vec<_> = f.caches.iter().filter(|c| c.explained).collect();
    if explained
        .iter()
        .any(|c| c.named != Some(Layout::TokenMajor))
    {
        return Some(Stage::PrefillWriter);
    }
    if !explained.is_empty() && explained.iter().all(|c| c.shift != 0) {
        return Some(Stage::Offset);
    }
    None
}

pub fn stage_from(
    stale: Option<&StaleFinding>,
    causality: Option<&CausalityFinding>,
    splits: Option<&SplitsFinding>,
) -> Option<Stage> {
    if let Some(c) = causality {
        if c.first_layer_leak_cells > 0 || c.first_layer_shift.is_some_and(|s| s != 0) {
            return Some(if c.first_layer_spread <= 1 {
                Stage::Offset
            } else {
                Stage::PrefillWriter
            });
        }
        if c.frozen_tail_columns > 0 {
            return Some(Stage::PrefillWriter);
        }
        if c.leak_cells > 0 {
            return Some(Stage::Mask);
        }
    }
    if let Some(st) = stale.filter(|s| s.first_moved_step.is_some()) {
        return Some(if st.leaks_whole_entries == Some(false) {
            Stage::TbtReader
        } else {
            Stage::Mask
        });
    }
    let sp = splits?;
    if sp.pure_decode_min >= FAILS && sp.mixed_decode_min < FAILS {
        return Some(Stage::TbtReader);
    }
    if sp.pure_decode_min < FAILS {
        return Some(Stage::Graph);
    }
    if sp.whole_prefill.cosine < FAILS || sp.prefill_continue_min < FAILS {
        return Some(Stage::Graph);
    }
    None
}

/// Runs layout --infer, stale, causality and splits (bounded for `diagnose`), adds their evidence lines and
/// findings, and returns the stage they point at.
pub(crate) fn run_new_probes(
    s: &mut Session,
    timings: &mut Vec<Timing>,
    p: &mut ProbeFindings,
    ev: &mut Vec<String>,
) -> Result<Option<Stage>> {
    // diagnose may have solved the layout already before calling it unknown
    let li = match p.layout_infer.take() {
        Some(li) => li,
        None => timed(timings, "layout --infer", || layout_infer::run(s))?,
    };
    ev.push(layout_infer::evidence(&li));
    let st = timed(timings, "stale", || {
        // the back-to-back part checks reset, which no stage rule reads: skipped here
        let opts = stale::StaleOptions {
            steps: 3,
            max_leak_trials: 16,
            back_to_back_steps: 0,
        };
        stale::run(s, &opts)
    })?;
    let ca = timed(timings, "causality", || {
        causality::run(s, &causality::CausalityOptions { max_perturbed: 6 })
    })?;
    let sp = timed(timings, "splits", || {
        let opts = splits::SplitsOptions {
            max_splits: 4,
            max_decode_steps: 6,
        };
        splits::run(s, &opts)
    })?;
    let (st, ca, sp) = (Some(st), Some(ca), Some(sp));
    let stage =
        stage_from_layout(&li).or_else(|| stage_from(st.as_ref(), ca.as_ref(), sp.as_ref()));
    p.layout_infer = Some(li);
    if let Some(st) = &st {
        ev.push(format!(
            "stale: poison moved step {}; leaking slots {:?}{}",
            st.first_moved_step
                .map_or("none".to_string(), |k| k.to_string()),
            st.leaks.iter().map(|l| l.slot).collect::<Vec<_>>(),
            match st.leaks_whole_entries {
                Some(true) => " (read as whole entries: a mask admits them)",
                Some(false) => " (not read as whole entries: bytes of other slots)",
                None => "",
            }
        ));
    }
    if let Some(ca) = &ca {
        ev.push(format!(
            "causality: {} leak cells above the diagonal ({} in the first layer, one token over at most {} slots), frozen entry tail {} columns, {} stray cells, {} padding-row cells (expected)",
            ca.leak_cells,
            ca.first_layer_leak_cells,
            ca.first_layer_spread,
            ca.frozen_tail_columns,
            ca.stray_cells,
            ca.padding_cells
        ));
    }
    if let Some(sp) = &sp {
        ev.push(format!(
            "splits: pure decode min {:.4}, decode after prefill min {:.4}, prefill-continue min {:.4}, whole prefill {:.4}",
            sp.pure_decode_min, sp.mixed_decode_min, sp.prefill_continue_min, sp.whole_prefill.cosine
        ));
    }
    if let Some(x) = stage {
        ev.push(format!("→ stage (issue-10 probes): {}", x.name()));
    }
    p.stale = st;
    p.causality = ca;
    p.splits = sp;
    Ok(stage)
}

/// `diagnose` with every named-fault rule hidden (`DiagnoseOptions::stage_only`, a test and
/// research switch): only stale, causality and splits run, and the verdict is `unknown` with
/// their stage, or `healthy` (confidence 0.6) when none of them shows anything.
pub(crate) fn diagnose_stage_only(s: &mut Session, _opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let mut timings = Vec::new();
    let mut probes = ProbeFindings::default();
    let mut evidence = vec![
        "stage-only: the named-fault rules are hidden; layout --infer, stale, causality and splits decide"
            .to_string(),
    ];
    let stage = run_new_probes(s, &mut timings, &mut probes, &mut evidence)?;
    let (verdict, confidence) = match stage {
        Some(_) => (Verdict::Unknown, 0.3),
        None => (Verdict::Healthy, 0.6),
    };
    let mut d = finish(
        verdict,
        confidence,
        evidence,
        Vec::new(),
        Vec::new(),
        probes,
        timings,
    );
    d.stage = stage;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::test_findings;

    fn splits(pure: f64, mixed: f64, whole: f64) -> SplitsFinding {
        test_findings::splits(4, Vec::new(), pure, mixed, whole)
    }

    fn causality(first: usize, all: usize, shift: Option<i64>, spread: usize) -> CausalityFinding {
        CausalityFinding {
            slots: Vec::new(),
            slot_positions: Vec::new(),
            perturbed: Vec::new(),
            replacement_tokens: Vec::new(),
            matrix: Vec::new(),
            first_layer_matrix: Vec::new(),
            final_logits_cosine: Vec::new(),
            leaks: Vec::new(),
            leak_cells: all,
            first_layer_leak_cells: first,
            stray_cells: 0,
            padding_cells: 0,
            first_layer_spread: spread,
            frozen_tail_columns: 0,
            first_layer_shift: shift,
        }
    }

    /// Slots 5 and 6 leak; `whole`: the permutation test's answer.
    fn stale(whole: Option<bool>) -> StaleFinding {
        let mut f = test_findings::stale(vec![5, 6], Vec::new(), &[5, 6]);
        f.leak_permutation_cosine = whole.map(|w| if w { 1.0 } else { 0.5 });
        f.leaks_whole_entries = whole;
        f
    }

    #[test]
    fn stages_by_signature() {
        let ok = causality(0, 0, Some(0), 1);
        // kv-swap on SmolLM2 (measured): pure decode 0.98, decode after prefill −0.83
        assert_eq!(
            stage_from(None, Some(&ok), Some(&splits(0.9785, -0.83, 1.0))),
            Some(Stage::TbtReader)
        );
        assert_eq!(
            stage_from(None, Some(&ok), Some(&splits(0.5, 0.5, 1.0))),
            Some(Stage::Graph)
        );
        // decode clean, only the prefill's own logits fail: the prefill graph
        assert_eq!(
            stage_from(None, Some(&ok), Some(&splits(1.0, 0.99, 0.9))),
            Some(Stage::Graph)
        );
        assert_eq!(
            stage_from(None, Some(&ok), Some(&splits(0.99, 0.99, 0.99))),
            None
        );
        // a token's first-layer bytes over 8 slots: scattered by the writer
        assert_eq!(
            stage_from(None, Some(&causality(59, 59, None, 8)), None),
            Some(Stage::PrefillWriter)
        );
        // whole entries at other slots (one shift, or per-chunk shifts): placement
        assert_eq!(
            stage_from(None, Some(&causality(5, 5, Some(-1), 1)), None),
            Some(Stage::Offset)
        );
        assert_eq!(
            stage_from(None, Some(&causality(3, 20, None, 1)), None),
            Some(Stage::Offset)
        );
        assert_eq!(
            stage_from(None, Some(&causality(0, 3, Some(0), 1)), None),
            Some(Stage::Mask)
        );
        let mut frozen = ok.clone();
        frozen.frozen_tail_columns = 16;
        assert_eq!(
            stage_from(None, Some(&frozen), None),
            Some(Stage::PrefillWriter)
        );
    }

    #[test]
    fn stale_leaks_split_mask_from_reader() {
        let ok = causality(0, 0, Some(0), 1);
        assert_eq!(
            stage_from(Some(&stale(Some(true))), Some(&ok), None),
            Some(Stage::Mask)
        );
        assert_eq!(
            stage_from(Some(&stale(Some(false))), Some(&ok), None),
            Some(Stage::TbtReader)
        );
        // one leaking slot only: no permutation test, the mask is the direct reading
        assert_eq!(
            stage_from(Some(&stale(None)), Some(&ok), None),
            Some(Stage::Mask)
        );
    }

    fn edge(explained: bool, named: Option<Layout>, shift: i64) -> kvprobe_schema::InferredCache {
        kvprobe_schema::InferredCache {
            cache_id: 0,
            layer: Some(0),
            kind: None,
            explained,
            fraction_explained: if explained { 0.95 } else { 0.1 },
            residual_cosine: 0.9,
            shift,
            formula: String::new(),
            description: String::new(),
            digits: Vec::new(),
            tile: 8,
            named,
            runner_up: None,
            runner_up_fraction: 0.0,
            slot_fraction: Vec::new(),
            column_fraction: Vec::new(),
        }
    }

    fn inferred(caches: Vec<kvprobe_schema::InferredCache>) -> LayoutInferFinding {
        LayoutInferFinding {
            caches,
            prompt_tokens: 8,
            window: 8,
            features: 64,
            candidates: 10,
            shifts_searched: 24,
            tolerance_steps: 1.5,
            threshold: 0.75,
            unexplained: 0,
            writer_formula: None,
            writer_description: None,
            writer_shift: None,
            outlier_edges: Vec::new(),
        }
    }

    #[test]
    fn solved_writer_layout_names_writer_or_offset() {
        let tm = Some(Layout::TokenMajor);
        // healthy: token-major in place
        assert_eq!(
            stage_from_layout(&inferred(vec![edge(true, tm, 0); 4])),
            None
        );
        // one V edge written feature-major, or by a map outside the named list
        let mut one = vec![edge(true, tm, 0); 4];
        one[3] = edge(true, Some(Layout::FeatureMajor), 0);
        assert_eq!(
            stage_from_layout(&inferred(one)),
            Some(Stage::PrefillWriter)
        );
        let mut unnamed = vec![edge(true, tm, 0); 4];
        unnamed[1] = edge(true, None, 0);
        assert_eq!(
            stage_from_layout(&inferred(unnamed)),
            Some(Stage::PrefillWriter)
        );
        // right bytes in the wrong slots everywhere
        assert_eq!(
            stage_from_layout(&inferred(vec![edge(true, tm, -13); 4])),
            Some(Stage::Offset)
        );
        // unexplained edges say nothing (truncated bytes are the causality rules' business)
        assert_eq!(
            stage_from_layout(&inferred(vec![edge(false, None, 3); 4])),
            None
        );
    }
}
