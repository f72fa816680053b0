#![allow(clippy::needless_range_loop)] // slot/token indices read clearer in timelines
//! Ring timelines on the emulator (contract §1.5, §2.3, §2.7; prior art §2.6), with float edges so
//! the ring bytes can be compared with the reference's K directly.

mod common;
use common::*;

use kvprobe_npu::sim::SimDevice;
use kvprobe_npu::{Device, MaskMode};
use kvprobe_reference::{ForwardOptions, Model};

/// Reference K of layer 0 for every token of `seq`, as `[T][features]` (features = kv_head·hd + d).
fn ref_k0(model: &Model, seq: &[u32]) -> Vec<Vec<f32>> {
    let f = model
        .forward(
            seq,
            &ForwardOptions {
                taps: true,
                ..Default::default()
            },
        )
        .unwrap();
    let k = &f.taps.unwrap()[0].k;
    let (h, t, hd) = k.dims3().unwrap();
    let v: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
    (0..t)
        .map(|ti| {
            (0..h)
                .flat_map(|hi| v[(hi * t + ti) * hd..(hi * t + ti + 1) * hd].to_vec())
                .collect()
        })
        .collect()
}

fn slot_f32(dev: &mut SimDevice, cache_id: u32, slot: usize) -> Vec<f32> {
    let bufs = dev.cache_buffers().unwrap();
    let (features, _) = dev.entry_format();
    let ep = dev.describe().groups[0].cache_edges[0].padded_entry_size;
    let b = &bufs[&cache_id][slot * ep..slot * ep + features * 4];
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    approx::abs_diff_eq!(a, b, epsilon = 1e-4)
}

#[test]
fn l24_p16_prompt16_first_tbt_window_and_write_slot() {
    let (_d, m) = tiny_llama(7);
    let mut o = float_opts(24, 16);
    o.taps = true;
    let (mut dev, mut drv) = sim(&m, o);
    let prompt = ids(16, m.config().vocab_size, 0);
    drv.prefill(&mut dev, &prompt).unwrap();
    assert_eq!(dev.read_offset(), 16);
    let want = ref_k0(&m, &prompt);
    for t in 0..16 {
        assert!(
            close(&slot_f32(&mut dev, 0, t), &want[t]),
            "slot {t} holds token {t}"
        );
    }
    for s in 16..24 {
        assert!(
            slot_f32(&mut dev, 0, s).iter().all(|&x| x == 0.0),
            "slot {s} never written"
        );
    }
    let next = 42u32;
    let out = drv.step(&mut dev, next, &MaskMode::Ring).unwrap();
    assert_eq!(dev.read_offset(), 17);
    let tap = &out.taps[&0];
    let (features, _) = dev.entry_format();
    assert_eq!(tap.len(), 23 * features, "tbt reads L - 1 = 23 entries");
    for e in 0..7 {
        assert!(
            tap[e * features..(e + 1) * features]
                .iter()
                .all(|&x| x == 0.0),
            "entry {e} never written"
        );
    }
    for t in 0..16 {
        let e = 7 + t;
        assert!(
            close(&tap[e * features..(e + 1) * features], &want[t]),
            "window entry {e} = token {t}"
        );
    }
    // the step wrote slot 16 with the K of position 16
    let mut seq = prompt.clone();
    seq.push(next);
    assert!(close(&slot_f32(&mut dev, 0, 16), &ref_k0(&m, &seq)[16]));
}

