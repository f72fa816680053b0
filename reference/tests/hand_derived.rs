//! One-layer models with hand-picked weights whose logits are worked out here by hand (f64
//! arithmetic on the formulas of the HF modelling code), not by the code under test.

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use kvprobe_reference::fixtures::build_tokenizer;
use kvprobe_reference::{Family, ForwardOptions, Model, ModelConfig, TextTokenizer, Weights};

const EPS: f64 = 1e-6;
const EMB: [[f32; 4]; 4] = [
    [3., 4., 0., 0.],
    [0., 0., 2., 0.],
    [1., 1., 1., 1.],
    [0., 0., 0., 1.],
];

fn t2(rows: &[[f32; 4]]) -> Tensor {
    let v: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(v, (rows.len(), 4), &Device::Cpu).unwrap()
}
fn t1(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap()
}
fn eye() -> [[f32; 4]; 4] {
    let mut m = [[0.; 4]; 4];
    (0..4).for_each(|i| m[i][i] = 1.);
    m
}
fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_tokenizer(build_tokenizer(&["<s>"], false).unwrap(), false, None)
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + EPS).sqrt()
}

/// Llama: hidden 4, one head (hd 4), q = 0 (all scores equal), k = identity, v swaps dims 0 and 2,
/// o = identity, MLP output 0 (down = 0), final norm gain [1,2,1,1], lm_head = identity.
fn llama() -> Model {
    let config = ModelConfig {
        family: Family::Llama,
        architecture: "LlamaForCausalLM".into(),
        vocab_size: 4,
        hidden_size: 4,
        n_layers: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        intermediate_size: 2,
        norm_eps: EPS,
        rope_theta: 100.0,
        max_position: 16,
        tie_embeddings: false,
        qkv_bias: false,
        bos_token_id: None,
        eos_token_id: None,
        add_bos: false,
        qk_norm: false,
        rope_freq_factors: None,
    };
    let mut swap = [[0.; 4]; 4];
    swap[0][2] = 1.;
    swap[1][1] = 1.;
    swap[2][0] = 1.;
    swap[3][3] = 1.;
    let p = "model.layers.0";
    let w: Weights = HashMap::from([
        ("model.embed_tokens.weight".to_string(), t2(&EMB)),
        (format!("{p}.input_layernorm.weight"), t1(&[1.; 4])),
        (format!("{p}.self_attn.q_proj.weight"), t2(&[[0.; 4]; 4])),
        (format!("{p}.self_attn.k_proj.weight"), t2(&eye())),
        (format!("{p}.self_attn.v_proj.weight"), t2(&swap)),
        (format!("{p}.self_attn.o_proj.weight"), t2(&eye())),
        (format!("{p}.post_attention_layernorm.weight"), t1(&[1.; 4])),
        (
            format!("{p}.mlp.gate_proj.weight"),
            Tensor::ones((2, 4), candle_core::DType::F32, &Device::Cpu).unwrap(),
        ),
        (
            format!("{p}.mlp.up_proj.weight"),
            Tensor::ones((2, 4), candle_core::DType::F32, &Device::Cpu).unwrap(),
        ),
        (
            format!("{p}.mlp.down_proj.weight"),
            Tensor::zeros((4, 2), candle_core::DType::F32, &Device::Cpu).unwrap(),
        ),
        ("model.norm.weight".to_string(), t1(&[1., 2., 1., 1.])),
        ("lm_head.weight".to_string(), t2(&eye())),
    ]);
    Model::from_parts(config, w, tokenizer()).unwrap()
}

/// Final RMSNorm with gain [1,2,1,1] and identity lm_head.
fn llama_logits(x: [f64; 4]) -> Vec<f32> {
    let r = rms(&x);
    let g = [1., 2., 1., 1.];
    (0..4).map(|i| (x[i] / r * g[i]) as f32).collect()
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert!(
        approx::abs_diff_eq!(a, b, epsilon = 1e-5),
        "{what}: got {a:?}, expected {b:?}"
    );
}

