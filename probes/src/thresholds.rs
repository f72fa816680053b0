//! Diagnosis thresholds (docs/diagnosis.md explains each). Grounded in the prior art's numbers
//! (prior-art doc §8) and calibrated on the emulator with default INT8 edges; the margins keep a
//! healthy quantised device (0.96-0.99 cosine, dependency notes) clear of the fault levels
//! (0.84-0.86 for a mis-laid-out cache on hardware).

/// Logit cosine at or above which a stage (prefill rows, self-only steps, greedy steps) agrees
/// with the reference. Below the 0.96 floor of a healthy INT8 device, above the 0.84-0.86 of F9.
pub const STAGE_MEAN_COSINE: f64 = 0.94;
/// A single row/step may dip further on a healthy INT8 device (clipping on an unlucky token).
pub const STAGE_MIN_COSINE: f64 = 0.85;
/// A passing cache-reading stage below these (mean / min cosine) is *marginal*: under the
/// 0.96 floor of a healthy INT8 device and far under the emulator's healthy 0.998 (SmolLM2) and
/// 0.9999 (fixtures). Marginal runs get the cache-path probes, and only a positive
/// discriminator (not elimination) may then name a fault.
pub const MARGINAL_MEAN_COSINE: f64 = 0.96;
pub const MARGINAL_MIN_COSINE: f64 = 0.9;
/// Relative controls: the prefill and tbt graphs see the same quantised edges, so a graph whose
/// rows miss the reference `REL_RATIO` × further than the device's own precise controls (and
/// by at least the gap) computes different math, even inside the absolute floors. Healthy
/// SmolLM2: prefill 1 − cosine 2e-4-1e-3, tbt ≈ 1.2e-3 (cache quantisation); random-weight fixtures
/// ≈ 1e-5, where a ×1.3 attention scale moves them by 3e-3-2e-2.
pub const REL_RATIO: f64 = 20.0;
pub const REL_PREFILL_GAP: f64 = 0.005;
pub const REL_TBT_GAP: f64 = 0.003;
/// Noise below this (1 − cosine) is rounding, not the device's precision.
pub const REL_NOISE_FLOOR: f64 = 1e-5;
/// Prefill top-1 agreement over the prefix sweep (prior art: argmax exact on a healthy device).
pub const PREFILL_TOP1: f64 = 0.75;
/// Above this mean cosine, top-1 disagreements are near-ties and do not count.
pub const TOP1_IRRELEVANT_ABOVE: f64 = 0.99;
/// Greedy top-1 agreement (teacher-forced) below which the tbt path is called broken, even when
/// the mean cosine passes (prior art: healthy on chip 13/16 = 0.81).
pub const GREEDY_TOP1: f64 = 0.6;
/// A variant (mask convention, position shift, golden ring) "reproduces the reference" at this
/// cosine, and must beat the server's own path by at least `REPAIR_MARGIN`.
pub const REPRODUCES_COSINE: f64 = 0.94;
pub const REPAIR_MARGIN: f64 = 0.02;
/// A position shift competes only with other shifts over the same ring (same edge noise), so a
/// smaller lead suffices once the shifted step reproduces the reference.
pub const POSITION_MARGIN: f64 = 0.005;
/// A wiring offset is reproduced at the healthy level (SmolLM2: 0.991 for ±2/−3 faults), while a
/// wrong attention scale can be partly mimicked by a shift (SmolLM2 tbt-attn-scale=2: 0.944 at
/// δ = −2), so the shifted step must reach this cosine.
pub const POSITION_REPRODUCES: f64 = 0.97;
/// The flipped theta table must pass the prefill stage and cut the shipped table's miss
/// (1 − cosine) at least this many times: a convention mismatch breaks every rotation (SmolLM2
/// rows 0.30 shipped vs 0.9999 flipped; the flat random fixture 0.985 vs 1.0000), while a prefill
/// graph fault is repaired by no table (flipping only adds a second error).
pub const THETA_REPAIR_RATIO: f64 = 10.0;
/// Outputs this close (cosine) are the same run (mask rows ignored by the graph). Device runs
/// are deterministic, so an ignored input gives exactly the same logits.
pub const IDENTICAL_COSINE: f64 = 0.999_999;
/// A per-head mask variant is a control only where it moves the reference: its output below
/// this cosine to the plain mask's (a thousand times the `IDENTICAL_COSINE` distance).
pub const VARIANT_MOVES_COSINE: f64 = 0.999;
/// Relative scale difference between cache writer and reader that counts as a mismatch.
pub const QUANT_SCALE_TOLERANCE: f64 = 1e-3;
/// Layout probe: Pearson correlation of decoded entries with the reference K/V for a clean match;
/// the winner must beat token-major at the predicted slots by `LAYOUT_MARGIN`.
pub const LAYOUT_CLEAN: f64 = 0.8;
pub const LAYOUT_MARGIN: f64 = 0.1;
/// A mostly shifted placement (only once golden rings repair the step and multi-chunk prefill
/// rows fail): SmolLM2 `offset=after-run` with a remainder chunk, 0.62 vs 0.02 token-major.
pub const PARTIAL_SHIFT_SCORE: f64 = 0.5;
pub const PARTIAL_SHIFT_LEAD: f64 = 0.3;
/// Colmap: a row is `clean` when its best cell beats the second by this margin; `none` below
/// `COLMAP_MATCH`. Never-written rows are identical when their spread (1 − cosine) is below
/// `COLMAP_EMPTY_SPREAD`.
pub const COLMAP_MATCH: f64 = 0.3;
pub const COLMAP_CLEAN_MARGIN: f64 = 0.15;
pub const COLMAP_EMPTY_SPREAD: f64 = 1e-4;
/// Diagonal strength of a healthy column map.
pub const COLMAP_DIAGONAL: f64 = 0.6;
/// A fitted variant (attention scale, position shift) explains the device output when it
/// shrinks the server path's miss (1 − cosine) this many times and gains at least
/// `FIT_MIN_GAIN`. Healthy SmolLM2 first tbt steps: the best scale in ×0.94-1.10 shrinks the
/// miss at most 2.4-fold (gain ≤ 1e-3, INT8 cache noise leans on the scale); tbt-attn-scale
/// ×0.65-2 shrinks it 20-60-fold; position faults ±1..4 8-35-fold.
pub const FIT_RATIO: f64 = 5.0;
pub const FIT_MIN_GAIN: f64 = 5e-4;

