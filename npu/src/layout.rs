//! Memory orders of a cache edge's stream (contract §7.2, §7.4).
//!
//! An edge of `N` entries streams a logical `[N tokens × C features]` block (elements of `b`
//! bytes, `E = C·b` bytes per token) through a layout function `ℓ_N(token, feature)`; HailoRT cuts
//! the stream into `E`-byte entries (contract §7.1). A writer encodes with its layout and window
//! length, a reader decodes with its own: the writer→reader composition of §7.4 is then exactly
//! `decode(reader) ∘ ring ∘ encode(writer)`.

use kvprobe_schema::Layout;

use crate::{Error, Result};

/// Geometry of one edge's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamShape {
    /// `N`: tokens (entries) in the window.
    pub tokens: usize,
    /// `C`: features (elements) per token.
    pub features: usize,
    /// `b`: bytes per element.
    pub elem_bytes: usize,
    /// Features per KV head (only the head-major test layout uses it).
    pub head_dim: usize,
}

impl StreamShape {
    pub fn entry_bytes(&self) -> usize {
        self.features * self.elem_bytes
    }
    pub fn total_bytes(&self) -> usize {
        self.tokens * self.entry_bytes()
    }
}

/// Tokens per tile of the `tile16` test layout.
pub const TILE: usize = 16;

/// Whether a layout can stream `features` per token without padding (F8CR pads channels to 8,
/// contract §7.2; the emulator keeps `E = C·b`, so it needs `C` to be a multiple of 8).
pub fn check_supported(layout: Layout, features: usize) -> Result<()> {
    if layout == Layout::F8cr && !features.is_multiple_of(8) {
        return Err(Error::Geometry(format!(
            "f8cr needs a multiple of 8 features per entry, this cache has {features}; use feature-major"
        )));
    }
    Ok(())
}

/// Element index of logical `(token, feature)` in the stream (contract §7.2 with `H = 1`, tokens on
/// the width axis, `W = N`):
/// token-major (NHWC) `t·C + c`; feature-major (NHCW) `c·N + t`; F8CR `⌊c/8⌋·8N + 8t + c mod 8`.
/// Test layouts: head-major `h·N·D + t·D + d` (`c = h·D + d`); tile16
/// `⌊t/16⌋·16C + c·w + t mod 16` with `w` the tile's width (16, less in a last partial tile).
pub fn element_position(layout: Layout, shape: StreamShape, t: usize, c: usize) -> usize {
    let (n, c_total) = (shape.tokens, shape.features);
    match layout {
        Layout::TokenMajor => t * c_total + c,
        Layout::FeatureMajor => c * n + t,
        Layout::F8cr => (c / 8) * (8 * n) + 8 * t + (c % 8),
        Layout::HeadMajor => {
            let d = shape.head_dim.max(1);
            (c / d) * n * d + t * d + c % d
        }
        Layout::Tile16 => {
            let base = t / TILE * TILE;
            let w = TILE.min(n - base);
            base * c_total + c * w + (t - base)
        }
    }
}

/// `element_position` of every `(t, c)`, token-major order (tests and solvers compare these).
pub fn position_table(layout: Layout, shape: StreamShape) -> Vec<usize> {
    (0..shape.tokens)
        .flat_map(|t| (0..shape.features).map(move |c| element_position(layout, shape, t, c)))
        .collect()
}

/// `ℓ_N(token, feature)` as a byte position of the element's first byte.
pub fn byte_position(layout: Layout, shape: StreamShape, t: usize, c: usize) -> usize {
    element_position(layout, shape, t, c) * shape.elem_bytes
}

/// Logical block (token-major bytes, `[N][E]`) → stream in `layout`.
pub fn encode(layout: Layout, shape: StreamShape, block: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(block.len(), shape.total_bytes());
    out.clear();
    if layout == Layout::TokenMajor {
        out.extend_from_slice(block);
        return;
    }
    out.resize(shape.total_bytes(), 0);
    let b = shape.elem_bytes;
    for_each_run(layout, shape, |at, p, len| {
        copy(
            &mut out[p * b..(p + len) * b],
            &block[at * b..(at + len) * b],
        );
    });
}

/// Stream in `layout` → logical block (token-major bytes, `[N][E]`).
pub fn decode(layout: Layout, shape: StreamShape, stream: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(stream.len(), shape.total_bytes());
    out.clear();
    if layout == Layout::TokenMajor {
        out.extend_from_slice(stream);
        return;
    }
    out.resize(shape.total_bytes(), 0);
    let b = shape.elem_bytes;
    for_each_run(layout, shape, |at, p, len| {
        copy(
            &mut out[at * b..(at + len) * b],
            &stream[p * b..(p + len) * b],
        );
    });
}

/// One run's bytes; a one-byte element (uint8 caches) without the call `copy_from_slice` makes
/// for a length it does not know.
#[inline(always)]
fn copy(dst: &mut [u8], src: &[u8]) {
    if let ([d], [s]) = (&mut *dst, src) {
        *d = *s;
    } else {
        dst.copy_from_slice(src);
    }
}

