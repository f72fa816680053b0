//! State checks of a stateful device (issue 9, `RuntimeKind::Stateful`): what its K/V states
//! hold after a prefill, where inf/NaN first appears, which state layout its attention reads,
//! and whether its mask input is honoured. All through the [`kvprobe_npu::Device`] contract:
//! `cache_buffers` / `write_cache_buffer` expose the states as `[kv_heads, max_ctx, head_dim]`
//! little-endian fp16, cache ids `2l` (K) and `2l + 1` (V).

use std::collections::BTreeMap;

use kvprobe_npu::MaskMode;
use kvprobe_reference::{KeySet, LayerKv};
use kvprobe_schema::{OverflowFinding, StateFinding};

use crate::cache_io;
use crate::metrics::cosine;
use crate::session::{append, window_step, Session};
use crate::{Error, Result};

fn f16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

struct Shape {
    layers: usize,
    kv: usize,
    hd: usize,
    ctx: usize,
}

fn shape(s: &Session) -> Shape {
    let d = s.describe();
    Shape {
        layers: d.shape.n_layers,
        kv: d.shape.n_kv_heads,
        hd: d.shape.head_dim,
        ctx: d.cache_len,
    }
}

/// Scan the states right after a fresh prefill of the prompt (whose logits are `logits`) for
/// the first non-finite value: a layer whose output at position p is inf/NaN shows up as
/// non-finite K/V of the next layer at p.
pub fn overflow(s: &mut Session, logits: &[f32]) -> Result<OverflowFinding> {
    let logits_finite = logits.iter().all(|x| x.is_finite());
    let sh = shape(s);
    let bufs = cache_io::read(s.dev, "after the prompt's prefill (state overflow scan)")?;
    let mut first: Option<(usize, usize)> = None; // (state layer, position)
    'layers: for l in 0..sh.layers {
        let mut best: Option<usize> = None;
        for id in [2 * l as u32, 2 * l as u32 + 1] {
            let b = bufs
                .get(&id)
                .ok_or_else(|| Error::Device(format!("the device exposes no state {id}")))?;
            let v = f16s(b);
            for h in 0..sh.kv {
                for p in 0..sh.ctx {
                    let o = (h * sh.ctx + p) * sh.hd;
                    if v[o..o + sh.hd].iter().any(|x| !x.is_finite()) {
                        best = Some(best.map_or(p, |b| b.min(p)));
                        break;
                    }
                }
            }
        }
        if let Some(p) = best {
            first = Some((l, p));
            break 'layers;
        }
    }
    let (layer, position) = match first {
        // layer 0's K/V come from the embeddings alone: a non-finite value there is the input
        Some((0, p)) => (Some(0), Some(p)),
        Some((l, p)) => (Some(l - 1), Some(p)),
        None if !logits_finite => (Some(sh.layers - 1), None),
        None => (None, None),
    };
    Ok(OverflowFinding {
        prompt_len: s.ids.len(),
        layer,
        position,
        logits_finite,
        longest_finite_prefix: None,
        zero_rows: zero_rows(&bufs, &sh, s.ids.len())?,
        logits_zero: !logits.is_empty() && logits.iter().all(|&x| x == 0.0),
    })
}

/// The evidence line of an overflow finding: where the first inf/NaN (or zeroed row) sits, and
/// what that points at — a position past the prompt is a row the host never sent (the mask of
/// a padded row), one inside it a layer.
pub fn overflow_evidence(ov: &OverflowFinding) -> String {
    let n = ov.prompt_len;
    match (ov.layer, ov.position, ov.zero_rows) {
        // a row past the prompt is one the host never sent: a pad row whose mask allows nothing
        (Some(l), Some(pos), _) if pos >= n => format!(
            "overflow: the {n}-token prefill produces inf/NaN at position {pos}, past the {n} positions the host sent (the first non-finite K/V is layer {} there): the mask — a padded row whose mask allows nothing gets 0/0 in its softmax when the mask's large negative is −inf in fp16 (the fp32 minimum), and every row reads its NaN K/V",
            l + 1
        ),
        (Some(l), Some(pos), _) => format!("overflow: the {n}-token prefill produces inf/NaN inside layer {l} at position {pos} (the first non-finite K/V is layer {} at position {pos})", l + 1),
        (Some(l), None, _) => format!("overflow: the {n}-token prefill produces inf/NaN in layer {l} or the head (every state finite, logits not)"),
        (None, _, Some([l, pos])) => format!(
            "overflow: layer {l}'s K and V at position {pos} are exactly zero where layer 0 wrote it: the input norm of layer {l} returned zeros (its sum of squares passed fp16's 65504, rsqrt(inf) = 0: an RMSNorm without its fp32 cast)"
        ),
        (None, _, None) if ov.logits_zero => format!("overflow: every logit of the {n}-token prefill is exactly zero: the final norm returned zeros (its sum of squares overflowed fp16)"),
        _ => format!("overflow: the {n}-token prefill produces inf/NaN in the graph"),
    }
}

