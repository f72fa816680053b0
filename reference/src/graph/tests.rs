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