/// `f(block element, stream element, len)` over runs of `len` features of one token that
/// [`element_position`] places one after the other in the stream: a token's 8-channel groups
/// (f8cr) and its heads (head-major) move a run at a time, the other layouts an element at a
/// time. The same positions as an element-by-element walk, a run at a time: the tbt steps of an
/// emulator with a non-token-major reader decoded each window's bytes one call at a time (a
/// twentieth of a `diagnose` of a feature-major reader; profiled with perf).
fn for_each_run(layout: Layout, shape: StreamShape, mut f: impl FnMut(usize, usize, usize)) {
    let (n, features) = (shape.tokens, shape.features);
    match layout {
        Layout::FeatureMajor => {
            // feature by feature: the stream side reads (or writes) in order
            for c in 0..features {
                for t in 0..n {
                    f(t * features + c, c * n + t, 1);
                }
            }
        }
        Layout::F8cr | Layout::HeadMajor => {
            let group = match layout {
                Layout::F8cr => 8,
                _ => shape.head_dim.max(1),
            };
            for t in 0..n {
                let mut c = 0;
                while c < features {
                    let len = (group - c % group).min(features - c);
                    f(t * features + c, element_position(layout, shape, t, c), len);
                    c += len;
                }
            }
        }
        Layout::TokenMajor | Layout::Tile16 => {
            for t in 0..n {
                for c in 0..features {
                    f(t * features + c, element_position(layout, shape, t, c), 1);
                }
            }
        }
    }
}

/// The ring-safety criterion of contract §7.4 for one window length: every token's features land
/// in its own entry, `⌊ℓ_N(t, f)/E⌋ = t`.
pub fn is_ring_safe_for(layout: Layout, shape: StreamShape) -> bool {
    let e = shape.entry_bytes();
    (0..shape.tokens).all(|t| {
        (0..shape.features).all(|c| {
            let p = byte_position(layout, shape, t, c);
            p / e == t && (p + shape.elem_bytes - 1) / e == t
        })
    })
}

