//! A layer scope grown from the residual (issue 34, docs/diagnosis.md "Scope grown from the
//! residual"). A fault on a subset of layers is hypothesised only at the layers a probe or
//! kvdiff names, so its closest replay can cover the first faulty layer alone and not
//! reproduce. The device's rings and that replay's rings, both driven on the device's greedy
//! tokens from a fresh start, then first part at the next faulty layer (or, for a reader's fault,
//! the layer after it). That layer and the layer before it each join the scope, and the scorer
//! (`evidence::beats_healthy` at the declared precision) judges the grown replays. Rings that
//! part nowhere while the replay does not reproduce leave one layer no ring shows, the last
//! layer's reader: it is toggled. Growth stops when one reproduces, when the residual adds no
//! layer, or after as many rounds as the model has layers (each round changes a layer).
//!
//! Where device and replay part is decided by kvdiff's band with the replay in place of the
//! precision-matched reference: both sides run the same arithmetic, so the band of a head vector
//! is the rounding of the cache's declared format alone (`kvdiff::rounding`), and an entry parts
//! when it leaves `BAND_RATIO` × that band (kvdiff's test of one entry, `Cell::outside`). A ring
//! parts at its first such entry: kvdiff averages a head's positions because a device's healthy
//! arithmetic spreads around the reference's, while a replay's spreads nowhere, and a tbt step's
//! fault moves only the entries the few compared steps wrote. No constant is new.

use kvprobe_reference::Model;
use kvprobe_schema::{CacheKind, DeviceDescription, FaultHypothesis, Replay};

use super::replay::in_replay;
use super::replayer::Replayer;
use crate::cache_io::{self, Rings};
use crate::determinism::request_step;
use crate::kvdiff::rounding;
use crate::kvdiff_cache::CacheView;
use crate::kvdiff_compare::{self as cmp, Cell, Cells, Point, Rounding};

/// The first ring (layer, kind) where the device's rings leave a replay's, `None` where none does.
pub(super) type Residual = Option<(usize, CacheKind)>;

/// The layer sets a scope of `layers` grows to when the residual first parts at `first`: the
/// layer itself (a writer's or a binding's fault shows at its own layer) and the layer before it
/// (a reader's fault leaves its own layer's stored K/V right and shows one layer later), each
/// added alone, those already in the scope skipped. Nothing when the residual is empty, when the
/// scope already holds every layer (no `layer=` items), or when both layers are in it: the
/// residual then adds nothing. A parting at `n_layers` (past the last ring: no ring apart, yet
/// the replay does not reproduce) can only be the last layer's reader, which no ring shows: its
/// one set is the scope with the last layer toggled, decided by the replay alone.
pub(super) fn grown(first: Residual, layers: &[usize], n_layers: usize) -> Vec<Vec<usize>> {
    let Some((layer, _)) = first.filter(|_| !layers.is_empty()) else {
        return Vec::new();
    };
    if layer >= n_layers {
        let last = n_layers.saturating_sub(1);
        let toggled: Vec<usize> = match layers.contains(&last) {
            true => layers.iter().copied().filter(|&l| l != last).collect(),
            false => layers.iter().copied().chain([last]).collect(),
        };
        return [toggled].into_iter().filter(|t| !t.is_empty()).collect();
    }
    [Some(layer), layer.checked_sub(1)]
        .into_iter()
        .flatten()
        .filter(|l| !layers.contains(l))
        .map(|l| {
            let mut set = layers.to_vec();
            set.push(l);
            set.sort_unstable();
            set
        })
        .collect()
}

/// Where a non-reproducing replay's rings part from the device's, for growth: where they do, or
/// past the last ring (`n_layers`) where none does (`grown`).
fn parting(r: Residual, n_layers: usize) -> (usize, CacheKind) {
    r.unwrap_or((n_layers, CacheKind::K))
}

