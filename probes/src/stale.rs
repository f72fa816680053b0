//! `stale`: stale-slot poisoning (issue 10).
//!
//! After the prompt's prefill, every ring slot that holds no prompt token is overwritten with a
//! poison pattern of the largest values the cache's quantisation can hold (alternating signs,
//! element by element, so it is large in any layout). The same tbt steps then run on the clean
//! and on the poisoned rings, fed the same tokens. The server's ring mask never lets a step see
//! those slots before the device itself overwrote them (contract §2.5, §2.9), and device runs are
//! deterministic, so on a healthy device the poisoned logits are *identical*; any change is a
//! mask or offset bug, and group testing at the first moved step names the slots.
//!
//! The back-to-back part runs a second, different request after the first, with and without
//! `Driver::reset`, against that request on its own: with a reset it must not depend on the
//! first (the rings keep the first request's bytes, contract §2.10, only the mask hides them).

use kvprobe_npu::{Device, HostState, MaskMode};
use kvprobe_schema::{BackToBack, StaleFinding, StaleLeak, StaleStep};

use crate::metrics::{cosine, top1};
use crate::rings::{cache_infos, CacheInfo};
use crate::session::Session;
use crate::thresholds::IDENTICAL_COSINE;
use crate::Result;

#[derive(Debug, Clone, Copy)]
pub struct StaleOptions {
    /// tbt steps after the prefill.
    pub steps: usize,
    /// Trial runs the slot search may spend at the first moved step.
    pub max_leak_trials: usize,
    /// tbt steps of each request in the back-to-back part (0 = skip that part).
    pub back_to_back_steps: usize,
}

impl Default for StaleOptions {
    fn default() -> Self {
        StaleOptions {
            steps: 16,
            max_leak_trials: 32,
            back_to_back_steps: 2,
        }
    }
}

/// Poison codes of one element, alternating between the two ends of the code range.
fn poison_element(info: &CacheInfo, index: usize, out: &mut Vec<u8>) {
    let high = index.is_multiple_of(2);
    match info.elem_bytes {
        1 => out.push(if high { u8::MAX } else { 0 }),
        2 => out.extend_from_slice(&(if high { u16::MAX } else { 0 }).to_le_bytes()),
        _ => {
            let v: f32 = if high { FLOAT_POISON } else { -FLOAT_POISON };
            out.extend_from_slice(&v.to_le_bytes());
            out.resize(out.len() + info.elem_bytes.saturating_sub(4), 0);
        }
    }
}

/// Permuting admitted entries changes the attention only by the order of a float sum.
pub const PERMUTATION_INVARIANT: f64 = 0.99999;

/// Magnitude written into a float cache: far beyond any K/V of a normalised transformer.
const FLOAT_POISON: f32 = 1.0e3;

/// Entry bytes of the poison for one cache (E bytes; the page padding is left alone).
pub fn poison_entry(info: &CacheInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(info.entry_size);
    for i in 0..info.features {
        poison_element(info, i, &mut out);
    }
    out.truncate(info.entry_size);
    out
}

/// Largest dequantised |value| of the poison over all caches.
fn poison_magnitude(infos: &[CacheInfo]) -> f64 {
    infos
        .iter()
        .map(|i| {
            if i.elem_bytes > 2 {
                return FLOAT_POISON as f64;
            }
            let q = i.reader_quant();
            let top = if i.elem_bytes == 1 {
                u8::MAX as f64
            } else {
                u16::MAX as f64
            };
            let hi = (top - q.zero_point as f64) * q.scale as f64;
            let lo = (0.0 - q.zero_point as f64) * q.scale as f64;
            hi.abs().max(lo.abs())
        })
        .fold(0.0, f64::max)
}

use crate::cache_io::{self, Rings};