#[test]
fn llama_single_token_rmsnorm_and_one_key_softmax() {
    let m = llama();
    let out = m.forward(&[0], &ForwardOptions::default()).unwrap();
    // h = e/rms(e) = [1.2, 1.6, 0, 0]; one key → weight 1 → attn = v = swap(h) = [0, 1.6, 1.2, 0].
    let r = rms(&[3., 4., 0., 0.]);
    let (h0, h1) = (3. / r, 4. / r);
    let x = [3., 4. + h1, h0, 0.];
    close(&out.logits, &llama_logits(x), "one token");
}

#[test]
fn llama_equal_scores_average_values_and_masks_pick_keys() {
    let m = llama();
    let r0 = rms(&[3., 4., 0., 0.]);
    let v0 = [0., 4. / r0, 3. / r0, 0.];
    let v1 = [2., 0., 0., 0.]; // e1 = [0,0,2,0], rms 1, swapped
    let e1 = [0., 0., 2., 0.];
    // Causal: q = 0 → both scores 0 → weights 1/2 each.
    let out = m.forward(&[0, 1], &ForwardOptions::default()).unwrap();
    let x: Vec<f64> = (0..4).map(|i| e1[i] + (v0[i] + v1[i]) / 2.).collect();
    close(
        out.row(1),
        &llama_logits([x[0], x[1], x[2], x[3]]),
        "causal row 1",
    );
    // Row 1 may attend only to key 0, then only to itself.
    for (mask, v) in [
        (vec![true, false, true, false], v0),
        (vec![true, false, false, true], v1),
    ] {
        let out = m
            .forward(
                &[0, 1],
                &ForwardOptions {
                    mask: Some(mask),
                    ..Default::default()
                },
            )
            .unwrap();
        let x: Vec<f64> = (0..4).map(|i| e1[i] + v[i]).collect();
        close(
            out.row(1),
            &llama_logits([x[0], x[1], x[2], x[3]]),
            "masked row 1",
        );
    }
    // Nothing allowed: attention output is zero, logits are those of the residual alone.
    let out = m
        .forward(
            &[0, 1],
            &ForwardOptions {
                mask: Some(vec![true, false, false, false]),
                ..Default::default()
            },
        )
        .unwrap();
    close(out.row(1), &llama_logits(e1), "empty row");
}

#[test]
fn llama_rope_rotates_key_as_hf_rotate_half() {
    let m = llama();
    assert_eq!(m.rope_inv_freq().unwrap(), vec![1.0, 0.1]); // 100^(-0/4), 100^(-2/4)
    let p = 3usize;
    let out = m
        .forward(
            &[0],
            &ForwardOptions {
                positions: Some(vec![p]),
                taps: true,
                ..Default::default()
            },
        )
        .unwrap();
    let k: Vec<f32> = out.taps.unwrap()[0]
        .k
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let r = rms(&[3., 4., 0., 0.]);
    let x = [3. / r, 4. / r, 0., 0.];
    let (a0, a1) = (p as f64 * 1.0, p as f64 * 0.1);
    // rotate_half: out[i] = x[i] cos a_i - x[i+2] sin a_i; out[i+2] = x[i+2] cos a_i + x[i] sin a_i.
    let want = [
        x[0] * a0.cos() - x[2] * a0.sin(),
        x[1] * a1.cos() - x[3] * a1.sin(),
        x[2] * a0.cos() + x[0] * a0.sin(),
        x[3] * a1.cos() + x[1] * a1.sin(),
    ];
    close(&k, &want.map(|v| v as f32), "rope");
    // V carries no rotation.
}

