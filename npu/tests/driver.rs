//! The genai driver against a recording device: chunking, offsets, masks, positions, embeddings
//! (contract §2.3-§2.6), checked against hand-derived values.

mod common;
use common::*;

use std::collections::BTreeMap;

use kvprobe_npu::sim::SimDevice;
use kvprobe_npu::{Buffer, Device, Error, MaskMode, Result, RunOutput};
use kvprobe_schema::{DeviceDescription, GroupKind, InputRole};

/// One recorded run: group, read offset at run time, inputs.
type RunLog = (GroupKind, u32, Vec<(String, Buffer)>);

struct Rec {
    inner: SimDevice,
    runs: Vec<RunLog>,
}

impl Device for Rec {
    fn describe(&self) -> &DeviceDescription {
        self.inner.describe()
    }
    fn run(&mut self, g: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        self.runs
            .push((g, self.inner.read_offset(), inputs.to_vec()));
        self.inner.run(g, inputs)
    }
    fn init_cache(&mut self, r: u32) -> Result<()> {
        self.inner.init_cache(r)
    }
    fn update_cache_offset(&mut self, d: i32) -> Result<()> {
        self.inner.update_cache_offset(d)
    }
    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        self.inner.cache_buffers()
    }
    fn write_cache_buffer(&mut self, id: u32, b: &[u8]) -> Result<()> {
        self.inner.write_cache_buffer(id, b)
    }
}

fn input(dev: &Rec, run: usize, role: InputRole) -> Buffer {
    let (g, _, inputs) = &dev.runs[run];
    let name = &dev
        .describe()
        .group(*g)
        .unwrap()
        .inputs
        .iter()
        .find(|i| i.role == Some(role))
        .unwrap()
        .name;
    inputs.iter().find(|(n, _)| n == name).unwrap().1.clone()
}

fn row_str(mask: &[u8], row: usize, heads: usize, keys: usize, head: usize) -> String {
    let o = (row * heads + head) * keys;
    mask[o..o + keys]
        .iter()
        .map(|&v| {
            if v == 255 {
                '#'
            } else if v == 0 {
                '.'
            } else {
                '?'
            }
        })
        .collect()
}

/// The tiny llama on the emulator (L 24, P 16) behind a recording device, and its driver.
fn recorded_l24_p16() -> (
    tempfile::TempDir,
    std::sync::Arc<kvprobe_reference::Model>,
    kvprobe_npu::Driver,
    Rec,
) {
    let (d, m) = tiny_llama(21);
    let inner = SimDevice::new(
        m.clone(),
        kvprobe_npu::sim::SimOptions {
            cache_len: 24,
            prefill_len: 16,
            ..Default::default()
        },
    )
    .unwrap();
    let drv = inner.driver().unwrap();
    let dev = Rec {
        inner,
        runs: Vec::new(),
    };
    (d, m, drv, dev)
}

#[test]
fn rope_tables_are_float32_angles_as_the_server_computes_them() {
    // pre_process.cpp `angular_positional_embed`: `float angle = theta[c] * (float)pos`, then
    // float cos/sin. Hand-derived here: the exact product θ·pos (an f32 times a small integer is
    // exact in f64) rounded once to f32, its cos/sin in f64 rounded to f32 (≤ 1 ulp from the
    // float functions). An f64 angle misses by up to hundreds of ulps where θ·pos is not exact.
    let (_d, m, mut drv, mut dev) = recorded_l24_p16();
    drv.prefill(&mut dev, &ids(20, m.config().vocab_size, 5))
        .unwrap();
    drv.step(&mut dev, 7, &MaskMode::Ring).unwrap();
    let theta = dev.describe().shape.rope_theta.clone().unwrap();
    let d = theta.len();
    let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
    let mut inexact = 0;
    // run 1: prefill chunk B, rows 0..16 = positions 4..20; run 2: tbt, position 20
    for (run, first_pos, rows) in [(1usize, 4u64, 16usize), (2, 20, 1)] {
        for (role, heads) in [
            (InputRole::PeQCos, m.config().n_heads),
            (InputRole::PeQSin, m.config().n_heads),
            (InputRole::PeKCos, m.config().n_kv_heads),
            (InputRole::PeKSin, m.config().n_kv_heads),
        ] {
            let Buffer::F32(got) = input(&dev, run, role) else {
                panic!()
            };
            assert_eq!(got.len(), rows * heads * d);
            for (i, &g) in got.iter().enumerate() {
                let (row, c) = (i / (heads * d), i % d);
                let pos = first_pos + row as u64;
                let exact = theta[c] as f64 * pos as f64;
                let angle = exact as f32;
                inexact += usize::from(angle as f64 != exact);
                let want = match role {
                    InputRole::PeQCos | InputRole::PeKCos => (angle as f64).cos() as f32,
                    _ => (angle as f64).sin() as f32,
                };
                assert!(
                    ulps(g, want) <= 1,
                    "run {run} {role:?} row {row} col {c}: {g} vs {want}"
                );
            }
        }
    }
    // the check has teeth: many angles are not exact in f32
    assert!(inexact > 100, "{inexact}");
}

