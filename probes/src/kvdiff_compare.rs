//! `kvdiff`'s arithmetic: one comparison point's device cache against the f32 reference and the
//! precision-matched reference, per layer × KV head × position; the band the declared precision
//! allows; the first divergent layer; the first layer's K as a rotation of its RoPE pairs.
//!
//! The band of one head vector is what the declared precision costs there: the matched
//! reference's own distance from the f32 one, or the rounding of the declared format alone
//! (uniform rounding at a step s over d elements: s·√(d/12) in L2), whichever is larger. A
//! layer and head leave it when the device's mean distance from the matched reference exceeds
//! [`BAND_RATIO`] × the mean band, or a quarter of its positions (at least two) do (a fault that
//! moves only the entries tbt steps wrote).

use kvprobe_schema::{
    CacheKind, KvdiffDivergence, KvdiffRotation, KvdiffStep, KVDIFF_NON_FINITE as NON_FINITE,
};

use crate::kvdiff_cache::{KvRef, Rows};

/// How far past its precision a head vector may sit: the diagnosis's median-ratio criterion for
/// a stage failing against the matched reference (docs/diagnosis.md), per cache entry.
pub const BAND_RATIO: f64 = 2.5;
/// Fraction of a layer and head's positions outside their band that makes the layer divergent.
pub const OUTSIDE_FRACTION: f64 = 0.25;

/// The rounding a cache format costs one element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rounding {
    /// An integer code of this step (the writer's declared scale).
    Step(f64),
    /// A float format with this unit roundoff (fp16: 2⁻¹¹; f32: 2⁻²⁴).
    Relative(f64),
    /// A graph computing in a float format: this relative L2 for the whole vector.
    Arithmetic(f64),
}

impl Rounding {
    /// Expected L2 of the rounding error of `v`.
    fn l2(&self, v: &[f32]) -> f64 {
        match *self {
            Rounding::Step(s) => s * (v.len() as f64 / 12.0).sqrt(),
            Rounding::Relative(u) => u * norm(v) / 3f64.sqrt(),
            Rounding::Arithmetic(r) => r * norm(v),
        }
    }
}

/// The three references of one comparison point, `[layer][position]` rows.
pub struct Point<'a> {
    pub device: (&'a Rows, &'a Rows),
    pub reference: KvRef<'a>,
    pub matched: KvRef<'a>,
    /// Per layer: K and V rounding.
    pub rounding: &'a [[Rounding; 2]],
    pub n_kv: usize,
    pub head_dim: usize,
}

/// Per layer, kind, head and position: (rel L2 vs f32, cosine vs f32, rel L2 vs matched, band).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cell {
    pub rel_l2: f64,
    pub cosine: f64,
    pub matched_rel_l2: f64,
    pub band: f64,
}

impl Cell {
    pub fn outside(&self) -> bool {
        self.matched_rel_l2 > BAND_RATIO * self.band
    }
}

/// `[layer][kind 0 = K, 1 = V][head][position]`; `None` = position not in the cache.
pub type Cells = Vec<[Vec<Vec<Option<Cell>>>; 2]>;

pub fn norm(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

/// ‖a − b‖ / max(‖b‖, tiny); [`kvprobe_schema::KVDIFF_NON_FINITE`] when `a` or `b` holds inf or NaN (the device's
/// entry is as far as a number can be, and results.json can still hold it).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 - y as f64)
        .map(|e| e * e)
        .sum();
    let r = d.sqrt() / norm(b).max(1e-12);
    if r.is_finite() {
        r
    } else {
        NON_FINITE
    }
}

/// Cells of the positions the device's rows hold (the references may hold more).
pub fn cells<'a>(pt: &Point<'a>) -> Cells {
    let hd = pt.head_dim;
    let layers = pt.device.0.len();
    (0..layers)
        .map(|l| {
            let rows = [
                (&pt.device.0[l], &pt.reference.0[l], &pt.matched.0[l]),
                (&pt.device.1[l], &pt.reference.1[l], &pt.matched.1[l]),
            ];
            let mut out: [Vec<Vec<Option<Cell>>>; 2] = [Vec::new(), Vec::new()];
            for (kind, (dev, r, m)) in rows.into_iter().enumerate() {
                let round = pt.rounding[l][kind];
                out[kind] = (0..pt.n_kv)
                    .map(|h| {
                        (0..dev.len())
                            .map(|p| {
                                let head = |x: &'a Vec<Vec<f32>>| -> Option<&'a [f32]> {
                                    x.get(p).and_then(|row| row.get(h * hd..(h + 1) * hd))
                                };
                                let (d, r, m) = (head(dev)?, head(r)?, head(m)?);
                                let rn = norm(r).max(1e-12);
                                let floor = round.l2(r) / rn;
                                Some(Cell {
                                    rel_l2: rel_l2(d, r),
                                    cosine: crate::metrics::cosine(d, r),
                                    matched_rel_l2: rel_l2(d, m),
                                    band: rel_l2(m, r).max(floor),
                                })
                            })
                            .collect()
                    })
                    .collect();
            }
            out
        })
        .collect()
}