/// `base` with the poison written into `slots` of every ring.
fn poisoned(base: &Rings, infos: &[CacheInfo], slots: &[usize]) -> Rings {
    let mut out = base.clone();
    for info in infos {
        let Some(ring) = out.get_mut(&info.cache_id) else {
            continue;
        };
        let entry = poison_entry(info);
        for &s in slots {
            let at = s * info.padded_entry_size;
            if at + entry.len() <= ring.len() {
                ring[at..at + entry.len()].copy_from_slice(&entry);
            }
        }
    }
    out
}

fn write_rings(dev: &mut dyn Device, rings: &Rings) -> Result<()> {
    cache_io::write_all(dev, rings, "of poisoned or restored entries (stale probe)")
}

/// Slots that still hold the poison in every ring (not overwritten by a device write yet).
fn still_poisoned(now: &Rings, infos: &[CacheInfo], slots: &[usize]) -> Vec<usize> {
    slots
        .iter()
        .copied()
        .filter(|&s| {
            infos.iter().all(|info| {
                let entry = poison_entry(info);
                let at = s * info.padded_entry_size;
                now.get(&info.cache_id)
                    .and_then(|r| r.get(at..at + entry.len()))
                    .is_some_and(|b| b == entry.as_slice())
            })
        })
        .collect()
}

