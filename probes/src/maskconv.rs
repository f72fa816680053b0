//! `maskconv`: the first tbt step under alternative mask conventions built from the contract
//! (§2.5 ring right-aligned; prior art §2.4 left-valid; the ring shifted by ±1; a per-head
//! variant). Whichever reproduces the reference tells how the graph reads its mask.
//!
//! The per-head variant gives head 0 the ring row and every other head the self-only row, and is
//! compared with a reference computed with exactly those per-head masks. A graph that uses one
//! head's row for all heads (F4, mask repeated instead of tiled) returns the same logits as the
//! plain ring mask: `other_heads_ignored_cosine` ≈ 1.
//!
//! The same per-head control runs on one prefill chunk (the prompt's first `P` tokens, head 0
//! causal, heads ≥ 1 self-only): a prefill graph that repeats one head's row ignores the change
//! (`prefill_other_heads_ignored_cosine` ≈ 1) while the reference moves
//! (`prefill_per_head_reference_cosine`), which tells F4 confined to the prefill graph from any
//! other prefill graph fault.

use kvprobe_npu::mask::{left_valid_row, ring_rows};
use kvprobe_npu::MaskMode;
use kvprobe_reference::{GraphInput, GraphOptions, PositionInput};
use kvprobe_schema::{MaskVariant, MaskconvFinding};

use crate::metrics::{compare, cosine};
use crate::session::Session;
use crate::thresholds::{REPAIR_MARGIN, REPRODUCES_COSINE};
use crate::Result;

/// The ring row with every cached column moved by `delta` (self stays in the last column).
pub fn shifted_ring_row(keys: usize, usage: usize, delta: i64) -> Vec<bool> {
    let ring = ring_rows(1, keys, usage);
    let mut row = vec![false; keys];
    for (c, &a) in ring[..keys - 1].iter().enumerate() {
        let d = c as i64 + delta;
        if a && d >= 0 && (d as usize) < keys - 1 {
            row[d as usize] = true;
        }
    }
    row[keys - 1] = true;
    row
}

pub fn run(s: &mut Session) -> Result<MaskconvFinding> {
    s.require_tbt("maskconv")?;
    let g = s.geometry();
    let l = g.cache_len;
    let usage = g.prompt_len + 1;
    let nh = s.model.config().n_heads;
    s.progress.phase("maskconv", 9);
    // before `first_step`, which prefills the prompt again after this trial
    let prefill_control = prefill_per_head(s)?;
    s.progress.inc(2);
    let first = s.first_step()?;
    s.progress.inc(1);
    let q = first.query;
    let ring = ring_rows(1, l, usage);
    let mut self_only = vec![false; l];
    self_only[l - 1] = true;
    let plain: Vec<(&str, Vec<bool>)> = vec![
        ("ring", ring.clone()),
        ("left-valid", left_valid_row(l, usage)),
        ("shift-1", shifted_ring_row(l, usage, -1)),
        ("shift+1", shifted_ring_row(l, usage, 1)),
    ];
    // per-head: head 0 ring, others self-only
    let mut maps = vec![self_only.clone(); nh];
    maps[0] = ring.clone();
    let mut modes: Vec<MaskMode> = plain
        .iter()
        .map(|(_, row)| MaskMode::Custom(vec![row.clone()]))
        .collect();
    modes.push(MaskMode::Custom(maps));
    // every convention in one batched run (independent trials from the same state)
    let mut outs: Vec<Vec<f32>> = s
        .driver
        .trial_steps(s.dev, q, &modes)?
        .into_iter()
        .map(|o| o.logits)
        .collect();
    s.progress.inc(modes.len() as u64);
    if outs.len() != modes.len() {
        return Err(crate::Error::Device(format!(
            "the batched trial run returned {} outputs for {} masks",
            outs.len(),
            modes.len()
        )));
    }
    let per_head_dev = outs.pop().unwrap_or_default();
    let ring_logits = outs[0].clone();
    let mut variants: Vec<MaskVariant> = plain
        .iter()
        .zip(&outs)
        .map(|((name, _), out)| MaskVariant {
            name: name.to_string(),
            comparison: compare(out, &first.reference),
            reproduces: false,
        })
        .collect();
    let per_head_ref = per_head_reference(s, q)?;
    s.progress.inc(1);
    variants.push(MaskVariant {
        name: "per-head".into(),
        comparison: compare(&per_head_dev, &per_head_ref),
        reproduces: false,
    });
    let other_heads_ignored_cosine = (nh > 1).then(|| cosine(&per_head_dev, &ring_logits));
    let ring_cos = variants[0].comparison.cosine;
    for v in &mut variants {
        v.reproduces = v.comparison.cosine >= REPRODUCES_COSINE
            && (v.name == "ring"
                || v.name == "per-head"
                || v.comparison.cosine >= ring_cos + REPAIR_MARGIN);
    }
    let best = variants
        .iter()
        .filter(|v| v.name != "per-head")
        .max_by(|a, b| a.comparison.cosine.total_cmp(&b.comparison.cosine))
        .map(|v| v.name.clone());
    Ok(MaskconvFinding {
        variants,
        other_heads_ignored_cosine,
        best,
        prefill_other_heads_ignored_cosine: prefill_control.map(|c| c.0),
        prefill_per_head_reference_cosine: prefill_control.map(|c| c.1),
    })
}

