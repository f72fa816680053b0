//! Stage from the stale, causality and splits probes alone (issue 10), kept apart from the named
//! rules: `diagnose` runs them on an `unknown` verdict, and with `DiagnoseOptions::stage_only` (a
//! test/research switch) they alone decide.
//!
//! [`TABLE`] names a pipeline stage, not a verdict, so it is evaluated first match wins
//! ([`locate`]); its order = how direct the evidence is (docs/diagnosis.md, "Stage from the
//! issue-10 probes").

use kvprobe_schema::{
    CausalityFinding, Layout, LayoutInferFinding, ProbeFindings, SplitsFinding, Stage,
    StaleFinding, Timing, Verdict,
};

use super::engine::Conclusion;
use super::outcome::{timed, DiagnoseOptions, Diagnosis};
use crate::session::Session;
use crate::thresholds::STAGE_MEAN_COSINE;
use crate::{causality, layout_infer, splits, stale, Result};

/// A path through the cache fails when its lowest cosine to the reference falls below the stage
/// floor (healthy emulator runs: ≥ 0.995 on SmolLM2, ≈ 1 on the fixtures).
const FAILS: f64 = STAGE_MEAN_COSINE;

/// What the issue-10 probes measured; `None` = not run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageFacts {
    pub layout_infer: Option<LayoutInferFinding>,
    pub stale: Option<StaleFinding>,
    pub causality: Option<CausalityFinding>,
    pub splits: Option<SplitsFinding>,
}

/// One row of the stage table.
pub struct StageRule {
    pub id: &'static str,
    pub stage: Stage,
    pub check: fn(&StageFacts) -> bool,
}

const fn rule(id: &'static str, stage: Stage, check: fn(&StageFacts) -> bool) -> StageRule {
    StageRule { id, stage, check }
}

pub const TABLE: &[StageRule] = &[
    rule("solved-writer-map", Stage::PrefillWriter, solved_writer_map),
    rule("solved-slot-shift", Stage::Offset, solved_slot_shift),
    rule("first-layer-moved", Stage::Offset, first_layer_moved),
    rule(
        "first-layer-scattered",
        Stage::PrefillWriter,
        first_layer_scattered,
    ),
    rule("frozen-tail", Stage::PrefillWriter, frozen_tail),
    rule("later-layer-leak", Stage::Mask, later_layer_leak),
    rule("stale-whole-entries", Stage::Mask, stale_whole_entries),
    rule("stale-other-bytes", Stage::TbtReader, stale_other_bytes),
    rule(
        "decode-after-prefill",
        Stage::TbtReader,
        decode_after_prefill,
    ),
    rule("pure-decode", Stage::Graph, pure_decode),
    rule("prefill-logits", Stage::Graph, prefill_logits),
];

/// The first rule of [`TABLE`] that holds.
pub fn locate(f: &StageFacts) -> Option<Stage> {
    TABLE.iter().find(|r| (r.check)(f)).map(|r| r.stage)
}

fn explained(f: &StageFacts) -> Vec<&kvprobe_schema::InferredCache> {
    f.layout_infer
        .iter()
        .flat_map(|li| li.caches.iter().filter(|c| c.explained))
        .collect()
}

/// Rule 0: `layout --infer` explains an edge with a map that is not token-major. Unexplained edges
/// say nothing here (zeroed bytes or a map outside the family are left to the causality rules).
fn solved_writer_map(f: &StageFacts) -> bool {
    explained(f)
        .iter()
        .any(|c| c.named != Some(Layout::TokenMajor))
}

/// Rule 0: Every explained edge is token-major but at a non-zero slot shift: right bytes, wrong place.
fn solved_slot_shift(f: &StageFacts) -> bool {
    let e = explained(f);
    !e.is_empty() && e.iter().all(|c| c.shift != 0)
}

/// Rule 1: A later token's bytes were written into an earlier slot (the first layer's K/V depend on
/// the token alone).
fn first_layer_leaks(c: &CausalityFinding) -> bool {
    c.first_layer_leak_cells > 0 || c.first_layer_shift.is_some_and(|s| s != 0)
}

/// Rule 1: Each token's entry moved whole to one other slot: placement.
fn first_layer_moved(f: &StageFacts) -> bool {
    f.causality
        .as_ref()
        .is_some_and(|c| first_layer_leaks(c) && c.first_layer_spread <= 1)
}

/// Rule 1: A token's bytes scattered over several slots: the writer.
fn first_layer_scattered(f: &StageFacts) -> bool {
    f.causality
        .as_ref()
        .is_some_and(|c| first_layer_leaks(c) && c.first_layer_spread > 1)
}

