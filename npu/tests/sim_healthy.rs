//! A healthy emulator with float edges reproduces the reference's greedy tokens exactly.

mod common;
use common::*;

fn check(
    model: &std::sync::Arc<kvprobe_reference::Model>,
    l: usize,
    p: usize,
    prompt_len: usize,
    n_new: usize,
    salt: usize,
) {
    let vocab = model.config().vocab_size;
    let prompt = ids(prompt_len, vocab, salt);
    let want = reference_greedy(model, &prompt, n_new);
    let (mut dev, mut drv) = sim(model, float_opts(l, p));
    let got = drv.generate_greedy(&mut dev, &prompt, n_new).unwrap();
    assert_eq!(got, want, "L={l} P={p} prompt {prompt_len}");
}

#[test]
fn llama_fixture_full_chunk_l24_p16() {
    let (_d, m) = tiny_llama(1);
    check(&m, 24, 16, 16, 8, 0);
}

#[test]
fn llama_fixture_remainder_chunk_l32_p8() {
    // 13 tokens = a 5-token remainder chunk, then one full chunk of 8
    let (_d, m) = tiny_llama(2);
    check(&m, 32, 8, 13, 12, 1);
}

#[test]
fn gpt2_fixture_two_geometries() {
    let (_d, m) = tiny_gpt2(3);
    check(&m, 24, 16, 16, 8, 2);
    check(&m, 40, 6, 17, 10, 3);
}

#[test]
fn expanded_cache_and_uint16_free_float_match_too() {
    let (_d, m) = tiny_llama(4);
    let prompt = ids(11, m.config().vocab_size, 4);
    let want = reference_greedy(&m, &prompt, 6);
    let mut o = float_opts(20, 4);
    o.cache_heads = kvprobe_npu::sim::CacheHeads::Expanded;
    let (mut dev, mut drv) = sim(&m, o);
    assert_eq!(drv.generate_greedy(&mut dev, &prompt, 6).unwrap(), want);
}

#[test]
fn smollm2_float_greedy_two_geometries() {
    let Some(m) = smollm2() else { return };
    let prompt = m.encode("The capital of France is", None).unwrap();
    let want = reference_greedy(&m, &prompt, 8);
    for (l, p) in [(128, 32), (48, 4)] {
        let (mut dev, mut drv) = sim(&m, float_opts(l, p));
        let got = drv.generate_greedy(&mut dev, &prompt, 8).unwrap();
        assert_eq!(got, want, "SmolLM2 L={l} P={p}");
    }
}

/// Qwen2 (biases), Qwen3 (QK-norm) and Llama-3 (rope_scaling llama3) fixtures: the emulator
/// builds on the reference's graph, so with float edges it gives the reference's greedy tokens.
#[test]
fn architecture_fixtures_float_greedy() {
    use kvprobe_reference::arch_fixtures::{write_hf, FixtureArch, Geometry};
    for (salt, arch) in FixtureArch::ALL.into_iter().enumerate() {
        let d = tempfile::tempdir().unwrap();
        let (_, g) = Geometry::named(&format!("tiny-{}", arch.name())).unwrap();
        write_hf(d.path(), arch, &g, 9, &Default::default()).unwrap();
        let m = std::sync::Arc::new(kvprobe_reference::Model::load(d.path()).unwrap());
        check(&m, 32, 8, 13, 10, salt);
    }
}
