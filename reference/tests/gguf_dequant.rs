//! K-quant, Q4_0 and F16 tensors of a GGUF dequantise as ggml defines them. Expected values come
//! from the block layouts written out below (ggml's `dequantize_row_*`), applied to arbitrary bytes.

mod gguf_support;

use gguf_support::*;
use kvprobe_reference::gguf;

fn f16_bits(x: f32) -> [u8; 2] {
    // Only exact small powers of two are used, so the conversion is exact.
    let bits: u16 = match x {
        0.5 => 0x3800,
        0.25 => 0x3400,
        0.125 => 0x3000,
        0.0625 => 0x2C00,
        1.0 => 0x3C00,
        -1.0 => 0xBC00,
        _ => panic!("no f16 constant for {x}"),
    };
    bits.to_le_bytes()
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    values(n, seed)
        .iter()
        .map(|v| ((v + 0.5) * 256.0) as u8)
        .collect()
}

/// ggml `get_scale_min_k4`: 8 six-bit scales and 8 six-bit mins packed in 12 bytes.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K block (256 weights, 144 bytes): f16 d, f16 dmin, scales[12], qs[128]. Each 64 weights use
/// 32 bytes of qs: low nibbles for the first 32 (sub-block 2k), high nibbles for the next 32.
fn q4k_block(d: f32, dmin: f32, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let scales = bytes(12, seed);
    let qs = bytes(128, seed + 1);
    let mut b = Vec::new();
    b.extend(f16_bits(d));
    b.extend(f16_bits(dmin));
    b.extend(&scales);
    b.extend(&qs);
    let mut y = Vec::new();
    for chunk in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * chunk, &scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, &scales);
        let q = &qs[32 * chunk..32 * chunk + 32];
        for &x in q {
            y.push(d * sc1 as f32 * (x & 0xF) as f32 - dmin * m1 as f32);
        }
        for &x in q {
            y.push(d * sc2 as f32 * (x >> 4) as f32 - dmin * m2 as f32);
        }
    }
    (b, y)
}

/// Q6_K block (256 weights, 210 bytes): ql[128], qh[64], int8 scales[16], f16 d. Each 128 weights
/// use 64 bytes of ql, 32 of qh and 8 scales; a weight is 4 low bits from ql, 2 high bits from qh,
/// minus 32, times d and its 16-weight group's scale.
fn q6k_block(d: f32, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let ql = bytes(128, seed);
    let qh = bytes(64, seed + 1);
    let sc: Vec<i8> = bytes(16, seed + 2).iter().map(|&b| b as i8).collect();
    let mut b = Vec::new();
    b.extend(&ql);
    b.extend(&qh);
    b.extend(sc.iter().map(|&s| s as u8));
    b.extend(f16_bits(d));
    let mut y = vec![0f32; 256];
    for half in 0..2 {
        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
        let y = &mut y[128 * half..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
    (b, y)
}

/// Q4_0 block (32 weights, 18 bytes): f16 d, qs[16]; (nibble - 8) * d, low nibbles first.
fn q4_0_block(d: f32, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let qs = bytes(16, seed);
    let mut b = f16_bits(d).to_vec();
    b.extend(&qs);
    let mut y: Vec<f32> = qs
        .iter()
        .map(|&x| ((x & 0xF) as i32 - 8) as f32 * d)
        .collect();
    y.extend(qs.iter().map(|&x| ((x >> 4) as i32 - 8) as f32 * d));
    (b, y)
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{what}[{i}]: got {g}, ggml layout says {w}"
        );
    }
}

fn load_with(edit: impl Fn(&mut RawTensor)) -> kvprobe_reference::LoadedParts {
    let n = vocab().0.len();
    let mut tensors = base_tensors(n, false);
    tensors.iter_mut().for_each(edit);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.gguf");
    write(&p, &base_meta("llama", n), &tensors);
    gguf::load(&p).unwrap_or_else(|e| panic!("{e}"))
}

fn flat(parts: &kvprobe_reference::LoadedParts, name: &str) -> Vec<f32> {
    parts.weights[name]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

#[test]
fn q4_k_rows_dequantise_per_ggml_layout() {
    // ffn_down is [HIDDEN, FFN] = 32 rows of 256: one super-block per row.
    let mut data = Vec::new();
    let mut want = Vec::new();
    for r in 0..HIDDEN {
        let (b, y) = q4k_block(0.0625, 0.125, 100 + r as u64);
        data.extend(b);
        want.extend(y);
    }
    let parts = load_with(|t| {
        if t.name == "blk.0.ffn_down.weight" {
            t.type_id = 12;
            t.data = data.clone();
        }
    });
    assert_close(
        &flat(&parts, "model.layers.0.mlp.down_proj.weight"),
        &want,
        "Q4_K",
    );
}

#[test]
fn q6_k_rows_dequantise_per_ggml_layout() {
    let mut data = Vec::new();
    let mut want = Vec::new();
    for r in 0..HIDDEN {
        let (b, y) = q6k_block(0.0625, 300 + r as u64);
        data.extend(b);
        want.extend(y);
    }
    let parts = load_with(|t| {
        if t.name == "blk.0.ffn_down.weight" {
            t.type_id = 14;
            t.data = data.clone();
        }
    });
    assert_close(
        &flat(&parts, "model.layers.0.mlp.down_proj.weight"),
        &want,
        "Q6_K",
    );
}

#[test]
fn q4_0_and_f16_dequantise_per_ggml_layout() {
    // attn_v is [KV_HEADS*HEAD_DIM, HIDDEN] = 16 rows of 32: one Q4_0 block per row.
    let rows = KV_HEADS * HEAD_DIM;
    let mut data = Vec::new();
    let mut want = Vec::new();
    for r in 0..rows {
        let (b, y) = q4_0_block(0.25, 500 + r as u64);
        data.extend(b);
        want.extend(y);
    }
    // F16 norm weights: alternate 1.0 and -1.0 and 0.5.
    let norm: Vec<f32> = (0..HIDDEN).map(|i| [1.0, -1.0, 0.5][i % 3]).collect();
    let norm_bytes: Vec<u8> = norm.iter().flat_map(|&v| f16_bits(v)).collect();
    let parts = load_with(|t| {
        if t.name == "blk.0.attn_v.weight" {
            t.type_id = 2;
            t.data = data.clone();
        } else if t.name == "output_norm.weight" {
            t.type_id = 1;
            t.data = norm_bytes.clone();
        }
    });
    assert_close(
        &flat(&parts, "model.layers.0.self_attn.v_proj.weight"),
        &want,
        "Q4_0",
    );
    assert_close(&flat(&parts, "model.norm.weight"), &norm, "F16");
}
