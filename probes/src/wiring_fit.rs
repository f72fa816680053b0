//! Host-wiring hypotheses fitted on the reference side against logits a device gave
//! (docs/diagnosis.md "Stateful devices", rules `output-position` / `output-mask`, and the chat's
//! fit). A device whose K/V states are out of reach (OpenVINO's C API), or whose host sets the
//! position ids and the mask itself (openvino.genai), cannot be driven at another position or
//! mask, so the ring's `positions` / `maskconv` sweeps and the state position check do not apply;
//! the reference can be. A run is recomputed, teacher-forced on the device's tokens, under each
//! hypothesis of how a host feeds the runs after the prompt wrong — every position id off by δ,
//! one column of the mask hidden (the newest stored entry, the oldest, the row's own), or an
//! appended chat turn's position ids restarted at 0 — and each is judged like a replay
//! (`diagnose::evidence::beats_healthy`): its miss per compared row within the declared precision
//! and `PRECISION_RATIO` times below the healthy hypothesis', at the median row or at the worst
//! one — the two statistics by which the greedy control fails (`ring::fits::leaves_matched`:
//! the median step, or one lone step far outside the band).

use kvprobe_npu::onnx::window_feed::LogicalFeed;
use kvprobe_reference::{ForwardOptions, Model};
use kvprobe_schema::{GreedyStep, Verdict};
use serde::{Deserialize, Serialize};

use crate::diagnose::evidence::beats_healthy;
use crate::matched::{run_rows, Precision, PREFILL, TBT};
use crate::matched_store::Store;
use crate::metrics::cosine;
use crate::thresholds::{REL_NOISE_FLOOR, STEP_NOISE_FLOOR};
use crate::Result;

/// How the runs after the prompt are fed, as a hypothesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wiring {
    /// Every position id after the prompt off by δ.
    Shift(i64),
    /// The newest stored entry (the previous token) hidden from each run after the prompt.
    HideNewest,
    /// The oldest entry (position 0) hidden.
    HideOldest,
    /// The run's own column hidden.
    HideOwn,
    /// Each appended chat turn's rows get position ids from 0, as a new prompt's would.
    TurnRestart,
    /// The same restarted position ids into a pipeline that stores each run's K/V at the slot
    /// its position id names, the host's mask opening the slots it counts
    /// (`crate::wiring_slots`).
    TurnRestartSlots,
}

/// The hypotheses for one greedy request.
pub const REQUEST: [Wiring; 7] = [
    Wiring::Shift(1),
    Wiring::Shift(-1),
    Wiring::Shift(2),
    Wiring::Shift(-2),
    Wiring::HideNewest,
    Wiring::HideOldest,
    Wiring::HideOwn,
];

/// The hypotheses for a conversation: a turn's positions restarted, then the request's.
pub fn chat() -> Vec<Wiring> {
    [Wiring::TurnRestart, Wiring::TurnRestartSlots]
        .into_iter()
        .chain(REQUEST)
        .collect()
}

impl Wiring {
    pub fn verdict(self) -> Verdict {
        match self {
            Wiring::Shift(_) | Wiring::TurnRestart | Wiring::TurnRestartSlots => {
                Verdict::PositionMismatch
            }
            Wiring::HideNewest | Wiring::HideOldest | Wiring::HideOwn => Verdict::MaskConvention,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Wiring::Shift(d) => format!("every position id after the prompt {d:+}"),
            Wiring::HideNewest => {
                "the newest stored entry (the previous token) masked out after the prompt".into()
            }
            Wiring::HideOldest => {
                "the oldest entry (position 0) masked out after the prompt".into()
            }
            Wiring::HideOwn => "the run's own column masked out after the prompt".into(),
            Wiring::TurnRestart => {
                "each appended turn fed with position ids restarting at 0".into()
            }
            Wiring::TurnRestartSlots => {
                "each appended turn fed with position ids restarting at 0, into a cache that stores each token's K/V at the slot its position id names (overwriting the history from slot 0) while the host's mask opens every slot it counts".into()
            }
        }
    }

    fn short(self) -> String {
        match self {
            Wiring::Shift(d) => format!("position {d:+}"),
            Wiring::HideNewest => "hide newest".into(),
            Wiring::HideOldest => "hide oldest".into(),
            Wiring::HideOwn => "hide own".into(),
            Wiring::TurnRestart => "turn positions from 0".into(),
            Wiring::TurnRestartSlots => "turn positions from 0, K/V at their slots".into(),
        }
    }
}