/// The grown replays, in the order they ran, and how many residuals were read (each one replay
/// of the compared steps that reads its rings).
#[derive(Debug, Default)]
pub(super) struct Growth {
    pub replays: Vec<Replay>,
    pub residuals: usize,
    /// Each round's hypothesis and where its rings first left the device's (`None`: nowhere).
    pub path: Vec<(String, Residual)>,
}

impl Growth {
    /// The replay budget line's words for it (nothing when no residual was read).
    pub(super) fn said(&self, k: usize) -> String {
        if self.residuals == 0 {
            return String::new();
        }
        let path: Vec<String> = self
            .path
            .iter()
            .map(|(h, r)| match r {
                Some((l, kind)) => format!("{h} parts from the device at layer {l} {kind:?}"),
                None => format!("{h} leaves no ring apart"),
            })
            .collect();
        format!(
            "; {} of them replayed the first {k} steps to read the rings for a residual, and {} \
             grown layer scopes were replayed over every step ({})",
            self.residuals,
            self.replays.len(),
            if path.is_empty() {
                "the rings could not be compared".to_string()
            } else {
                path.join("; ")
            }
        )
    }
}

/// Where growth starts: for each kind of hypothesis (a fault with its value and ring kinds:
/// everything growth leaves as it is), its scopes of some layers, closest first. The kinds
/// replayed over every step come first, closest replay first, then the ones only screened, by
/// their screen's summed miss (`screened`). A kind the screen ranked below the whole replays is
/// otherwise never seen by a residual, and its residual can name the layer its scope lacked (a
/// reader decoding f8cr K and V on layers 0 and 4, screened at layer 0 and ranked below the
/// truncations and other readers there: sweep seed 2504 #285). `grow` reads one residual per
/// kind, and a kind's next scope only when the one before is refuted inside its own scope.
pub(super) fn starts(
    whole: &[Replay],
    screened: &[(f64, FaultHypothesis)],
) -> Vec<Vec<FaultHypothesis>> {
    let mut replayed: Vec<&Replay> = whole.iter().collect();
    replayed.sort_by(|a, b| a.replay_miss.total_cmp(&b.replay_miss));
    let mut screen: Vec<&(f64, FaultHypothesis)> = screened.iter().collect();
    screen.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<Vec<FaultHypothesis>> = Vec::new();
    let ranked = replayed.into_iter().map(|r| &r.fault);
    for h in ranked.chain(screen.into_iter().map(|s| &s.1)) {
        if h.layers.is_empty() {
            continue;
        }
        let same_kind = |o: &FaultHypothesis| {
            FaultHypothesis {
                layers: h.layers.clone(),
                ..o.clone()
            } == *h
        };
        match out.iter_mut().find(|k| same_kind(&k[0])) {
            Some(kind) if !kind.contains(h) => kind.push(h.clone()),
            Some(_) => {}
            None => out.push(vec![h.clone()]),
        }
    }
    out
}

/// Whether a residual parts inside its hypothesis' own scope: the rings first part at a layer
/// the hypothesis holds, every layer below agreeing. For a writer's or a binding's fault that
/// refutes the layer, and growth (which only adds layers) cannot mend it: a layer added above
/// cannot change what the refuted layer stores, one added below parts there. Only for a reader's
/// fault does the layer before still explain it (`grown`). So the start stays, and its kind's
/// next scope is read too (sweep seed 6302 #360: `kv-swap` on layers 13 and 20, whose closest
/// single-layer replay by a hair was layer 12, parting at layer 12).
fn parts_inside(h: &FaultHypothesis, r: Residual) -> bool {
    r.is_some_and(|(l, _)| h.layers.contains(&l))
}