fn ln(x: &[f64]) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    x.iter().map(|v| (v - mean) / (var + EPS).sqrt()).collect()
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1. + ((2. / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

/// GPT-2: hidden 4, one head, q = k = 0, v = identity, c_proj = identity, c_fc = identity,
/// mlp c_proj = identity, unit LayerNorms, tied lm_head; wpe[p] = [0, 0, 0, p/2].
fn gpt2() -> Model {
    let config = ModelConfig {
        family: Family::Gpt2,
        architecture: "GPT2LMHeadModel".into(),
        vocab_size: 4,
        hidden_size: 4,
        n_layers: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        intermediate_size: 4,
        norm_eps: EPS,
        rope_theta: 0.0,
        max_position: 8,
        tie_embeddings: true,
        qkv_bias: true,
        bos_token_id: None,
        eos_token_id: None,
        add_bos: false,
        qk_norm: false,
        rope_freq_factors: None,
    };
    let mut c_attn = vec![0f32; 4 * 12];
    for i in 0..4 {
        c_attn[i * 12 + 8 + i] = 1.; // [in, out]: v block is columns 8..12
    }
    let wpe: Vec<[f32; 4]> = (0..8).map(|p| [0., 0., 0., p as f32 / 2.]).collect();
    let z = |n: usize| t1(&vec![0.; n]);
    let w: Weights = HashMap::from([
        ("transformer.wte.weight".to_string(), t2(&EMB)),
        ("transformer.wpe.weight".to_string(), t2(&wpe)),
        ("h.0.ln_1.weight".to_string(), t1(&[1.; 4])),
        ("h.0.ln_1.bias".to_string(), z(4)),
        (
            "h.0.attn.c_attn.weight".to_string(),
            Tensor::from_vec(c_attn, (4, 12), &Device::Cpu).unwrap(),
        ),
        ("h.0.attn.c_attn.bias".to_string(), z(12)),
        ("h.0.attn.c_proj.weight".to_string(), t2(&eye())),
        ("h.0.attn.c_proj.bias".to_string(), z(4)),
        ("h.0.ln_2.weight".to_string(), t1(&[1.; 4])),
        ("h.0.ln_2.bias".to_string(), z(4)),
        ("h.0.mlp.c_fc.weight".to_string(), t2(&eye())),
        ("h.0.mlp.c_fc.bias".to_string(), z(4)),
        ("h.0.mlp.c_proj.weight".to_string(), t2(&eye())),
        ("h.0.mlp.c_proj.bias".to_string(), z(4)),
        ("transformer.ln_f.weight".to_string(), t1(&[1.; 4])),
        ("ln_f.bias".to_string(), z(4)),
    ]);
    Model::from_parts(config, w, tokenizer()).unwrap()
}

fn gpt2_by_hand(tokens: &[(usize, usize)], attend: &[usize]) -> Vec<f32> {
    // x_t = wte[id] + wpe[p]; row of interest = the last token; equal scores (q = k = 0).
    let xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&(id, p)| {
            let mut x: Vec<f64> = EMB[id].iter().map(|&v| v as f64).collect();
            x[3] += p as f64 / 2.;
            x
        })
        .collect();
    let last = xs.last().unwrap().clone();
    let mut attn = [0f64; 4];
    for &j in attend {
        let h = ln(&xs[j]);
        (0..4).for_each(|i| attn[i] += h[i] / attend.len() as f64);
    }
    let x1: Vec<f64> = (0..4).map(|i| last[i] + attn[i]).collect();
    let g: Vec<f64> = ln(&x1).into_iter().map(gelu_tanh).collect();
    let x2: Vec<f64> = (0..4).map(|i| x1[i] + g[i]).collect();
    let f = ln(&x2);
    EMB.iter()
        .map(|row| row.iter().zip(&f).map(|(w, v)| *w as f64 * v).sum::<f64>() as f32)
        .collect()
}

#[test]
fn gpt2_layernorm_gelu_positions_and_tied_head() {
    let m = gpt2();
    let one = m.forward(&[0], &ForwardOptions::default()).unwrap();
    close(&one.logits, &gpt2_by_hand(&[(0, 0)], &[0]), "one token");
    let two = m
        .forward(
            &[0, 1],
            &ForwardOptions {
                positions: Some(vec![2, 5]),
                ..Default::default()
            },
        )
        .unwrap();
    close(
        two.row(1),
        &gpt2_by_hand(&[(0, 2), (1, 5)], &[0, 1]),
        "two tokens",
    );
}
