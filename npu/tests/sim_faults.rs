//! Each emulator fault changes what it should and only that (fault-signatures.md), on float edges
//! so "unchanged" can be exact.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::sync::Arc;

use kvprobe_npu::sim::SimOptions;
use kvprobe_npu::{Device, MaskMode, RopeTheta};
use kvprobe_reference::Model;
use kvprobe_schema::{CacheDirection, GroupKind};

/// What a probe would look at after a 16-token prompt on L = 24, P = 16.
struct Obs {
    prefill: Vec<f32>,
    ring_after_prefill: BTreeMap<u32, Vec<u8>>,
    self_only: Vec<f32>,
    ring_step: Vec<f32>,
}

fn observe(m: &Arc<Model>, faults: &[&str]) -> Obs {
    let mut o: SimOptions = float_opts(24, 16);
    o.faults = faults.iter().map(|s| s.to_string()).collect();
    let (mut dev, mut drv) = sim(m, o);
    let prompt = ids(16, m.config().vocab_size, 3);
    let prefill = drv.prefill(&mut dev, &prompt).unwrap().logits;
    let ring_after_prefill = dev.cache_buffers().unwrap();
    let self_only = drv
        .trial_step(&mut dev, 17, &MaskMode::SelfOnly)
        .unwrap()
        .logits;
    let ring_step = drv.step(&mut dev, 17, &MaskMode::Ring).unwrap().logits;
    Obs {
        prefill,
        ring_after_prefill,
        self_only,
        ring_step,
    }
}

fn differs(a: &[f32], b: &[f32]) -> bool {
    max_abs_diff(a, b) > 1e-3
}

fn near(a: &[f32], b: &[f32]) -> bool {
    approx::abs_diff_eq!(a, b, epsilon = 1e-4)
}

struct Expect {
    prefill: bool,
    placement: bool,
    self_only: bool,
    ring_step: bool,
}

fn check(m: &Arc<Model>, healthy: &Obs, fault: &str, e: Expect) {
    let f = observe(m, &[fault]);
    assert_eq!(
        differs(&f.prefill, &healthy.prefill),
        e.prefill,
        "{fault}: prefill"
    );
    if !e.prefill {
        assert!(
            near(&f.prefill, &healthy.prefill),
            "{fault}: prefill must be unchanged"
        );
    }
    assert_eq!(
        f.ring_after_prefill != healthy.ring_after_prefill,
        e.placement,
        "{fault}: ring bytes"
    );
    assert_eq!(
        differs(&f.self_only, &healthy.self_only),
        e.self_only,
        "{fault}: self-only step"
    );
    if !e.self_only {
        assert!(
            near(&f.self_only, &healthy.self_only),
            "{fault}: self-only must be unchanged"
        );
    }
    assert_eq!(
        differs(&f.ring_step, &healthy.ring_step),
        e.ring_step,
        "{fault}: ring tbt step"
    );
    assert!(f.ring_step.iter().all(|x| x.is_finite()), "{fault}: no NaN");
}

const TBT_ONLY: Expect = Expect {
    prefill: false,
    placement: false,
    self_only: false,
    ring_step: true,
};

#[test]
fn tbt_side_faults_leave_prefill_and_self_only_alone() {
    let (_d, m) = tiny_llama(31);
    let h = observe(&m, &[]);
    for fault in [
        "tbt-read-layout=feature-major",
        "tbt-read-layout=f8cr",
        "mask=left-valid",
        "tbt-cache-scale=2",
        "tbt-cache-scale=0.5@v",
        "tbt-position=+1",
        "tbt-position=-3",
        "kv-swap",
        "tbt-attn-scale=3",
    ] {
        check(&m, &h, fault, TBT_ONLY);
    }
}

#[test]
fn writer_and_runtime_faults_move_the_bytes() {
    let (_d, m) = tiny_llama(32);
    let h = observe(&m, &[]);
    for fault in [
        "prefill-write-layout=feature-major",
        "prefill-write-layout=f8cr@k",
        "prefill-write-layout=head-major",
        "prefill-write-layout=tile16@v,layer=1",
        "offset=after-run",
        "truncate-entry=64",
    ] {
        check(
            &m,
            &h,
            fault,
            Expect {
                prefill: false,
                placement: true,
                self_only: false,
                ring_step: true,
            },
        );
    }
}