/// Whether one layer, kind and head leaves its band.
pub fn head_outside(cells: &[Option<Cell>]) -> bool {
    let held: Vec<&Cell> = cells.iter().flatten().collect();
    if held.is_empty() {
        return false;
    }
    let n = held.len() as f64;
    let miss = held.iter().map(|c| c.matched_rel_l2).sum::<f64>() / n;
    let band = held.iter().map(|c| c.band).sum::<f64>() / n;
    let outside = held.iter().filter(|c| c.outside()).count() as f64;
    // one position alone is no layer: a short prompt's quarter can be a single entry
    miss > BAND_RATIO * band || (outside >= 2.0 && outside >= OUTSIDE_FRACTION * n)
}

/// The step's summary and its first divergent layer (then head, K before V).
pub fn step(step: usize, c: &Cells) -> KvdiffStep {
    let agg = |kind: usize, f: fn(&Cell) -> f64, max: bool| -> Vec<Vec<f64>> {
        c.iter()
            .map(|layer| {
                layer[kind]
                    .iter()
                    .map(|head| {
                        let it = head.iter().flatten().map(f);
                        if max {
                            it.fold(0.0, f64::max)
                        } else {
                            it.fold(1.0, f64::min)
                        }
                    })
                    .collect()
            })
            .collect()
    };
    let positions = c
        .first()
        .and_then(|l| l[0].first())
        .map_or(0, |h| h.iter().flatten().count());
    KvdiffStep {
        step,
        positions,
        k_rel_l2: agg(0, |x| x.rel_l2, true),
        v_rel_l2: agg(1, |x| x.rel_l2, true),
        k_cosine: agg(0, |x| x.cosine, false),
        v_cosine: agg(1, |x| x.cosine, false),
        first_divergent: first_divergent(step, c),
    }
}

/// Over the comparison points: the lowest layer (then head, K before V) ever outside its band,
/// at the first point it is (a fault in layer L shows first in the entries few tbt steps wrote,
/// where a later layer's larger miss may cross its band earlier).
pub fn first_over_steps(steps: &[KvdiffStep]) -> Option<KvdiffDivergence> {
    let key = |d: &KvdiffDivergence| (d.layer, d.kv_head, d.kind == CacheKind::V, d.step);
    steps
        .iter()
        .filter_map(|s| s.first_divergent.as_ref())
        .min_by_key(|d| key(d))
        .cloned()
}

fn first_divergent(step: usize, c: &Cells) -> Option<KvdiffDivergence> {
    for (layer, kinds) in c.iter().enumerate() {
        for h in 0..kinds[0].len() {
            for (kind, heads) in kinds.iter().enumerate() {
                let cells = &heads[h];
                if !head_outside(cells) {
                    continue;
                }
                let (position, worst) = cells
                    .iter()
                    .enumerate()
                    .filter_map(|(p, x)| x.map(|x| (p, x)))
                    .max_by(|a, b| a.1.matched_rel_l2.total_cmp(&b.1.matched_rel_l2))?;
                return Some(KvdiffDivergence {
                    step,
                    layer,
                    kv_head: h,
                    kind: if kind == 0 {
                        CacheKind::K
                    } else {
                        CacheKind::V
                    },
                    position,
                    rel_l2: worst.rel_l2,
                    matched_rel_l2: worst.matched_rel_l2,
                    band: worst.band,
                    positions_outside: cells.iter().flatten().filter(|x| x.outside()).count(),
                });
            }
        }
    }
    None
}

/// `[layer][position]`: the largest relative L2 over heads (−1 = not in the cache), K and V; and
/// whether some head's cell is outside its band.
/// `(k_map, v_map, outside_map)`, each `[layer][position]`.
pub type Maps = (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<Vec<bool>>);

pub fn maps(c: &Cells) -> Maps {
    let map = |kind: usize| -> Vec<Vec<f64>> {
        c.iter()
            .map(|layer| {
                let heads = &layer[kind];
                let n = heads.first().map_or(0, Vec::len);
                (0..n)
                    .map(|p| {
                        heads
                            .iter()
                            .filter_map(|h| h[p].map(|x| x.rel_l2))
                            .fold(-1.0, f64::max)
                    })
                    .collect()
            })
            .collect()
    };
    let outside = c
        .iter()
        .map(|layer| {
            let n = layer[0].first().map_or(0, Vec::len);
            (0..n)
                .map(|p| {
                    layer
                        .iter()
                        .flatten()
                        .any(|h| h[p].is_some_and(|x| x.outside()))
                })
                .collect()
        })
        .collect();
    (map(0), map(1), outside)
}