/// Grows a scope of `starts` (hypotheses no replay of which reproduces) round by round:
/// `residual(h)` compares `h`'s rings with the device's, `run(h)` replays `h` over every compared
/// step. Every start's residual is read first (at most `n_layers` of them, in `starts`' order),
/// and growth goes on from the start whose rings follow the device's furthest (the deepest
/// residual: it explains the most leading layers), then the next. Each round replays
/// [`grown`]'s sets and goes on from the closest; a start ends when its residual adds nothing or
/// cannot be read, growth ends when a grown replay reproduces or after `n_layers` rounds.
pub(super) fn grow(
    starts: &[Vec<FaultHypothesis>],
    n_layers: usize,
    residual: &mut dyn FnMut(&FaultHypothesis) -> Result<Residual, String>,
    run: &mut dyn FnMut(&FaultHypothesis) -> Result<Replay, String>,
) -> Growth {
    let mut out = Growth::default();
    let mut parted: Vec<(FaultHypothesis, (usize, CacheKind))> = Vec::new();
    'kinds: for kind in starts {
        for h in kind {
            if out.residuals >= n_layers {
                break 'kinds;
            }
            let Ok(first) = residual(h) else {
                continue 'kinds;
            };
            out.residuals += 1;
            out.path.push((h.text(), first));
            parted.push((h.clone(), parting(first, n_layers)));
            if !parts_inside(h, first) {
                continue 'kinds;
            }
        }
    }
    // deepest first (V parting after K at one layer is the deeper); stable, so ties keep
    // `starts`' order
    parted.sort_by_key(|(_, (l, k))| std::cmp::Reverse((*l, *k == CacheKind::V)));
    let mut rounds = 0;
    let mut ran: Vec<String> = Vec::new();
    for (start, at) in parted {
        let (mut current, mut first) = (start, at);
        while rounds < n_layers {
            rounds += 1;
            let mut round: Vec<Replay> = Vec::new();
            for layers in grown(Some(first), &current.layers, n_layers) {
                let h = FaultHypothesis {
                    layers,
                    ..current.clone()
                };
                if !ran.contains(&h.text()) {
                    ran.push(h.text());
                    round.extend(run(&h).ok());
                }
            }
            let next = round
                .iter()
                .min_by(|a, b| a.replay_miss.total_cmp(&b.replay_miss))
                .map(|r| r.fault.clone());
            let reproduced = round.iter().any(|r| r.reproduces);
            out.replays.extend(round);
            if reproduced {
                return out;
            }
            let Some(h) = next.filter(|_| rounds < n_layers) else {
                break;
            };
            let Ok(r) = residual(&h) else { break };
            out.residuals += 1;
            out.path.push((h.text(), r));
            (current, first) = (h, parting(r, n_layers));
        }
    }
    out
}

/// The device's rings against a replay's, per compared step (module doc).
pub(super) struct RingResidual {
    view: CacheView,
    rounding: Vec<[Rounding; 2]>,
    n_layers: usize,
    n_kv: usize,
    head_dim: usize,
    prompt: usize,
}

impl RingResidual {
    pub(super) fn of(
        desc: &DeviceDescription,
        model: &Model,
        prompt: usize,
    ) -> crate::Result<Self> {
        let c = model.config();
        Ok(RingResidual {
            view: CacheView::of(desc)?,
            rounding: rounding(desc, c.n_layers)?,
            n_layers: c.n_layers,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            prompt,
        })
    }

    /// The lowest ring where `device` leaves `replay` at any compared step (`[step]` rings, step
    /// 0 the prompt's prefill).
    pub(super) fn first(&self, device: &[&Rings], replay: &[Rings]) -> crate::Result<Residual> {
        let mut steps: Vec<(usize, CacheKind)> = Vec::with_capacity(device.len());
        for (k, (d, r)) in device.iter().zip(replay).enumerate() {
            let last = self.prompt - 1 + k;
            let d = self.view.rows(d, self.n_layers, self.prompt, last)?;
            let r = self.view.rows(r, self.n_layers, self.prompt, last)?;
            let cells = cmp::cells(&Point {
                device: (&d.0, &d.1),
                reference: (&r.0, &r.1),
                matched: (&r.0, &r.1),
                rounding: &self.rounding,
                n_kv: self.n_kv,
                head_dim: self.head_dim,
            });
            steps.extend(first_outside(&cells));
        }
        Ok(steps
            .into_iter()
            .min_by_key(|&(l, k)| (l, k == CacheKind::V)))
    }
}

