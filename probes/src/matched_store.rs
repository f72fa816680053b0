//! The precision-matched reference's cache (`matched`): the K/V rows a ring or state holds,
//! rounded as written, and a session's memory of its last greedy drive (issue 34: the greedy
//! probe and the chat's first turn drive the same prompt and replies; driven once).

use std::sync::Mutex;

use candle_core::{Device as CDevice, Tensor};
use kvprobe_reference::{LayerKv, Model};

use crate::matched::Precision;

use crate::matched_edges::Round;
use crate::Result;

/// K/V rows already rounded as the cache holds them: per layer, per position, `[n_kv][hd]`.
#[derive(Clone)]
pub(crate) struct Store {
    pub(crate) k: Vec<Vec<Vec<f32>>>,
    pub(crate) v: Vec<Vec<Vec<f32>>>,
    n_kv: usize,
    hd: usize,
}

impl Store {
    /// An empty store for `model`'s layers and KV heads.
    pub(crate) fn new(model: &Model) -> Store {
        let c = model.config();
        Store {
            k: vec![Vec::new(); c.n_layers],
            v: vec![Vec::new(); c.n_layers],
            n_kv: c.n_kv_heads,
            hd: c.head_dim,
        }
    }

    /// Past tensors `[n_kv, W, hd]` of positions `from..to`.
    pub(crate) fn past(&self, from: usize, to: usize) -> Result<Vec<LayerKv>> {
        let w = to - from;
        if w == 0 {
            return Ok(Vec::new());
        }
        let gather = |rows: &[Vec<f32>]| -> Result<Tensor> {
            let mut out = vec![0f32; self.n_kv * w * self.hd];
            for (j, row) in rows[from..to].iter().enumerate() {
                for h in 0..self.n_kv {
                    let dst = (h * w + j) * self.hd;
                    out[dst..dst + self.hd].copy_from_slice(&row[h * self.hd..(h + 1) * self.hd]);
                }
            }
            Ok(Tensor::from_vec(
                out,
                (self.n_kv, w, self.hd),
                &CDevice::Cpu,
            )?)
        };
        self.k
            .iter()
            .zip(&self.v)
            .map(|(k, v)| {
                Ok(LayerKv {
                    k: gather(k)?,
                    v: gather(v)?,
                })
            })
            .collect()
    }

    /// Appends the new rows (`[n_kv, T, hd]` per layer), rounded as each ring holds them.
    pub(crate) fn push(&mut self, new_kv: &[LayerKv], round: &[[Round; 2]]) -> Result<()> {
        for (layer, kv) in new_kv.iter().enumerate() {
            for (which, t) in [(0, &kv.k), (1, &kv.v)] {
                let (h, rows, hd) = t.dims3()?;
                let flat: Vec<f32> = t.flatten_all()?.to_vec1()?;
                for r in 0..rows {
                    let mut row = Vec::with_capacity(h * hd);
                    for head in 0..h {
                        let src = (head * rows + r) * hd;
                        row.extend_from_slice(&flat[src..src + hd]);
                    }
                    round[layer][which].apply(&mut row);
                    let dst = if which == 0 { &mut self.k } else { &mut self.v };
                    dst[layer].push(row);
                }
            }
        }
        Ok(())
    }
}

impl Store {
    /// The last `q` positions' rows rolled by `r`: position `i` of them then holds what position
    /// `i + r` (mod `q`) held, K and V of every layer (`crate::host_slots`: a run's presents
    /// stored rolled).
    pub(crate) fn roll_last(&mut self, q: usize, r: usize) {
        for rows in self.k.iter_mut().chain(self.v.iter_mut()) {
            let n = rows.len();
            if q > 0 && q <= n {
                rows[n - q..].rotate_left(r % q);
            }
        }
    }
}

impl Store {
    /// The same store cut to its first `positions` positions.
    fn truncated(&self, positions: usize) -> Store {
        let cut = |x: &Vec<Vec<Vec<f32>>>| {
            x.iter()
                .map(|l| l[..positions.min(l.len())].to_vec())
                .collect()
        };
        Store {
            k: cut(&self.k),
            v: cut(&self.v),
            n_kv: self.n_kv,
            hd: self.hd,
        }
    }
}

/// One session's last greedy drive of the matched reference (`matched::greedy_logits_shared`):
/// the tokens driven, its geometry (prompt length, cache length, prefill length), the store
/// after its last step and each step's logits. The session's description and model fix the
/// precision, so tokens and geometry are the whole key.
#[derive(Default)]
pub struct DriveMemo(Mutex<Option<Drive>>);

struct Drive {
    seq: Vec<u32>,
    geometry: (usize, usize, usize),
    store: Store,
    logits: Vec<Vec<f32>>,
}

impl DriveMemo {
    /// The remembered steps that `seq` (prompt then tokens) shares with the last drive — step t
    /// reads positions up to n − 1 + t, so it is shared when the first n + t tokens are — and
    /// the store after the last of them, cut to its positions; none when nothing is shared.
    pub(crate) fn resume(
        &self,
        seq: &[u32],
        geometry: (usize, usize, usize),
        steps: usize,
    ) -> (Vec<Vec<f32>>, Option<Store>) {
        let Ok(m) = self.0.lock() else {
            return (Vec::new(), None);
        };
        let Some(d) = m.as_ref().filter(|d| d.geometry == geometry) else {
            return (Vec::new(), None);
        };
        let n = geometry.0;
        let common = d.seq.iter().zip(seq).take_while(|(a, b)| a == b).count();
        if common < n {
            return (Vec::new(), None);
        }
        let r = (common - n + 1).min(d.logits.len()).min(steps);
        if r == 0 {
            return (Vec::new(), None);
        }
        (d.logits[..r].to_vec(), Some(d.store.truncated(n + r - 1)))
    }