/// Ring slots holding prompt positions after the prefill, and the poison classes of the rest.
pub fn slot_classes(cache_len: usize, prompt_len: usize, padding_floor: i64) -> SlotClasses {
    let l = cache_len as i64;
    let valid: Vec<bool> = (0..cache_len)
        .map(|s| (0..prompt_len as i64).any(|p| p.rem_euclid(l) == s as i64))
        .collect();
    let padding: Vec<bool> = (0..cache_len)
        .map(|s| (padding_floor..0).any(|p| p.rem_euclid(l) == s as i64))
        .collect();
    let mut c = SlotClasses::default();
    for s in 0..cache_len {
        if valid[s] {
            continue;
        }
        if padding[s] {
            c.previously_written.push(s);
        } else {
            c.never_written.push(s);
        }
    }
    c
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotClasses {
    pub never_written: Vec<usize>,
    pub previously_written: Vec<usize>,
}

/// Ring distance from `slot` to the nearest slot valid for a step at `position` (the window of
/// the last `L − 1` positions plus the step's own, contract §2.9).
pub fn distance_to_valid(slot: usize, position: usize, cache_len: usize) -> usize {
    let l = cache_len as i64;
    let lo = (position as i64 + 1 - l).max(0);
    (lo..=position as i64)
        .map(|p| {
            let d = (p.rem_euclid(l) - slot as i64).rem_euclid(l);
            d.min(l - d) as usize
        })
        .min()
        .unwrap_or(cache_len)
}

pub fn run(s: &mut Session, opts: &StaleOptions) -> Result<StaleFinding> {
    s.require_tbt("stale")?;
    let g = s.geometry();
    let l = g.cache_len;
    let n = g.prompt_len;
    let steps = opts.steps.max(1);
    let infos = cache_infos(s.describe())?;
    let classes = slot_classes(l, n, g.padding_floor());
    let mut all_slots = classes.never_written.clone();
    all_slots.extend(&classes.previously_written);
    all_slots.sort_unstable();
    s.progress.phase("stale", 2 * steps as u64 + 4);

    // The host window feeds the prefill's padding rows (contract §2.4, not cleared by a reset):
    // both runs start from the same one, so only the poison differs.
    let host0 = s.driver.host_state();
    let ids = s.ids.clone();

    // clean run: its own argmax tokens, which the poisoned run is then fed
    s.clear_rings()?;
    s.driver.set_host_state(host0.clone());
    let out = s.prefill(&ids)?;
    let clean_rings = cache_io::read(s.dev, "after the clean prefill (stale probe)")?;
    let mut tokens = vec![top1(&out.logits)];
    let mut clean = Vec::with_capacity(steps);
    for k in 0..steps {
        let o = s.driver.step(s.dev, tokens[k], &MaskMode::Ring)?;
        tokens.push(top1(&o.logits));
        clean.push(o.logits);
        s.progress.inc(1);
    }

    // poisoned run
    s.clear_rings()?;
    s.driver.set_host_state(host0.clone());
    s.prefill(&ids)?;
    let after_prefill = cache_io::read(s.dev, "after the prefill to poison (stale probe)")?;
    write_rings(s.dev, &poisoned(&after_prefill, &infos, &all_slots))?;
    let mut rows = Vec::with_capacity(steps);
    let mut first_moved = None;
    let mut leaks = Vec::new();
    let mut complete = true;
    let mut trials = 0usize;
    let mut permutation_cosine = None;
    for k in 0..steps {
        let o = s.driver.step(s.dev, tokens[k], &MaskMode::Ring)?;
        let c = cosine(&o.logits, &clean[k]);
        let moved = c < IDENTICAL_COSINE;
        if moved && first_moved.is_none() {
            first_moved = Some(k);
            s.driver.step_back(s.dev)?;
            let search = locate(s, &infos, &clean_rings, &all_slots, tokens[k], opts)?;
            trials = search.trials;
            complete = search.complete;
            permutation_cosine = search.permutation_cosine;
            leaks = search
                .slots
                .iter()
                .map(|&slot| StaleLeak {
                    step: k,
                    slot,
                    class: if classes.previously_written.contains(&slot) {
                        "previously-written".into()
                    } else {
                        "never-written".into()
                    },
                    distance_to_valid: distance_to_valid(slot, n + k, l),
                })
                .collect();
            // resume the poisoned run where it was
            s.driver.step(s.dev, tokens[k], &MaskMode::Ring)?;
        }
        rows.push(StaleStep {
            step: k,
            position: n + k,
            cosine_to_clean: c,
            max_abs_diff: o
                .logits
                .iter()
                .zip(&clean[k])
                .map(|(a, b)| (a - b).abs() as f64)
                .filter(|d| d.is_finite())
                .fold(0.0, f64::max),
            moved,
        });
        s.progress.inc(1);
    }
    let back_to_back = if opts.back_to_back_steps > 0 {
        Some(back_to_back(s, &host0, opts.back_to_back_steps)?)
    } else {
        None
    };
    s.progress.inc(4);
    Ok(StaleFinding {
        poison_magnitude: poison_magnitude(&infos),
        never_written_slots: classes.never_written,
        previously_written_slots: classes.previously_written,
        steps: rows,
        first_moved_step: first_moved,
        leaks,
        leak_search_complete: complete,
        leak_trials: trials,
        leak_permutation_cosine: permutation_cosine,
        leaks_whole_entries: permutation_cosine.map(|c| c >= PERMUTATION_INVARIANT),
        back_to_back,
    })
}

struct Search {
    slots: Vec<usize>,
    complete: bool,
    trials: usize,
    permutation_cosine: Option<f64>,
}

/// Group testing at the current step: which still-poisoned slots alone move the logits. The
/// rings are restored afterwards.
fn locate(
    s: &mut Session,
    infos: &[CacheInfo],
    clean_rings: &Rings,
    poisoned_slots: &[usize],
    token: u32,
    opts: &StaleOptions,
) -> Result<Search> {
    let now = cache_io::read(s.dev, "after a poisoned step (stale probe)")?;
    let live = still_poisoned(&now, infos, poisoned_slots);
    // the same rings with every live poison reverted to the clean run's bytes
    let mut base = now.clone();
    for info in infos {
        if let (Some(dst), Some(src)) = (
            base.get_mut(&info.cache_id),
            clean_rings.get(&info.cache_id),
        ) {
            for &slot in &live {
                let a = slot * info.padded_entry_size;
                let b = a + info.padded_entry_size;
                if b <= dst.len() && b <= src.len() {
                    dst[a..b].copy_from_slice(&src[a..b]);
                }
            }
        }
    }
    let trial = |s: &mut Session, slots: &[usize]| -> Result<Vec<f32>> {
        write_rings(s.dev, &poisoned(&base, infos, slots))?;
        Ok(s.driver.trial_step(s.dev, token, &MaskMode::Ring)?.logits)
    };
    let reference = trial(s, &[])?;
    let mut trials = 1usize;
    let mut found = Vec::new();
    let mut complete = true;
    let mut queue = vec![live];
    while let Some(group) = queue.pop() {
        if group.len() == 1 {
            found.push(group[0]);
            continue;
        }
        if group.is_empty() {
            continue;
        }
        let (a, b) = group.split_at(group.len() / 2);
        for half in [b, a] {
            if trials + 1 > opts.max_leak_trials.max(2) {
                complete = false;
                break;
            }
            let out = trial(s, half)?;
            trials += 1;
            if cosine(&out, &reference) < IDENTICAL_COSINE {
                queue.push(half.to_vec());
            }
        }
        if !complete {
            break;
        }
    }
    found.sort_unstable();
    // every found slot leaked on its own, so the check holds on an incomplete search too
    let permutation_cosine = if found.len() >= 2 {
        Some(permutation_check(
            s,
            infos,
            &base,
            clean_rings,
            &found,
            token,
        )?)
    } else {
        None
    };
    write_rings(s.dev, &now)?;
    Ok(Search {
        slots: found,
        complete,
        trials,
        permutation_cosine,
    })
}

/// Are the leaking slots read as whole entries? Attention is a function of the *set* of admitted
/// (K, V) entries (K carries its position after RoPE), so a graph whose mask admits the leaking
/// slots gives the same output when their contents are permuted among themselves; a reader that
/// assembles each entry from bytes of other slots (another layout) does not. The slots get
/// distinct contents (clean entries of the prompt's slots, so no poison saturates the softmax),
/// then the same contents rotated by one slot. Returns the cosine between the two outputs.
fn permutation_check(
    s: &mut Session,
    infos: &[CacheInfo],
    base: &Rings,
    clean_rings: &Rings,
    leaks: &[usize],
    token: u32,
) -> Result<f64> {
    let l = s.geometry().cache_len;
    let sources: Vec<usize> = (0..l).filter(|x| !leaks.contains(x)).collect();
    let fill = |rot: usize| -> Rings {
        let mut out = base.clone();
        for info in infos {
            let (Some(dst), Some(src)) =
                (out.get_mut(&info.cache_id), clean_rings.get(&info.cache_id))
            else {
                continue;
            };
            let e = info.padded_entry_size;
            for j in 0..leaks.len() {
                let from = sources[j % sources.len().max(1)];
                let to = leaks[(j + rot) % leaks.len()];
                if (from + 1) * e <= src.len() && (to + 1) * e <= dst.len() {
                    dst[to * e..(to + 1) * e].copy_from_slice(&src[from * e..(from + 1) * e]);
                }
            }
        }
        out
    };
    write_rings(s.dev, &fill(0))?;
    let a = s.driver.trial_step(s.dev, token, &MaskMode::Ring)?.logits;
    write_rings(s.dev, &fill(1))?;
    let b = s.driver.trial_step(s.dev, token, &MaskMode::Ring)?.logits;
    Ok(cosine(&a, &b))
}

/// A second prompt for the back-to-back runs: the prompt reversed (rotated when it reads the
/// same both ways).
pub fn second_request(ids: &[u32], vocab: usize) -> Vec<u32> {
    let mut b: Vec<u32> = ids.iter().rev().copied().collect();
    if b == ids {
        b = ids
            .iter()
            .map(|&t| ((t as usize + 1) % vocab.max(1)) as u32)
            .collect();
    }
    b
}

/// Outputs of a request: the prefill's logits, then `steps` tbt steps on the given tokens (or
/// on its own argmax when `tokens` is empty). Returns logits and the tokens fed.
fn request(
    s: &mut Session,
    ids: &[u32],
    steps: usize,
    tokens: &[u32],
) -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
    let out = s.driver.prefill(s.dev, ids)?;
    let mut fed = Vec::with_capacity(steps);
    let mut logits = vec![out.logits];
    for k in 0..steps {
        let t = tokens
            .get(k)
            .copied()
            .unwrap_or_else(|| top1(logits.last().map_or(&[][..], |v| v.as_slice())));
        fed.push(t);
        logits.push(s.driver.step(s.dev, t, &MaskMode::Ring)?.logits);
    }
    Ok((logits, fed))
}

