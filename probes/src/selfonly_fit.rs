//! The self-only step's mask hypotheses (rule `self-only-mask`; issue 34's rule of evidence).
//!
//! A decode step whose mask allows only itself computes the token alone when the mask is applied
//! as 0 / −inf. A mask fault lets the blocked columns in, and what they get instead of −inf is the
//! hypothesis' parameter, from the fault grammars' mask-convention rows that a self-only step
//! can show:
//! - bias 0, the mask not applied: every blocked column enters with its own score
//!   (`win-mask-all-valid`: every held entry visible whatever the request asked; a graph that
//!   drops its mask input);
//! - bias +1, the 0 / +1 convention (`ane-mask-01`: blocked becomes +1, allowed 0).
//!
//! (`ov-mask-short` hides a column instead: the wiring fit's `output-mask`; and its device
//! hides its states, so the state experiments never run there.)
//!
//! The blocked columns hold what the device's state holds after the prompt's prefill (read from
//! the device: a mask fault also changes what the prefill wrote). Which of them enter is the
//! scope: the slots the prefill wrote, and — where the state has slots nobody wrote (a stateful
//! device's additive mask spans its whole state, `cache_len` slots) — every slot but the step's
//! own, the empty ones as the zeros they hold. Each hypothesis is replayed on the
//! precision-matched reference (the arithmetic the device declares: fp16, a QDQ graph's grids),
//! f32 where the device declares f32; the same query at the same position.

use std::collections::BTreeMap;

use candle_core::{Device as CDevice, Tensor};
use kvprobe_reference::{Blocked, GraphOptions, KeySet, KvState, LayerKv};
use kvprobe_schema::{MaskReplay, SelfOnlyFit};

use crate::metrics::cosine;
use crate::session::Session;
use crate::Result;

/// What the blocked columns get instead of −inf, from the grammars' mask-convention rows.
pub const BIASES: [f32; 2] = [0.0, 1.0];

/// The scopes for a state of `ctx` slots of which the prefill wrote `written`, the step at
/// `position`: the written slots, and every slot but the step's own where some are empty.
pub fn scopes(written: &[usize], ctx: usize, position: usize) -> Vec<Vec<usize>> {
    let held: Vec<usize> = written.iter().copied().filter(|&p| p != position).collect();
    let all: Vec<usize> = (0..ctx).filter(|&p| p != position).collect();
    if all.len() > held.len() {
        vec![held, all]
    } else {
        vec![held]
    }
}

/// The words of a hypothesis for the evidence line.
pub fn describe(h: &MaskReplay) -> String {
    if h.device_step {
        return "the mask not applied, every entry the device holds visible (its own full-context step from the same state)".into();
    }
    describe_bias(h.bias, h.empty)
}

fn describe_bias(bias: f64, empty: usize) -> String {
    let what = if bias == 0.0 {
        "the mask not applied (blocked columns get their score)".to_string()
    } else if bias == 1.0 {
        "the 0 / +1 convention (blocked columns get their score + 1)".to_string()
    } else {
        format!("blocked columns get their score {bias:+}")
    };
    if empty == 0 {
        format!("{what}, over the slots the prefill wrote")
    } else {
        format!("{what}, over the whole state ({empty} never-written slots, zero keys)")
    }
}

/// The grammar row a hypothesis is, where one is: what reproduces it on an emulator (the
/// replay of a named verdict runs it there, `diagnose::replay`, and gives its command).
pub fn grammar_row(bias: f64, empty: usize) -> &'static str {
    match (bias == 1.0, empty > 0) {
        (true, true) => {
            "the Core ML grammar's `ane-mask-01`: `--device ane-sim --fault ane-mask-01`"
        }
        (false, false) => {
            "the ONNX GenAI grammar's `win-mask-all-valid`: `--fault win-mask-all-valid`"
        }
        (false, true) => {
            "a graph that drops its mask input: no grammar row, no emulator reproduces it"
        }
        (true, false) => "no grammar row, no emulator reproduces it",
    }
}

