//! What the stateful diagnosis measured ([`StatefulFacts`]) and which of its controls failed:
//! the facts the rules of [`super::stateful`] and their evidence text read.

use kvprobe_schema::{
    DeclaredArithmetic, DeterminismFinding, DeviceDescription, OverflowFinding, PrefillFinding,
    StateFinding,
};

use super::engine::{Control, Controls};
use super::ring::fits::leaves_matched;
use crate::determinism;
use crate::thresholds::*;
use crate::wiring_fit::WiringFit;

/// What the state checks and the controls measured; `None` = not run (an earlier rule ended it).
#[derive(Debug, Clone, PartialEq)]
pub struct StatefulFacts {
    /// The same request twice from fresh states, in this process.
    pub repeat: Option<DeterminismFinding>,
    /// The prompt after a reset gave bit-identical logits whatever request came before.
    pub back_to_back_identical: bool,
    /// Cosine of the two back-to-back runs (NaN when refused).
    pub back_to_back_cosine: f64,
    /// The device refused the second request (why).
    pub back_to_back_refused: Option<String>,
    pub overflow: Option<OverflowFinding>,
    /// First greedy step (0 = the prefill's last row) whose device logits hold inf or NaN.
    pub non_finite_step: Option<usize>,
    /// Prefill rows and greedy steps against the reference: (mean, min, top-1 agreement).
    pub prefill: Option<[f64; 3]>,
    pub greedy: Option<[f64; 3]>,
    /// Per prefill row `(f32 vs matched, matched vs device)` cosines, where the matched
    /// reference computes a prefill row as the device declares it (`matched::computes_prefill`;
    /// the f32 reference, cosine 1, on a device that declares f32 throughout); empty where it
    /// does not, and the stage floors alone judge the prefill.
    pub prefill_rows: Vec<(f64, f64)>,
    /// Per tbt step `(f32 vs matched, matched vs device)` cosines; the matched reference is the
    /// f32 one (cosine 1) on a device that declares f32 throughout.
    pub greedy_steps: Vec<(f64, f64)>,
    /// The cache-free controls' miss (prefill rows run from a reset, self-only steps), the
    /// larger of the two: the graph's own arithmetic, which the declared precision adds to.
    pub graph_noise: f64,
    /// The host-wiring hypotheses fitted on the reference side (run when greedy failed).
    pub output_fit: Option<WiringFit>,
    /// The host's declared feed replayed on the reference (run when a control failed and the
    /// request's feed departs from the model's: `crate::host_feed`).
    pub host_feed: Option<crate::host_feed::HostFeedFit>,
    /// The host's runs replayed at the slot level under each writer hypothesis (run when a
    /// control failed, the host's feed explains nothing and the first window holds pads:
    /// `crate::host_slots`).
    pub host_writer: Option<crate::host_slots::HostWriterFit>,
    /// Greedy against the f32 reference when `greedy` holds the matched comparison, and the
    /// matched reference's first fp16 overflow (issue 36).
    pub fp16_overflow: Option<(String, [f64; 3])>,
    pub state: Option<StateFinding>,
    /// Cache edges that declare different element types or quantisations for one cache
    /// (the description's, e.g. a uint16 runner input over a uint8 graph output).
    pub declared_quant_mismatch: Option<String>,
    /// The K/V binding the states show after the first decode step and its replay
    /// (`crate::state_binding`; run with the state experiments, `None` when the identity).
    pub binding: Option<crate::state_binding::BindingFit>,
}

/// The evidence line of a prefill control that fails at the declared precision.
pub(super) const PREFILL_LEAVES_MATCHED: &str = "prefill: the rows leave the precision-matched reference by more than the declared precision explains (median row ≥ 2.5× its precision, floored at 1e-4)";

/// Each prefill row's `(f32 vs matched, matched vs device)`, where the matched reference
/// computes the rows as `desc` declares them (`matched::computes_prefill`) and the device
/// computes nothing else (`unmodelled`: `Device::unmodelled_precision`, OpenVINO's bf16
/// arithmetic and int8 activations: a healthy NPUW SmolLM2 prompt's rows sat 2.6e-3 from f32
/// on average, one at 1.0e-2); empty otherwise.
pub(super) fn declared_rows(
    desc: &DeviceDescription,
    unmodelled: bool,
    pf: &PrefillFinding,
) -> Vec<(f64, f64)> {
    // fp16 arithmetic inside the graph is computed op by op (outputs rounded), not as the
    // device accumulates: QNN HTP's healthy "Can you recommend a good book?" rows leave that
    // reference at median ratio 4.7 (docs/qnn.md, session 26), so only a float32 graph is judged
    let f32_graph = matches!(desc.arithmetic, DeclaredArithmetic::Float32);
    if unmodelled || !f32_graph || !crate::matched::computes_prefill(desc) {
        return Vec::new();
    }
    // a row's band: the jitter control's spread where it ran, else the declared precision's
    // cost against f32 (`crate::footing::band`, as the greedy steps')
    let jitter = crate::footing::jitter_applies(desc, unmodelled);
    pf.rows
        .iter()
        .map(|r| {
            r.matched.map_or((1.0, r.comparison.cosine), |m| {
                crate::footing::judged(&m, jitter)
            })
        })
        .collect()
}