/// Where the rows of a run sit: `t` rows of which the first `prompt` are the first request's
/// prompt, each appended turn `(start, fed)`, the reference windowed to `window` keys.
#[derive(Debug, Clone)]
pub struct Rows<'a> {
    pub prompt: usize,
    pub t: usize,
    pub window: usize,
    pub turns: &'a [(usize, usize)],
}

/// The positions and the "may attend" mask under `w`; `None` when `w` says nothing here (a
/// shift below position 0, a turn restart without appended turns).
fn inputs(w: Wiring, r: &Rows) -> Option<(Vec<usize>, Vec<bool>)> {
    let t = r.t;
    let mut pos: Vec<usize> = (0..t).collect();
    // causal within the reference's window of `window` keys (the row itself and window − 1 before)
    let mut mask = kvprobe_reference::mask::banded(t, r.window.saturating_sub(1));
    if matches!(w, Wiring::TurnRestart | Wiring::TurnRestartSlots) {
        if r.turns.is_empty() {
            return None;
        }
        for &(start, fed) in r.turns {
            for (i, p) in pos.iter_mut().enumerate().skip(start).take(fed) {
                *p = i - start;
            }
        }
        return Some((pos, mask));
    }
    for row in r.prompt..t {
        match w {
            Wiring::Shift(d) => pos[row] = usize::try_from(row as i64 + d).ok()?,
            Wiring::HideNewest => mask[row * t + row - 1] = false,
            Wiring::HideOldest => mask[row * t] = false,
            Wiring::HideOwn => mask[row * t + row] = false,
            Wiring::TurnRestart | Wiring::TurnRestartSlots => {}
        }
    }
    Some((pos, mask))
}

/// The best wiring hypothesis and how it compares with the healthy one (median misses, 1 −
/// cosine, over the compared rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WiringFit {
    pub wiring: Wiring,
    pub miss: f64,
    pub healthy_miss: f64,
    /// The declared precision's cost plus the cache-free controls' miss.
    pub precision: f64,
    /// Every hypothesis tried with its median miss.
    pub tried: Vec<(Wiring, f64)>,
    /// The best hypothesis' and the healthy one's misses at their worst compared row (0 in
    /// results written before they were recorded, which then decide by the median alone).
    #[serde(default)]
    pub worst: f64,
    #[serde(default)]
    pub healthy_worst: f64,
}

/// The healthy hypothesis over the compared rows (median and worst miss against the
/// precision-matched reference) and the declared precision plus the graph's noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    pub median: f64,
    pub worst: f64,
    pub precision: f64,
}

impl WiringFit {
    /// The best hypothesis reproduces the device as `beats_healthy` asks of a replay, at the
    /// median row, or at the worst one: a control that failed by one step far outside the band
    /// (a shift that matters only where the next token depends on the position, as after "The
    /// capital of France is") is explained only by a hypothesis that reproduces that step too,
    /// while the median row sits at the noise floor for every hypothesis alike.
    pub fn reproduces(&self) -> bool {
        reproduces(
            (self.miss, self.worst),
            (self.healthy_miss, self.healthy_worst),
            self.precision,
        )
    }

    fn worst_text(&self) -> String {
        if self.healthy_worst > 0.0 {
            format!(
                "; worst row {:.1e}, the healthy hypothesis' {:.1e}",
                self.worst, self.healthy_worst
            )
        } else {
            String::new()
        }
    }

    pub fn line(&self) -> String {
        let tried: Vec<String> = self
            .tried
            .iter()
            .map(|(w, m)| format!("{} {m:.1e}", w.short()))
            .collect();
        format!(
            "wiring fit (reference side, the device's tokens): {} → median miss {:.1e}, the healthy hypothesis {:.1e}, the declared precision {:.1e}{} (tried: {})",
            self.wiring.describe(),
            self.miss,
            self.healthy_miss,
            self.precision,
            self.worst_text(),
            tried.join(", ")
        )
    }

    /// The verdict line when the fit reproduces the device.
    pub fn cause(&self) -> Option<String> {
        self.reproduces().then(|| {
            format!(
                "the host feeds the runs after the prompt wrong: {} reproduces the device (median miss {:.1e}, the healthy hypothesis {:.1e}, the declared precision {:.1e}{})",
                self.wiring.describe(),
                self.miss,
                self.healthy_miss,
                self.precision,
                self.worst_text()
            )
        })
    }
}