/// Per layer, per slot of `slots`, the `[n_kv · hd]` K and V rows of the device's fp16 states
/// (`[kv_heads, ctx, hd]`, cache ids `2l` and `2l + 1`, statecheck's layout).
type Rows = Vec<Vec<Vec<f32>>>;

fn state_rows(
    states: &BTreeMap<u32, Vec<u8>>,
    (layers, kv, ctx, hd): (usize, usize, usize, usize),
    slots: &[usize],
) -> Result<(Rows, Rows)> {
    let mut out = (Vec::with_capacity(layers), Vec::with_capacity(layers));
    for l in 0..layers {
        for (which, id) in [(0, 2 * l as u32), (1, 2 * l as u32 + 1)] {
            let b = states
                .get(&id)
                .ok_or_else(|| crate::Error::Device(format!("the device exposes no state {id}")))?;
            let rows: Vec<Vec<f32>> = slots
                .iter()
                .map(|&p| {
                    (0..kv)
                        .flat_map(|h| {
                            let o = 2 * (h * ctx + p) * hd;
                            b[o..o + 2 * hd]
                                .chunks_exact(2)
                                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                        })
                        .collect()
                })
                .collect();
            if which == 0 {
                out.0.push(rows);
            } else {
                out.1.push(rows);
            }
        }
    }
    Ok(out)
}

/// The rows as an f32 reference state `[kv, W, hd]` per layer.
fn as_state((k, v): &(Rows, Rows), kv: usize, hd: usize) -> Result<KvState> {
    let t = |rows: &Vec<Vec<f32>>| -> Result<Tensor> {
        let w = rows.len();
        let mut flat = vec![0f32; kv * w * hd];
        for (j, row) in rows.iter().enumerate() {
            for h in 0..kv {
                flat[(h * w + j) * hd..(h * w + j + 1) * hd]
                    .copy_from_slice(&row[h * hd..(h + 1) * hd]);
            }
        }
        Ok(Tensor::from_vec(flat, (kv, w, hd), &CDevice::Cpu)?)
    };
    let layers = k
        .iter()
        .zip(v)
        .map(|(k, v)| Ok(LayerKv { k: t(k)?, v: t(v)? }))
        .collect::<Result<_>>()?;
    let w = k.first().map_or(0, Vec::len);
    Ok(KvState {
        layers,
        positions: (0..w).collect(),
        ids: vec![0; w],
    })
}

/// The self-only step of `query` at `position` over the device's rows at the declared
/// precision: the matched reference's store holds them as the state does (already rounded).
fn matched_over(
    model: &kvprobe_reference::Model,
    p: &crate::matched::Precision,
    (k, v): &(Rows, Rows),
    (query, position): (u32, usize),
    blocked: Blocked,
) -> Result<Vec<f32>> {
    let model = p.model(model);
    let mut store = crate::matched::Store::new(model);
    store.k = k.clone();
    store.v = v.clone();
    let seq = vec![query; k.first().map_or(0, Vec::len) + 1];
    crate::matched::run_self_only(model, p, &mut store, &seq, (blocked, position))
}