/// Whether `layout` streams exactly like token-major for this shape (then a layout fault would
/// change nothing, e.g. feature-major with a one-entry window).
pub fn equals_token_major(layout: Layout, shape: StreamShape) -> bool {
    (0..shape.tokens).all(|t| {
        (0..shape.features).all(|c| {
            byte_position(layout, shape, t, c) == byte_position(Layout::TokenMajor, shape, t, c)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: usize, c: usize, b: usize) -> StreamShape {
        StreamShape {
            tokens: n,
            features: c,
            elem_bytes: b,
            head_dim: c,
        }
    }

    /// Block of N=3 tokens × E=4 bytes: token t feature f = 10·(t+1) + f.
    fn block_3x4() -> Vec<u8> {
        vec![10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33]
    }

    /// The run-at-a-time walk against the element-by-element definition: every layout, element
    /// sizes 1, 2 and 4, a partial last tile (a shape a layout does not tile is left out).
    #[test]
    fn encode_and_decode_move_each_element_where_element_position_says() {
        for layout in [
            Layout::TokenMajor,
            Layout::FeatureMajor,
            Layout::F8cr,
            Layout::HeadMajor,
            Layout::Tile16,
        ] {
            for (n, c, b, d) in [(3, 4, 1, 2), (18, 12, 2, 4), (5, 16, 4, 8), (19, 24, 1, 6)] {
                let sh = StreamShape {
                    tokens: n,
                    features: c,
                    elem_bytes: b,
                    head_dim: d,
                };
                let mut all = position_table(layout, sh);
                all.sort_unstable();
                if all != (0..n * c).collect::<Vec<_>>() {
                    continue;
                }
                let block: Vec<u8> = (0..sh.total_bytes()).map(|i| (i * 7 % 251) as u8).collect();
                let mut want = vec![0u8; sh.total_bytes()];
                for t in 0..n {
                    for f in 0..c {
                        let p = byte_position(layout, sh, t, f);
                        let src = (t * c + f) * b;
                        want[p..p + b].copy_from_slice(&block[src..src + b]);
                    }
                }
                let (mut s, mut back) = (Vec::new(), Vec::new());
                encode(layout, sh, &block, &mut s);
                assert_eq!(s, want, "{layout:?} {n}×{c}×{b}");
                decode(layout, sh, &s, &mut back);
                assert_eq!(back, block, "{layout:?} {n}×{c}×{b}");
            }
        }
    }

    #[test]
    fn token_major_is_identity_n3_e4() {
        let mut s = Vec::new();
        encode(Layout::TokenMajor, shape(3, 4, 1), &block_3x4(), &mut s);
        assert_eq!(s, block_3x4());
    }

    #[test]
    fn feature_major_hand_example_n3_e4() {
        let mut s = Vec::new();
        encode(Layout::FeatureMajor, shape(3, 4, 1), &block_3x4(), &mut s);
        // ℓ = f·N + t: feature 0 of tokens 0,1,2, then feature 1, ...
        assert_eq!(s, vec![10, 20, 30, 11, 21, 31, 12, 22, 32, 13, 23, 33]);
        let mut back = Vec::new();
        decode(Layout::FeatureMajor, shape(3, 4, 1), &s, &mut back);
        assert_eq!(back, block_3x4());
    }

    #[test]
    fn feature_major_two_byte_elements() {
        // N = 2, C = 2 features of 2 bytes (E = 4): token t feature c bytes = [t c 0, t c 1]
        let block = vec![0, 1, 2, 3, 10, 11, 12, 13];
        let mut s = Vec::new();
        encode(Layout::FeatureMajor, shape(2, 2, 2), &block, &mut s);
        assert_eq!(s, vec![0, 1, 10, 11, 2, 3, 12, 13]);
    }

    #[test]
    fn f8cr_hand_example_n2_c16() {
        // token t feature c = 100·t + c
        let block: Vec<u8> = (0..2)
            .flat_map(|t| (0..16).map(move |c| (100 * t + c) as u8))
            .collect();
        let mut s = Vec::new();
        encode(Layout::F8cr, shape(2, 16, 1), &block, &mut s);
        let mut want = Vec::new();
        want.extend(0..8u8); // token 0, c 0..7
        want.extend(100..108u8); // token 1, c 0..7
        want.extend(8..16u8); // token 0, c 8..15
        want.extend(108..116u8); // token 1, c 8..15
        assert_eq!(s, want);
        let mut back = Vec::new();
        decode(Layout::F8cr, shape(2, 16, 1), &s, &mut back);
        assert_eq!(back, block);
    }

    #[test]
    fn ring_safety_criterion() {
        for n in [1, 2, 7, 23] {
            assert!(is_ring_safe_for(Layout::TokenMajor, shape(n, 16, 1)));
            assert!(is_ring_safe_for(Layout::TokenMajor, shape(n, 8, 2)));
        }
        assert!(!is_ring_safe_for(Layout::FeatureMajor, shape(3, 4, 1)));
        assert!(!is_ring_safe_for(Layout::F8cr, shape(3, 16, 1)));
        // one-entry windows are ring-safe whatever the order
        assert!(equals_token_major(Layout::FeatureMajor, shape(1, 4, 1)));
        assert!(equals_token_major(Layout::F8cr, shape(1, 16, 1)));
        assert!(!equals_token_major(Layout::FeatureMajor, shape(2, 4, 1)));
        // C ≤ 8 with f8cr on one token... and f8cr with C = 8 equals token-major for any N? No:
        // ⌊c/8⌋ = 0 → 8t + c = t·C + c when C = 8.
        assert!(equals_token_major(Layout::F8cr, shape(5, 8, 1)));
    }

    #[test]
    fn feature_major_depends_on_n() {
        // Writer N = 3, reader N = 2 over the first two entries: tokens get mixed.
        let mut s = Vec::new();
        encode(Layout::FeatureMajor, shape(3, 4, 1), &block_3x4(), &mut s);
        let mut back = Vec::new();
        decode(Layout::FeatureMajor, shape(2, 4, 1), &s[..8], &mut back);
        // reader token 0 feature f sits at f·2: stream[0,2,4,6] = 10, 30, 21, 12
        assert_eq!(&back[..4], &[10, 30, 21, 12]);
    }

    #[test]
    fn head_major_hand_example_two_heads() {
        // N = 2 tokens, 2 heads of D = 2 (C = 4): token t feature c = 10·(t+1) + c
        let block: Vec<u8> = vec![10, 11, 12, 13, 20, 21, 22, 23];
        let sh = StreamShape {
            head_dim: 2,
            ..shape(2, 4, 1)
        };
        let mut s = Vec::new();
        encode(Layout::HeadMajor, sh, &block, &mut s);
        // head 0: tokens 0, 1 dims 0..2; then head 1
        assert_eq!(s, vec![10, 11, 20, 21, 12, 13, 22, 23]);
        let mut back = Vec::new();
        decode(Layout::HeadMajor, sh, &s, &mut back);
        assert_eq!(back, block);
    }

    #[test]
    fn tile16_hand_example_with_partial_tile() {
        // N = 18 tokens, C = 2: tile 0 holds tokens 0..16 feature-major, tile 1 tokens 16, 17.
        let sh = shape(18, 2, 1);
        assert_eq!(element_position(Layout::Tile16, sh, 0, 0), 0);
        assert_eq!(element_position(Layout::Tile16, sh, 15, 0), 15);
        assert_eq!(element_position(Layout::Tile16, sh, 0, 1), 16);
        assert_eq!(element_position(Layout::Tile16, sh, 15, 1), 31);
        assert_eq!(element_position(Layout::Tile16, sh, 16, 0), 32);
        assert_eq!(element_position(Layout::Tile16, sh, 17, 0), 33);
        assert_eq!(element_position(Layout::Tile16, sh, 16, 1), 34);
        assert_eq!(element_position(Layout::Tile16, sh, 17, 1), 35);
        let mut seen: Vec<usize> = (0..18)
            .flat_map(|t| (0..2).map(move |c| element_position(Layout::Tile16, sh, t, c)))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..36).collect::<Vec<_>>());
    }
}
