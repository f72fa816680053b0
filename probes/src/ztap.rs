//! `ztap` (zero-column taps): which columns of the cache data are zero in every entry.
//!
//! Source: the tbt graph's taps when the device has them (what the graph read: a debug HEF, or
//! the emulator's `--sim-taps`), otherwise the writer-side ring bytes after prefill (the finding
//! says which). Compared with `never-written entries × entry width / entries`: a transposed
//! reader spreads the never-written entries' zeros over that many columns (Finding 9: 82/272 ≈
//! 7·272/23), a truncated entry zeroes the same tail bytes in every written entry, and a healthy
//! cache has neither. "Zero" means code 0 (raw 0 bytes; in taps, the dequantised code 0).

use kvprobe_npu::quant::dequantize;
use kvprobe_npu::MaskMode;
use kvprobe_schema::{GroupKind, ZtapCache, ZtapFinding};

use crate::cache_io;
use crate::rings::cache_infos;
use crate::session::Session;
use crate::Result;

pub fn run(s: &mut Session) -> Result<ZtapFinding> {
    let g = s.geometry();
    let infos = cache_infos(s.describe())?;
    let has_taps = s
        .describe()
        .group(GroupKind::Tbt)
        .is_some_and(|t| !t.taps.is_empty());
    s.progress.phase("ztap", 2);
    let window = g.tbt_window();
    let empty = (0..window)
        .filter(|&j| g.first_window_position(j).is_none())
        .count();
    let mut caches = Vec::new();
    let mut tbt_written = Vec::new();
    let source;
    if has_taps {
        source = "taps";
        let first = s.first_step()?;
        s.progress.inc(1);
        let out = s.driver.trial_step(s.dev, first.query, &MaskMode::Ring)?;
        s.progress.inc(1);
        for info in &infos {
            let Some(tap) = out.taps.get(&info.cache_id) else {
                continue;
            };
            if tap.is_empty() || tap.len() % window != 0 {
                continue;
            }
            let width = tap.len() / window;
            let q = info.reader_quant();
            let zero = dequantize(0.0, &q);
            let tol = (q.scale.abs() * 0.5).max(f32::EPSILON);
            let zero_map: Vec<bool> = (0..width)
                .map(|c| (0..window).all(|t| (tap[t * width + c] - zero).abs() <= tol))
                .collect();
            caches.push(finish(
                info.cache_id,
                info.layer,
                info.kind,
                window,
                width,
                empty,
                zero_map,
            ));
        }
    } else {
        source = "ring-bytes";
        // a reset keeps the ring bytes (contract §2.10): entries earlier probes' steps wrote
        // past the prompt would otherwise fill the window and hide a truncated writer
        s.clear_rings()?;
        let prefill = s.prefill_prompt()?;
        s.progress.inc(1);
        let rings = cache_io::read(s.dev, "after the prompt's prefill (ztap probe)")?;
        s.progress.inc(1);
        tbt_written = tbt_written_maps(s, &infos, &rings, &prefill.logits)?;
        let l = g.cache_len;
        // the first tbt step reads L − 1 entries from R = n + 1 (contract §1.5)
        let start = g.prompt_len + 1;
        for info in &infos {
            let Some(ring) = rings.get(&info.cache_id) else {
                continue;
            };
            let width = info.entry_size;
            let zero_map: Vec<bool> = (0..width)
                .map(|c| {
                    (0..window).all(|j| {
                        let o = ((start + j) % l) * info.padded_entry_size + c;
                        ring.get(o).is_none_or(|&b| b == 0)
                    })
                })
                .collect();
            caches.push(finish(
                info.cache_id,
                info.layer,
                info.kind,
                window,
                width,
                empty,
                zero_map,
            ));
        }
    }
    let trunc = caches
        .iter()
        .filter(|c| c.interpretation == "truncation")
        .count();
    let trans = caches
        .iter()
        .filter(|c| c.interpretation == "transposition")
        .count();
    let interpretation = if trunc * 2 > caches.len() {
        "truncation"
    } else if trans * 2 > caches.len() {
        "transposition"
    } else {
        "none"
    };
    Ok(ZtapFinding {
        source: source.into(),
        caches,
        interpretation: interpretation.into(),
        tbt_written,
    })
}

/// Tbt steps run after the prefill to read what the tbt writer leaves (a few entries: a tail
/// that is zero in every one of them by chance is below 1e-8 per ring even for a byte that is
/// zero one time in twenty).
const TBT_STEPS: usize = 3;