#[test]
fn graph_faults_show_in_the_self_only_step() {
    let (_d, m) = tiny_llama(33);
    let h = observe(&m, &[]);
    // GQA order: the self K/V come from the wrong KV head for some query heads
    check(
        &m,
        &h,
        "gqa-repeat=block",
        Expect {
            prefill: false,
            placement: false,
            self_only: true,
            ring_step: true,
        },
    );
    // F11 on tbt only; on both groups prefill (and its writes) change too
    check(
        &m,
        &h,
        "softmax=shared-across-heads@tbt",
        Expect {
            prefill: false,
            placement: false,
            self_only: true,
            ring_step: true,
        },
    );
    check(
        &m,
        &h,
        "softmax=shared-across-heads",
        Expect {
            prefill: true,
            placement: true,
            self_only: true,
            ring_step: true,
        },
    );
    // F4: heads get scrambled masks in both groups
    check(
        &m,
        &h,
        "mask=repeat",
        Expect {
            prefill: true,
            placement: true,
            self_only: true,
            ring_step: true,
        },
    );
    check(
        &m,
        &h,
        "prefill-attn-scale=2",
        Expect {
            prefill: true,
            placement: true,
            self_only: false,
            ring_step: true,
        },
    );
}

#[test]
fn truncate_entry_zeroes_the_same_byte_columns_in_every_written_entry() {
    let (_d, m) = tiny_llama(34);
    let f = observe(&m, &["truncate-entry=40"]);
    let h = observe(&m, &[]);
    // E = 32 floats = 128 bytes, Ep = 128; prompt slots 0..15 written
    for (id, ring) in &f.ring_after_prefill {
        for slot in 0..16 {
            let entry = &ring[slot * 128..slot * 128 + 128];
            assert!(
                entry[40..].iter().all(|&b| b == 0),
                "cache {id} slot {slot}"
            );
            assert_eq!(
                entry[..40],
                h.ring_after_prefill[id][slot * 128..slot * 128 + 40],
                "kept bytes unchanged"
            );
        }
    }
    // scoped: only V of layer 1
    let f = observe(&m, &["truncate-entry=40@v,layer=1"]);
    for (id, ring) in &f.ring_after_prefill {
        assert_eq!(*id == 3, ring != &h.ring_after_prefill[id], "cache {id}");
    }
}

#[test]
fn describe_reveals_scale_faults_but_not_layout_or_binding_faults() {
    let (_d, m) = tiny_llama(35);
    let healthy = kvprobe_npu::sim::SimDevice::new(m.clone(), float_opts(24, 16)).unwrap();
    for (fault, visible) in [
        ("tbt-cache-scale=2@k,layer=0", true),
        ("tbt-read-layout=feature-major", false),
        ("prefill-write-layout=f8cr", false),
        ("kv-swap", false),
        ("offset=after-run", false),
    ] {
        let mut o = float_opts(24, 16);
        o.faults = vec![fault.to_string()];
        let dev = kvprobe_npu::sim::SimDevice::new(m.clone(), o).unwrap();
        assert_eq!(dev.describe() != healthy.describe(), visible, "{fault}");
        if visible {
            let tbt = dev.describe().group(GroupKind::Tbt).unwrap();
            let k0_in = tbt
                .cache_edges
                .iter()
                .find(|e| e.cache_id == 0 && e.direction == CacheDirection::Input)
                .unwrap();
            let k0_out = tbt
                .cache_edges
                .iter()
                .find(|e| e.cache_id == 0 && e.direction == CacheDirection::Output)
                .unwrap();
            assert_eq!(k0_in.quant.scale, 2.0 * k0_out.quant.scale);
        }
    }
}

#[test]
fn left_valid_fault_is_repaired_by_a_left_valid_mask() {
    // The mask-convention probe's evidence: under mask=left-valid, a first tbt step sent with the
    // left-valid convention reproduces the healthy ring step exactly.
    let (_d, m) = tiny_llama(36);
    let h = observe(&m, &[]);
    let mut o = float_opts(24, 16);
    o.faults = vec!["mask=left-valid".into()];
    let (mut dev, mut drv) = sim(&m, o);
    drv.prefill(&mut dev, &ids(16, m.config().vocab_size, 3))
        .unwrap();
    let row = kvprobe_npu::mask::left_valid_row(24, 17);
    let out = drv
        .step(&mut dev, 17, &MaskMode::Custom(vec![row]))
        .unwrap();
    assert_eq!(out.logits, h.ring_step);
}

