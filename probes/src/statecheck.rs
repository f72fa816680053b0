//! State checks of a stateful device (issue 9, `RuntimeKind::Stateful`): what its K/V states
//! hold after a prefill, where inf/NaN first appears, which state layout its attention reads,
//! and whether its mask input is honoured. All through the [`kvprobe_npu::Device`] contract:
//! `cache_buffers` / `write_cache_buffer` expose the states as `[kv_heads, max_ctx, head_dim]`
//! little-endian fp16, cache ids `2l` (K) and `2l + 1` (V).

use kvprobe_npu::MaskMode;
use kvprobe_reference::{KeySet, LayerKv};
use kvprobe_schema::{OverflowFinding, StateFinding};

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
    let bufs = s.dev.cache_buffers()?;
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
    })
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
            Err(Error::Npu(e @ kvprobe_npu::Error::ContextFull { .. }))
            | Err(Error::Npu(e @ kvprobe_npu::Error::ContextTooLong { .. })) => {
                return Ok(BackToBack {
                    identical: false,
                    cosine: f64::NAN,
                    refused: Some(e.to_string()),
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
    let bufs = s.dev.cache_buffers()?;
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
            s.dev.write_cache_buffer(id, &bytes)?;
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
    let outs = s
        .driver
        .trial_steps(s.dev, first.query, &[MaskMode::Ring, MaskMode::SelfOnly])?;
    let alone = s.model.step(
        &s.model.empty_state()?,
        first.query,
        first.position,
        &KeySet::None,
    )?;
    f.full_cosine = Some(cosine(&outs[0].logits, &first.reference));
    f.selfonly_cosine = Some(cosine(&outs[1].logits, &alone));
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