/// Whether the K and V rows of state layer `l` at `p` are exactly zero in every KV head.
fn row_zero(bufs: &BTreeMap<u32, Vec<u8>>, sh: &Shape, l: usize, p: usize) -> Result<bool> {
    for id in [2 * l as u32, 2 * l as u32 + 1] {
        let b = bufs
            .get(&id)
            .ok_or_else(|| Error::Device(format!("the device exposes no state {id}")))?;
        for h in 0..sh.kv {
            let o = 2 * (h * sh.ctx + p) * sh.hd;
            if b[o..o + 2 * sh.hd].chunks_exact(2).any(|c| {
                let x = half::f16::from_le_bytes([c[0], c[1]]);
                x.to_f32() != 0.0
            }) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The first layer `l ≥ 1` and prompt position whose K and V are exactly zero while layer 0
/// holds that position: a written row that a later layer zeroed (its input norm collapsed). A
/// slot nobody wrote is zero in layer 0 too and is the occupancy check's business.
fn zero_rows(bufs: &BTreeMap<u32, Vec<u8>>, sh: &Shape, n: usize) -> Result<Option<[usize; 2]>> {
    let n = n.min(sh.ctx);
    let held: Vec<bool> = (0..n)
        .map(|p| row_zero(bufs, sh, 0, p).map(|z| !z))
        .collect::<Result<_>>()?;
    for l in 1..sh.layers {
        for p in (0..n).filter(|&p| held[p]) {
            if row_zero(bufs, sh, l, p)? {
                return Ok(Some([l, p]));
            }
        }
    }
    Ok(None)
}

/// Two requests for the prompt after a reset, each following a different first request
/// (the prompt reversed, then its first token alone). A device that starts every request from
/// fresh states gives bit-identical logits; `Err` text when the device refused a run (a stale
/// state running out of context is the typical one).
pub struct BackToBack {
    pub identical: bool,
    pub cosine: f64,
    pub refused: Option<String>,
    /// Logits of the last run: the prompt after a reset (the device is left right after it).
    pub last: Vec<f32>,
}

pub fn back_to_back(s: &mut Session) -> Result<BackToBack> {
    let ids = s.ids.clone();
    let rev: Vec<u32> = ids.iter().rev().copied().collect();
    let mut outs = Vec::with_capacity(2);
    for first in [&rev[..], &ids[..1]] {
        let r = s.prefill(first).and_then(|_| s.prefill(&ids));
        match r {
            Ok(o) => outs.push(o.logits),
            Err(Error::Npu(e)) if e.is_capacity_refusal() => {
                return Ok(BackToBack {
                    identical: false,
                    cosine: f64::NAN,
                    refused: Some(e.what_device_did()),
                    last: Vec::new(),
                })
            }
            Err(e) => return Err(e),
        }
    }
    Ok(BackToBack {
        // bitwise, so that two equally non-finite runs (an overflow) count as identical
        identical: outs[0]
            .iter()
            .map(|x| x.to_bits())
            .eq(outs[1].iter().map(|x| x.to_bits())),
        cosine: cosine(&outs[0], &outs[1]),
        refused: None,
        last: outs.pop().unwrap_or_default(),
    })
}

/// Positions the last prefill wrote (layer-0 K non-zero in every KV head), on fresh states.
pub fn written_positions(s: &mut Session) -> Result<Vec<usize>> {
    let sh = shape(s);
    let bufs = cache_io::read(s.dev, "after a fresh prefill (state positions)")?;
    let k0 = bufs
        .get(&0)
        .ok_or_else(|| Error::Device("the device exposes no state 0".into()))?;
    let v = f16s(k0);
    Ok((0..sh.ctx)
        .filter(|&p| {
            (0..sh.kv).all(|h| {
                let o = (h * sh.ctx + p) * sh.hd;
                v[o..o + sh.hd].iter().any(|&x| x != 0.0)
            })
        })
        .collect())
}

/// The reference K/V of the prompt written into the states in one of two orders.
fn write_reference(s: &mut Session, layers: &[LayerKv], swapped: bool) -> Result<()> {
    let sh = shape(s);
    for (l, kv) in layers.iter().enumerate() {
        let n = kv.k.dim(1)?;
        for (id, t) in [(2 * l as u32, &kv.k), (2 * l as u32 + 1, &kv.v)] {
            let r: Vec<f32> = t.flatten_all()?.to_vec1()?; // [kv, n, hd]
            let mut st = vec![half::f16::ZERO; sh.kv * sh.ctx * sh.hd];
            for h in 0..sh.kv {
                for p in 0..n {
                    let src = (h * n + p) * sh.hd;
                    let dst = if swapped {
                        (p * sh.kv + h) * sh.hd
                    } else {
                        (h * sh.ctx + p) * sh.hd
                    };
                    for c in 0..sh.hd {
                        st[dst + c] = half::f16::from_f32(r[src + c]);
                    }
                }
            }
            let bytes: Vec<u8> = st.iter().flat_map(|x| x.to_le_bytes()).collect();
            cache_io::write(s.dev, id, &bytes, "of the reference K/V (state check)")?;
        }
    }
    Ok(())
}

/// The finding from the occupancy (`written_positions` after a fresh prefill of the prompt),
/// plus the layout and mask experiments when `experiments` (the generation failed).
pub fn run(s: &mut Session, written: Vec<usize>, experiments: bool) -> Result<StateFinding> {
    let mut f = StateFinding {
        prompt_len: s.ids.len(),
        written,
        layout_cosines: None,
        selfonly_cosine: None,
        full_cosine: None,
        position_cosines: None,
        selfonly_control: None,
        selfonly_fit: None,
    };
    if !experiments {
        return Ok(f);
    }
    let first = s.first_step()?;
    let prompt = s.prompt_ref()?;
    // the prompt's K/V plus the query's own (its slot is read by the step, and under a
    // swapped read the slot the device writes is not the one it reads)
    let n = s.ids.len();
    let (_, own) = window_step(s.model, &prompt.state, first.query, n, n)?;
    let mut with_own = prompt.state.clone();
    append(&mut with_own, &own, first.query, n)?;
    let mut cos = [0f64; 2];
    for (i, swapped) in [false, true].into_iter().enumerate() {
        s.prefill_prompt()?;
        write_reference(s, &with_own.layers, swapped)?;
        let out = s.driver.trial_step(s.dev, first.query, &MaskMode::Ring)?;
        cos[i] = cosine(&out.logits, &first.reference);
    }
    f.layout_cosines = Some(cos);
    s.prefill_prompt()?;
    // what the self-only step's blocked columns hold: the state the device's prefill wrote
    let states = cache_io::read(s.dev, "after the prompt's prefill (self-only mask replay)")?;
    // a device that reads the mask as a length cannot run the self-only step: no cosine, so
    // no rule reads one it did not measure
    let length_mask = s.dev.mask_by_length().is_some();
    let modes = [MaskMode::Ring, MaskMode::SelfOnly];
    let outs = s.driver.trial_steps(
        s.dev,
        first.query,
        &modes[..if length_mask { 1 } else { 2 }],
    )?;
    f.full_cosine = Some(cosine(&outs[0].logits, &first.reference));
    if let Some(own) = outs.get(1) {
        // at the declared precision where the matched reference computes every op: against
        // f32 a healthy QDQ self-only step sits at 0.94, below what this check calls wrong
        let row = [(first.query, first.position)];
        let (alone, matched) = match crate::matched_jitter::self_only(s.model, s.describe(), &row)?
        {
            Some(mut m) if !m.is_empty() => (m.swap_remove(0), true),
            _ => (
                s.model.step(
                    &s.model.empty_state()?,
                    first.query,
                    first.position,
                    &KeySet::None,
                )?,
                false,
            ),
        };
        f.selfonly_cosine = Some(cosine(&own.logits, &alone));
        // the same feed on the device's control, where one runs: the graph's own mask
        let control = s.dev.control_logits(&own.logits);
        f.selfonly_control = control
            .as_ref()
            .map(|c| [cosine(c, &alone), cosine(&own.logits, c)]);
        // the mask hypotheses replayed on the same reference for the same feed
        f.selfonly_fit = Some(crate::selfonly_fit::fit(
            s,
            (&states, &f.written),
            (first.query, first.position),
            (&own.logits, control.as_deref()),
            (
                &outs[0].logits,
                s.dev.control_logits(&outs[0].logits).as_deref(),
            ),
            (&alone, matched),
        )?);
    }
    // the full-context step against the reference with its query moved by δ (the prompt's keys
    // where they are): a runner that feeds a wrong position id is reproduced by its δ
    let mut shifts = Vec::new();
    for delta in -4i64..=4 {
        let pos = first.position as i64 + delta;
        if pos < 0 {
            continue;
        }
        let r = s
            .model
            .step(&prompt.state, first.query, pos as usize, &KeySet::All)?;
        shifts.push([delta as f64, cosine(&outs[0].logits, &r)]);
    }
    f.position_cosines = Some(shifts);
    Ok(f)
}