#[test]
fn remainder_chunk_writes_padding_rows_and_keeps_t_mod_l() {
    // 20 tokens, P = 16: chunk A = 4 tokens (R = 4, writes slots 12..23, 0..3 with 12 padding rows
    // first), chunk B = 16 tokens (R = 20, writes slots 4..19) — contract §2.7 scaled down.
    let (_d, m) = tiny_llama(8);
    let mut o = float_opts(24, 16);
    o.taps = true;
    let (mut dev, mut drv) = sim(&m, o);
    // a previous conversation leaves stale rows in the host window (contract §2.10): they become
    // chunk A's padding rows (a zero window would give all-zero K on this bias-free model)
    drv.prefill(&mut dev, &ids(16, m.config().vocab_size, 9))
        .unwrap();
    drv.reset(&mut dev).unwrap();
    let prompt = ids(20, m.config().vocab_size, 1);
    drv.prefill(&mut dev, &prompt).unwrap();
    assert_eq!(dev.read_offset(), 20);
    let want = ref_k0(&m, &prompt);
    for t in 0..20 {
        assert!(
            close(&slot_f32(&mut dev, 0, t), &want[t]),
            "token {t} in slot {t}"
        );
    }
    for s in 20..24 {
        assert!(
            slot_f32(&mut dev, 0, s).iter().any(|&x| x != 0.0),
            "slot {s} holds a padding row"
        );
    }
    let out = drv.step(&mut dev, 3, &MaskMode::Ring).unwrap();
    let (features, _) = dev.entry_format();
    let tap = &out.taps[&0];
    for t in 0..20 {
        let e = 3 + t;
        assert!(close(&tap[e * features..(e + 1) * features], &want[t]));
    }
}

#[test]
fn generation_wraps_the_ring_into_a_sliding_window() {
    let (_d, m) = tiny_llama(9);
    let (mut dev, mut drv) = sim(&m, float_opts(24, 16));
    let prompt = ids(16, m.config().vocab_size, 2);
    let toks = drv.generate_greedy(&mut dev, &prompt, 12).unwrap();
    // 16 prompt + 11 fed tokens = 27 processed: R = 27 mod 24 = 3
    assert_eq!(dev.read_offset(), 3);
    assert_eq!(drv.usage(), 27);
    assert_eq!(drv.position(), 27);
    let mut seq = prompt.clone();
    seq.extend_from_slice(&toks[..11]);
    let want = ref_k0(&m, &seq);
    // positions 24, 25, 26 overwrote slots 0, 1, 2 (layer-0 K does not depend on attention)
    for (slot, pos) in [(0, 24), (1, 25), (2, 26), (3, 3), (23, 23)] {
        assert!(
            close(&slot_f32(&mut dev, 0, slot), &want[pos]),
            "slot {slot} = position {pos}"
        );
    }
}

#[test]
fn negative_delta_wraps_in_u32() {
    let (_d, m) = tiny_llama(10);
    let (mut dev, _) = sim(&m, float_opts(24, 16));
    dev.init_cache(0).unwrap();
    dev.update_cache_offset(-1).unwrap();
    assert_eq!(dev.read_offset(), 15, "(2^32 - 1) mod 24");
    dev.init_cache(5).unwrap();
    dev.update_cache_offset(-2).unwrap();
    assert_eq!(dev.read_offset(), 3);
    let (mut dev16, _) = sim(&m, float_opts(16, 4));
    dev16.update_cache_offset(-1).unwrap();
    assert_eq!(dev16.read_offset(), 15, "L = 16 divides 2^32");
    assert!(dev.init_cache(24).is_err());
}

#[test]
fn write_cache_buffer_round_trips() {
    let (_d, m) = tiny_llama(11);
    let (mut dev, _) = sim(&m, float_opts(24, 16));
    let bufs = dev.cache_buffers().unwrap();
    assert_eq!(bufs.len(), 2 * m.config().n_layers);
    let n = bufs[&1].len();
    assert_eq!(n, 24 * 128, "L × Ep with E = 32 floats = 128 bytes");
    let pattern: Vec<u8> = (0..n).map(|i| (i * 7 % 253) as u8).collect();
    dev.write_cache_buffer(1, &pattern).unwrap();
    assert_eq!(dev.cache_buffers().unwrap()[&1], pattern);
    assert!(dev.write_cache_buffer(1, &pattern[..n - 1]).is_err());
    assert!(dev.write_cache_buffer(99, &pattern).is_err());
}