/// A hypothesis whose `(median, worst)` step misses are `fit` reproduces the device as
/// `beats_healthy` asks, at the median step or at the worst one (`WiringFit::reproduces`); a
/// healthy worst of 0 (results written before it was recorded) decides by the median alone.
pub fn reproduces(fit: (f64, f64), healthy: (f64, f64), precision: f64) -> bool {
    beats_healthy(fit.0, healthy.0, precision)
        || (healthy.1 > 0.0 && beats_healthy(fit.1, healthy.1, precision))
}

/// A hypothesis' logits: a forward pass, or the rows `from..` of the slot emulation.
enum Fitted {
    Pass(kvprobe_reference::ForwardOutput),
    Slots { from: usize, rows: Vec<Vec<f32>> },
}

impl Fitted {
    fn row(&self, i: usize) -> Option<&[f32]> {
        match self {
            Fitted::Pass(out) => Some(out.row(i)),
            Fitted::Slots { from, rows } => i
                .checked_sub(*from)
                .and_then(|k| rows.get(k))
                .map(Vec::as_slice),
        }
    }
}

/// The same steps on the precision-matched reference of a host-cache device (the prompt in one
/// run, as its description's prefill group takes it, then one row per token), every stored
/// position read under the feed.
pub(crate) fn matched_replay(
    model: &Model,
    p: &Precision,
    seq: &[u32],
    feed: &LogicalFeed,
    n: usize,
) -> Result<Vec<Vec<f32>>> {
    let model = p.model(model);
    let mut store = Store::new(model);
    let fed = (seq, Some(feed));
    let mut out = vec![run_rows(model, p, &mut store, fed, 0..n, 0, PREFILL, 1.0)?];
    for pos in n..seq.len() {
        out.push(run_rows(
            model,
            p,
            &mut store,
            fed,
            pos..pos + 1,
            0,
            TBT,
            1.0,
        )?);
    }
    Ok(out)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Healthy misses and declared precision (plus `graph_noise`) over compared steps: their median
/// and worst miss against the precision-matched reference (the f32 one where none ran) and that
/// reference's own median miss against f32, floored at `STEP_NOISE_FLOOR`. With `jitter`
/// (`crate::footing::Footing::jitter`: the hypotheses are replayed on the matched reference,
/// `fit`'s `matched`), the precision is the jitter control's spread where it ran instead
/// (`crate::footing::band`): the miss against f32 is then a cost the hypotheses do not pay, not
/// a room the device has.
pub fn healthy_and_precision(steps: &[&GreedyStep], graph_noise: f64, jitter: bool) -> Baseline {
    let healthy: Vec<f64> = steps
        .iter()
        .map(|x| {
            1.0 - x
                .matched
                .map_or(x.comparison.cosine, |m| m.matched_vs_device)
        })
        .collect();
    let precision = median(
        steps
            .iter()
            .map(|x| {
                x.matched
                    .map_or(0.0, |m| 1.0 - crate::footing::band(&m, jitter))
                    .max(STEP_NOISE_FLOOR)
            })
            .collect(),
    ) + graph_noise.max(REL_NOISE_FLOOR);
    Baseline {
        worst: worst(&healthy),
        median: median(healthy),
        precision,
    }
}

/// The largest miss (NaN-free: a non-finite row counts as 2, the largest 1 − cosine).
fn worst(misses: &[f64]) -> f64 {
    misses
        .iter()
        .map(|&m| if m.is_finite() { m } else { 2.0 })
        .fold(0.0, f64::max)
}

/// Fits each of `wirings` to the device's `rows` (`(row index in seq, device logits)`), each
/// hypothesis replayed on the precision-matched reference `matched` where given (the rows after
/// the prompt, as `matched_replay`: the healthy hypothesis' own arithmetic, so that a fault's
/// hypothesis is not charged the declared precision's cost against f32), else on `model` in f32.
pub fn fit(
    (model, matched): (&Model, Option<&Precision>),
    seq: &[u32],
    layout: &Rows,
    wirings: &[Wiring],
    rows: &[(usize, &[f32])],
    base: Baseline,
) -> Result<Option<WiringFit>> {
    let mut tried = Vec::new();
    for &w in wirings {
        let Some((positions, mask)) = inputs(w, layout) else {
            continue;
        };
        let out = match matched {
            Some(p) if w != Wiring::TurnRestartSlots && layout.prompt > 0 => {
                let feed = LogicalFeed {
                    positions: positions.iter().map(|&x| x as i64).collect(),
                    visible: mask,
                };
                let got = matched_replay(model, p, seq, &feed, layout.prompt)?;
                Fitted::Slots {
                    from: layout.prompt - 1,
                    rows: got,
                }
            }
            _ if w == Wiring::TurnRestartSlots => {
                // rows from the first appended turn on, each fed alone into position-indexed slots
                let from = layout.turns.first().map_or(layout.t, |&(start, _)| start);
                let got = crate::wiring_slots::rows(model, seq, &positions, from)?;
                Fitted::Slots { from, rows: got }
            }
            _ => Fitted::Pass(model.forward(
                seq,
                &ForwardOptions {
                    mask: Some(mask),
                    positions: Some(positions),
                    ..Default::default()
                },
            )?),
        };
        let misses: Vec<f64> = rows
            .iter()
            .map(|&(i, d)| {
                let c = out.row(i).map_or(f64::NAN, |r| cosine(d, r));
                if c.is_finite() {
                    1.0 - c
                } else {
                    2.0
                }
            })
            .collect();
        tried.push((w, median(misses.clone()), worst(&misses)));
    }
    let Some(&(wiring, miss, worst)) = tried.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Ok(None);
    };
    Ok(Some(WiringFit {
        wiring,
        miss,
        healthy_miss: base.median,
        precision: base.precision,
        tried: tried.iter().map(|&(w, m, _)| (w, m)).collect(),
        worst,
        healthy_worst: base.worst,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(prompt: usize, t: usize, turns: &[(usize, usize)]) -> Rows<'_> {
        Rows {
            prompt,
            t,
            window: 64,
            turns,
        }
    }

    #[test]
    fn each_wiring_moves_only_what_it_names() {
        let r = rows(3, 5, &[]);
        let (pos, mask) = inputs(Wiring::Shift(1), &r).unwrap();
        assert_eq!(pos, [0, 1, 2, 4, 5]);
        let causal = inputs(Wiring::Shift(0), &r).unwrap().1;
        assert_eq!(mask, causal);
        let (pos, mask) = inputs(Wiring::HideNewest, &r).unwrap();
        assert_eq!(pos, [0, 1, 2, 3, 4]);
        let hidden: Vec<(usize, usize)> = (0..25)
            .filter(|&k| causal[k] && !mask[k])
            .map(|k| (k / 5, k % 5))
            .collect();
        assert_eq!(hidden, [(3, 2), (4, 3)]);
        let own = inputs(Wiring::HideOwn, &r).unwrap().1;
        assert!(!own[3 * 5 + 3] && !own[4 * 5 + 4] && own[2 * 5 + 2]);
        // a shift below position 0, a restart without turns: no hypothesis
        assert!(inputs(Wiring::Shift(-2), &rows(1, 3, &[])).is_none());
        assert!(inputs(Wiring::TurnRestart, &r).is_none());
        // two rows of prompt, two generated, a turn of 3 appended at 4, one generated
        let turns = [(4, 3)];
        let (pos, mask) = inputs(Wiring::TurnRestart, &rows(2, 8, &turns)).unwrap();
        assert_eq!(pos, [0, 1, 2, 3, 0, 1, 2, 7]);
        assert_eq!(mask, inputs(Wiring::Shift(0), &rows(2, 8, &[])).unwrap().1);
    }

    #[test]
    fn a_fit_names_a_cause_only_within_precision_and_by_the_ratio() {
        let fit = |miss, healthy| WiringFit {
            wiring: Wiring::Shift(1),
            miss,
            healthy_miss: healthy,
            precision: 2e-4,
            tried: vec![],
            worst: miss,
            healthy_worst: healthy,
        };
        assert!(fit(1e-7, 3e-3).reproduces());
        assert!(!fit(1e-7, 2e-4).reproduces());
        assert!(!fit(1e-3, 3e-2).reproduces());
        // SmolLM2 on the CPU plugin at f32, `ov-position-shift`, "The capital of France is": the
        // shift matters at one step; every hypothesis' median sits at the floor, the healthy
        // one's worst row misses by 3.2e-3 and position +1 reproduces every row
        let lone = WiringFit {
            healthy_miss: 1.0e-4,
            worst: 1.2e-8,
            healthy_worst: 3.2e-3,
            ..fit(1.2e-8, 1.0e-4)
        };
        assert!(lone.reproduces());
        // the worst row reproduced by the ratio but not within the precision: no cause
        assert!(!WiringFit {
            worst: 5e-4,
            ..lone.clone()
        }
        .reproduces());
        // a result written before the worst rows were recorded decides by the median alone
        assert!(!WiringFit {
            worst: 0.0,
            healthy_worst: 0.0,
            ..lone
        }
        .reproduces());
    }
}