/// Rule 2: Trailing columns no replaced token ever changes: the writer keeps only part of an entry.
fn frozen_tail(f: &StageFacts) -> bool {
    f.causality
        .as_ref()
        .is_some_and(|c| c.frozen_tail_columns > 0)
}

/// Rule 3: Attention saw a later token.
fn later_layer_leak(f: &StageFacts) -> bool {
    f.causality.as_ref().is_some_and(|c| c.leak_cells > 0)
}

fn stale_moved(f: &StageFacts) -> Option<&StaleFinding> {
    f.stale.as_ref().filter(|s| s.first_moved_step.is_some())
}

/// Rule 4: Stale poison moves a step and the leaking slots are read as whole entries (permuting
/// them changes nothing; one leaking slot: no permutation test, the mask is the direct reading).
fn stale_whole_entries(f: &StageFacts) -> bool {
    stale_moved(f).is_some_and(|s| s.leaks_whole_entries != Some(false))
}

/// Rule 4: … read as bytes of other slots: the reader assembles entries wrongly.
fn stale_other_bytes(f: &StageFacts) -> bool {
    stale_moved(f).is_some_and(|s| s.leaks_whole_entries == Some(false))
}

/// Rule 5: Pure decode passes, decode after a prefill fails: tbt disagrees with what prefill wrote.
fn decode_after_prefill(f: &StageFacts) -> bool {
    f.splits
        .as_ref()
        .is_some_and(|sp| sp.pure_decode_min >= FAILS && sp.mixed_decode_min < FAILS)
}

/// Rule 6: Pure decode fails.
fn pure_decode(f: &StageFacts) -> bool {
    f.splits
        .as_ref()
        .is_some_and(|sp| sp.pure_decode_min < FAILS)
}

/// Rule 7: Decode clean everywhere, only the prefill's own logits fail.
fn prefill_logits(f: &StageFacts) -> bool {
    f.splits
        .as_ref()
        .is_some_and(|sp| sp.whole_prefill.cosine < FAILS || sp.prefill_continue_min < FAILS)
}

/// Rule 0 alone (the writer's solved layout).
pub fn stage_from_layout(f: &LayoutInferFinding) -> Option<Stage> {
    locate(&StageFacts {
        layout_infer: Some(f.clone()),
        ..Default::default()
    })
}

/// Rules 1-7 (the stale, causality and splits findings).
pub fn stage_from(
    stale: Option<&StaleFinding>,
    causality: Option<&CausalityFinding>,
    splits: Option<&SplitsFinding>,
) -> Option<Stage> {
    locate(&StageFacts {
        layout_infer: None,
        stale: stale.cloned(),
        causality: causality.cloned(),
        splits: splits.cloned(),
    })
}

/// Runs layout --infer, stale, causality and splits (bounded for `diagnose`), adds their
/// evidence lines and findings, and returns the stage they point at.
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
    let facts = StageFacts {
        layout_infer: Some(li),
        stale: Some(st),
        causality: Some(ca),
        splits: Some(sp),
    };
    let stage = locate(&facts);
    ev.extend(probe_lines(&facts));
    if let Some(x) = stage {
        ev.push(format!("→ stage (issue-10 probes): {}", x.name()));
    }
    let StageFacts {
        layout_infer,
        stale,
        causality,
        splits,
    } = facts;
    p.layout_infer = layout_infer;
    p.stale = stale;
    p.causality = causality;
    p.splits = splits;
    Ok(stage)
}

