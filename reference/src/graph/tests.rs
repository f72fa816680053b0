//! The attention helpers of graph.rs checked by hand.

use super::*;

fn ctx<'a>(
    nh: usize,
    t: usize,
    w: usize,
    mask: &'a [bool],
    map: &'a [usize],
    shared: bool,
) -> AttnCtx<'a> {
    // leaked: a test's groups live as long as the context that borrows them
    let groups: Vec<Vec<usize>> = if shared {
        vec![(0..nh).collect()]
    } else {
        softmax_per_head(nh)
    };
    AttnCtx {
        nh,
        hd: 4,
        t,
        w,
        mask,
        kv_map: map,
        scale: 1.0,
        softmax_groups: Box::leak(groups.into_boxed_slice()),
        blocked: None,
    }
}

#[test]
fn softmax_by_hand() {
    let map = [0usize, 0];
    // One head, one row, scores [1, 0, 5], third key masked out.
    let mask = [true, true, false];
    let mut s = [1.0f32, 0.0, 5.0];
    ctx(1, 1, 2, &mask, &map, false).masked_softmax(&mut s);
    let e = std::f32::consts::E;
    assert!((s[0] - e / (e + 1.0)).abs() < 1e-6);
    assert!((s[1] - 1.0 / (e + 1.0)).abs() < 1e-6);
    assert_eq!(s[2], 0.0);
    // A single allowed key gets weight exactly 1.
    let mask = [false, true, false];
    let mut s = [3.0f32, -7.0, 2.0];
    ctx(1, 1, 2, &mask, &map, false).masked_softmax(&mut s);
    assert_eq!(s, [0.0, 1.0, 0.0]);
    // Nothing allowed: all zero, no NaN.
    let mask = [false; 3];
    let mut s = [3.0f32, -7.0, 2.0];
    ctx(1, 1, 2, &mask, &map, false).masked_softmax(&mut s);
    assert_eq!(s, [0.0, 0.0, 0.0]);
}

/// A mask hypothesis ([`crate::Blocked`]) by hand: scores [1, 0, 5], the third key blocked.
#[test]
fn blocked_columns_enter_with_their_bias_and_empty_slots_dilute() {
    let map = [0usize, 0];
    let mask = [true, true, false];
    let e = std::f64::consts::E;
    let run = |bias: f32, empty: usize| {
        let mut s = [1.0f32, 0.0, 5.0];
        let mut c = ctx(1, 1, 2, &mask, &map, false);
        c.blocked = Some(crate::Blocked { bias, empty });
        c.masked_softmax(&mut s);
        s.map(f64::from)
    };
    // not applied: the softmax of every score
    let d = e + 1.0 + e.powi(5);
    let s = run(0.0, 0);
    for (got, want) in s.iter().zip([e / d, 1.0 / d, e.powi(5) / d]) {
        assert!((got - want).abs() < 1e-6, "{s:?}");
    }
    // 0 / +1: the blocked key's score plus 1; two empty slots add e^1 each to the sum only
    let d = e + 1.0 + e.powi(6) + 2.0 * e;
    let s = run(1.0, 2);
    for (got, want) in s.iter().zip([e / d, 1.0 / d, e.powi(6) / d]) {
        assert!((got - want).abs() < 1e-6, "{s:?}");
    }
}

#[test]
fn shared_softmax_splits_mass_over_heads() {
    let map = [0usize, 0];
    // Two heads, one row, two keys, equal scores: per head 1/2 each, shared 1/4 each.
    let mask = [true; 4];
    let mut per = [0.0f32; 4];
    ctx(2, 1, 1, &mask, &map, false).masked_softmax(&mut per);
    assert_eq!(per, [0.5; 4]);
    let mut sh = [0.0f32; 4];
    ctx(2, 1, 1, &mask, &map, true).masked_softmax(&mut sh);
    assert_eq!(sh, [0.25; 4]);
    // Head 1 scores higher: the joint distribution favours head 1's keys (mask layout
    // [T, nh, C], scores [nh, T, C]).
    let mut s = [0.0f32, 0.0, 1.0, 1.0];
    ctx(2, 1, 1, &mask, &map, true).masked_softmax(&mut s);
    let e = std::f32::consts::E;
    let z = 2.0 + 2.0 * e;
    assert!((s[0] - 1.0 / z).abs() < 1e-6 && (s[2] - e / z).abs() < 1e-6);
}

#[test]
fn scores_over_the_attended_columns_have_the_full_products_bits() {
    use crate::arith::{Arithmetic, Rounder};
    use crate::matmul::{self, Rhs};
    // 6 query heads over 2 KV heads (3 per group), 16 rows, a window of 584 past columns of
    // which the first 200 nothing attends: the narrowed product must give every attended
    // column the bits of the full one (gemm's order per output depends on hd alone)
    let (nh, t, w, hd, g, per) = (6usize, 16usize, 584usize, 4usize, 2usize, 3usize);
    let c = w + t;
    let mask: Vec<bool> = (0..t * nh * c).map(|i| i % c >= 200).collect();
    let map = [0usize, 0, 0, 1, 1, 1];
    let cx = ctx(nh, t, w, &mask, &map, false);
    let mut x = 0x9e37_79b9_u32;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32) * 8.0 - 4.0
    };
    let q: Vec<f32> = (0..g * per * t * hd).map(|_| next()).collect();
    let k: Vec<f32> = (0..g * c * hd).map(|_| next()).collect();
    let m = per * t;
    let narrow = cx
        .scores(&q, &k, g, m, &Rounder::new(Arithmetic::F32))
        .unwrap();
    let full = matmul::batched(&q, &k, Rhs::Transposed, g, m, hd, c).unwrap();
    assert_eq!(cx.attended_columns(), (200, c));
    for (i, (a, b)) in narrow.iter().zip(&full).enumerate() {
        if i % c >= 200 {
            assert_eq!(a.to_bits(), b.to_bits(), "score {i}");
        } else {
            assert_eq!(*a, 0.0, "score {i}");
        }
    }
}
