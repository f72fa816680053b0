//! `splits`: the split-point matrix (issue 10). The same prompt reaches its last position along
//! different paths through the cache, and each path's logits are compared with the reference:
//!
//! - **prefill-continue at k**: prefill `ids[..k]`, then `ids[k..]` as a second prefill without
//!   a reset, so chunk boundaries fall at k (the genai driver itself always runs remainder-first
//!   chunks of P, contract §2.3; this is how other chunkings are realised);
//! - **decode from k**: prefill `ids[..k]`, then feed `ids[k..]` one tbt step at a time. Split 0
//!   is pure decode: tbt reads only entries tbt wrote.
//!
//! A healthy device gives the same cosine everywhere. A chunking bug drops the prefill-continue
//! column at the boundaries it cannot handle; a tbt reader that disagrees with the prefill writer
//! fails every split ≥ 1 while pure decode stays clean; a graph fault fails pure decode too.

use kvprobe_npu::MaskMode;
use kvprobe_schema::{SplitRow, SplitsFinding};

use crate::metrics::compare;
use crate::session::Session;
use crate::thresholds::{STAGE_MEAN_COSINE, STAGE_MIN_COSINE};
use crate::Result;

#[derive(Debug, Clone, Copy)]
pub struct SplitsOptions {
    /// Split points at most (0 and n − 1 always among them, the rest evenly spread).
    pub max_splits: usize,
    /// Decode steps per split row k ≥ 1 at most (`diagnose` bounds its cost; the `splits`
    /// command decodes to the end of the prompt); the row's `decode_final` is then its last
    /// decoded step. Every such step already reads all the prefill-written entries. Pure decode
    /// (split 0) always runs to the end: attention over more tbt-written keys shows graph faults
    /// (e.g. an attention scale) that the first few steps hide.
    pub max_decode_steps: usize,
}

impl Default for SplitsOptions {
    fn default() -> Self {
        SplitsOptions {
            max_splits: 64,
            max_decode_steps: usize::MAX,
        }
    }
}

/// Split points `0..n` (`max` evenly spread, always 0 and n − 1, plus up to `max` more at
/// `n mod p + k·p`, the server's own chunk boundaries).
pub fn split_points(n: usize, p: usize, max: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let max = max.max(2);
    if n <= max {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = crate::causality::pick_positions(n, max);
    let boundaries = std::iter::once(n % p).chain((1..).map(|k| n % p + k * p));
    for b in boundaries.take_while(|&b| b < n) {
        if v.len() >= 2 * max {
            break;
        }
        if b > 0 && !v.contains(&b) {
            v.push(b);
        }
    }
    v.sort_unstable();
    v
}

pub fn run(s: &mut Session, opts: &SplitsOptions) -> Result<SplitsFinding> {
    s.require_tbt("splits")?;
    let g = s.geometry();
    let n = g.prompt_len;
    let points = split_points(n, g.prefill_len, opts.max_splits);
    s.progress.phase("splits", points.len() as u64 + 1);
    let prompt = s.prompt_ref()?;
    let ids = s.ids.clone();
    let reference_last = prompt.row(n - 1);
    let whole = s.prefill(&ids)?;
    let whole_prefill = compare(&whole.logits, reference_last);
    s.progress.inc(1);
    let mut rows = Vec::with_capacity(points.len());
    for &k in &points {
        let prefill_continue = if k > 0 {
            s.prefill(&ids[..k])?;
            let out = s.driver.prefill(s.dev, &ids[k..])?;
            Some(compare(&out.logits, reference_last))
        } else {
            None
        };
        if k > 0 {
            s.prefill(&ids[..k])?;
        } else {
            s.driver.reset(s.dev)?;
        }
        let mut decode_cosines = Vec::with_capacity(n - k);
        let mut last = None;
        let budget = if k == 0 { n } else { opts.max_decode_steps };
        for (i, &t) in ids.iter().enumerate().skip(k).take(budget) {
            let out = s.driver.step(s.dev, t, &MaskMode::Ring)?;
            let c = compare(&out.logits, prompt.row(i));
            decode_cosines.push(c.cosine);
            last = Some(c);
        }
        let decode_final = match last {
            Some(c) => c,
            // k = n is never a split point (split_points stops at n − 1)
            None => whole_prefill.clone(),
        };
        rows.push(SplitRow {
            split: k,
            prefill_continue,
            decode_cosines,
            decode_final,
        });
        s.progress.inc(1);
    }
    let min = |it: &mut dyn Iterator<Item = f64>| it.fold(1.0f64, f64::min);
    let pure_decode_min = min(&mut rows
        .iter()
        .filter(|r| r.split == 0)
        .flat_map(|r| r.decode_cosines.iter().copied()));
    let mixed_decode_min = min(&mut rows
        .iter()
        .filter(|r| r.split > 0)
        .flat_map(|r| r.decode_cosines.iter().copied()));
    let prefill_continue_min = min(&mut rows
        .iter()
        .filter_map(|r| r.prefill_continue.as_ref().map(|c| c.cosine)));
    let failing_splits = rows
        .iter()
        .filter(|r| {
            let pc = r
                .prefill_continue
                .as_ref()
                .is_some_and(|c| c.cosine < STAGE_MEAN_COSINE);
            let dec = r.decode_final.cosine < STAGE_MEAN_COSINE
                || r.decode_cosines.iter().any(|&c| c < STAGE_MIN_COSINE);
            pc || dec
        })
        .map(|r| r.split)
        .collect();
    Ok(SplitsFinding {
        prompt_len: n,
        prefill_len: g.prefill_len,
        rows,
        whole_prefill,
        pure_decode_min,
        mixed_decode_min,
        prefill_continue_min,
        failing_splits,
    })
}

/// `kvprobe splits`.
pub struct SplitsProbe;

impl crate::probe::Probe for SplitsProbe {
    fn name(&self) -> &'static str {
        "splits"
    }

    fn about(&self) -> &'static str {
        "The prompt prefilled and decoded with a split at every position, against the reference"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.splits = Some(run(s, &SplitsOptions::default())?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_split_when_short() {
        assert_eq!(split_points(5, 4, 8), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn spread_keeps_ends_and_chunk_boundaries() {
        // n = 13, P = 4: server boundaries at 1, 5, 9 (remainder first)
        let v = split_points(13, 4, 4);
        assert_eq!(v.first(), Some(&0));
        assert_eq!(v.last(), Some(&12));
        for b in [1, 5, 9] {
            assert!(v.contains(&b), "{v:?}");
        }
    }
}
