//! Default (quantised) emulator against the float reference: prefill and per-step logits cosines.
//! Prints the numbers (run with --nocapture); asserts only loose health bounds.

mod common;
use common::*;

use std::sync::Arc;

use kvprobe_npu::sim::SimOptions;
use kvprobe_npu::{argmax, MaskMode};
use kvprobe_reference::Model;

/// Teacher-forced on the reference's greedy tokens so every step compares the same context.
fn cosines(m: &Arc<Model>, o: SimOptions, prompt: &[u32], steps: usize) -> (f64, Vec<f64>, usize) {
    let want = reference_greedy(m, prompt, steps + 1);
    let (mut dev, mut drv) = sim(m, o);
    let pf = drv.prefill(&mut dev, prompt).unwrap().logits;
    let mut seq = prompt.to_vec();
    let pf_cos = cosine(&pf, &reference_last_logits(m, &seq));
    let mut agree = (argmax(&pf) == want[0]) as usize;
    let mut per = Vec::new();
    for s in 0..steps {
        seq.push(want[s]);
        let out = drv.step(&mut dev, want[s], &MaskMode::Ring).unwrap().logits;
        per.push(cosine(&out, &reference_last_logits(m, &seq)));
        agree += (argmax(&out) == want[s + 1]) as usize;
    }
    (pf_cos, per, agree)
}

fn report(name: &str, r: &(f64, Vec<f64>, usize)) {
    let min = r.1.iter().cloned().fold(1.0, f64::min);
    let mean = r.1.iter().sum::<f64>() / r.1.len().max(1) as f64;
    println!(
        "{name}: prefill cos {:.5}; tbt cos min {:.5} mean {:.5}; top-1 {}/{}",
        r.0,
        min,
        mean,
        r.2,
        r.1.len() + 1
    );
}

#[test]
fn fixtures_default_quantisation() {
    let (_d, m) = tiny_llama(51);
    for (l, p, n) in [(24, 16, 16), (32, 8, 13)] {
        let o = SimOptions {
            cache_len: l,
            prefill_len: p,
            ..SimOptions::default()
        };
        let r = cosines(&m, o, &ids(n, m.config().vocab_size, 2), 7);
        report(&format!("tiny llama L={l} P={p} n={n} uint8"), &r);
        assert!(r.0 > 0.9 && r.1.iter().all(|&c| c > 0.9));
    }
    let (_g, g) = tiny_gpt2(52);
    let r = cosines(
        &g,
        SimOptions {
            cache_len: 24,
            prefill_len: 16,
            ..SimOptions::default()
        },
        &ids(16, g.config().vocab_size, 2),
        7,
    );
    report("tiny gpt2 L=24 P=16 uint8", &r);
    assert!(r.0 > 0.9 && r.1.iter().all(|&c| c > 0.9));
}

#[test]
fn smollm2_default_quantisation() {
    let Some(m) = smollm2() else { return };
    let prompt = m
        .encode("<|im_start|>user\nTell me a short story about a dragon.<|im_end|>\n<|im_start|>assistant\n", None)
        .unwrap();
    for (name, o) in [
        ("uint8", SimOptions::default()),
        (
            "uint16",
            SimOptions {
                cache_quant: kvprobe_npu::sim::CacheQuant::U16,
                ..SimOptions::default()
            },
        ),
    ] {
        let r = cosines(&m, o, &prompt, 16);
        report(
            &format!("SmolLM2 L=128 P=32 {name} ({} prompt tokens)", prompt.len()),
            &r,
        );
        assert!(r.0 > 0.9, "prefill cosine {}", r.0);
    }
}

#[test]
fn int8_weights_and_expanded_uint16_cache_stay_close() {
    let (_d, m) = tiny_llama(53);
    let prompt = ids(13, m.config().vocab_size, 4);
    for (name, o) in [
        (
            "int8 weights",
            SimOptions {
                cache_len: 24,
                prefill_len: 8,
                weights: kvprobe_npu::sim::SimWeights::Int8,
                ..SimOptions::default()
            },
        ),
        (
            "expanded uint16",
            SimOptions {
                cache_len: 24,
                prefill_len: 8,
                cache_heads: kvprobe_npu::sim::CacheHeads::Expanded,
                cache_quant: kvprobe_npu::sim::CacheQuant::U16,
                ..SimOptions::default()
            },
        ),
    ] {
        let r = cosines(&m, o, &prompt, 5);
        report(&format!("tiny llama {name}"), &r);
        assert!(r.0 > 0.9 && r.1.iter().all(|&c| c > 0.9), "{name}");
    }
    // int8 weights really change the computation
    let (mut a, mut da) = sim(
        &m,
        SimOptions {
            cache_len: 24,
            prefill_len: 8,
            weights: kvprobe_npu::sim::SimWeights::Int8,
            ..float_opts(24, 8)
        },
    );
    let (mut b, mut db) = sim(&m, float_opts(24, 8));
    let la = da.prefill(&mut a, &prompt).unwrap().logits;
    let lb = db.prefill(&mut b, &prompt).unwrap().logits;
    assert!(max_abs_diff(&la, &lb) > 1e-5);
}