/// The per-head control on one prefill chunk: `(device per-head vs device plain, reference
/// per-head vs reference plain)` cosines of the chunk's last row. None where it cannot tell
/// anything: a stateful device (no `[T][NH][KV]` mask input), one head, or a 1-token prefix
/// (self-only is then the causal row).
fn prefill_per_head(s: &mut Session) -> Result<Option<(f64, f64)>> {
    let nh = s.model.config().n_heads;
    let g = s.geometry();
    let n = s.ids.len().min(g.prefill_len);
    if !s.driver.capabilities().ring_offset || nh < 2 || n < 2 {
        return Ok(None);
    }
    let prefix: Vec<u32> = s.ids[..n].to_vec();
    let (p, l) = (g.prefill_len, g.cache_len);
    let causal = ring_rows(p, l, n);
    let mut own = causal.clone();
    // real row i of the chunk (after p − n pad rows) keeps only its own column
    for i in 0..n {
        let row = &mut own[(p - n + i) * l..(p - n + i + 1) * l];
        row.fill(false);
        row[l - n + i] = true;
    }
    let mut per_head = vec![own; nh];
    per_head[0] = causal;
    let plain = s.prefill(&prefix)?.logits;
    let dev = &mut *s.dev;
    let varied = s
        .driver
        .prefill_chunk_masked(dev, &prefix, &per_head)?
        .logits;
    let mut mask = vec![false; n * nh * n];
    for i in 0..n {
        for h in 0..nh {
            let at = (i * nh + h) * n;
            if h == 0 {
                mask[at..at + i + 1].fill(true);
            } else {
                mask[at + i] = true;
            }
        }
    }
    let ref_varied = s
        .model
        .run_graph(&GraphInput {
            hidden: s.model.embed(&prefix)?,
            positions: PositionInput::Ids((0..n).map(|i| i as f32).collect()),
            past: Vec::new(),
            mask,
            graph: GraphOptions::default(),
            last_only: true,
        })?
        .logits;
    // the plain causal row is the prompt's own (row n − 1 of its causal forward: the prefix is
    // the prompt's first n tokens), computed once per session
    let ref_plain = s.prompt_ref()?.row(n - 1).to_vec();
    Ok(Some((
        cosine(&varied, &plain),
        cosine(&ref_varied, &ref_plain),
    )))
}

/// Reference of the first tbt step where head 0 sees every prompt key and the other heads only
/// the token itself.
fn per_head_reference(s: &mut Session, q: u32) -> Result<Vec<f32>> {
    let prompt = s.prompt_ref()?;
    let n = s.ids.len();
    let nh = s.model.config().n_heads;
    let mut mask = vec![false; nh * (n + 1)];
    for h in 0..nh {
        let row = &mut mask[h * (n + 1)..(h + 1) * (n + 1)];
        row[n] = true;
        if h == 0 {
            row[..n].fill(true);
        }
    }
    let out = s.model.run_graph(&GraphInput {
        hidden: s.model.embed(&[q])?,
        positions: PositionInput::Ids(vec![n as f32]),
        past: prompt.state.layers.clone(),
        mask,
        graph: GraphOptions::default(),
        last_only: true,
    })?;
    Ok(out.logits)
}

/// `kvprobe maskconv`.
pub struct MaskconvProbe;

impl crate::probe::Probe for MaskconvProbe {
    fn name(&self) -> &'static str {
        "maskconv"
    }

    fn about(&self) -> &'static str {
        "The first tbt step under alternative mask conventions"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.maskconv = Some(run(s)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(r: &[bool]) -> String {
        r.iter().map(|&a| if a { '#' } else { '.' }).collect()
    }

    #[test]
    fn shifted_rows_prior_art_geometry() {
        // L = 24, first tbt step after 16 tokens: ring ".......#################"
        assert_eq!(
            show(&shifted_ring_row(24, 17, 0)),
            ".......#################"
        );
        assert_eq!(
            show(&shifted_ring_row(24, 17, -1)),
            "......################.#"
        );
        assert_eq!(
            show(&shifted_ring_row(24, 17, 1)),
            "........################"
        );
    }
}