/// A fitted variant shrinks the server path's miss (1 − cosine) `FIT_RATIO`-fold and gains at
/// least `FIT_MIN_GAIN`: both are needed, the ratio against noise, the gain against rounding.
pub fn fit_repairs(base: f64, fitted: f64) -> bool {
    fitted - base >= FIT_MIN_GAIN && 1.0 - base >= FIT_RATIO * (1.0 - fitted)
}

/// A position shift repairs the server-position step when it shrinks the miss this many times
/// (and gains `FIT_MIN_GAIN`): lower than `FIT_RATIO` because the shifted step keeps the int8
/// cache's rounding, which no shift removes (SmolLM2 positions +1 on an int8 ring: 0.99875 at
/// δ 0, 0.99961 at δ −1, 3.2×; healthy devices peak at δ 0, where no shift is a fit).
pub const POSITION_FIT_RATIO: f64 = 3.0;

/// The position fit's repair test (see [`POSITION_FIT_RATIO`]).
pub fn position_repairs(base: f64, fitted: f64) -> bool {
    fitted - base >= FIT_MIN_GAIN && 1.0 - base >= POSITION_FIT_RATIO * (1.0 - fitted)
}

/// A single layer's (or edge's) ring variant counts as helping when it lifts the golden step's
/// cosine this much (one of 30 layers crossed moves SmolLM2's output by far more; rounding by
/// far less).
pub const LAYER_SWAP_GAIN: f64 = 1e-3;

/// Variant rings (a partial K↔V swap, a reader layout) repair the tbt step the best of the
/// device's and the golden rings (`base`) leave: they reproduce the reference by a clear margin,
/// or come near it and shrink the miss as a fit must.
pub fn rings_repair(base: f64, variant: f64) -> bool {
    (variant >= REPRODUCES_COSINE && variant >= base + REPAIR_MARGIN)
        || (variant >= POSITION_REPRODUCES && fit_repairs(base, variant))
}

/// The device's tbt steps fail against the precision-matched reference (issue 18) when, at the
/// median tbt step, they leave it by ≥ `PRECISION_RATIO` × what the declared precision costs
/// that step (the matched reference's own miss, floored at `STEP_NOISE_FLOOR`, plus the
/// cache-free controls' miss), and by at least `MATCHED_GAP` over the tbt steps (1 − mean
/// cosine). SmolLM2 on the emulator: healthy medians 0.27-0.64 over 6 prompts, a tbt position
/// −4 and a ×0.5 V-cache scale on two layers 5.2 and 6.8 (docs/diagnosis.md).
pub const PRECISION_RATIO: f64 = 2.5;
pub const MATCHED_GAP: f64 = 2e-4;
pub const STEP_NOISE_FLOOR: f64 = 1e-4;
/// One step alone fails the stage when the device leaves the matched reference there by
/// ≥ `LONE_STEP_GAP` (1 − cosine) and ≥ `LONE_STEP_RATIO` × the step's precision cost: a left-valid
/// mask at the wrap moves two steps by 0.0067 and 0.0028 where the matched reference sits 1e-5
/// from f32 (ratio 60); the largest healthy SmolLM2 step ratio seen with a matched reference that
/// did not round the RoPE tables (so it missed the emulator like it will miss hardware) was 11.5.
pub const LONE_STEP_RATIO: f64 = 25.0;
pub const LONE_STEP_GAP: f64 = 2e-3;