/// The lowest layer (K before V) holding an entry outside its band.
fn first_outside(cells: &Cells) -> Residual {
    cells.iter().enumerate().find_map(|(layer, kinds)| {
        let kind = (0..2).find(|&k| kinds[k].iter().flatten().flatten().any(Cell::outside))?;
        Some((layer, [CacheKind::K, CacheKind::V][kind]))
    })
}

/// `fault` replayed over the first `k` steps on the device's `tokens` from a fresh start, its
/// rings read after each (as `DeviceSteps` steps the device and reads its rings; the replay ends
/// with the tokens, where `DeviceSteps` goes on on the device's argmax: `request_step`).
pub(super) fn replay_rings(
    session: (&Model, &[u32]),
    replayer: &dyn Replayer,
    fault: &FaultHypothesis,
    tokens: &[u32],
    k: usize,
) -> Result<Vec<Rings>, String> {
    in_replay(session, replayer, fault, |rs| {
        let mut out = Vec::with_capacity(k);
        for step in 0..k {
            if request_step(rs, step, tokens, None)
                .map_err(|e| e.to_string())?
                .is_none()
            {
                break;
            }
            let what = format!("after step {step} of a residual replay");
            out.push(cache_io::read(rs.dev, &what).map_err(|e| e.to_string())?);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::FaultValue;

    #[test]
    fn the_residual_adds_its_layer_and_the_one_before() {
        let k = Some((10, CacheKind::K));
        assert_eq!(grown(k, &[1], 30), vec![vec![1, 10], vec![1, 9]]);
        // the layer before already in the scope: the layer alone
        assert_eq!(
            grown(Some((5, CacheKind::V)), &[0, 4], 30),
            vec![vec![0, 4, 5]]
        );
        // layer 0 has no layer before it
        assert_eq!(grown(Some((0, CacheKind::V)), &[3], 30), vec![vec![0, 3]]);
        // nothing new, nothing parting, or every layer already: nothing to grow
        assert!(grown(Some((5, CacheKind::K)), &[4, 5], 30).is_empty());
        assert!(grown(None, &[4], 30).is_empty());
        assert!(grown(Some((5, CacheKind::K)), &[], 30).is_empty());
        // past the last ring: the last layer toggled, never an empty scope
        let past = Some((30, CacheKind::K));
        assert_eq!(grown(past, &[3, 23], 30), vec![vec![3, 23, 29]]);
        assert_eq!(grown(past, &[1, 2, 19, 29], 30), vec![vec![1, 2, 19]]);
        assert!(grown(past, &[29], 30).is_empty());
    }

    fn swap(layers: &[usize]) -> FaultHypothesis {
        FaultHypothesis {
            name: "kv-swap".into(),
            value: FaultValue::None,
            groups: vec![],
            kinds: vec![],
            layers: layers.to_vec(),
        }
    }

    fn replay(h: &FaultHypothesis, device: &[usize]) -> Replay {
        // hand-made: the miss falls with every faulty layer the hypothesis holds, and only the
        // device's own scope reproduces
        let right = h.layers.iter().filter(|l| device.contains(l)).count();
        let wrong = h.layers.len() - right;
        let exact = right == device.len() && wrong == 0;
        Replay {
            fault: h.clone(),
            steps: vec![],
            replay_miss: if exact {
                0.0
            } else {
                0.1 / (right + 1) as f64 + 0.01 * wrong as f64
            },
            healthy_miss: Some(0.2),
            precision: Some(1e-3),
            reproduces: exact,
        }
    }

    /// Hand-made facts of sweep seed 2504's #326 and #285 (the residuals measured by hand with
    /// `kvdiff`, docs/diagnosis.md): a swap parts at its next swapped layer; a reader's fault at
    /// the layer after the faulty reader.
    fn run_case(device: &[usize], from: &[usize], reader: bool) -> (Growth, Vec<String>) {
        let mut read: Vec<String> = Vec::new();
        let mut residual = |h: &FaultHypothesis| -> Result<Residual, String> {
            read.push(h.text());
            let missing = device.iter().find(|l| !h.layers.contains(l));
            Ok(missing.map(|&l| (l + usize::from(reader), CacheKind::K)))
        };
        let mut run = |h: &FaultHypothesis| Ok(replay(h, device));
        let g = grow(&[vec![swap(from)]], 30, &mut residual, &mut run);
        (g, read)
    }

    #[test]
    fn a_partial_swap_grows_layer_by_layer_to_the_devices_scope() {
        let (g, read) = run_case(&[1, 10, 17], &[1], false);
        let tried: Vec<String> = g.replays.iter().map(|r| r.fault.text()).collect();
        assert_eq!(
            tried,
            [
                "kv-swap@layer=1,layer=10",
                "kv-swap@layer=1,layer=9",
                "kv-swap@layer=1,layer=10,layer=17",
                "kv-swap@layer=1,layer=10,layer=16",
            ]
        );
        assert_eq!(read, ["kv-swap@layer=1", "kv-swap@layer=1,layer=10"]);
        assert!(g.replays[2].reproduces && g.residuals == 2);
    }

    /// Sweep seed 6302 #360's shape (`kv-swap` on layers 13 and 20): the kind's closest scope
    /// by a hair is layer 12, whose rings part from the device's at layer 12 itself; growth
    /// takes the kind's next scope, layer 13, whose residual names layer 20.
    #[test]
    fn a_start_refuted_inside_its_scope_gives_way_to_its_kinds_next_scope() {
        const DEVICE: [usize; 2] = [13, 20];
        // a binding fault parts at the lowest layer the two scopes do not share
        let parts = |h: &FaultHypothesis| -> Residual {
            let differs = (0..30).find(|l| h.layers.contains(l) != DEVICE.contains(l));
            differs.map(|l| (l, CacheKind::K))
        };
        let mut read: Vec<String> = Vec::new();
        let mut residual = |h: &FaultHypothesis| -> Result<Residual, String> {
            read.push(h.text());
            Ok(parts(h))
        };
        let mut run = |h: &FaultHypothesis| Ok(replay(h, &DEVICE));
        let g = grow(
            &[vec![swap(&[12]), swap(&[13])]],
            30,
            &mut residual,
            &mut run,
        );
        assert_eq!(read, ["kv-swap@layer=12", "kv-swap@layer=13"]);
        let hit = g
            .replays
            .iter()
            .find(|r| r.reproduces)
            .map(|r| r.fault.text());
        assert_eq!(hit.as_deref(), Some("kv-swap@layer=13,layer=20"));
        // the refuted start alone (one scope per kind, as before): nothing reproduces
        let mut residual = |h: &FaultHypothesis| Ok(parts(h));
        let g = grow(&[vec![swap(&[12])]], 30, &mut residual, &mut run);
        assert!(g.replays.iter().all(|r| !r.reproduces));
    }

    #[test]
    fn a_readers_fault_is_found_through_the_layer_before_the_residual() {
        // #285: the reader at 4 parts the rings at 5; the layer before names the reader
        let (g, _) = run_case(&[0, 4], &[0], true);
        let hit = g
            .replays
            .iter()
            .find(|r| r.reproduces)
            .map(|r| r.fault.text());
        assert_eq!(hit.as_deref(), Some("kv-swap@layer=0,layer=4"));
        assert_eq!(g.replays.len(), 2);
    }

    #[test]
    fn growth_stops_when_the_residual_adds_nothing_and_is_bounded_by_the_layers() {
        // the residual names a layer already in the scope: one read, no replay
        let mut residual = |_: &FaultHypothesis| Ok(Some((4, CacheKind::V)));
        let mut run = |h: &FaultHypothesis| Ok(replay(h, &[9]));
        let g = grow(&[vec![swap(&[3, 4])]], 30, &mut residual, &mut run);
        assert!(g.replays.is_empty() && g.residuals == 1);
        // a residual that always names the next layer: at most one round per layer
        let mut next = |h: &FaultHypothesis| Ok(h.layers.last().map(|l| (l + 1, CacheKind::K)));
        let mut never = |h: &FaultHypothesis| Ok(replay(h, &[99]));
        let g = grow(&[vec![swap(&[0])]], 6, &mut next, &mut never);
        assert_eq!(g.residuals, 6);
        // a residual that cannot be read ends it
        let mut broken = |_: &FaultHypothesis| Err("no cache_buffers".to_string());
        let g = grow(&[vec![swap(&[0])]], 6, &mut broken, &mut run);
        assert!(g.replays.is_empty() && g.residuals == 0);
    }

    fn named(name: &str, layers: &[usize]) -> FaultHypothesis {
        FaultHypothesis {
            name: name.into(),
            ..swap(layers)
        }
    }

    #[test]
    fn growth_starts_from_each_faults_closest_scope_whole_replays_first() {
        // seed 2504 #285's shape: the closest whole replay writes layer 0's V wrong, the
        // reader's fault at layer 0 was only screened
        let whole = [
            Replay {
                replay_miss: 2.5e-2,
                ..replay(&named("truncate-entry", &[0]), &[])
            },
            Replay {
                replay_miss: 1e-2,
                ..replay(&named("tbt-cache-scale", &[]), &[])
            },
        ];
        let f8cr = FaultHypothesis {
            value: FaultValue::Word("f8cr".into()),
            ..named("tbt-read-layout", &[0])
        };
        let screened = [
            (0.3, named("tbt-read-layout", &[0])),
            (0.4, f8cr),
            (0.1, named("truncate-entry", &[1])),
            (0.5, named("tbt-read-layout", &[1])),
            (0.2, named("kv-swap", &[])),
        ];
        let texts: Vec<Vec<String>> = starts(&whole, &screened)
            .iter()
            .map(|k| k.iter().map(|h| h.text()).collect())
            .collect();
        // one kind per fault and value, scoped to some layers: replayed whole first, then by
        // the screen; a kind's scopes closest first
        assert_eq!(
            texts,
            [
                vec!["truncate-entry@layer=0", "truncate-entry@layer=1"],
                vec!["tbt-read-layout@layer=0", "tbt-read-layout@layer=1"],
                vec!["tbt-read-layout=f8cr@layer=0"],
            ]
        );
    }

    #[test]
    fn a_start_whose_residual_adds_nothing_leaves_the_rounds_to_the_next() {
        // the writer's scope parts at its own layer; the reader's at the layer after layer 4
        let device = [0, 4];
        let mut residual = |h: &FaultHypothesis| -> Result<Residual, String> {
            Ok(match h.name.as_str() {
                "truncate-entry" => Some((0, CacheKind::V)),
                _ => device
                    .iter()
                    .find(|l| !h.layers.contains(l))
                    .map(|&l| (l + 1, CacheKind::K)),
            })
        };
        let mut run = |h: &FaultHypothesis| {
            let mut r = replay(h, &device);
            r.reproduces &= h.name == "tbt-read-layout";
            Ok(r)
        };
        let from = [
            vec![named("truncate-entry", &[0])],
            vec![named("tbt-read-layout", &[0])],
        ];
        let g = grow(&from, 30, &mut residual, &mut run);
        let hit = g
            .replays
            .iter()
            .find(|r| r.reproduces)
            .map(|r| r.fault.text());
        assert_eq!(hit.as_deref(), Some("tbt-read-layout@layer=0,layer=4"));
        assert_eq!(g.residuals, 2);
        // the first start alone: nothing grows
        let g = grow(&from[..1], 30, &mut residual, &mut run);
        assert!(g.replays.is_empty() && g.residuals == 1);
    }
}
