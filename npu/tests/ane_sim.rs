//! The stateful ANE-style emulator through the driver's stateful path (issue 9): against the f32
//! reference (fp16 tolerance), and the properties a stateful cache must have.

mod common;
use common::*;

use std::sync::Arc;

use kvprobe_npu::ane::{AneDevice, AneOptions};
use kvprobe_npu::{argmax, Device, Driver, Error, MaskMode};
use kvprobe_reference::Model;
use kvprobe_schema::RuntimeKind;

fn ane(
    model: &Arc<Model>,
    max_ctx: usize,
    max_query: usize,
    faults: &[&str],
) -> (AneDevice, Driver) {
    let dev = AneDevice::new(
        model.clone(),
        AneOptions {
            max_ctx,
            max_query,
            faults: faults.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
    .expect("ane device");
    let drv = driver_for(&dev, model);
    (dev, drv)
}

/// Device logits of every greedy step (teacher-forced on the reference's own tokens) against the
/// reference's causal forward of the same sequence.
fn greedy_cosines(
    model: &Arc<Model>,
    dev: &mut AneDevice,
    drv: &mut Driver,
    prompt: &[u32],
    steps: usize,
) -> Vec<f64> {
    let toks = reference_greedy(model, prompt, steps);
    let mut seq = prompt.to_vec();
    let full = model
        .forward(&[prompt, &toks[..steps - 1]].concat(), &Default::default())
        .unwrap();
    drv.reset(dev).unwrap();
    let mut cos = Vec::new();
    let out = drv.prefill(dev, prompt).unwrap();
    cos.push(cosine(&out.logits, full.row(prompt.len() - 1)));
    for (s, &t) in toks[..steps - 1].iter().enumerate() {
        seq.push(t);
        let out = drv.step(dev, t, &MaskMode::Ring).unwrap();
        cos.push(cosine(&out.logits, full.row(prompt.len() + s)));
    }
    cos
}

#[test]
fn fixture_matches_the_reference_under_fp16() {
    let (_d, model) = tiny_llama(3);
    let (mut dev, mut drv) = ane(&model, 64, 8, &[]);
    assert_eq!(dev.describe().runtime, RuntimeKind::Stateful);
    let prompt = ids(13, model.config().vocab_size, 1);
    let cos = greedy_cosines(&model, &mut dev, &mut drv, &prompt, 12);
    let min = cos.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(min >= 0.99, "fp16 cosines {cos:?}");
}

#[test]
fn decode_step_equals_the_last_row_of_a_longer_prefill() {
    let (_d, model) = tiny_llama(5);
    let v = model.config().vocab_size;
    let seq = ids(21, v, 2);
    let (mut dev, mut drv) = ane(&model, 64, 32, &[]);
    drv.reset(&mut dev).unwrap();
    let whole = drv.prefill(&mut dev, &seq).unwrap().logits;
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &seq[..15]).unwrap();
    let mut last = Vec::new();
    for &t in &seq[15..] {
        last = drv.step(&mut dev, t, &MaskMode::Ring).unwrap().logits;
    }
    // fp16: the same math, other matmul shapes; a few fp16 ulps of the logits
    assert!(cosine(&whole, &last) > 0.9995, "{}", cosine(&whole, &last));
    assert_eq!(argmax(&whole), argmax(&last));
}

#[test]
fn chunked_prefill_equals_one_prefill() {
    let (_d, model) = tiny_llama(7);
    let seq = ids(30, model.config().vocab_size, 3);
    let (mut one, mut d1) = ane(&model, 64, 32, &[]);
    let (mut chunked, mut d4) = ane(&model, 64, 4, &[]);
    d1.reset(&mut one).unwrap();
    d4.reset(&mut chunked).unwrap();
    let a = d1.prefill(&mut one, &seq).unwrap().logits;
    let b = d4.prefill(&mut chunked, &seq).unwrap().logits;
    assert!(cosine(&a, &b) > 0.9995, "{}", cosine(&a, &b));
    // and the states hold the same K/V for every prompt position
    let sa = one.cache_buffers().unwrap();
    let sb = chunked.cache_buffers().unwrap();
    assert_eq!(sa.len(), 4);
    for (id, a) in &sa {
        let fa: Vec<f32> = a.chunks(2).map(half_to_f32).collect();
        let fb: Vec<f32> = sb[id].chunks(2).map(half_to_f32).collect();
        assert!(
            max_abs_diff(&fa, &fb) < 0.02,
            "state {id}: {}",
            max_abs_diff(&fa, &fb)
        );
    }
}

fn half_to_f32(c: &[u8]) -> f32 {
    // IEEE binary16 by hand (independent of the device's own conversion)
    let b = u16::from_le_bytes([c[0], c[1]]);
    let sign = if b & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 10) & 0x1f) as i32;
    let m = (b & 0x3ff) as f32;
    sign * match e {
        0 => m * 2f32.powi(-24),
        31 => f32::INFINITY,
        _ => (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

#[test]
fn state_holds_kv_at_absolute_positions_and_nowhere_else() {
    let (_d, model) = tiny_llama(3);
    let (mut dev, mut drv) = ane(&model, 32, 8, &[]);
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &ids(5, model.config().vocab_size, 4))
        .unwrap();
    let c = model.config();
    for bytes in dev.cache_buffers().unwrap().values() {
        assert_eq!(bytes.len(), c.n_kv_heads * 32 * c.head_dim * 2);
        for h in 0..c.n_kv_heads {
            for p in 0..32 {
                let o = (h * 32 + p) * c.head_dim * 2;
                let nonzero = bytes[o..o + c.head_dim * 2].iter().any(|&b| b != 0);
                assert_eq!(nonzero, p < 5, "head {h} position {p}");
            }
        }
    }
    // a new request starts from zero states
    drv.reset(&mut dev).unwrap();
    assert!(dev
        .cache_buffers()
        .unwrap()
        .values()
        .all(|b| b.iter().all(|&x| x == 0)));
}

#[test]
fn the_context_ends_at_max_ctx() {
    let (_d, model) = tiny_llama(3);
    let (mut dev, mut drv) = ane(&model, 16, 8, &[]);
    let v = model.config().vocab_size;
    drv.reset(&mut dev).unwrap();
    assert!(matches!(
        drv.prefill(&mut dev, &ids(16, v, 1)),
        Err(Error::ContextTooLong {
            tokens: 16,
            max_ctx: 16
        })
    ));
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &ids(15, v, 1)).unwrap();
    drv.step(&mut dev, 1, &MaskMode::Ring).unwrap(); // position 15, the last slot
    assert!(matches!(
        drv.step(&mut dev, 1, &MaskMode::Ring),
        Err(Error::ContextFull { max_ctx: 16 })
    ));
    assert!(dev.update_cache_offset(1).is_err());
    assert!(dev.init_cache(3).is_err());
}