/// The device's self-only row (`device`, and its control's `control` where one runs) against
/// each hypothesis replayed over the device's `states` after the prompt's prefill (`written`:
/// the slots it wrote); `alone` is the healthy hypothesis, `matched` whether it was computed on
/// the precision-matched reference.
/// `full`: the device's full-context step of the same query from the same state (and its
/// control's): the mask not applied makes the self-only step that step, whatever the held
/// entries are (a windowed host's pads, which the state view hides, included).
pub fn fit(
    s: &Session,
    (states, written): (&BTreeMap<u32, Vec<u8>>, &[usize]),
    (query, position): (u32, usize),
    (device, control): (&[f32], Option<&[f32]>),
    full: (&[f32], Option<&[f32]>),
    (alone, _matched): (&[f32], bool),
) -> Result<SelfOnlyFit> {
    let d = s.describe();
    let (kv, hd, ctx) = (d.shape.n_kv_heads, d.shape.head_dim, d.cache_len);
    let geometry = (d.shape.n_layers, kv, ctx, hd);
    // the reference the device declares (fp16 arithmetic, a QDQ graph's grids); the replays run
    // on it only where it computes every op (`matched`), as the healthy hypothesis does
    let declared_ref = crate::matched::Precision::of(d, s.model)?;
    let precision = declared_ref.as_ref();
    let mut hypotheses = vec![MaskReplay {
        bias: 0.0,
        empty: 0,
        miss: 1.0 - cosine(device, full.0),
        control_miss: control.zip(full.1).map(|(c, f)| 1.0 - cosine(c, f)),
        device_step: true,
    }];
    let held = written.len();
    for slots in scopes(written, ctx, position) {
        let rows = state_rows(states, geometry, &slots)?;
        let empty = slots.len().saturating_sub(held);
        let f32_state = match precision {
            Some(_) => None,
            None => Some(as_state(&rows, kv, hd)?),
        };
        for bias in BIASES {
            let blocked = Blocked { bias, empty: 0 };
            let row = match (precision, &f32_state) {
                (Some(p), _) => matched_over(s.model, p, &rows, (query, position), blocked)?,
                (None, Some(st)) => {
                    let graph = GraphOptions {
                        blocked: Some(blocked),
                        ..GraphOptions::default()
                    };
                    s.model.step_in(st, query, position, &KeySet::None, graph)?
                }
                (None, None) => continue,
            };
            hypotheses.push(MaskReplay {
                bias: bias as f64,
                empty,
                miss: 1.0 - cosine(device, &row),
                control_miss: control.map(|c| 1.0 - cosine(c, &row)),
                device_step: false,
            });
        }
    }
    // the declared precision's cost on this row: the token alone at the declared precision
    // against f32 (an fp16 device's self-only row carries SmolLM2's first-token activations)
    let declared = match &declared_ref {
        Some(p) => {
            let f32_alone =
                s.model
                    .step(&s.model.empty_state()?, query, position, &KeySet::None)?;
            let none = (Vec::new(), Vec::new());
            let layers = d.shape.n_layers;
            let empty = (vec![none.0; layers], vec![none.1; layers]);
            let at = matched_over(
                s.model,
                p,
                &empty,
                (query, position),
                Blocked {
                    bias: 0.0,
                    empty: 0,
                },
            )?;
            (1.0 - cosine(&at, &f32_alone)).max(0.0)
        }
        None => 0.0,
    };
    Ok(SelfOnlyFit {
        hypotheses,
        healthy_miss: 1.0 - cosine(device, alone),
        declared,
        ids: s.ids.iter().copied().chain([query]).collect(),
        model: s.model.source().display().to_string(),
    })
}

/// The `kvprobe ref logits` command that computes a hypothesis' row on the f32 reference, over
/// the prompt's K/V as the reference writes them (the fit replays it over the device's).
pub fn command(fit: &SelfOnlyFit, h: &MaskReplay) -> String {
    let ids: Vec<String> = fit.ids.iter().map(u32::to_string).collect();
    format!(
        "kvprobe ref logits --model {} --ids {} --self-only-bias {} --empty-slots {} --out self-only.npy",
        fit.model,
        ids.join(","),
        h.bias,
        h.empty
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_slots_and_the_whole_state_where_some_are_empty() {
        // a host cache whose prompt fills every slot but the step's own: one scope
        assert_eq!(scopes(&[0, 1, 2], 4, 3), vec![vec![0, 1, 2]]);
        // a stateful device's state of 6 slots, 3 written, the step at 3
        assert_eq!(
            scopes(&[0, 1, 2], 6, 3),
            vec![vec![0, 1, 2], vec![0, 1, 2, 4, 5]]
        );
    }
}
