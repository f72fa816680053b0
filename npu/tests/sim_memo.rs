//! The emulator's remembered prefill runs (`sim/memo.rs`): a prefill answered from memory gives
//! the bits the computed run gives — logits, and every ring byte after the steps that follow —
//! even when the stale slots it does not attend hold other bytes than when it was remembered;
//! and its remembered tbt runs (`sim/tbt_memo.rs`), whole or resumed at a layer, likewise.

mod common;

use std::collections::BTreeMap;

use common::{ids, sim, tiny_llama};
use kvprobe_npu::sim::{CacheQuant, SimDevice, SimOptions};
use kvprobe_npu::{argmax, Device, Driver, MaskMode};

/// Logit bits of every run and the rings at the end.
type Trace = (Vec<Vec<u32>>, BTreeMap<u32, Vec<u8>>);

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn generate(dev: &mut SimDevice, drv: &mut Driver, prompt: &[u32], steps: usize) -> Vec<Vec<u32>> {
    drv.reset(dev).unwrap();
    let mut out = drv.prefill(dev, prompt).unwrap();
    let mut trace = vec![bits(&out.logits)];
    for _ in 0..steps {
        out = drv.step(dev, argmax(&out.logits), &MaskMode::Ring).unwrap();
        trace.push(bits(&out.logits));
    }
    trace
}

/// Prompt A (`n` tokens), prompt B, every ring overwritten with `stale` bytes, prompt A again:
/// its full chunks' runs equal the first ones except in the slots no row attends.
fn scenario(dev: &mut SimDevice, drv: &mut Driver, n: usize, stale: impl Fn(usize) -> u8) -> Trace {
    let vocab = dev.describe().shape.vocab_size;
    let a = ids(n, vocab, 1);
    let b = ids(9, vocab, 2);
    let mut trace = generate(dev, drv, &a, 4);
    trace.extend(generate(dev, drv, &b, 2));
    for (id, buf) in dev.cache_buffers().unwrap() {
        let junk: Vec<u8> = (0..buf.len()).map(|i| stale(i * 7 + id as usize)).collect();
        dev.write_cache_buffer(id, &junk).unwrap();
    }
    trace.extend(generate(dev, drv, &a, 3));
    (trace, dev.cache_buffers().unwrap())
}

fn both(opts: SimOptions, n: usize, stale: impl Fn(usize) -> u8 + Copy) -> (Trace, Trace, usize) {
    let (_dir, model) = tiny_llama(23);
    let (mut on, mut on_drv) = sim(&model, opts.clone());
    let (mut off, mut off_drv) = sim(&model, opts);
    off.remember_prefill_runs(false);
    let a = scenario(&mut on, &mut on_drv, n, stale);
    let b = scenario(&mut off, &mut off_drv, n, stale);
    assert_eq!(off.remembered_runs(), 0);
    (a, b, on.remembered_runs())
}

fn opts(cache_quant: CacheQuant) -> SimOptions {
    SimOptions {
        cache_len: 48,
        prefill_len: 16,
        cache_quant,
        ..SimOptions::default()
    }
}

#[test]
fn a_remembered_prefill_gives_the_computed_bits_over_other_stale_slots() {
    let junk = |i: usize| (i * 131 % 251) as u8;
    // 21 tokens at P 16: the remainder chunk's idle rows hold prompt B's tokens the second time
    // (computed), the full chunk after it comes from memory
    let (a, b, hits) = both(opts(CacheQuant::U8), 21, junk);
    assert_eq!(hits, 1);
    assert_eq!(a.0, b.0, "logits");
    assert_eq!(a.1, b.1, "rings");
    // 32 tokens: two full chunks, both from memory
    let (a, b, hits) = both(opts(CacheQuant::U8), 32, junk);
    assert_eq!(hits, 2);
    assert_eq!(a.0, b.0, "logits");
    assert_eq!(a.1, b.1, "rings");
}

/// A stale slot holding NaN is never skipped: 0 × NaN reaches the output, so the run is computed.
#[test]
fn a_prefill_over_non_finite_stale_slots_is_computed() {
    let (a, b, hits) = both(opts(CacheQuant::Float), 32, |_| 0xff);
    assert_eq!(hits, 0);
    assert_eq!(a.0, b.0, "logits");
    assert_eq!(a.1, b.1, "rings");
    // the same float device over finite stale bytes does remember
    let (a, b, hits) = both(opts(CacheQuant::Float), 32, |i| {
        [0x00, 0x3c, 0x12, 0x40][i % 4]
    });
    assert_eq!(hits, 2);
    assert_eq!(a.0, b.0);
    assert_eq!(a.1, b.1);
}

/// The emulator's remembered tbt runs (`sim/tbt_memo.rs`): a request repeated from a fresh start
/// takes its steps whole from memory, and a trial step with one layer's K ring changed starts
/// at that layer from the golden step's streams; the logits and rings are the computed bits.
fn tbt_scenario(dev: &mut SimDevice, drv: &mut Driver) -> Trace {
    let vocab = dev.describe().shape.vocab_size;
    let n_layers = dev.describe().shape.n_layers;
    let a = ids(12, vocab, 1);
    let mut trace = generate(dev, drv, &a, 3);
    trace.extend(generate(dev, drv, &a, 3));
    let golden = dev.cache_buffers().unwrap();
    let token = 5 % vocab as u32;
    let out = drv.trial_step(dev, token, &MaskMode::Ring).unwrap();
    trace.push(bits(&out.logits));
    for layer in 0..n_layers {
        for (id, buf) in &golden {
            dev.write_cache_buffer(*id, buf).unwrap();
        }
        let (k, _) = SimDevice::cache_ids(layer);
        let changed: Vec<u8> = golden[&k].iter().map(|b| b ^ 0x55).collect();
        dev.write_cache_buffer(k, &changed).unwrap();
        let out = drv.trial_step(dev, token, &MaskMode::Ring).unwrap();
        trace.push(bits(&out.logits));
    }
    (trace, dev.cache_buffers().unwrap())
}

#[test]
fn remembered_and_resumed_tbt_runs_give_the_computed_bits() {
    let (_dir, model) = tiny_llama(29);
    let (mut on, mut on_drv) = sim(&model, opts(CacheQuant::U8));
    let (mut off, mut off_drv) = sim(&model, opts(CacheQuant::U8));
    off.remember_prefill_runs(false);
    off.remember_tbt_runs(false);
    let a = tbt_scenario(&mut on, &mut on_drv);
    let b = tbt_scenario(&mut off, &mut off_drv);
    assert_eq!(off.remembered_tbt_runs(), (0, 0));
    assert_eq!(a.0, b.0, "logits");
    assert_eq!(a.1, b.1, "rings");
    // the repeated request's three steps whole; every layer's trial but the first resumed
    let n_layers = on.describe().shape.n_layers;
    assert_eq!(on.remembered_tbt_runs(), (3, n_layers - 1));
}