#[test]
fn trial_steps_leave_the_request_as_it_was() {
    let (_d, model) = tiny_llama(3);
    let (mut dev, mut drv) = ane(&model, 32, 8, &[]);
    let v = model.config().vocab_size;
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &ids(9, v, 6)).unwrap();
    let pos = drv.position();
    let trials = drv
        .trial_steps(
            &mut dev,
            7,
            &[MaskMode::Ring, MaskMode::SelfOnly, MaskMode::SingleKey(2)],
        )
        .unwrap();
    assert_eq!(drv.position(), pos);
    let real = drv.step(&mut dev, 7, &MaskMode::Ring).unwrap();
    assert_eq!(trials[0].logits, real.logits);
    assert_ne!(trials[1].logits, real.logits);
    // self-only equals the reference of the token alone at that position
    let reference = model
        .step(
            &model.empty_state().unwrap(),
            7,
            pos as usize,
            &kvprobe_reference::KeySet::None,
        )
        .unwrap();
    assert!(cosine(&trials[1].logits, &reference) > 0.99);
}

#[test]
fn gpt2_is_refused_with_a_pointer_to_sim() {
    let (_d, model) = tiny_gpt2(1);
    let e = AneDevice::new(model, AneOptions::default()).err().unwrap();
    assert!(e.to_string().contains("--sim"), "{e}");
}

