//! `Driver::trial_batch` / `trial_steps` through the emulator's batched `run_batch` (one graph run
//! of N rows) equal the same trials run one by one with `trial_step`: logits, rings, read offset
//! and driver state. Property-tested over masks, position shifts, tokens and faults.

mod common;

use std::sync::Arc;

use common::{float_opts, ids, sim, tiny_gpt2, tiny_llama};
use kvprobe_npu::sim::{SimDevice, SimOptions};
use kvprobe_npu::{Device, Driver, MaskMode, Trial};
use kvprobe_reference::Model;
use proptest::prelude::*;

const L: usize = 24;
const P: usize = 8;

fn mode_strategy(nh: usize) -> impl Strategy<Value = MaskMode> {
    prop_oneof![
        Just(MaskMode::Ring),
        Just(MaskMode::SelfOnly),
        (0..L - 1).prop_map(MaskMode::SingleKey),
        proptest::collection::vec(proptest::collection::vec(any::<bool>(), L), 1..=1)
            .prop_map(MaskMode::Custom),
        proptest::collection::vec(proptest::collection::vec(any::<bool>(), L), nh..=nh)
            .prop_map(MaskMode::Custom),
    ]
}

fn trials_strategy(nh: usize, vocab: u32) -> impl Strategy<Value = Vec<Trial>> {
    proptest::collection::vec(
        (0..vocab, mode_strategy(nh), -3i64..=3).prop_map(|(token, mode, position_shift)| Trial {
            token,
            mode,
            position_shift,
        }),
        1..7,
    )
}

/// A device after a prefill and a few ring steps (so the window holds real entries).
fn prepared(model: &Arc<Model>, opts: SimOptions, prompt: usize) -> (SimDevice, Driver) {
    let (mut dev, mut drv) = sim(model, opts);
    let v = model.config().vocab_size;
    drv.prefill(&mut dev, &ids(prompt, v, 3)).unwrap();
    for t in ids(3, v, 9) {
        drv.step(&mut dev, t, &MaskMode::Ring).unwrap();
    }
    (dev, drv)
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    approx::abs_diff_eq!(a, b, epsilon = tol)
}

/// Batched and looped trials from two identical devices; returns (max logit diff allowed
/// exceeded?, ...) via assertions.
fn check(model: &Arc<Model>, opts: SimOptions, prompt: usize, trials: &[Trial]) {
    let float = opts.cache_quant == kvprobe_npu::sim::CacheQuant::Float;
    let (mut d1, mut r1) = prepared(model, opts.clone(), prompt);
    let (mut d2, mut r2) = prepared(model, opts, prompt);
    // one logits quantisation step (or float noise) of slack: the batched rows go through
    // matrix products of another shape
    let tol = if float {
        1e-4
    } else {
        d1.quant().logits.scale * 1.01 + 1e-4
    };
    let start = r1.host_state();
    let batched = r1.trial_batch(&mut d1, trials).unwrap();
    let mut looped = Vec::new();
    for t in trials {
        r2.set_host_state(start.clone().with_position_offset(t.position_shift));
        looped.push(r2.trial_step(&mut d2, t.token, &t.mode).unwrap());
        r2.set_host_state(start.clone());
    }
    assert_eq!(batched.len(), looped.len());
    for (i, (a, b)) in batched.iter().zip(&looped).enumerate() {
        assert!(
            close(&a.logits, &b.logits, tol),
            "trial {i} {:?}: logits differ (max {})",
            trials[i],
            a.logits
                .iter()
                .zip(&b.logits)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        );
        assert_eq!(
            a.taps.keys().collect::<Vec<_>>(),
            b.taps.keys().collect::<Vec<_>>()
        );
    }
    assert_eq!(d1.read_offset(), d2.read_offset());
    assert_eq!(r1.usage(), r2.usage());
    assert_eq!(r1.position(), r2.position());
    assert_eq!(r1.window_positions(), r2.window_positions());
    // the rings: the slot the trials wrote holds the last trial's K/V in both
    let (b1, b2) = (d1.cache_buffers().unwrap(), d2.cache_buffers().unwrap());
    for (id, x) in &b1 {
        let y = &b2[id];
        if float {
            let f = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            assert!(close(&f(x), &f(y), 1e-4), "ring {id} differs");
        } else {
            assert!(
                x.iter().zip(y).all(|(a, b)| a.abs_diff(*b) <= 1),
                "ring {id} differs by more than one code"
            );
        }
    }
    // and the next real step agrees
    let v = model.config().vocab_size as u32;
    let n1 = r1.step(&mut d1, 7 % v, &MaskMode::Ring).unwrap();
    let n2 = r2.step(&mut d2, 7 % v, &MaskMode::Ring).unwrap();
    assert!(
        close(&n1.logits, &n2.logits, tol),
        "the step after the trials differs"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn llama_float_batched_equals_looped(trials in trials_strategy(4, 300), prompt in 1usize..20) {
        let (_d, m) = tiny_llama(5);
        check(&m, float_opts(L, P), prompt, &trials);
    }

    #[test]
    fn llama_quantised_batched_equals_looped(trials in trials_strategy(4, 300), prompt in 1usize..20) {
        let (_d, m) = tiny_llama(6);
        let opts = SimOptions { cache_len: L, prefill_len: P, taps: true, ..SimOptions::default() };
        check(&m, opts, prompt, &trials);
    }

    #[test]
    fn gpt2_batched_equals_looped(trials in trials_strategy(4, 280), prompt in 1usize..20) {
        let (_d, m) = tiny_gpt2(7);
        check(&m, float_opts(L, P), prompt, &trials);
    }
}

#[test]
fn batched_equals_looped_under_faults() {
    let (_d, m) = tiny_llama(8);
    let trials: Vec<Trial> = [
        MaskMode::Ring,
        MaskMode::SelfOnly,
        MaskMode::SingleKey(L - 3),
        MaskMode::SingleKey(2),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, mode)| Trial {
        token: 40 + i as u32,
        mode,
        position_shift: i as i64 - 1,
    })
    .collect();
    for fault in [
        "gqa-repeat=block",
        "mask=repeat",
        "mask=left-valid",
        "offset=after-run",
        "tbt-position=2",
        "kv-swap",
        "softmax=shared-across-heads",
        "tbt-read-layout=feature-major",
        "truncate-entry=8",
        "tbt-cache-scale=1.5",
    ] {
        for float in [true, false] {
            let base = if float {
                float_opts(L, P)
            } else {
                SimOptions {
                    cache_len: L,
                    prefill_len: P,
                    ..SimOptions::default()
                }
            };
            let opts = SimOptions {
                faults: vec![fault.to_string()],
                ..base
            };
            check(&m, opts, 13, &trials);
        }
    }
}

#[test]
fn trial_steps_is_trial_batch_without_shifts() {
    let (_d, m) = tiny_llama(9);
    let (mut dev, mut drv) = prepared(&m, float_opts(L, P), 10);
    let modes = [MaskMode::SelfOnly, MaskMode::SingleKey(20), MaskMode::Ring];
    let a = drv.trial_steps(&mut dev, 11, &modes).unwrap();
    let trials: Vec<Trial> = modes
        .iter()
        .map(|m| Trial {
            token: 11,
            mode: m.clone(),
            position_shift: 0,
        })
        .collect();
    let b = drv.trial_batch(&mut dev, &trials).unwrap();
    assert_eq!(a, b);
    // masks matter in the batch: self-only and ring rows differ
    assert!(!close(&a[0].logits, &a[2].logits, 1e-3));
}
