//! The family of stream layouts the solver searches: strided (mixed-radix) maps of a logical
//! `[N tokens × C features]` block, with the token axis cut into tiles of `T` and the feature axis
//! into groups of `g` (contract §7.2: NHWC, NHCW and F8CR are all members).
//!
//! A map is an order of up to four digits, outer → inner: `⌊t/T⌋`, `t mod T`, `⌊c/g⌋`,
//! `c mod g`; each axis keeps its high digit before its low one (a tile/group transposed within its
//! own axis is not a layout any compiler order produces). When tiles are outermost, `T` need not
//! divide `N`: the last tile is narrower, like the emulator's tile16 test layout.

use kvprobe_npu::layout::{position_table, StreamShape};
use kvprobe_schema::{Layout, MapAxis, MapDigit};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Digit {
    TokHi,
    TokLo,
    FeatHi,
    FeatLo,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StridedMap {
    /// `N`: tokens in the writer's window.
    pub tokens: usize,
    /// `C`: elements per entry.
    pub features: usize,
    /// `T`: tokens per tile (`N` when the token axis is not tiled).
    pub tile: usize,
    /// `g`: features per group (`C` when not grouped).
    pub group: usize,
    /// Outer → inner, canonical: no digit of size 1, no high digit right before its own low digit.
    pub order: Vec<Digit>,
}

impl StridedMap {
    /// Canonical form of a digit order, or `None` when it is not a layout (tiles not dividing
    /// `N` anywhere but outermost).
    pub fn new(
        tokens: usize,
        features: usize,
        tile: usize,
        group: usize,
        order: &[Digit],
    ) -> Option<StridedMap> {
        let (n, c) = (tokens.max(1), features.max(1));
        let (mut tile, mut group) = (tile.clamp(1, n), group.clamp(1, c));
        let mut order: Vec<Digit> = order.to_vec();
        // A tile of 1 token: the high digit is the whole token axis.
        if tile == 1 {
            order.retain(|d| *d != Digit::TokLo);
            for d in order.iter_mut().filter(|d| **d == Digit::TokHi) {
                *d = Digit::TokLo;
            }
            tile = n;
        }
        if group == 1 {
            order.retain(|d| *d != Digit::FeatLo);
            for d in order.iter_mut().filter(|d| **d == Digit::FeatHi) {
                *d = Digit::FeatLo;
            }
            group = c;
        }
        // Size-1 digits vanish, and adjacent high-then-low digits of one axis are that axis
        // untiled; each can enable the other, so repeat until nothing changes.
        loop {
            let before = order.len();
            if tile == n {
                order.retain(|d| *d != Digit::TokHi);
            }
            if group == c {
                order.retain(|d| *d != Digit::FeatHi);
            }
            if n == 1 {
                order.retain(|d| *d != Digit::TokLo);
            }
            if c == 1 {
                order.retain(|d| *d != Digit::FeatLo);
            }
            for (hi, lo) in [(Digit::TokHi, Digit::TokLo), (Digit::FeatHi, Digit::FeatLo)] {
                if let Some(i) = order.windows(2).position(|w| w[0] == hi && w[1] == lo) {
                    order.remove(i);
                    if hi == Digit::TokHi {
                        tile = n;
                    } else {
                        group = c;
                    }
                }
            }
            if order.len() == before {
                break;
            }
        }
        if !c.is_multiple_of(group) {
            return None;
        }
        if !n.is_multiple_of(tile) && order.first() != Some(&Digit::TokHi) {
            return None;
        }
        Some(StridedMap {
            tokens: n,
            features: c,
            tile,
            group,
            order,
        })
    }

    /// Token-major (NHWC): the identity of a ring-safe writer.
    pub fn token_major(tokens: usize, features: usize) -> StridedMap {
        StridedMap::new(
            tokens,
            features,
            tokens,
            features,
            &[Digit::TokLo, Digit::FeatLo],
        )
        .unwrap_or(StridedMap {
            tokens,
            features,
            tile: tokens,
            group: features,
            order: vec![Digit::TokLo, Digit::FeatLo],
        })
    }

    fn size(&self, d: Digit, width: usize) -> usize {
        match d {
            Digit::TokHi => self.tokens.div_ceil(self.tile),
            Digit::TokLo => width,
            Digit::FeatHi => self.features / self.group,
            Digit::FeatLo => self.group,
        }
    }

    fn value(&self, d: Digit, t: usize, c: usize) -> usize {
        match d {
            Digit::TokHi => t / self.tile,
            Digit::TokLo => t % self.tile,
            Digit::FeatHi => c / self.group,
            Digit::FeatLo => c % self.group,
        }
    }

    /// Element index of logical `(t, c)` in the stream.
    pub fn position(&self, t: usize, c: usize) -> usize {
        let tiles_outer = self.order.first() == Some(&Digit::TokHi);
        let base = t / self.tile * self.tile;
        let width = if tiles_outer {
            self.tile.min(self.tokens - base)
        } else {
            self.tile
        };
        let inner = if tiles_outer {
            &self.order[1..]
        } else {
            &self.order[..]
        };
        let (mut pos, mut stride) = (0, 1);
        for &d in inner.iter().rev() {
            pos += self.value(d, t, c) * stride;
            stride *= self.size(d, width);
        }
        if tiles_outer {
            pos += base * self.features;
        }
        pos
    }

    /// Digits outer → inner with their sizes and strides (full tiles).
    pub fn digits(&self) -> Vec<MapDigit> {
        let mut out = Vec::with_capacity(self.order.len());
        let mut stride = 1;
        for &d in self.order.iter().rev() {
            let size = self.size(d, self.tile);
            out.push(MapDigit {
                axis: match d {
                    Digit::TokHi | Digit::TokLo => MapAxis::Token,
                    Digit::FeatHi | Digit::FeatLo => MapAxis::Feature,
                },
                size,
                stride,
                divisor: match d {
                    Digit::TokHi => self.tile,
                    Digit::FeatHi => self.group,
                    _ => 1,
                },
            });
            stride *= size;
        }
        out.reverse();
        out
    }

    fn term(&self, d: Digit) -> String {
        match d {
            Digit::TokHi => format!("⌊t/{}⌋", self.tile),
            Digit::TokLo if self.tile == self.tokens => "t".into(),
            Digit::TokLo => format!("t mod {}", self.tile),
            Digit::FeatHi => format!("⌊c/{}⌋", self.group),
            Digit::FeatLo if self.group == self.features => "c".into(),
            Digit::FeatLo => format!("c mod {}", self.group),
        }
    }

    /// `ℓ(t, c) = …` in elements, outer digit first.
    pub fn formula(&self) -> String {
        let terms: Vec<String> = self
            .order
            .iter()
            .zip(self.digits())
            .map(|(&d, g)| {
                if g.stride == 1 {
                    self.term(d)
                } else {
                    format!("{}·{}", g.stride, self.term(d))
                }
            })
            .collect();
        let mut s = format!(
            "ℓ(t, c) = {}",
            if terms.is_empty() {
                "0".to_string()
            } else {
                terms.join(" + ")
            }
        );
        if self.order.first() == Some(&Digit::TokHi) && !self.tokens.is_multiple_of(self.tile) {
            s += &format!(
                " (last tile of {} tokens narrower)",
                self.tokens % self.tile
            );
        }
        s
    }

    /// The same map in words, naming the usual device orders (contract §7.2).
    pub fn description(&self, head_dim: usize) -> String {
        use Digit::*;
        let (n, c, t, g) = (self.tokens, self.features, self.tile, self.group);
        match self.order.as_slice() {
            [] | [TokLo] | [FeatLo] | [TokLo, FeatLo] => {
                format!("token-major: each token's {c} features contiguous (NHWC, ring-safe)")
            }
            [FeatLo, TokLo] => format!(
                "feature-major: tokens on the width axis, each feature across all {n} tokens (NHCW)"
            ),
            [FeatHi, TokLo, FeatLo] => {
                let head = if g == head_dim {
                    " (one KV head per group: head-major)"
                } else {
                    ""
                };
                format!("tokens on the width axis, {g}-channel groups{head}")
            }
            [TokHi, FeatLo, TokLo] => {
                format!("tiles of {t} tokens, each tile feature-major (tokens innermost)")
            }
            [TokHi, TokLo, FeatLo] => format!("tiles of {t} tokens, token-major inside"),
            _ => {
                let parts: Vec<String> = self
                    .order
                    .iter()
                    .zip(self.digits())
                    .map(|(&d, g)| format!("{} ({})", self.term(d), g.size))
                    .collect();
                format!("nested, outer → inner: {}", parts.join(", "))
            }
        }
    }

    /// `position` of every `(t, c)`, token-major order.
    pub fn table(&self) -> Vec<usize> {
        (0..self.tokens)
            .flat_map(|t| (0..self.features).map(move |c| self.position(t, c)))
            .collect()
    }

    /// The named layout ([`Layout::ALL`]) this map equals for its window, if any.
    pub fn named(&self, head_dim: usize) -> Option<Layout> {
        let shape = StreamShape {
            tokens: self.tokens,
            features: self.features,
            elem_bytes: 1,
            head_dim,
        };
        let mine = self.table();
        Layout::ALL.into_iter().find(|&l| {
            kvprobe_npu::layout::check_supported(l, self.features).is_ok()
                && position_table(l, shape) == mine
        })
    }

    /// Digits in this map (fewer = simpler, preferred on ties).
    pub fn complexity(&self) -> usize {
        self.order.len()
    }
}

/// Divisors of `n`, ascending.
pub fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Tile sizes tried: the divisors of `N`, plus multiples of 8 and powers of two below `N` (a
/// compiler tiles tokens in hardware-friendly widths even when `N` is not a multiple).
fn tiles(n: usize) -> Vec<usize> {
    let mut v = divisors(n);
    for t in 2..n {
        if (t.is_multiple_of(8) || t.is_power_of_two()) && !v.contains(&t) {
            v.push(t);
        }
    }
    v.sort_unstable();
    v
}

/// The interleavings of `[TokHi, TokLo]` with `[FeatHi, FeatLo]` keeping hi before lo.
const ORDERS: [[Digit; 4]; 6] = {
    use Digit::*;
    [
        [TokHi, TokLo, FeatHi, FeatLo],
        [TokHi, FeatHi, TokLo, FeatLo],
        [TokHi, FeatHi, FeatLo, TokLo],
        [FeatHi, TokHi, TokLo, FeatLo],
        [FeatHi, TokHi, FeatLo, TokLo],
        [FeatHi, FeatLo, TokHi, TokLo],
    ]
};

/// Every distinct map of the family for an `N × C` window, token-major first, then by
/// complexity.
pub fn candidates(tokens: usize, features: usize) -> Vec<StridedMap> {
    let mut out: Vec<StridedMap> = vec![StridedMap::token_major(tokens, features)];
    for t in tiles(tokens.max(1)) {
        for g in divisors(features.max(1)) {
            for order in ORDERS {
                if let Some(m) = StridedMap::new(tokens, features, t, g, &order) {
                    if !out.contains(&m) {
                        out.push(m);
                    }
                }
            }
        }
    }
    out.sort_by_key(|m| m.complexity());
    // token-major stays first: it is the healthy answer and wins every tie
    if let Some(i) = out
        .iter()
        .position(|m| *m == StridedMap::token_major(tokens, features))
    {
        let tm = out.remove(i);
        out.insert(0, tm);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(m: &StridedMap) -> Vec<usize> {
        m.table()
    }

    /// The emulator's own layout functions (npu/src/layout.rs), the independent reference.
    fn emulator(l: Layout, n: usize, c: usize, hd: usize) -> Vec<usize> {
        let sh = StreamShape {
            tokens: n,
            features: c,
            elem_bytes: 1,
            head_dim: hd,
        };
        position_table(l, sh)
    }

    #[test]
    fn every_candidate_is_a_permutation() {
        for (n, c) in [(32, 192), (24, 32), (8, 32), (1, 16), (5, 6)] {
            for m in candidates(n, c) {
                let mut t = table(&m);
                t.sort_unstable();
                assert_eq!(t, (0..n * c).collect::<Vec<_>>(), "{m:?}");
            }
        }
    }

    #[test]
    fn candidates_are_distinct_functions() {
        let all = candidates(24, 32);
        let tables: Vec<Vec<usize>> = all.iter().map(table).collect();
        for i in 0..tables.len() {
            for j in i + 1..tables.len() {
                assert_ne!(tables[i], tables[j], "{:?} = {:?}", all[i], all[j]);
            }
        }
    }

    #[test]
    fn the_family_holds_every_emulator_layout() {
        // N = 24 is not a multiple of 16: tile16's last tile has 8 tokens
        for (n, c, hd) in [(32, 192, 64), (24, 32, 16), (40, 32, 8)] {
            let tables: Vec<Vec<usize>> = candidates(n, c).iter().map(table).collect();
            for l in Layout::ALL.into_iter().chain(Layout::TEST) {
                let want = emulator(l, n, c, hd);
                assert!(
                    tables.contains(&want),
                    "{} missing for N={n} C={c}",
                    l.name()
                );
            }
        }
    }

    #[test]
    fn hand_written_maps() {
        use Digit::*;
        // f8cr, N = 2, C = 16: ⌊c/8⌋·16 + 8t + c mod 8
        let m = StridedMap::new(2, 16, 2, 8, &[FeatHi, TokHi, TokLo, FeatLo]).unwrap();
        assert_eq!(m.order, vec![FeatHi, TokLo, FeatLo]);
        assert_eq!(m.position(1, 9), 16 + 8 + 1);
        assert_eq!(m.formula(), "ℓ(t, c) = 16·⌊c/8⌋ + 8·t + c mod 8");
        assert_eq!(m.named(16), Some(Layout::F8cr));
        assert_eq!(
            m.description(16),
            "tokens on the width axis, 8-channel groups"
        );
        // tiles of 16 over N = 18: token 17 feature 1 sits at 32 + 1·2 + 1
        let m = StridedMap::new(18, 2, 16, 2, &[TokHi, TokLo, FeatHi, FeatLo]).unwrap();
        assert_eq!(m, StridedMap::token_major(18, 2));
        let m = StridedMap::new(18, 2, 16, 1, &[TokHi, FeatHi, FeatLo, TokLo]).unwrap();
        assert_eq!(m.position(17, 1), 35);
        assert_eq!(m.position(15, 1), 31);
        assert!(m.formula().contains("last tile of 2 tokens"));
        // a tile that does not divide N cannot sit inside a feature digit
        assert!(StridedMap::new(18, 4, 16, 2, &[FeatHi, TokHi, FeatLo, TokLo]).is_none());
    }
}
