//! `inject`'s reader-layout search: when golden token-major rings fail too, the same reference
//! K/V re-encoded over the tbt read window in each named layout a compile produces
//! (feature-major, F8CR; contract §7.2). A reader that decodes its window in layout X sees
//! exactly the token-major block when the window holds `encode(X, block)` (the writer→reader
//! composition of contract §7.4), so the candidate that reproduces the reference names the
//! reader's layout. Tried first on every K ring, every V ring and both, then edge by edge for
//! a reader wrong on some layers only, starting where the step's own K/V writes first leave
//! the reference.

use std::collections::BTreeMap;

use kvprobe_npu::layout::{self, StreamShape};
use kvprobe_npu::MaskMode;
use kvprobe_schema::{
    CacheDirection, CacheKind, GroupKind, Layout, LogitComparison, ReaderEdgeLayout,
    ReaderLayoutRepair,
};

use kvprobe_reference::KvState;

use crate::cache_io;
use crate::metrics::compare;
use crate::rings::{dequantize_entry, reference_entries, CacheInfo};
use crate::session::Session;
use crate::thresholds::{rings_repair, LAYER_SWAP_GAIN, REL_TBT_GAP};
use crate::Result;

/// The tbt read window of the first step after an `n`-token prompt: entry `i` at slot
/// `(start + i) mod L` (contract §1.5), `start ≡ n − in` so that the step writes position `n` at
/// slot `n mod L`, where the golden rings expect it.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: usize,
    len: usize,
    cache_len: usize,
}

/// One candidate: which infos (by index) are re-encoded in which layout.
type Edits = Vec<(usize, Layout)>;

struct Search<'a> {
    infos: &'a [CacheInfo],
    golden: BTreeMap<u32, Vec<u8>>,
    window: Window,
    /// What each ring holds on the device now (`None` = the token-major golden ring).
    written: Vec<Option<Option<Layout>>>,
    query: u32,
    reference: &'a [f32],
    trials: usize,
    /// The reference state after the prompt (the guided search's locator starts from it).
    prompt: &'a KvState,
}

/// Layers screened per round of the guided search, likeliest first.
const LAYERS_PER_ROUND: usize = 3;

/// The reference K/V of the first tbt step's own token (position `n`), per cache, and the slot
/// the step writes them to.
pub(crate) struct Locator {
    slot: usize,
    entries: Vec<Vec<f32>>,
    n_layers: usize,
}

/// A written entry counts as its partner's when it correlates with the partner's reference at
/// least this well and by this lead over its own. Correlation, not distance: a crosswise write
/// quantises with its own edge's scale and is read back with the partner ring's, an affine map
/// that a distance counts as a miss.
const CROSSWISE_CORRELATION: f64 = 0.9;
const CROSSWISE_LEAD: f64 = 0.3;

/// Pearson correlation of two equally long vectors (0 when either is constant).
fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len()).max(1) as f64;
    let (ma, mb) = (
        a.iter().map(|&x| f64::from(x)).sum::<f64>() / n,
        b.iter().map(|&x| f64::from(x)).sum::<f64>() / n,
    );
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x) - ma, f64::from(y) - mb);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa <= 0.0 || bb <= 0.0 {
        0.0
    } else {
        ab / (aa * bb).sqrt()
    }
}

impl Locator {
    /// Layers whose last step wrote, in both its K and its V ring, the entry the reference puts
    /// in the other one: the step binds that layer's rings crosswise (`kv-swap` writes through
    /// the same binding it reads with).
    pub(crate) fn crosswise(&self, s: &mut Session, infos: &[CacheInfo]) -> Result<Vec<usize>> {
        let rings = cache_io::read(s.dev, "after a tbt step (inject probe's binding search)")?;
        let mut votes = vec![0usize; self.n_layers];
        let mut values = Vec::new();
        for (i, info) in infos.iter().enumerate() {
            let partner = infos
                .iter()
                .position(|p| p.layer == info.layer && p.kind != info.kind);
            let (Some(ring), Some(j)) = (rings.get(&info.cache_id), partner) else {
                continue;
            };
            if !self.written(ring, info, &mut values) {
                continue;
            }
            if values.len() != self.entries[j].len() {
                continue;
            }
            let (own, cross) = (
                correlation(&values, &self.entries[i]),
                correlation(&values, &self.entries[j]),
            );
            if cross >= CROSSWISE_CORRELATION && own < cross - CROSSWISE_LEAD {
                votes[info.layer] += 1;
            }
        }
        Ok((0..self.n_layers).filter(|&l| votes[l] == 2).collect())
    }