#[test]
fn position_fault_is_repaired_by_shifting_the_position() {
    // tbt-position=+2 at position 16 computes what a healthy step at position 18 would (the ring
    // contents are the same), so the shift is recoverable — the position sweep's evidence.
    let (_d, m) = tiny_llama(37);
    let prompt = ids(16, m.config().vocab_size, 3);
    let mut o = float_opts(24, 16);
    o.faults = vec!["tbt-position=+2".into()];
    let (mut dev, mut drv) = sim(&m, o);
    drv.prefill(&mut dev, &prompt).unwrap();
    let faulty = drv.step(&mut dev, 17, &MaskMode::Ring).unwrap().logits;
    let (mut hdev, mut hdrv) = sim(&m, float_opts(24, 16));
    hdrv.prefill(&mut hdev, &prompt).unwrap();
    let mut st = hdrv.host_state();
    // move the driver's position counter on by 2 (positions only; usage and ring unchanged)
    st = shift_position(st, 2);
    hdrv.set_host_state(st);
    let shifted = hdrv.step(&mut hdev, 17, &MaskMode::Ring).unwrap().logits;
    assert!(
        near(&faulty, &shifted),
        "max diff {}",
        max_abs_diff(&faulty, &shifted)
    );
}

fn shift_position(st: kvprobe_npu::HostState, by: i64) -> kvprobe_npu::HostState {
    st.with_position_offset(by)
}

/// The theta table the device description ships, split into halves.
fn theta_halves(dev: &kvprobe_npu::sim::SimDevice) -> (Vec<f32>, Vec<f32>) {
    let t = dev.describe().shape.rope_theta.clone().unwrap();
    let (a, b) = t.split_at(t.len() / 2);
    (a.to_vec(), b.to_vec())
}

#[test]
fn a_sign_folded_graph_with_its_folded_table_computes_like_the_plain_one() {
    // Contract §2.6: a graph that swaps halves without a sign, fed the table whose first half is
    // negated, rotates exactly like HF rotate_half with the plain table.
    let (_d, m) = tiny_llama(41);
    let healthy = observe(&m, &[]);
    let mut o = float_opts(24, 16);
    o.rope_theta = RopeTheta::SignFolded;
    let (dev, _) = sim(&m, o.clone());
    let (first, second) = theta_halves(&dev);
    let inv = m.rope_inv_freq().unwrap();
    assert_eq!(second, inv);
    assert_eq!(first, inv.iter().map(|x| -x).collect::<Vec<_>>());
    let (mut dev, mut drv) = sim(&m, o);
    let prompt = ids(16, m.config().vocab_size, 3);
    let prefill = drv.prefill(&mut dev, &prompt).unwrap().logits;
    let ring_step = drv.step(&mut dev, 17, &MaskMode::Ring).unwrap().logits;
    assert!(near(&prefill, &healthy.prefill));
    assert!(near(&ring_step, &healthy.ring_step));
}

#[test]
fn rope_theta_fault_breaks_prefill_and_the_other_table_repairs_it() {
    let (_d, m) = tiny_llama(41);
    let healthy = observe(&m, &[]);
    let mut o = float_opts(24, 16);
    o.faults = vec!["rope-theta=sign-folded".into()];
    let (mut dev, mut drv) = sim(&m, o);
    let (first, _) = theta_halves(&dev);
    assert!(
        first.iter().all(|x| *x < 0.0),
        "the shipped table is folded"
    );
    let prompt = ids(16, m.config().vocab_size, 3);
    let faulty = drv.prefill(&mut dev, &prompt).unwrap().logits;
    assert!(differs(&faulty, &healthy.prefill));
    // the graph still expects the plain table: driving with it reproduces the healthy device
    let plain = RopeTheta::Plain.table(drv.rope_theta().unwrap());
    drv.replace_rope_theta(plain).unwrap();
    drv.reset(&mut dev).unwrap();
    let repaired = drv.prefill(&mut dev, &prompt).unwrap().logits;
    assert!(
        near(&repaired, &healthy.prefill),
        "max diff {}",
        max_abs_diff(&repaired, &healthy.prefill)
    );
}