#[test]
fn smollm2_matches_the_reference_under_fp16() {
    let Some(model) = smollm2() else {
        eprintln!("SmolLM2 not fetched; skipped");
        return;
    };
    let (mut dev, mut drv) = ane(&model, 128, 64, &[]);
    let prompt = model
        .encode(
            "The capital of France is Paris. The capital of Italy is",
            None,
        )
        .unwrap();
    let cos = greedy_cosines(&model, &mut dev, &mut drv, &prompt, 8);
    eprintln!("smollm2 fp16 cosines: {cos:?}");
    let min = cos.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(min >= 0.99, "fp16 cosines {cos:?}");
}

#[test]
fn scale_after_qk_changes_only_the_overflow() {
    let (_d, model) = tiny_llama(3);
    let prompt = ids(20, model.config().vocab_size, 9);
    let run = |faults: &[&str]| {
        let (mut dev, mut drv) = ane(&model, 64, 8, faults);
        drv.reset(&mut dev).unwrap();
        drv.prefill(&mut dev, &prompt).unwrap().logits
    };
    let healthy = run(&[]);
    // the literal fault on a small model: the raw products stay far below 65504
    let literal = run(&["ane-scale-after-qk=1"]);
    assert!(literal.iter().all(|x| x.is_finite()));
    assert!(
        cosine(&healthy, &literal) > 0.9999,
        "{}",
        cosine(&healthy, &literal)
    );
    // the stand-in gain pushes them past the fp16 range: inf/NaN, never a silent wrong number
    let big = run(&["ane-scale-after-qk=65536"]);
    assert!(big.iter().any(|x| !x.is_finite()));
}

#[test]
fn write_offset_fills_one_slot_late_and_stale_state_continues_the_old_request() {
    let (_d, model) = tiny_llama(3);
    let c = model.config().clone();
    let (mut dev, mut drv) = ane(&model, 32, 8, &["ane-write-offset"]);
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &ids(5, c.vocab_size, 4)).unwrap();
    let k0 = &dev.cache_buffers().unwrap()[&0];
    let slot = |p: usize| {
        k0[p * c.head_dim * 2..(p + 1) * c.head_dim * 2]
            .iter()
            .any(|&b| b != 0)
    };
    assert_eq!(
        (0..32).filter(|&p| slot(p)).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );

    let (mut dev, mut drv) = ane(&model, 32, 8, &["ane-stale-state"]);
    let a = ids(6, c.vocab_size, 1);
    let b = ids(6, c.vocab_size, 2);
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &a).unwrap();
    drv.reset(&mut dev).unwrap();
    let second = drv.prefill(&mut dev, &b).unwrap().logits;
    // the second request attends to the first: it equals the reference of a ++ b
    let joined = model
        .forward(&[a.clone(), b.clone()].concat(), &Default::default())
        .unwrap();
    let alone = model.forward(&b, &Default::default()).unwrap();
    assert!(cosine(&second, joined.row(11)) > 0.99);
    assert!(cosine(&second, alone.row(5)) < cosine(&second, joined.row(11)));
}

/// Qwen2 (biases), Qwen3 (QK-norm in the fp16 graph) and Llama-3 (rope_scaling llama3, through
/// the exported inverse frequencies) fixtures against the reference under fp16.
#[test]
fn architecture_fixtures_match_the_reference_under_fp16() {
    use kvprobe_reference::arch_fixtures::{write_hf, FixtureArch, Geometry};
    for arch in FixtureArch::ALL {
        let d = tempfile::tempdir().unwrap();
        let (_, g) = Geometry::named(&format!("tiny-{}", arch.name())).unwrap();
        write_hf(d.path(), arch, &g, 9, &Default::default()).unwrap();
        let model = Arc::new(Model::load(d.path()).unwrap());
        let (mut dev, mut drv) = ane(&model, 64, 8, &[]);
        let prompt = ids(13, model.config().vocab_size, 1);
        let cos = greedy_cosines(&model, &mut dev, &mut drv, &prompt, 12);
        let min = cos.iter().cloned().fold(f64::INFINITY, f64::min);
        assert!(min >= 0.99, "{}: fp16 cosines {cos:?}", arch.name());
    }
}