    /// What the last step wrote to `info`'s ring, dequantised into `values`; false when the
    /// ring is shorter than the write slot.
    fn written(&self, ring: &[u8], info: &CacheInfo, values: &mut Vec<f32>) -> bool {
        let o = self.slot * info.padded_entry_size;
        let Some(bytes) = ring.get(o..o + info.entry_size) else {
            return false;
        };
        let q = info.tbt_out.unwrap_or_else(|| info.writer_quant());
        dequantize_entry(bytes, info.elem_bytes, &q, values);
        true
    }

    pub(crate) fn new(
        state: &KvState,
        s: &Session,
        infos: &[CacheInfo],
        query: u32,
    ) -> Result<Locator> {
        let n = s.geometry().prompt_len;
        let mut state = state.clone();
        s.model.decode_step(&mut state, query, n)?;
        let nh = s.model.config().n_heads;
        let entries = infos
            .iter()
            .map(|info| {
                let all = reference_entries(&state, info, nh)?;
                Ok(all[all.len() - info.features..].to_vec())
            })
            .collect::<Result<_>>()?;
        Ok(Locator {
            slot: n % s.describe().cache_len,
            entries,
            n_layers: infos.iter().map(|c| c.layer + 1).max().unwrap_or(0),
        })
    }

    /// Per layer, the relative L2 distance of what the last step wrote (K and V together) from
    /// the reference.
    fn layer_errors(&self, s: &mut Session, infos: &[CacheInfo]) -> Result<Vec<f64>> {
        let rings = cache_io::read(s.dev, "after a tbt step (inject probe's layer search)")?;
        let (mut diff, mut norm) = (vec![0.0f64; self.n_layers], vec![0.0f64; self.n_layers]);
        let mut values = Vec::new();
        for (info, want) in infos.iter().zip(&self.entries) {
            let Some(ring) = rings.get(&info.cache_id) else {
                continue;
            };
            if !self.written(ring, info, &mut values) {
                continue;
            }
            for (&x, &r) in values.iter().zip(want) {
                diff[info.layer] += f64::from(x - r).powi(2);
                norm[info.layer] += f64::from(r).powi(2);
            }
        }
        Ok(diff
            .iter()
            .zip(&norm)
            .map(|(d, n)| (d / n.max(f64::MIN_POSITIVE)).sqrt())
            .collect())
    }
}

