//! `prefill`: device prefill logits against the reference, per prompt prefix.
//!
//! A genai prefill group emits one position (contract §2.8), so the per-position table comes from
//! a sweep of prefixes, each after a reset. The first prefix is run again at the end: a different
//! result means state leaked across the reset. Prefixes longer than `P` need more than one chunk
//! and so read the cache inside prefill; the diagnosis keeps them apart from single-chunk rows
//! (`Geometry::chunks`), so that a cache fault is not called a prefill-graph fault.

use kvprobe_schema::{PrefillFinding, PrefillRow};

use crate::matched;
use crate::metrics::{compare, cosine, summarise};
use crate::session::Session;
use crate::thresholds::IDENTICAL_COSINE;
use crate::Result;

#[derive(Debug, Clone, Copy)]
pub struct PrefillOptions {
    /// At most this many prefixes (evenly spread; the first, the last and both sides of the first
    /// chunk boundary always included). 0 = every prefix.
    pub max_rows: usize,
}

impl Default for PrefillOptions {
    fn default() -> Self {
        PrefillOptions { max_rows: 10 }
    }
}

/// Prefix lengths to run.
pub fn prefix_lengths(n: usize, p: usize, max_rows: usize) -> Vec<usize> {
    if max_rows == 0 || n <= max_rows {
        return (1..=n).collect();
    }
    let mut ks: Vec<usize> = (0..max_rows)
        .map(|i| 1 + i * (n - 1) / (max_rows - 1).max(1))
        .collect();
    ks.push(n);
    if n > p {
        ks.push(p);
        ks.push(p + 1);
    }
    ks.sort_unstable();
    ks.dedup();
    ks
}

pub fn run(s: &mut Session, opts: &PrefillOptions) -> Result<PrefillFinding> {
    let g = s.geometry();
    let ks = prefix_lengths(g.prompt_len, g.prefill_len, opts.max_rows);
    let runs: usize = ks.iter().map(|&k| g.chunks(k)).sum::<usize>() + g.chunks(ks[0]);
    s.progress.phase("prefill sweep", runs as u64);
    let reference = s.prompt_ref()?;
    let ids = s.ids.clone();
    // single-chunk prefixes: one precision-matched forward gives every row (causal)
    let single = g.prompt_len.min(g.prefill_len);
    let (matched, spread) = match matched::Precision::of(s.describe(), s.model)? {
        Some(p) => {
            let rows = matched::chunk_rows(s.model, &p, &ids[..single])?;
            // the jitter control's band per row, where it applies (matched_jitter)
            let spread = match crate::matched_jitter::applies(s.describe()) {
                true => Some(crate::matched_jitter::row_spread(
                    s.model,
                    &p,
                    &ids[..single],
                    &rows,
                )?),
                false => None,
            };
            (Some(rows), spread)
        }
        None => (None, None),
    };
    let mut rows = Vec::with_capacity(ks.len());
    let mut first_logits = Vec::new();
    for (i, &k) in ks.iter().enumerate() {
        let out = s.prefill(&ids[..k])?;
        s.progress.inc(g.chunks(k) as u64);
        rows.push(PrefillRow {
            position: k - 1,
            comparison: compare(&out.logits, reference.row(k - 1)),
            matched: matched.as_ref().and_then(|m| {
                let row = m.get(k - 1)?;
                let mut step = matched::step(row, reference.row(k - 1), &out.logits);
                step.jitter = spread.as_ref().and_then(|s| s.get(k - 1).copied());
                crate::device_stray::fill(&*s.dev, &out.logits, row, &mut step);
                Some(step)
            }),
        });
        if i == 0 {
            first_logits = out.logits;
        }
    }
    // the rerun checks that nothing leaks across a reset: a run on the device, never shared
    let shared = s.dev.share_identical_runs(false);
    let again = s.prefill(&ids[..ks[0]]);
    s.dev.share_identical_runs(shared);
    let again = again?;
    s.progress.inc(g.chunks(ks[0]) as u64);
    let rerun_cosine = cosine(&first_logits, &again.logits);
    let rerun_identical = first_logits == again.logits || rerun_cosine >= IDENTICAL_COSINE;
    let (mean_cosine, min_cosine, top1_agreement) = summarise(rows.iter().map(|r| &r.comparison));
    let token_texts = s.token_texts(
        rows.iter()
            .flat_map(|r| [r.comparison.device_top1, r.comparison.reference_top1]),
    );
    Ok(PrefillFinding {
        token_texts,
        rows,
        rerun_cosine,
        rerun_identical,
        min_cosine,
        mean_cosine,
        top1_agreement,
        scale: None,
    })
}

/// `kvprobe prefill`.
pub struct PrefillProbe;

impl crate::probe::Probe for PrefillProbe {
    fn name(&self) -> &'static str {
        "prefill"
    }

    fn about(&self) -> &'static str {
        "Device prefill logits against the reference, per prompt prefix"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.prefill = Some(run(s, &PrefillOptions::default())?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cover_ends_and_chunk_boundary() {
        assert_eq!(prefix_lengths(5, 4, 10), vec![1, 2, 3, 4, 5]);
        let ks = prefix_lengths(40, 16, 6);
        assert_eq!(ks.first(), Some(&1));
        assert_eq!(ks.last(), Some(&40));
        assert!(ks.contains(&16) && ks.contains(&17));
        assert!(ks.len() <= 9);
        assert_eq!(prefix_lengths(7, 4, 0).len(), 7);
    }
}