#[test]
fn remainder_first_chunks_update_before_run_masks_positions() {
    // quantised edges: M1 = q(1.0) = 255, embeddings are uint16 codes
    let (_d, m, mut drv, mut dev) = recorded_l24_p16();
    assert_eq!(drv.m1(), 255);
    let prompt = ids(20, m.config().vocab_size, 5);
    drv.prefill(&mut dev, &prompt).unwrap();
    assert_eq!(dev.runs.len(), 2);
    // chunk A: 4 tokens, offset updated before the run → R = 4 at run time; chunk B → 20
    assert_eq!((dev.runs[0].0, dev.runs[0].1), (GroupKind::Prefill, 4));
    assert_eq!((dev.runs[1].0, dev.runs[1].1), (GroupKind::Prefill, 20));
    let nh = m.config().n_heads;
    let Buffer::U8(mask_a) = &input(&dev, 0, InputRole::AttentionMask) else {
        panic!()
    };
    assert_eq!(mask_a.len(), 16 * nh * 24);
    // U = 4: rows 0-11 padding (all M1); row 12 = first real token
    assert_eq!(row_str(mask_a, 0, nh, 24, 0), "########################");
    assert_eq!(row_str(mask_a, 11, nh, 24, 3), "########################");
    assert_eq!(row_str(mask_a, 12, nh, 24, 0), "....................#...");
    assert_eq!(row_str(mask_a, 15, nh, 24, 2), "....................####");
    let Buffer::U8(mask_b) = &input(&dev, 1, InputRole::AttentionMask) else {
        panic!()
    };
    // U = 20: cols [0,4) unused, [4,8) tokens 0-3 (older), then the 16×16 triangle
    assert_eq!(row_str(mask_b, 0, nh, 24, 0), "....#####...............");
    assert_eq!(row_str(mask_b, 15, nh, 24, 1), "....####################");

    // positions: chunk A rows 12..15 = 0..3, chunk B rows = 4..19 (pe_k_cos column 1: cos(θ1·pos))
    let theta = dev.describe().shape.rope_theta.clone().unwrap();
    let d = theta.len();
    let nkv = m.config().n_kv_heads;
    let Buffer::F32(kc_a) = &input(&dev, 0, InputRole::PeKCos) else {
        panic!()
    };
    assert_eq!(kc_a.len(), 16 * nkv * d);
    for (row, pos) in [(12usize, 0f64), (13, 1.0), (15, 3.0)] {
        let got = kc_a[(row * nkv + 1) * d + 1];
        assert!(
            (got as f64 - (theta[1] as f64 * pos).cos()).abs() < 1e-6,
            "row {row}"
        );
    }
    let Buffer::F32(ks_b) = &input(&dev, 1, InputRole::PeKSin) else {
        panic!()
    };
    assert!(
        (ks_b[(7 * nkv) * d + 3] as f64 - (theta[3] as f64 * 11.0).sin()).abs() < 1e-6,
        "row 7 = position 11"
    );
    // HF rotate_half convention: theta = [inv_freq, inv_freq]
    assert_eq!(theta[..d / 2], theta[d / 2..]);

    // embeddings: chunk B row r = token 4 + r; chunk A rows 12..15 = tokens 0..3
    let Buffer::U16(emb_b) = &input(&dev, 1, InputRole::Embeddings) else {
        panic!()
    };
    let Buffer::U16(emb_a) = &input(&dev, 0, InputRole::Embeddings) else {
        panic!()
    };
    let f = m.config().hidden_size;
    // the window slides: chunk A's newest row (token 3) is chunk B's row... dropped (B has 16 new
    // rows), so B row 0 = token 4 and A row 15 = token 3: equal only if the tokens' rows are.
    assert_eq!(emb_a.len(), 16 * f);
    assert_eq!(emb_b.len(), 16 * f);
    assert_eq!(emb_a[12 * f..13 * f] == emb_b[..f], prompt[0] == prompt[4]);

    // tbt: R = 21 at run, ring row for U = 21, newest position 20
    drv.step(&mut dev, 7, &MaskMode::Ring).unwrap();
    assert_eq!((dev.runs[2].0, dev.runs[2].1), (GroupKind::Tbt, 21));
    let Buffer::U8(mt) = &input(&dev, 2, InputRole::AttentionMask) else {
        panic!()
    };
    assert_eq!(row_str(mt, 0, nh, 24, 0), "...#####################");
    let Buffer::F32(qc) = &input(&dev, 2, InputRole::PeQCos) else {
        panic!()
    };
    assert!((qc[5] as f64 - (theta[5] as f64 * 20.0).cos()).abs() < 1e-6);
    assert_eq!(drv.usage(), 21);

    // step back restores R and the host state; a trial step leaves both unchanged
    drv.step_back(&mut dev).unwrap();
    assert_eq!(
        (dev.inner.read_offset(), drv.usage(), drv.position()),
        (20, 20, 20)
    );
    drv.trial_step(&mut dev, 7, &MaskMode::SelfOnly).unwrap();
    assert_eq!(
        (dev.inner.read_offset(), drv.usage(), drv.position()),
        (20, 20, 20)
    );
    let Buffer::U8(ms) = &input(&dev, 3, InputRole::AttentionMask) else {
        panic!()
    };
    assert_eq!(row_str(ms, 0, nh, 24, 3), ".......................#");
}