/// Whether some KV head of the first layer's K leaves its band.
pub fn first_layer_k_outside(c: &Cells) -> bool {
    c.first()
        .is_some_and(|kinds| kinds[0].iter().any(|h| head_outside(h)))
}

/// The first layer's K as a rotation of its RoPE pairs `(i, i + hd/2)`: per position and pair,
/// the one angle (shared by the KV heads) that best turns the device's pairs onto the
/// reference's; `None` without K rows.
pub fn first_layer_rotation(pt: &Point, c: &Cells) -> Option<KvdiffRotation> {
    let (hd, n_kv) = (pt.head_dim, pt.n_kv);
    let half = hd / 2;
    let (dev, r, m) = (
        pt.device.0.first()?,
        pt.reference.0.first()?,
        pt.matched.0.first()?,
    );
    let kinds = c.first()?;
    let mut angle_sum = vec![0f64; half];
    let mut counted = 0usize;
    let mut rotated_cells: Vec<Vec<Option<Cell>>> = vec![Vec::new(); n_kv];
    for p in 0..dev.len() {
        let (d, rr, mm) = (&dev[p], r.get(p)?, m.get(p)?);
        if d.len() < n_kv * hd || rr.len() < n_kv * hd || mm.len() < n_kv * hd {
            rotated_cells.iter_mut().for_each(|h| h.push(None));
            continue;
        }
        let mut out = d.clone();
        for (i, sum) in angle_sum.iter_mut().enumerate() {
            let (mut dot, mut cross) = (0f64, 0f64);
            for h in 0..n_kv {
                let (a, b) = (h * hd + i, h * hd + i + half);
                let (rx, ry) = (rr[a] as f64, rr[b] as f64);
                let (dx, dy) = (d[a] as f64, d[b] as f64);
                dot += rx * dx + ry * dy;
                cross += dx * ry - dy * rx;
            }
            // the angle that turns the device's pairs onto the reference's
            let delta = cross.atan2(dot);
            *sum += delta.abs();
            let (s, co) = delta.sin_cos();
            for h in 0..n_kv {
                let (a, b) = (h * hd + i, h * hd + i + half);
                let (dx, dy) = (d[a] as f64, d[b] as f64);
                out[a] = (dx * co - dy * s) as f32;
                out[b] = (dx * s + dy * co) as f32;
            }
        }
        counted += 1;
        for (h, cells) in rotated_cells.iter_mut().enumerate() {
            let band = kinds[0][h][p].map_or(0.0, |x| x.band);
            let seg = h * hd..(h + 1) * hd;
            cells.push(Some(Cell {
                rel_l2: rel_l2(&out[seg.clone()], &rr[seg.clone()]),
                cosine: 0.0,
                matched_rel_l2: rel_l2(&out[seg.clone()], &mm[seg]),
                band,
            }));
        }
    }
    if counted == 0 {
        return None;
    }
    let worst = |cells: &[Vec<Option<Cell>>], f: fn(&Cell) -> f64| {
        cells
            .iter()
            .flat_map(|h| h.iter().flatten().map(f))
            .fold(0.0, f64::max)
    };
    let k_out = first_layer_k_outside(c);
    let v_in = !kinds[1].iter().any(|h| head_outside(h));
    let rotated_in = !rotated_cells.iter().any(|h| head_outside(h));
    let band = kinds[0]
        .iter()
        .flat_map(|h| h.iter().flatten().map(|x| x.band))
        .fold(0.0, f64::max);
    Some(KvdiffRotation {
        layer: 0,
        step: 0,
        k_rel_l2: worst(&kinds[0], |x| x.rel_l2),
        rotated_rel_l2: worst(&rotated_cells, |x| x.rel_l2),
        v_rel_l2: worst(&kinds[1], |x| x.rel_l2),
        band,
        mean_angle_per_frequency: angle_sum.iter().map(|a| a / counted as f64).collect(),
        explained: k_out && v_in && rotated_in,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_l2_by_hand() {
        // ‖(0, 1)‖ / ‖(3, 4)‖ = 0.2
        assert!((rel_l2(&[3.0, 5.0], &[3.0, 4.0]) - 0.2).abs() < 1e-12);
        assert_eq!(rel_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn uniform_rounding_floor_by_hand() {
        // 12 elements at step 0.5: 0.5 · √(12 / 12) = 0.5
        assert!((Rounding::Step(0.5).l2(&[1.0; 12]) - 0.5).abs() < 1e-12);
    }

    fn cell(miss: f64, band: f64) -> Option<Cell> {
        Some(Cell {
            rel_l2: miss,
            cosine: 1.0,
            matched_rel_l2: miss,
            band,
        })
    }

    #[test]
    fn a_head_leaves_its_band_on_the_mean_or_a_quarter_of_its_positions() {
        // every position at 2× its band: inside (2 < 2.5)
        assert!(!head_outside(&[cell(0.02, 0.01), cell(0.02, 0.01), None]));
        // mean 3× the band: outside
        assert!(head_outside(&[cell(0.03, 0.01), cell(0.03, 0.01)]));
        // one of four positions far out, mean 0.0325 ≥ 2.5 × 0.01: outside either way
        assert!(head_outside(&[
            cell(0.1, 0.01),
            cell(0.01, 0.01),
            cell(0.01, 0.01),
            cell(0.01, 0.01)
        ]));
        // two of eight slightly out (3×): the mean stays inside (0.015), a quarter is out
        let mut eight = vec![cell(0.01, 0.01); 8];
        eight[0] = cell(0.03, 0.01);
        assert!(!head_outside(&eight), "one position alone is no layer");
        eight[5] = cell(0.03, 0.01);
        assert!(head_outside(&eight));
        // one of five slightly out (3×): the mean stays inside and 1/5 < 1/4
        assert!(!head_outside(&[
            cell(0.03, 0.01),
            cell(0.01, 0.01),
            cell(0.01, 0.01),
            cell(0.01, 0.01),
            cell(0.01, 0.01)
        ]));
    }

    #[test]
    fn the_lowest_layer_ever_outside_is_the_first_divergent() {
        let d = |step, layer| KvdiffDivergence {
            step,
            layer,
            kv_head: 0,
            kind: CacheKind::V,
            position: 0,
            rel_l2: 1.0,
            matched_rel_l2: 1.0,
            band: 0.1,
            positions_outside: 1,
        };
        let st = |step, first: Option<KvdiffDivergence>| KvdiffStep {
            step,
            positions: 1,
            k_rel_l2: Vec::new(),
            v_rel_l2: Vec::new(),
            k_cosine: Vec::new(),
            v_cosine: Vec::new(),
            first_divergent: first,
        };
        // layer 5 crosses at step 1, layer 3 only at step 3: layer 3 (at step 3)
        let steps = [st(0, None), st(1, Some(d(1, 5))), st(3, Some(d(3, 3)))];
        let f = first_over_steps(&steps).expect("some");
        assert_eq!((f.layer, f.step), (3, 3));
        assert!(first_over_steps(&steps[..1]).is_none());
    }

    /// One layer, one head of 4 dims (pairs (0, 2) and (1, 3)), two positions.
    #[test]
    fn a_rotated_first_layer_k_is_explained_and_a_scaled_one_is_not() {
        let r: Rows = vec![vec![vec![1.0, 0.0, 0.0, 1.0], vec![0.5, 0.5, 0.5, -0.5]]];
        let v: Rows = vec![vec![vec![1.0; 4], vec![2.0; 4]]];
        // pair (0, 2) of position 1 turned by 90°: (0.5, 0.5) → (−0.5, 0.5)
        let mut rot = r.clone();
        rot[0][1] = vec![-0.5, 0.5, 0.5, -0.5];
        let round = [[Rounding::Relative(1e-7); 2]];
        let run = |dev_k: &Rows| {
            let pt = Point {
                device: (dev_k, &v),
                reference: (&r, &v),
                matched: (&r, &v),
                rounding: &round,
                n_kv: 1,
                head_dim: 4,
            };
            let c = cells(&pt);
            (step(0, &c), first_layer_rotation(&pt, &c).expect("rows"))
        };
        let (st, rotation) = run(&rot);
        let d = st.first_divergent.expect("layer 0 K leaves the band");
        assert_eq!((d.layer, d.kind, d.position), (0, CacheKind::K, 1));
        assert!(rotation.explained, "{rotation:?}");
        assert!((rotation.mean_angle_per_frequency[0] - std::f64::consts::FRAC_PI_4).abs() < 1e-6);
        // K scaled by 2: no rotation repairs a norm
        let scaled: Rows = vec![r[0]
            .iter()
            .map(|x| x.iter().map(|y| 2.0 * y).collect())
            .collect()];
        assert!(!run(&scaled).1.explained);
        // healthy: nothing divergent, nothing to explain
        let (st, rotation) = run(&r);
        assert!(st.first_divergent.is_none() && !rotation.explained);
    }
}