/// Layers in the order a misread is likeliest: by how far the next layer's written entry jumps
/// above every layer's below it (the last layer, which no written entry can show, ranks as a
/// mild jump of 1.5).
fn likeliest_layers(errors: &[f64]) -> Vec<usize> {
    let mut scored: Vec<(usize, f64)> = (0..errors.len())
        .map(|l| {
            let score = match errors.get(l + 1) {
                Some(next) => {
                    let below = errors[..=l].iter().cloned().fold(1e-6, f64::max);
                    next / below
                }
                None => 1.5,
            };
            (l, score)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored
        .into_iter()
        .take(LAYERS_PER_ROUND)
        .map(|x| x.0)
        .collect()
}

/// The best reader-layout candidate, or `None` when the device has no tbt read window or no
/// candidate moves the step.
pub(crate) fn search(
    s: &mut Session,
    infos: &[CacheInfo],
    golden: BTreeMap<u32, Vec<u8>>,
    prompt: &KvState,
    query: u32,
    reference: &[f32],
    golden_cosine: f64,
) -> Result<Option<ReaderLayoutRepair>> {
    let desc = s.describe();
    let Some(len) = desc
        .groups
        .iter()
        .filter(|g| g.kind == GroupKind::Tbt)
        .flat_map(|g| &g.cache_edges)
        .find(|e| e.direction == CacheDirection::Input)
        .map(|e| e.length)
    else {
        return Ok(None);
    };
    let cache_len = desc.cache_len;
    let n = s.geometry().prompt_len;
    if len == 0 || len > cache_len {
        return Ok(None);
    }
    let window = Window {
        start: (n % cache_len + cache_len - len) % cache_len,
        len,
        cache_len,
    };
    let mut search = Search {
        infos,
        golden,
        window,
        written: vec![None; infos.len()],
        query,
        reference,
        trials: 0,
        prompt,
    };
    search.run(s, golden_cosine)
}

impl Search<'_> {
    fn run(&mut self, s: &mut Session, golden: f64) -> Result<Option<ReaderLayoutRepair>> {
        let mut best: Option<(Edits, LogitComparison)> = None;
        let keep = |best: &mut Option<(Edits, LogitComparison)>, e: Edits, c: LogitComparison| {
            if !e.is_empty() && best.as_ref().is_none_or(|b| c.cosine > b.1.cosine) {
                *best = Some((e, c));
            }
        };
        for lay in [Layout::FeatureMajor, Layout::F8cr] {
            for kinds in [
                &[CacheKind::K][..],
                &[CacheKind::V],
                &[CacheKind::K, CacheKind::V],
            ] {
                let edits: Edits = (0..self.infos.len())
                    .filter(|&i| kinds.contains(&self.infos[i].kind) && self.applies(i, lay))
                    .map(|i| (i, lay))
                    .collect();
                if edits.is_empty() {
                    continue;
                }
                let c = self.trial(s, &edits)?;
                keep(&mut best, edits, c);
            }
        }
        let whole_repairs = best
            .as_ref()
            .is_some_and(|b| rings_repair(golden, b.1.cosine));
        if !whole_repairs {
            if let Some((edits, c)) = self.guided(s, golden)? {
                keep(&mut best, edits, c);
            }
        }
        self.restore(s)?;
        Ok(best
            .filter(|b| b.1.cosine >= golden + LAYER_SWAP_GAIN || rings_repair(golden, b.1.cosine))
            .map(|(edits, comparison)| ReaderLayoutRepair {
                edges: edits
                    .iter()
                    .map(|&(i, layout)| ReaderEdgeLayout {
                        layer: self.infos[i].layer,
                        kind: self.infos[i].kind,
                        layout,
                    })
                    .collect(),
                comparison,
                trials: self.trials,
            }))
    }

    /// Edge by edge, guided by where the step's own writes leave the reference: layer ℓ's new
    /// K/V depend only on what layers below ℓ read, so the first layer whose written entry jumps
    /// away from the reference sits just above the first misread layer. Each round screens the
    /// edges of the likeliest layers (at most `LAYERS_PER_ROUND`) and keeps the edge whose
    /// re-encoding brings the next layer's written entry back (halves its distance; for the
    /// last layer: lifts the step by `LAYER_SWAP_GAIN`), then locates again with it in place.
    /// Output logits alone cannot guide this: with a second layer still misread, SmolLM2's step
    /// stays garbage whichever first layer is repaired.
    fn guided(&mut self, s: &mut Session, golden: f64) -> Result<Option<(Edits, LogitComparison)>> {
        let locator = Locator::new(self.prompt, s, self.infos, self.query)?;
        let n_layers = locator.n_layers;
        let mut edits: Edits = Vec::new();
        let mut current: Option<LogitComparison> = None;
        let mut floor = golden;
        for _ in 0..n_layers {
            self.trial(s, &edits)?;
            let errors = locator.layer_errors(s, self.infos)?;
            let mut found: Option<((usize, Layout), LogitComparison, f64)> = None;
            for layer in likeliest_layers(&errors) {
                for i in (0..self.infos.len()).filter(|&i| self.infos[i].layer == layer) {
                    if edits.iter().any(|e| e.0 == i) {
                        continue;
                    }
                    for lay in [Layout::FeatureMajor, Layout::F8cr] {
                        if !self.applies(i, lay) {
                            continue;
                        }
                        let mut with = edits.clone();
                        with.push((i, lay));
                        let c = self.trial(s, &with)?;
                        // smaller is better: the next layer's distance, or the step's miss
                        let score = match errors.get(layer + 1) {
                            Some(&before) => {
                                let after = locator.layer_errors(s, self.infos)?[layer + 1];
                                (after <= before / 2.0).then_some(after)
                            }
                            None => (c.cosine >= floor + LAYER_SWAP_GAIN).then_some(1.0 - c.cosine),
                        };
                        if let Some(score) = score {
                            if found.as_ref().is_none_or(|f| score < f.2) {
                                found = Some(((i, lay), c, score));
                            }
                        }
                    }
                }
                if found.is_some() {
                    break;
                }
            }
            let Some((edit, c, _)) = found else { break };
            edits.push(edit);
            floor = floor.max(c.cosine);
            let done = 1.0 - c.cosine <= REL_TBT_GAP;
            current = Some(c);
            if done {
                break;
            }
        }
        Ok(current.map(|c| (edits, c)))
    }

    /// Whether re-encoding ring `i` in `lay` changes its window's bytes at all (F8CR needs a
    /// multiple of 8 features; a one-entry window reads the same in every layout).
    fn applies(&self, i: usize, lay: Layout) -> bool {
        let shape = self.shape(i);
        layout::check_supported(lay, shape.features).is_ok()
            && !layout::equals_token_major(lay, shape)
    }

    fn shape(&self, i: usize) -> StreamShape {
        let info = &self.infos[i];
        StreamShape {
            tokens: self.window.len,
            features: info.features,
            elem_bytes: info.elem_bytes,
            head_dim: info.features,
        }
    }

    /// The golden rings with `edits` re-encoded (only rings that differ from what the device
    /// holds are written), then the first tbt step.
    fn trial(&mut self, s: &mut Session, edits: &[(usize, Layout)]) -> Result<LogitComparison> {
        for i in 0..self.infos.len() {
            let want = edits.iter().find(|e| e.0 == i).map(|e| e.1);
            if self.written[i] != Some(want) {
                let bytes = match want {
                    Some(lay) => self.reencoded(i, lay),
                    None => self.golden[&self.infos[i].cache_id].clone(),
                };
                let step = "of re-encoded entries (inject probe's layout search)";
                cache_io::write(s.dev, self.infos[i].cache_id, &bytes, step)?;
                self.written[i] = Some(want);
            }
        }
        self.trials += 1;
        let out = s.driver.trial_step(s.dev, self.query, &MaskMode::Ring)?;
        Ok(compare(&out.logits, self.reference))
    }

    /// Leaves every ring golden token-major, as the searches before this one left them.
    fn restore(&mut self, s: &mut Session) -> Result<()> {
        for i in 0..self.infos.len() {
            if self.written[i].is_some_and(|w| w.is_some()) {
                let id = self.infos[i].cache_id;
                let step = "restoring the golden entries (inject probe's layout search)";
                cache_io::write(s.dev, id, &self.golden[&id], step)?;
                self.written[i] = Some(None);
            }
        }
        Ok(())
    }

    /// Ring `i`'s golden bytes with its read window re-encoded in `lay`; the slot outside the
    /// window (the step's write slot) and every slot's padding keep their bytes.
    fn reencoded(&self, i: usize, lay: Layout) -> Vec<u8> {
        let info = &self.infos[i];
        let (e, ep) = (info.entry_size, info.padded_entry_size);
        let w = self.window;
        let slot = |k: usize| (w.start + k) % w.cache_len * ep;
        let mut ring = self.golden[&info.cache_id].clone();
        let mut block = Vec::with_capacity(w.len * e);
        for k in 0..w.len {
            block.extend_from_slice(&ring[slot(k)..slot(k) + e]);
        }
        let mut stream = Vec::new();
        layout::encode(lay, self.shape(i), &block, &mut stream);
        for k in 0..w.len {
            ring[slot(k)..slot(k) + e].copy_from_slice(&stream[k * e..(k + 1) * e]);
        }
        ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layer 1 misread: layer 2's written entry jumps 40-fold over everything below it, the
    /// later layers only carry the damage on; the last layer ranks as a mild jump.
    #[test]
    fn the_layer_below_the_first_jump_ranks_first() {
        assert_eq!(likeliest_layers(&[0.01, 0.012, 0.5, 0.55]), vec![1, 3, 0]);
        // nothing jumps: the last layer, which no write can show, first
        assert_eq!(likeliest_layers(&[0.01, 0.011, 0.012])[0], 2);
    }

    /// A reader decoding the re-encoded window in the same layout gets the golden window back,
    /// and the write slot outside the window is untouched.
    #[test]
    fn reencoded_window_decodes_to_the_golden_one() {
        let info = CacheInfo {
            cache_id: 0,
            layer: 0,
            kind: CacheKind::K,
            role_declared: true,
            entry_size: 16,
            padded_entry_size: 24,
            elem_bytes: 1,
            features: 16,
            expanded: false,
            prefill_in: None,
            prefill_out: None,
            tbt_in: None,
            tbt_out: None,
            prefill_out_len: 4,
        };
        let l = 7;
        let ring: Vec<u8> = (0..l * 24).map(|b| (b * 7 % 251) as u8).collect();
        let infos = [info];
        let search = Search {
            infos: &infos,
            golden: BTreeMap::from([(0, ring.clone())]),
            window: Window {
                start: 5,
                len: 6,
                cache_len: l,
            },
            written: vec![None],
            query: 0,
            reference: &[],
            trials: 0,
            prompt: &KvState {
                layers: Vec::new(),
                positions: Vec::new(),
                ids: Vec::new(),
            },
        };
        for lay in [Layout::FeatureMajor, Layout::F8cr] {
            let out = search.reencoded(0, lay);
            assert_ne!(out, ring, "{lay:?}");
            let window: Vec<u8> = (0..6)
                .flat_map(|k| {
                    let o = (5 + k) % l * 24;
                    out[o..o + 16].to_vec()
                })
                .collect();
            let mut decoded = Vec::new();
            layout::decode(lay, search.shape(0), &window, &mut decoded);
            let golden: Vec<u8> = (0..6)
                .flat_map(|k| {
                    let o = (5 + k) % l * 24;
                    ring[o..o + 16].to_vec()
                })
                .collect();
            assert_eq!(decoded, golden, "{lay:?}");
            // slot 4 is the write slot (start − 1); padding bytes 16..24 of every slot stay
            assert_eq!(out[4 * 24..5 * 24], ring[4 * 24..5 * 24]);
            for slot in 0..l {
                assert_eq!(
                    out[slot * 24 + 16..slot * 24 + 24],
                    ring[slot * 24 + 16..slot * 24 + 24]
                );
            }
        }
    }
}