#[test]
fn embeddings_rows_are_the_quantised_table_rows() {
    let (_d, m) = tiny_llama(22);
    let inner = SimDevice::new(
        m.clone(),
        kvprobe_npu::sim::SimOptions {
            cache_len: 24,
            prefill_len: 8,
            ..Default::default()
        },
    )
    .unwrap();
    let emb_q = inner.quant().embeddings;
    let mut drv = inner.driver().unwrap();
    let mut dev = Rec {
        inner,
        runs: Vec::new(),
    };
    let prompt = vec![5u32, 9, 13];
    drv.prefill(&mut dev, &prompt).unwrap();
    let Buffer::U16(e) = &input(&dev, 0, InputRole::Embeddings) else {
        panic!()
    };
    let f = m.config().hidden_size;
    let table: Vec<f32> = m
        .embedding_table()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    // row 5 (of 8) = token 5's row, quantised by hand with the contract §4 formula
    for c in 0..f {
        let x = table[5 * f + c].clamp(emb_q.min, emb_q.max);
        let want = (x / emb_q.scale + emb_q.zero_point).round_ties_even() as u16;
        assert_eq!(e[5 * f + c], want);
        let x9 = table[9 * f + c].clamp(emb_q.min, emb_q.max);
        assert_eq!(
            e[6 * f + c],
            (x9 / emb_q.scale + emb_q.zero_point).round_ties_even() as u16
        );
    }
}

#[test]
fn prompt_of_l_tokens_is_refused_and_reset_keeps_the_window() {
    let (_d, m) = tiny_llama(23);
    let (inner, mut drv) = sim(&m, float_opts(24, 16));
    let mut dev = Rec {
        inner,
        runs: Vec::new(),
    };
    let v = m.config().vocab_size;
    let e = drv.prefill(&mut dev, &ids(24, v, 0)).unwrap_err();
    assert!(matches!(
        e,
        Error::PromptTooLong {
            tokens: 24,
            cache_len: 24
        }
    ));
    assert_eq!(e.exit_code(), 2);
    assert!(!e.to_string().contains('\n'));
    assert!(dev.runs.is_empty());
    drv.prefill(&mut dev, &ids(23, v, 0)).unwrap();
    drv.reset(&mut dev).unwrap();
    assert_eq!(
        (dev.inner.read_offset(), drv.usage(), drv.position()),
        (0, 0, 0)
    );
    // stale window rows from the previous conversation are re-sent (masked as padding)
    let before = input(&dev, dev.runs.len() - 1, InputRole::Embeddings);
    drv.prefill(&mut dev, &[1]).unwrap();
    let after = input(&dev, dev.runs.len() - 1, InputRole::Embeddings);
    let (Buffer::F32(b), Buffer::F32(a)) = (before, after) else {
        panic!()
    };
    let f = m.config().hidden_size;
    assert_eq!(
        &a[..15 * f],
        &b[f..16 * f],
        "window shifted by one, not cleared"
    );
    assert_eq!(drv.window_positions()[15], 0);
}

/// A fresh start (issue 34: what a new `kvprobe` process sends) does not re-send the previous
/// conversation's window rows: after `fresh_host_state` the padding rows are the raw zeros a new
/// driver starts with, so the request's inputs are a new driver's.
#[test]
fn a_fresh_host_state_sends_what_a_new_driver_sends() {
    let (_d, m) = tiny_llama(23);
    let v = m.config().vocab_size;
    let (inner, mut drv) = sim(&m, float_opts(24, 16));
    let mut dev = Rec {
        inner,
        runs: Vec::new(),
    };
    drv.prefill(&mut dev, &ids(23, v, 0)).unwrap();
    drv.reset(&mut dev).unwrap();
    let fresh = drv.fresh_host_state();
    drv.set_host_state(fresh);
    drv.prefill(&mut dev, &[1]).unwrap();
    let (inner, mut new_drv) = sim(&m, float_opts(24, 16));
    let mut new_dev = Rec {
        inner,
        runs: Vec::new(),
    };
    new_drv.prefill(&mut new_dev, &[1]).unwrap();
    let (Buffer::F32(a), Buffer::F32(b)) = (
        input(&dev, dev.runs.len() - 1, InputRole::Embeddings),
        input(&new_dev, 0, InputRole::Embeddings),
    ) else {
        panic!()
    };
    let f = m.config().hidden_size;
    assert!(a[..15 * f].iter().all(|&x| x == 0.0), "padding rows zero");
    assert_eq!(a, b);
    assert_eq!(drv.window_positions(), new_drv.window_positions());
}