fn min_cosine(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| cosine(x, y))
        .fold(1.0, f64::min)
}

fn back_to_back(s: &mut Session, host0: &HostState, steps: usize) -> Result<BackToBack> {
    let first = s.ids.clone();
    let second = second_request(&first, s.model.config().vocab_size);
    // the second request alone, from cleared rings
    s.clear_rings()?;
    s.driver.set_host_state(host0.clone());
    s.driver.reset(s.dev)?;
    let (alone, fed) = request(s, &second, steps, &[])?;
    let after = |s: &mut Session, reset: bool| -> Result<Vec<Vec<f32>>> {
        s.clear_rings()?;
        s.driver.set_host_state(host0.clone());
        s.driver.reset(s.dev)?;
        request(s, &first, steps, &[])?;
        if reset {
            s.driver.reset(s.dev)?;
        }
        Ok(request(s, &second, steps, &fed)?.0)
    };
    let with_reset = after(s, true)?;
    // without a reset the second request must fit behind the first in the context
    let without_reset = if first.len() + steps + second.len() < s.model.config().max_position {
        after(s, false)?
    } else {
        alone.clone()
    };
    let with_reset_cosine = min_cosine(&with_reset, &alone);
    let without_reset_cosine = min_cosine(&without_reset, &alone);
    Ok(BackToBack {
        first_ids: first,
        second_ids: second,
        with_reset_cosine,
        without_reset_cosine,
        depends_with_reset: with_reset_cosine < IDENTICAL_COSINE,
        depends_without_reset: without_reset_cosine < IDENTICAL_COSINE,
    })
}