/// What the stale, causality and splits probes measured, one line each.
fn probe_lines(f: &StageFacts) -> Vec<String> {
    let mut ev = Vec::new();
    if let Some(st) = &f.stale {
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
    if let Some(ca) = &f.causality {
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
    if let Some(sp) = &f.splits {
        ev.push(format!(
            "splits: pure decode min {:.4}, decode after prefill min {:.4}, prefill-continue min {:.4}, whole prefill {:.4}",
            sp.pure_decode_min, sp.mixed_decode_min, sp.prefill_continue_min, sp.whole_prefill.cosine
        ));
    }
    ev
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
    let conclusion = Conclusion {
        verdict,
        confidence,
        evidence,
        also: Vec::new(),
        warnings: Vec::new(),
        rule: None,
        decisive: Vec::new(),
    };
    let mut d = Diagnosis::from_rules(conclusion, probes, timings);
    d.stage = stage;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::ring::testing::layout_infer;
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

    /// Four edges solved token-major at `shift`; `edit` changes some.
    fn inferred(
        shift: i64,
        edit: impl FnOnce(&mut Vec<kvprobe_schema::InferredCache>),
    ) -> LayoutInferFinding {
        let mut li = layout_infer(Some(Layout::TokenMajor), shift);
        edit(&mut li.caches);
        li
    }

    #[test]
    fn solved_writer_layout_names_writer_or_offset() {
        // healthy: token-major in place
        assert_eq!(stage_from_layout(&inferred(0, |_| ())), None);
        // one V edge written feature-major, or by a map outside the named list
        let one = inferred(0, |c| c[3].named = Some(Layout::FeatureMajor));
        assert_eq!(stage_from_layout(&one), Some(Stage::PrefillWriter));
        let unnamed = inferred(0, |c| c[1].named = None);
        assert_eq!(stage_from_layout(&unnamed), Some(Stage::PrefillWriter));
        // right bytes in the wrong slots everywhere
        assert_eq!(
            stage_from_layout(&inferred(-13, |_| ())),
            Some(Stage::Offset)
        );
        // unexplained edges say nothing (truncated bytes are the causality rules' business)
        let unexplained = inferred(3, |c| {
            c.iter_mut().for_each(|e| {
                e.explained = false;
                e.named = None;
            })
        });
        assert_eq!(stage_from_layout(&unexplained), None);
    }

    fn facts_with(f: impl FnOnce(&mut StageFacts)) -> StageFacts {
        let mut facts = StageFacts::default();
        f(&mut facts);
        facts
    }

    /// (rule, facts where it holds, a near miss where it must not), in table order.
    fn cases() -> Vec<(&'static str, StageFacts, StageFacts)> {
        let layout = |li: LayoutInferFinding| facts_with(|f| f.layout_infer = Some(li));
        let cause = |c: CausalityFinding| facts_with(|f| f.causality = Some(c));
        let split = |p, m, w| facts_with(|f| f.splits = Some(splits(p, m, w)));
        let stale_at = |moved: bool, whole| {
            let mut st = stale(whole);
            if !moved {
                st.first_moved_step = None;
            }
            facts_with(|f| f.stale = Some(st))
        };
        let mut frozen = causality(0, 0, Some(0), 1);
        frozen.frozen_tail_columns = 16;
        vec![
            (
                "solved-writer-map",
                layout(inferred(0, |c| c[0].named = None)),
                layout(inferred(0, |c| {
                    c[0].named = None;
                    c[0].explained = false;
                })),
            ),
            (
                "solved-slot-shift",
                layout(inferred(-13, |_| ())),
                layout(inferred(-13, |c| c[0].shift = 0)),
            ),
            (
                "first-layer-moved",
                cause(causality(5, 5, Some(-1), 1)),
                cause(causality(59, 59, None, 8)),
            ),
            (
                "first-layer-scattered",
                cause(causality(59, 59, None, 8)),
                cause(causality(0, 3, Some(0), 8)),
            ),
            (
                "frozen-tail",
                cause(frozen),
                cause(causality(0, 0, Some(0), 1)),
            ),
            (
                "later-layer-leak",
                cause(causality(0, 3, Some(0), 1)),
                cause(causality(0, 0, Some(0), 1)),
            ),
            (
                "stale-whole-entries",
                stale_at(true, None),
                stale_at(false, Some(true)),
            ),
            (
                "stale-other-bytes",
                stale_at(true, Some(false)),
                stale_at(true, Some(true)),
            ),
            (
                "decode-after-prefill",
                split(0.9785, -0.83, 1.0),
                split(0.93, -0.83, 1.0),
            ),
            ("pure-decode", split(0.5, 0.5, 1.0), split(0.95, 0.5, 1.0)),
            (
                "prefill-logits",
                split(1.0, 0.99, 0.9),
                split(0.99, 0.99, 0.99),
            ),
        ]
    }

    #[test]
    fn every_stage_rule_fires_and_has_a_near_miss() {
        let cases = cases();
        let ids: Vec<&str> = cases.iter().map(|c| c.0).collect();
        let table: Vec<&str> = TABLE.iter().map(|r| r.id).collect();
        assert_eq!(ids, table, "one case per rule, in table order");
        for (rule, (id, hit, near)) in TABLE.iter().zip(&cases) {
            assert!((rule.check)(hit), "{id} should hold");
            assert!(!(rule.check)(near), "{id} should not hold on its near miss");
            assert_eq!(locate(hit), Some(rule.stage), "{id} is the first match");
        }
        assert_eq!(locate(&StageFacts::default()), None);
    }
}