/// Each tbt step's `(band, matched vs device)` (the greedy steps after the prompt's row): the
/// band as `footing::band` gives it (the jitter's spread where `jitter`, else the declared
/// precision's cost), `(1, cosine against f32)` where no matched reference ran.
pub(super) fn greedy_rows(gr: &kvprobe_schema::GreedyFinding, jitter: bool) -> Vec<(f64, f64)> {
    gr.steps
        .iter()
        .skip(1)
        .map(|x| {
            x.matched.map_or((1.0, x.comparison.cosine), |m| {
                crate::footing::judged(&m, jitter)
            })
        })
        .collect()
}

/// Passes the stage floors of the ring rules, top-1 ignored near identical logits.
pub(super) fn passes([mean, min, top1]: [f64; 3], top1_floor: f64) -> bool {
    mean >= STAGE_MEAN_COSINE
        && min >= STAGE_MIN_COSINE
        && (top1 >= top1_floor || mean >= TOP1_IRRELEVANT_ABOVE)
}

impl StatefulFacts {
    /// The facts before any probe ran: the repeat check's result and the cache quantisations the
    /// device declares; every control's slot empty until its probe fills it.
    pub(super) fn first(
        repeat: Option<kvprobe_schema::DeterminismFinding>,
        declared_quant_mismatch: Option<String>,
    ) -> StatefulFacts {
        StatefulFacts {
            repeat,
            back_to_back_identical: true,
            back_to_back_cosine: 1.0,
            back_to_back_refused: None,
            overflow: None,
            non_finite_step: None,
            prefill: None,
            greedy: None,
            prefill_rows: Vec::new(),
            greedy_steps: Vec::new(),
            graph_noise: REL_NOISE_FLOOR,
            output_fit: None,
            host_feed: None,
            host_writer: None,
            state: None,
            declared_quant_mismatch,
            fp16_overflow: None,
            binding: None,
        }
    }

    pub fn prefill_ok(&self) -> bool {
        self.prefill.is_some_and(|p| passes(p, PREFILL_TOP1)) && !self.prefill_leaves_matched()
    }

    /// The prefill rows leave the precision-matched reference by more than the declared
    /// precision explains: the greedy steps' per-row test (`ring::fits::leaves_matched`) with the
    /// noise floor of an f32 device as the graph's noise, never a control's own miss (each row
    /// from a reset reads no cache: the cache-free controls are this one and the self-only
    /// steps, and a graph fault moves both). The stage floors are fixed cosines that a fault
    /// inside a float32 device's precision passes (issue 35: a norm weight dropped on the tiny
    /// builder export, prefill 0.9970 against f32 where the device declares 1e-5).
    pub fn prefill_leaves_matched(&self) -> bool {
        leaves_matched(&self.prefill_rows, REL_NOISE_FLOOR)
    }

    /// The prefill control fails: the stage floors or the declared precision.
    pub fn prefill_fails(&self) -> bool {
        self.prefill.is_some_and(|p| !passes(p, PREFILL_TOP1)) || self.prefill_leaves_matched()
    }

    /// The f32 reference's greedy comparison passes.
    pub fn f32_greedy_ok(&self) -> bool {
        self.fp16_overflow
            .as_ref()
            .is_none_or(|(_, g)| passes(*g, GREEDY_TOP1))
    }

    pub fn greedy_ok(&self) -> bool {
        self.greedy.is_some_and(|g| passes(g, GREEDY_TOP1)) && !self.greedy_leaves_matched()
    }

    /// The tbt steps leave the precision-matched reference by more than the declared precision
    /// and the graph's own arithmetic explain — the per-step test of the ring rules
    /// (`ring::fits::leaves_matched`), which the absolute floors alone miss: a position id off
    /// by one on SmolLM2 keeps the greedy mean at 0.99 and top-1 at 100 % while one step falls
    /// to 0.92 where the healthy device sits at 1.0000.
    pub fn greedy_leaves_matched(&self) -> bool {
        leaves_matched(&self.greedy_steps, self.graph_noise)
    }

    pub fn overflowed(&self) -> bool {
        self.overflow.as_ref().is_some_and(|ov| {
            !ov.logits_finite || ov.layer.is_some() || ov.zero_rows.is_some() || ov.logits_zero
        })
    }

    /// Two runs from all-zero states with identical inputs differed.
    pub(super) fn repeat_differs(&self) -> bool {
        self.repeat
            .as_ref()
            .is_some_and(determinism::repeat_differs)
    }

    /// The prefill wrote exactly positions `0..n`.
    pub(super) fn written_ok(&self) -> Option<bool> {
        let st = self.state.as_ref()?;
        Some(st.written == (0..st.prompt_len).collect::<Vec<_>>())
    }
}