/// `kvprobe stale`.
pub struct StaleProbe;

impl crate::probe::Probe for StaleProbe {
    fn name(&self) -> &'static str {
        "stale"
    }

    fn about(&self) -> &'static str {
        "Poison unused ring slots and rerun the tbt steps: which steps and slots see the poison"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        let o = StaleOptions {
            steps: opts.steps.min(64),
            ..Default::default()
        };
        into.stale = Some(run(s, &o)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_classes_by_hand() {
        // L = 8, 5 prompt tokens, P = 4: chunks 1 + 4; the first chunk's 3 padding rows wrote
        // positions −3..−1 = slots 5, 6, 7; prompt in slots 0..4; nothing is never-written.
        let c = slot_classes(8, 5, -3);
        assert_eq!(c.previously_written, vec![5, 6, 7]);
        assert!(c.never_written.is_empty());
        // L = 10, 4 tokens in one full chunk of P = 4: slots 4..9 never written
        let c = slot_classes(10, 4, 0);
        assert_eq!(c.never_written, vec![4, 5, 6, 7, 8, 9]);
        assert!(c.previously_written.is_empty());
    }

    #[test]
    fn distance_by_hand() {
        // L = 8, step at position 5: valid slots 0..=5; slot 7 is 1 from slot 0 (wrap), 2 from 5
        assert_eq!(distance_to_valid(7, 5, 8), 1);
        assert_eq!(distance_to_valid(6, 5, 8), 1);
        assert_eq!(distance_to_valid(3, 5, 8), 0);
        // position 10, L = 8: window positions 3..=10 = every slot
        assert_eq!(distance_to_valid(2, 10, 8), 0);
    }

    #[test]
    fn second_request_differs() {
        assert_eq!(second_request(&[1, 2, 3], 10), vec![3, 2, 1]);
        assert_eq!(second_request(&[4, 5, 4], 10), vec![5, 6, 5]);
    }
}
