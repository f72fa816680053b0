//! What the probes measured on a genai-ring device, as plain data, and the control judgments
//! derived from it (docs/diagnosis.md, stage order 1-2). The orchestration fills a field when
//! the probe ran; a field left `None` means the probe did not run on this path.

use kvprobe_schema::{
    ColmapFinding, GreedyFinding, InjectFinding, LayoutFinding, LayoutInferFinding,
    MaskconvFinding, PositionsFinding, PrefillFinding, QuantFinding, ScaleFit, SelfmaskFinding,
    ThetaCheck, ZtapFinding,
};

use crate::affected;
use crate::diagnose::engine::{Control, Controls};
use crate::greedy::{tbt_min, tbt_top1};
use crate::session::{Geometry, Session};
use crate::thresholds::*;

pub use super::fits::{
    clean_shift, leaves_matched, mask_variant_fault, mean, pct, position_fault, scale_fault,
    theta_fault,
};

/// Evidence lines that say the issue-10 probes did not run (rewritten under `all_probes`).
pub const SKIPPED: &str = "stale/causality/splits skipped";
pub const SKIPPED_BOTH: &str = "cache-path probes and stale/causality/splits skipped";

/// Mean, min, count and top-1 agreement of a set of compared rows or steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowStats {
    pub mean: f64,
    pub min: f64,
    pub count: usize,
    pub top1: f64,
}

/// The greedy run's tbt steps (step ≥ 1).
#[derive(Debug, Clone, PartialEq)]
pub struct GreedyStats {
    pub steps: usize,
    /// `None` when no tbt step ran.
    pub tbt_mean: Option<f64>,
    pub tbt_min: f64,
    pub tbt_top1: f64,
    pub first_divergence: Option<usize>,
    /// The precision-matched reference's tbt steps (issue 18), when the device declares a lower
    /// precision.
    pub matched: Option<MatchedStats>,
}

/// Tbt cosines of the three-way comparison: means, and per step `(f32 vs matched, matched vs
/// device)`.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchedStats {
    pub reference_vs_matched: f64,
    pub matched_vs_device: f64,
    pub steps: Vec<(f64, f64)>,
}