impl Controls for StatefulFacts {
    fn fails(&self, c: Control) -> bool {
        match c {
            // the capacity check has facts of its own (diagnose::capacity)
            Control::Exempt | Control::Capacity => false,
            Control::Rerun => !self.back_to_back_identical || self.repeat_differs(),
            Control::Output => self.overflowed() || self.non_finite_step.is_some(),
            Control::StateWrites => self.written_ok() == Some(false),
            // a control that did not run has not failed
            Control::PrefillSingle | Control::PrefillMulti => self.prefill_fails(),
            // under a matched fp16 reference that overflowed, the f32 reference's greedy
            // comparison is the failing control
            Control::Greedy | Control::CacheReading => {
                self.greedy.is_some_and(|g| !passes(g, GREEDY_TOP1))
                    || self.greedy_leaves_matched()
                    || !self.f32_greedy_ok()
            }
            Control::SelfOnly => self
                .state
                .as_ref()
                .and_then(|st| st.selfonly_cosine)
                .is_some_and(|own| own < REPRODUCES_COSINE),
            Control::Any => [
                Control::Rerun,
                Control::Output,
                Control::StateWrites,
                Control::PrefillSingle,
                Control::Greedy,
                Control::SelfOnly,
            ]
            .into_iter()
            .any(|c| self.fails(c)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::leaves_matched;

    /// Recorded tbt steps `(f32 vs matched, matched vs device, jitter)`: the smallest cosine of the
    /// jitter control's draws against the matched reference, `probes.greedy.steps[].matched`.
    type Step = (f64, f64, f64);

    /// A step's band as the greedy control takes it: the jitter where the control ran, or the
    /// matched reference's miss against f32 (before it).
    fn judged(steps: &[Step], jitter: bool, noise: f64) -> bool {
        let rows: Vec<(f64, f64)> = steps
            .iter()
            .map(|&(rm, md, j)| (if jitter { j } else { rm }, md))
            .collect();
        leaves_matched(&rows, noise)
    }

    /// The QDQ fixture with its decode graph rotating at position id + 1
    /// (`export-qdq.py --fault rope-offset`, seed 7, W 8 / C 64, ids 1..11, `--steps 4`, CPU EP;
    /// docs/diagnosis.md, the jitter control): the grids' own cost against f32 (8e-3 – 1.6e-2)
    /// is larger than the fault's miss; the graph is well conditioned (jitter 1 to 1e-9).
    const ROPE_OFFSET: [Step; 3] = [
        (0.99172, 0.99343, 1.0),
        (0.99205, 0.99803, 1.0),
        (0.98439, 0.99272, 1.0),
    ];

    #[test]
    fn a_qdq_rope_offset_the_old_band_held_leaves_the_jitter_band() {
        // before: the f32 miss as the band, the self-only steps against f32 as the noise (7.6e-2)
        assert!(!judged(&ROPE_OFFSET, false, 7.6e-2));
        assert!(!judged(&ROPE_OFFSET, false, 1e-5));
        // the control: the jitter as the band, the self-only steps against the matched
        // reference (1 − 0.99999999) and its rows (1.0000) as the noise, floored at 1e-5
        assert!(judged(&ROPE_OFFSET, true, 1e-5));
    }

    /// SmolLM2's int4 builder export (MatMulNBits at `accuracy_level` 4), healthy, "How do I
    /// water a cactus?" chat-templated, 16 steps, CPU EP: step 4 misses the matched reference by
    /// 2.1e-2 where its rows sit 2.2e-4 from it (the graph noise), and the draws there by 2.7e-3.
    const CACTUS: [Step; 15] = [
        (0.96263, 0.99817, 0.9989890),
        (0.96891, 0.99978, 0.9994266),
        (0.77053, 0.99962, 0.9995915),
        (0.47393, 0.97895, 0.9972502),
        (0.98728, 0.99996, 0.9999397),
        (0.99559, 0.99994, 0.9999010),
        (0.98478, 0.99993, 0.9999149),
        (0.58374, 0.99970, 0.9988541),
        (0.89954, 0.99961, 0.9996753),
        (0.78465, 0.99990, 0.9998586),
        (0.98695, 0.99991, 0.9998253),
        (0.88062, 0.99925, 0.9997348),
        (0.94186, 0.99983, 0.9995068),
        (0.97200, 0.99950, 0.9995635),
        (0.93756, 0.99861, 0.9953551),
    ];

    #[test]
    fn a_healthy_int4_prompt_stays_inside_its_jitter_and_not_inside_the_floor() {
        let noise = 2.2e-4;
        assert!(!judged(&CACTUS, true, noise));
        // the same steps with no spread measured (every draw equal to the reference): step 4
        // alone is 66× its band, a false alarm
        let floor: Vec<Step> = CACTUS.iter().map(|&(rm, md, _)| (rm, md, 1.0)).collect();
        assert!(judged(&floor, true, noise));
    }
}