/// Greedy tbt steps after the prefill, then the zero map over the entries each step wrote, per
/// ring. The written entries are found by difference from `before` (no slot convention
/// assumed); a ring whose bytes did not change in exactly one entry per step (a writer that
/// scatters bytes over many entries) gets no map, since its rows are not entries.
fn tbt_written_maps(
    s: &mut Session,
    infos: &[crate::rings::CacheInfo],
    before: &std::collections::BTreeMap<u32, Vec<u8>>,
    prefill_logits: &[f32],
) -> Result<Vec<ZtapCache>> {
    if !s.has_tbt() {
        return Ok(Vec::new());
    }
    let mut token = kvprobe_npu::argmax(prefill_logits);
    for _ in 0..TBT_STEPS {
        let out = s.driver.step(s.dev, token, &MaskMode::Ring)?;
        token = kvprobe_npu::argmax(&out.logits);
    }
    let after = cache_io::read(s.dev, "after the tbt steps (ztap probe)")?;
    let mut maps = Vec::new();
    for info in infos {
        let (Some(a), Some(b)) = (before.get(&info.cache_id), after.get(&info.cache_id)) else {
            continue;
        };
        let (pad, width) = (info.padded_entry_size, info.entry_size);
        if pad == 0 || width == 0 {
            continue;
        }
        let rows: Vec<&[u8]> = a
            .chunks(pad)
            .zip(b.chunks(pad))
            .filter(|(x, y)| x != y)
            .map(|(_, y)| &y[..width.min(y.len())])
            .collect();
        if rows.len() != TBT_STEPS || rows.iter().any(|r| r.len() != width) {
            continue;
        }
        let zero_map: Vec<bool> = (0..width).map(|c| rows.iter().all(|r| r[c] == 0)).collect();
        maps.push(finish(
            info.cache_id,
            info.layer,
            info.kind,
            TBT_STEPS,
            width,
            0,
            zero_map,
        ));
    }
    Ok(maps)
}

fn finish(
    cache_id: u32,
    layer: usize,
    kind: kvprobe_schema::CacheKind,
    entries: usize,
    width: usize,
    empty: usize,
    zero_map: Vec<bool>,
) -> ZtapCache {
    let zero_columns = zero_map.iter().filter(|&&z| z).count();
    let expected = empty as f64 * width as f64 / entries.max(1) as f64;
    let interpretation = interpret(&zero_map, expected);
    ZtapCache {
        cache_id,
        layer: Some(layer),
        kind: Some(kind),
        entries,
        width,
        zero_columns,
        zero_map,
        empty_entries: empty,
        expected_transposed_zero_columns: expected,
        interpretation: interpretation.into(),
    }
}

/// "truncation" when the zero columns are a contiguous tail of at least two columns;
/// "transposition" when their count is within 20 % (or 2) of the transposed expectation;
/// otherwise "none" (scattered zeros from clipping).
pub fn interpret(zero_map: &[bool], expected_transposed: f64) -> &'static str {
    let zeros = zero_map.iter().filter(|&&z| z).count();
    if zeros == 0 {
        return "none";
    }
    let tail = zero_map.iter().rev().take_while(|&&z| z).count();
    if tail == zeros && tail >= 2 {
        return "truncation";
    }
    if expected_transposed >= 1.0
        && (zeros as f64 - expected_transposed).abs() <= (0.2 * expected_transposed).max(2.0)
    {
        return "transposition";
    }
    "none"
}

/// `kvprobe ztap`.
pub struct ZtapProbe;

impl crate::probe::Probe for ZtapProbe {
    fn name(&self) -> &'static str {
        "ztap"
    }

    fn about(&self) -> &'static str {
        "Always-zero columns of what the tbt graph read (or of the ring bytes)"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.ztap = Some(run(s)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding9_numbers_read_as_transposition() {
        // K: 82 of 272 columns zero, window 23 with 7 empty: 7·272/23 = 82.8
        let mut map = vec![false; 272];
        map[..82].fill(true);
        assert_eq!(interpret(&map, 7.0 * 272.0 / 23.0), "transposition");
        let mut tail = vec![false; 64];
        tail[40..].fill(true);
        assert_eq!(interpret(&tail, 0.0), "truncation");
        let mut one = vec![false; 64];
        one[5] = true;
        assert_eq!(interpret(&one, 20.0), "none");
    }
}