impl MatchedStats {
    pub fn of(g: &GreedyFinding) -> Option<MatchedStats> {
        let m = g.matched.as_ref()?;
        Some(MatchedStats {
            reference_vs_matched: m.tbt_reference_vs_matched?,
            matched_vs_device: m.tbt_matched_vs_device?,
            steps: g
                .steps
                .iter()
                .skip(1)
                .filter_map(|s| {
                    s.matched
                        .map(|m| (m.reference_vs_matched, m.matched_vs_device))
                })
                .collect(),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RingFacts {
    pub has_tbt: bool,
    /// The driver sends a RoPE theta table (the theta check applies).
    pub rope_table: bool,
    /// The model has learned absolute positions (no RoPE): a self-only step depends on them.
    pub learned_positions: bool,
    pub prompt_len: usize,
    pub quant: QuantFinding,
    /// Prefill rows whose prefix fits one chunk, and the ones that read earlier chunks' cache.
    /// An empty set has mean 0 and min 1.
    pub single: RowStats,
    pub multi: RowStats,
    /// Single-chunk rows against the precision-matched reference: `(f32 vs matched, matched vs
    /// device)` per row (empty when no matched reference ran).
    pub single_matched: Vec<(f64, f64)>,
    pub selfmask: Option<RowStats>,
    pub greedy: GreedyStats,
    /// First greedy step (0 = the prefill's last row) whose device logits hold inf or NaN.
    pub non_finite_step: Option<usize>,
    /// The whole prompt's prefill fitted over attention scales (runs when the rows pass).
    pub prefill_scale: Option<ScaleFit>,
    /// Cosine of the reference's first tbt step over cache-rounded K/V (runs when the tbt
    /// steps miss far more than the cache-free controls).
    pub cache_floor: Option<f64>,
    /// The rest: the latest run of each discriminator.
    pub positions: Option<PositionsFinding>,
    pub maskconv: Option<MaskconvFinding>,
    pub layout: Option<LayoutFinding>,
    pub ztap: Option<ZtapFinding>,
    pub inject: Option<InjectFinding>,
    pub colmap: Option<ColmapFinding>,
    pub theta: Option<ThetaCheck>,
    pub layout_infer: Option<LayoutInferFinding>,
    /// `kvdiff` after the prefill only (runs where single-chunk rows fail on a RoPE model).
    pub kvdiff: Option<kvprobe_schema::KvdiffFinding>,
    /// The same request twice from cleared rings (None: the device cannot clear its rings).
    pub repeat: Option<kvprobe_schema::DeterminismFinding>,
}

/// Nothing measured yet: no probe ran (the start of hand-made facts and of `from_controls`).
impl Default for RingFacts {
    fn default() -> Self {
        let none = RowStats {
            mean: 0.0,
            min: 1.0,
            count: 0,
            top1: 0.0,
        };
        RingFacts {
            has_tbt: false,
            rope_table: false,
            learned_positions: false,
            prompt_len: 0,
            quant: QuantFinding {
                caches: Vec::new(),
                mask: None,
                mask_allowed_value: None,
                embeddings: None,
                inconsistent_caches: 0,
            },
            single: none,
            multi: none,
            single_matched: Vec::new(),
            selfmask: None,
            greedy: GreedyStats {
                steps: 0,
                tbt_mean: None,
                tbt_min: 1.0,
                tbt_top1: 1.0,
                first_divergence: None,
                matched: None,
            },
            non_finite_step: None,
            prefill_scale: None,
            cache_floor: None,
            positions: None,
            maskconv: None,
            layout: None,
            ztap: None,
            inject: None,
            colmap: None,
            theta: None,
            layout_infer: None,
            kvdiff: None,
            repeat: None,
        }
    }
}

pub(crate) fn stage_ok(mean: f64, min: f64) -> bool {
    mean >= STAGE_MEAN_COSINE && min >= STAGE_MIN_COSINE
}

/// Top-1 agreement counts only where the logits are not near-identical: a flat distribution
/// (random-weight fixtures, near-tie tokens) flips its argmax on edge noise alone.
pub(crate) fn top1_ok(agreement: f64, floor: f64, mean_cosine: f64) -> bool {
    agreement >= floor || mean_cosine >= TOP1_IRRELEVANT_ABOVE
}

/// A miss (1 − cosine) with rounding noise floored away.
pub(crate) fn noise(cosine: f64) -> f64 {
    (1.0 - cosine).max(REL_NOISE_FLOOR)
}

/// Single-chunk and multi-chunk prefill rows.
pub fn prefill_split(f: &PrefillFinding, g: &Geometry) -> [RowStats; 2] {
    let mut out = [RowStats {
        mean: 0.0,
        min: f64::INFINITY,
        count: 0,
        top1: 0.0,
    }; 2];
    for r in &f.rows {
        let o = &mut out[usize::from(g.chunks(r.position + 1) > 1)];
        o.mean += r.comparison.cosine;
        o.min = o.min.min(r.comparison.cosine);
        o.count += 1;
        o.top1 += r.comparison.top1_match as usize as f64;
    }
    for o in &mut out {
        if o.count > 0 {
            o.mean /= o.count as f64;
            o.top1 /= o.count as f64;
        } else {
            o.min = 1.0;
        }
    }
    out
}

impl RingFacts {
    /// The facts the controls establish (the device, the model and the control probes'
    /// findings); the discriminators' fields stay `None` until they run.
    pub fn from_controls(
        s: &Session,
        quant: QuantFinding,
        prefill: &PrefillFinding,
        selfmask: Option<&SelfmaskFinding>,
        greedy: &GreedyFinding,
    ) -> Self {
        let g = s.geometry();
        let [single, multi] = prefill_split(prefill, &g);
        RingFacts {
            has_tbt: s.has_tbt(),
            rope_table: s.driver.rope_theta().is_some(),
            learned_positions: s.model.rope_inv_freq().is_none(),
            prompt_len: g.prompt_len,
            quant,
            single,
            multi,
            single_matched: prefill
                .rows
                .iter()
                .filter(|r| g.chunks(r.position + 1) == 1)
                .filter_map(|r| {
                    r.matched
                        .map(|m| (m.reference_vs_matched, m.matched_vs_device))
                })
                .collect(),
            selfmask: selfmask.map(|f| RowStats {
                mean: f.mean_cosine,
                min: f.min_cosine,
                count: f.steps.len(),
                top1: f.top1_agreement,
            }),
            greedy: GreedyStats {
                steps: greedy.steps.len(),
                tbt_mean: greedy.tbt_mean_cosine,
                tbt_min: tbt_min(greedy).unwrap_or(1.0),
                tbt_top1: tbt_top1(greedy).unwrap_or(1.0),
                first_divergence: greedy.first_divergence,
                matched: MatchedStats::of(greedy),
            },
            non_finite_step: crate::greedy::first_non_finite_step(s),
            ..RingFacts::default()
        }
    }

    fn rows_ok(r: &RowStats) -> bool {
        r.count == 0 || (stage_ok(r.mean, r.min) && top1_ok(r.top1, PREFILL_TOP1, r.mean))
    }

    pub fn selfmask_noise(&self) -> Option<f64> {
        self.selfmask.map(|f| noise(f.mean))
    }

    /// Relative prefill control: single-chunk rows that pass the absolute floors miss the
    /// reference ≥ `REL_RATIO` × further than the self-only steps on the same edges.
    pub fn prefill_relative_miss(&self) -> bool {
        let s = &self.single;
        Self::rows_ok(s)
            && s.count > 0
            && self
                .selfmask_noise()
                .is_some_and(|n| 1.0 - s.mean >= REL_PREFILL_GAP && 1.0 - s.mean >= REL_RATIO * n)
    }

    /// The prefill scale fit runs when the rows pass both the absolute and relative controls.
    pub fn wants_prefill_scale(&self) -> bool {
        Self::rows_ok(&self.single) && !self.prefill_relative_miss()
    }

    /// A scale ≠ 1 reproduces the prompt's prefill and shrinks its miss (`fit_repairs`). The fit
    /// is taken on the whole prompt, whose last row reads earlier chunks' cache when any prefix
    /// does: with those multi-chunk rows failing and the single-chunk ones passing, a scale
    /// that lifts it absorbs the cached columns' failure (SmolLM2 `mask=left-valid@prefill`,
    /// L 47, P 11: ×0.671 reached 0.983), which no attention scale of the graph explains.
    pub fn prefill_scale_hit(&self) -> Option<&ScaleFit> {
        if self.multi.count > 0 && !Self::rows_ok(&self.multi) {
            return None;
        }
        self.prefill_scale.as_ref().filter(|f| {
            f.best_cosine >= POSITION_REPRODUCES && fit_repairs(f.unit_cosine, f.best_cosine)
        })
    }

    pub fn pf_single_ok(&self) -> bool {
        !self.pf_single_fails() && self.prefill_scale_hit().is_none()
    }

    /// The single-chunk rows fail as measured: the absolute floors or the relative control
    /// against the self-only steps. The attention-scale fit may explain such a failure; it does
    /// not make one (issue 18).
    pub fn pf_single_fails(&self) -> bool {
        !Self::rows_ok(&self.single)
            || self.prefill_relative_miss()
            || self.prefill_leaves_matched()
    }

    /// The single-chunk rows leave the precision-matched reference by more than the declared
    /// precision explains (the tbt rule's median test, with the self-only steps' miss standing
    /// for the graph's own arithmetic).
    pub fn prefill_leaves_matched(&self) -> bool {
        let graph = self.selfmask_noise().unwrap_or(REL_NOISE_FLOOR);
        leaves_matched(&self.single_matched, graph)
    }

    pub fn pf_multi_ok(&self) -> bool {
        Self::rows_ok(&self.multi)
    }

    pub fn sm_ok(&self) -> bool {
        self.selfmask.is_none_or(|f| stage_ok(f.mean, f.min)) && !self.selfmask_relative_miss()
    }

    /// Relative self-only control, the prefill one's mirror: self-only steps that pass the
    /// absolute floors miss the reference ≥ `REL_RATIO` × further than the single-chunk prefill
    /// rows on the same edges, and by ≥ `REL_TBT_GAP` (SmolLM2 `gqa-repeat=block@tbt`, L 52 /
    /// P 4: self-only 0.966, min 0.924, prefill rows 1.0000; healthy devices 1.0000 on both).
    /// On hardware whose prefill rows miss by ≥ 1e-3 it needs a 0.02 miss: silent by design.
    pub fn selfmask_relative_miss(&self) -> bool {
        let s = &self.single;
        self.selfmask.is_some_and(|sm| {
            let miss = 1.0 - sm.mean;
            stage_ok(sm.mean, sm.min)
                && s.count > 0
                && Self::rows_ok(s)
                && !self.prefill_relative_miss()
                && miss >= REL_TBT_GAP
                && miss >= REL_RATIO * noise(s.mean)
        })
    }

    pub fn g_tbt_mean(&self) -> f64 {
        self.greedy.tbt_mean.unwrap_or(1.0)
    }

    fn greedy_abs_ok(&self) -> bool {
        let g = &self.greedy;
        let passes = stage_ok(self.g_tbt_mean(), g.tbt_min)
            && top1_ok(g.tbt_top1, GREEDY_TOP1, self.g_tbt_mean());
        // a miss the declared precision explains is no failure: the precision-matched
        // reference misses the f32 one about as much, and the device follows it
        // an absolute miss is the precision's only when the precision-matched reference misses
        // f32 about as much itself (a uint8 cache on a tiny model), and the device follows it
        let shared = self
            .greedy
            .matched
            .as_ref()
            .is_some_and(|m| 2.0 * noise(m.reference_vs_matched) >= noise(self.g_tbt_mean()));
        passes || (shared && !self.beyond_precision())
    }

    /// How far golden rings may miss the first tbt step before `inject` searches reader
    /// layouts: what the declared precision allows (`PRECISION_RATIO` × the band), never below
    /// the gain a repair must show, never above `REL_TBT_GAP` (SmolLM2 K of layer 17 read in
    /// f8cr, L 42 / P 12: golden rings 0.9990 where the precision costs 0.0001).
    pub fn reader_search_gap(&self) -> f64 {
        self.precision_band()
            .map_or(REL_TBT_GAP, |b| (PRECISION_RATIO * b).max(FIT_MIN_GAIN))
            .min(REL_TBT_GAP)
    }

    /// The miss the device's declared precision allows its tbt steps: the cache-free controls'
    /// miss (its graph's own arithmetic) plus the precision-matched reference's (its cache and
    /// edges), when that reference ran.
    pub fn precision_band(&self) -> Option<f64> {
        let m = self.greedy.matched.as_ref()?;
        Some(self.graph_noise() + noise(m.reference_vs_matched))
    }

    /// The graph's own arithmetic, from the controls that read no cache at all (multi-chunk
    /// rows read it and may be the failing stage): the smaller of the two, since a faulty graph
    /// fails its own control and must not widen the band it is judged by.
    fn graph_noise(&self) -> f64 {
        [
            self.selfmask_noise(),
            (self.single.count > 0).then(|| noise(self.single.mean)),
        ]
        .into_iter()
        .flatten()
        .reduce(f64::min)
        .unwrap_or(REL_NOISE_FLOOR)
        .max(REL_NOISE_FLOOR)
    }

    /// The device leaves its precision-matched reference by more than that precision explains:
    /// at the median tbt step its miss against the matched reference is ≥ `PRECISION_RATIO` ×
    /// the matched reference's own miss plus the graph's noise. Per step, because cache
    /// rounding amplifies at a few sensitive steps for the device and the matched reference
    /// alike, while a fault moves every step.
    pub fn beyond_precision(&self) -> bool {
        self.greedy
            .matched
            .as_ref()
            .is_some_and(|m| leaves_matched(&m.steps, self.graph_noise()))
    }

    /// The worst miss of the cache-free controls (prefill rows, self-only steps).
    pub fn cache_noise(&self) -> f64 {
        [
            self.selfmask_noise(),
            (self.single.count > 0).then(|| noise(self.single.mean)),
            (self.multi.count > 0).then(|| noise(self.multi.mean)),
        ]
        .into_iter()
        .flatten()
        .fold(REL_NOISE_FLOOR, f64::max)
    }

    /// Relative tbt control without a precision-matched reference: passing tbt steps miss
    /// ≥ `REL_RATIO` × the cache-free controls; the cache's first-step rounding floor then
    /// decides (`cache_floor`).
    pub fn wants_cache_floor(&self) -> bool {
        let miss = 1.0 - self.g_tbt_mean();
        self.greedy.matched.is_none()
            && self.greedy_abs_ok()
            && self.greedy.tbt_mean.is_some()
            && miss >= REL_TBT_GAP
            && miss >= REL_RATIO * self.cache_noise()
    }

    /// The tbt steps miss more than the device's precision explains: against the
    /// precision-matched reference when it ran, else more than the cache's rounding alone costs
    /// the first step.
    pub fn greedy_relative_miss(&self) -> bool {
        if self.greedy.matched.is_some() {
            return self.beyond_precision();
        }
        self.cache_floor
            .is_some_and(|c| 1.0 - self.g_tbt_mean() > 1.0 - c)
    }

    pub fn greedy_ok(&self) -> bool {
        self.greedy_abs_ok() && !self.greedy_relative_miss()
    }

    pub fn controls_pass(&self) -> bool {
        self.pf_single_ok() && self.pf_multi_ok() && self.sm_ok() && self.greedy_ok()
    }

    /// Every control passes and the declared quant infos agree.
    pub fn healthy_so_far(&self) -> bool {
        self.controls_pass() && self.quant.inconsistent_caches == 0
    }

    /// A passing but marginal cache-reading stage: too far from the device's healthy level to
    /// call healthy unchecked, too close to name a fault by elimination.
    pub fn marginal(&self) -> bool {
        let g = self.g_tbt_mean();
        (g < MARGINAL_MEAN_COSINE || self.greedy.tbt_min < MARGINAL_MIN_COSINE)
            || (self.multi.count > 0
                && (self.multi.mean < MARGINAL_MEAN_COSINE || self.multi.min < MARGINAL_MIN_COSINE))
    }

    /// On a healthy-so-far run, `positions` / `maskconv` show a non-server convention that
    /// reproduces the reference better than the server's own.
    pub fn quiet_fault(&self) -> bool {
        let (Some(ps), Some(mc)) = (&self.positions, &self.maskconv) else {
            return false;
        };
        position_fault(ps) || mask_variant_fault(mc).is_some() || scale_fault(ps).is_some()
    }

    /// On a healthy-so-far run, some rings' writer data decode cleanly as another layout.
    pub fn quiet_layout(&self) -> bool {
        self.layout
            .as_ref()
            .is_some_and(|ly| !affected::misplaced_layout(&ly.caches).is_empty())
    }

    /// Only the multi-chunk prefill rows fail (what earlier chunks wrote is read wrong). The
    /// tbt steps read the rings the same prefill wrote, so a small miss of theirs against the
    /// precision-matched reference follows from it: they only need to pass the stage floors.
    pub fn only_multi_chunk_fails(&self) -> bool {
        let g = &self.greedy;
        let greedy_floors = stage_ok(self.g_tbt_mean(), g.tbt_min)
            && top1_ok(g.tbt_top1, GREEDY_TOP1, self.g_tbt_mean());
        self.pf_single_ok() && !self.pf_multi_ok() && self.sm_ok() && greedy_floors
    }

    /// The theta check runs when single-chunk rows fail on a RoPE model with a tbt group.
    pub fn wants_theta(&self) -> bool {
        !self.pf_single_ok() && self.has_tbt && self.rope_table
    }

    /// Self-only steps fail on a model with learned positions: the position sweep can tell.
    pub fn wants_self_only_positions(&self) -> bool {
        !self.sm_ok() && self.pf_single_ok() && self.has_tbt && self.learned_positions
    }

    /// The position sweep run for the failing self-only control.
    pub fn self_only_positions(&self) -> Option<&PositionsFinding> {
        self.positions
            .as_ref()
            .filter(|_| self.wants_self_only_positions())
    }

    /// Golden rings repair the tbt step: the prefill writer's bytes are wrong.
    pub fn writer_blamed(&self) -> bool {
        self.inject.as_ref().is_some_and(|i| i.blame == "writer")
    }

    /// The attention-scale fit on the device's own rings repairs the first tbt step better than
    /// golden rings do, and golden rings do not reproduce it: golden rings then beat the
    /// device's only because the tbt steps wrote keys and values computed under the wrong scale
    /// (SmolLM2 `tbt-attn-scale=1.65`, L 45 / P 16: golden 0.950, the fit 0.997), so the
    /// writer's blame does not set the fit aside.
    pub fn scale_outdoes_golden(&self) -> Option<&ScaleFit> {
        let fit = scale_fault(self.positions.as_ref()?)?;
        let golden = self.inject.as_ref()?.golden.cosine;
        (golden < POSITION_REPRODUCES && fit.best_cosine > golden).then_some(fit)
    }

    /// Mean token-major correlation at the predicted slots over the rings.
    pub fn token_major_score(&self) -> f64 {
        self.layout.as_ref().map_or(0.0, |ly| {
            mean(ly.caches.iter().map(|c| c.token_major_score))
        })
    }
}

impl Controls for RingFacts {
    fn fails(&self, c: Control) -> bool {
        match c {
            Control::Exempt => false,
            Control::PrefillSingle => self.pf_single_fails(),
            Control::PrefillMulti => !self.pf_multi_ok(),
            Control::SelfOnly => !self.sm_ok(),
            Control::Greedy => !self.greedy_ok(),
            Control::CacheReading => !self.pf_multi_ok() || !self.greedy_ok(),
            Control::Output => self.non_finite_step.is_some(),
            // identical requests from cleared rings differ (a ring's state writes are not a
            // control of their own: the rings are read through kvdiff and layout)
            Control::Rerun => self
                .repeat
                .as_ref()
                .is_some_and(crate::determinism::repeat_differs),
            Control::StateWrites => false,
            // the capacity check has facts of its own (diagnose::capacity)
            Control::Capacity => false,
            Control::Any => [
                Control::Rerun,
                Control::PrefillSingle,
                Control::PrefillMulti,
                Control::SelfOnly,
                Control::Greedy,
                Control::Output,
            ]
            .into_iter()
            .any(|c| self.fails(c)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn self_only_steps_far_less_precise_than_the_prefill_rows_fail() {
        let with = |sm: f64, single: f64| {
            let mut f = healthy_facts();
            f.selfmask = Some(rows(sm, sm - 0.04, 4));
            f.single = rows(single, single, 4);
            f
        };
        // SmolLM2 `gqa-repeat=block@tbt`: self-only 0.966 (min 0.924), prefill rows 1.0000
        assert!(with(0.966, 0.99999).selfmask_relative_miss());
        assert!(!with(0.966, 0.99999).sm_ok());
        // prefill rows as imprecise (hardware-like): no failure
        assert!(!with(0.966, 0.998).selfmask_relative_miss());
        // under the gap: rounding
        assert!(!with(0.9985, 0.99999).selfmask_relative_miss());
        assert!(healthy_facts().sm_ok());
    }

    #[test]
    fn the_reader_search_gap_follows_the_declared_precision() {
        let with_band = |reference_vs_matched: f64| {
            let mut f = healthy_facts();
            f.selfmask = Some(rows(1.0, 1.0, 4));
            f.single = rows(1.0, 1.0, 4);
            f.greedy.matched = Some(MatchedStats {
                reference_vs_matched,
                matched_vs_device: 0.9988,
                steps: Vec::new(),
            });
            f
        };
        // SmolLM2, L 42 / P 12: the precision costs 1e-4, golden rings miss by 1e-3
        let gap = with_band(0.9999).reader_search_gap();
        assert!((gap - FIT_MIN_GAIN).abs() < 1e-9, "{gap}");
        assert!(1.0 - 0.9990 > gap);
        // a coarse precision keeps the fixed gap; no matched reference: the fixed gap
        assert_eq!(with_band(0.99).reader_search_gap(), REL_TBT_GAP);
        assert_eq!(healthy_facts().reader_search_gap(), REL_TBT_GAP);
        let mid = with_band(0.9995).reader_search_gap();
        assert!(mid > FIT_MIN_GAIN && mid < REL_TBT_GAP, "{mid}");
    }
}