    /// Remembers a drive (the last one replaces the one before).
    pub(crate) fn keep(
        &self,
        seq: &[u32],
        geometry: (usize, usize, usize),
        store: Store,
        logits: &[Vec<f32>],
    ) {
        if let Ok(mut m) = self.0.lock() {
            *m = Some(Drive {
                seq: seq.to_vec(),
                geometry,
                store,
                logits: logits.to_vec(),
            });
        }
    }
}

/// [`greedy_logits`] through this session's `memo`: the steps a remembered run of the same
/// prompt and geometry already computed on the same tokens are taken from it (greedy's 32
/// steps and the chat's first turn share the prompt and its first replies), the rest driven from
/// its store. Exact: a step's logits and K/V depend only on the tokens up to it. A run whose
/// fp16 arithmetic overflowed is not reused (the overflow is reported per run).
/// `geometry` as [`drive`]'s.
pub fn greedy_logits_shared(
    (memo, model): (&DriveMemo, &Model),
    p: &Precision,
    seq: &[u32],
    geometry: (usize, usize, usize, usize),
) -> Result<Vec<Vec<f32>>> {
    let (n, steps, cache_len, prefill_len) = geometry;
    let driven = &seq[..(n + steps.max(1) - 1).min(seq.len())];
    let (mut out, resume) = memo.resume(driven, (n, cache_len, prefill_len), steps);
    let r = out.len();
    let store = crate::matched::drive_from(
        model,
        p,
        seq,
        geometry,
        resume.map(|s| (s, r)),
        &mut |l, _, _| {
            out.push(l);
            Ok(())
        },
    )?;
    let overflowed = p.overflow.lock().map_or(true, |o| o.is_some());
    if !overflowed {
        memo.keep(driven, (n, cache_len, prefill_len), store, &out);
    }
    Ok(out)
}

/// [`crate::matched::drive`] through this session's `memo`: after the prefill and each step,
/// `each(logits, k, v)` with what a fresh drive gives there. The steps a remembered drive of the
/// same prompt and geometry already ran on the same tokens come from its store cut to each step's
/// positions (a step only appends its rows, so the store after step t is the first n + t
/// positions of any later one), the rest are driven from it. The memory keeps the longer drive it
/// has (kvdiff's few steps after greedy's whole run).
pub(crate) fn drive_shared(
    (memo, model): (&DriveMemo, &Model),
    p: &Precision,
    seq: &[u32],
    geometry: (usize, usize, usize, usize),
    each: &mut crate::matched::OnStep,
) -> Result<()> {
    let (n, steps, cache_len, prefill_len) = geometry;
    let driven = &seq[..(n + steps.max(1) - 1).min(seq.len())];
    let (kept, resume) = memo.resume(driven, (n, cache_len, prefill_len), steps);
    let r = kept.len();
    if let Some(store) = &resume {
        for (t, logits) in kept.into_iter().enumerate() {
            let at = store.truncated(n + t);
            each(logits, &at.k, &at.v)?;
        }
    }
    crate::matched::drive_from(model, p, seq, geometry, resume.map(|s| (s, r)), each)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvprobe_npu::Device;
    use kvprobe_reference::Model;

    use super::DriveMemo;
    use crate::matched::{greedy_logits, greedy_logits_shared, Precision};

    /// A drive that shares its prompt and first tokens with the remembered one takes those
    /// steps from it and gives, bit for bit, what a drive from nothing gives.
    #[test]
    fn a_shared_drive_gives_a_fresh_drives_logits() {
        let dir = tempfile::tempdir().expect("tempdir");
        kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 7).expect("fixture");
        let model = Arc::new(Model::load(dir.path()).expect("load"));
        let opts = kvprobe_npu::sim::SimOptions {
            cache_len: 24,
            prefill_len: 8,
            ..Default::default()
        };
        let dev = kvprobe_npu::sim::SimDevice::new(model.clone(), opts).expect("emulator");
        let p = Precision::of(dev.describe(), &model)
            .expect("precision")
            .expect("the emulator declares its precision");
        let a: Vec<u32> = (0..20).map(|i| 3 + (i * 37) % 250).collect();
        let mut b = a.clone();
        b[14] = 5;
        let n = 10;
        let memo = DriveMemo::default();
        let first = greedy_logits_shared((&memo, &model), &p, &a, (n, 11, 24, 8)).expect("a");
        assert_eq!(
            first,
            greedy_logits(&model, &p, &a, n, 11, 24, 8).expect("a fresh")
        );
        // steps 0..=4 read positions up to 13, before the first differing token
        let (kept, store) = memo.resume(&b[..17], (n, 24, 8), 8);
        assert_eq!((kept.len(), store.map(|s| s.k[0].len())), (5, Some(n + 4)));
        let second = greedy_logits_shared((&memo, &model), &p, &b, (n, 8, 24, 8)).expect("b");
        assert_eq!(second[..5], first[..5]);
        assert_eq!(
            second,
            greedy_logits(&model, &p, &b, n, 8, 24, 8).expect("b fresh")
        );
        // another geometry shares nothing
        assert!(memo.resume(&b[..17], (n, 32, 8), 8).1.is_none());
    }
}
