//! HF folder loading: sharded index, bf16/f16 storage, GPT-2 name prefixes, tokenizer and BOS,
//! architecture variants, int8 fake quantisation, GQA head order.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use common::{cosine, ids, llama, max_abs_diff};
use kvprobe_reference::fixtures::{
    write_tiny_gpt2, write_tiny_llama, write_tiny_llama_with, FixtureOptions,
};
use kvprobe_reference::{hf, Error, Family, ForwardOptions, GraphOptions, HeadWiring, Model};

fn logits(m: &Model, x: &[u32]) -> Vec<f32> {
    m.forward(x, &ForwardOptions::default()).unwrap().logits
}

#[test]
fn config_fields_of_the_fixtures() {
    let f = llama(1);
    let c = f.model.config();
    assert_eq!(c.family, Family::Llama);
    assert_eq!(
        (
            c.hidden_size,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.n_layers
        ),
        (64, 4, 2, 16, 2)
    );
    assert_eq!(
        (c.vocab_size, c.max_position, c.rope_theta),
        (300, 256, 10000.0)
    );
    assert!(!c.tie_embeddings && !c.qkv_bias);
    let g = common::gpt2(1);
    let c = g.model.config();
    assert_eq!(c.family, Family::Gpt2);
    assert_eq!(
        (
            c.hidden_size,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.intermediate_size
        ),
        (64, 4, 4, 16, 256)
    );
    assert!(c.tie_embeddings);
    assert!(g.model.rope_inv_freq().is_none());
}

#[test]
fn sharded_folder_equals_single_file() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    write_tiny_llama(a.path(), 3).unwrap();
    write_tiny_llama_with(
        b.path(),
        3,
        &FixtureOptions {
            shards: 3,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(b.path().join("model.safetensors.index.json").is_file());
    assert!(!b.path().join("model.safetensors").exists());
    let x = ids(8, 300, 3);
    assert_eq!(
        logits(&Model::load(a.path()).unwrap(), &x),
        logits(&Model::load(b.path()).unwrap(), &x)
    );
    // A shard listed in the index but missing is a typed error naming it.
    std::fs::remove_file(b.path().join("model-00002-of-00003.safetensors")).unwrap();
    let e = Model::load(b.path()).unwrap_err();
    assert!(matches!(e, Error::MissingFile { .. }), "{e}");
    assert!(
        e.to_string().contains("model-00002-of-00003.safetensors"),
        "{e}"
    );
}

#[test]
fn half_precision_checkpoints_load_as_f32() {
    let a = tempfile::tempdir().unwrap();
    write_tiny_llama(a.path(), 4).unwrap();
    let x = ids(8, 300, 4);
    let full = logits(&Model::load(a.path()).unwrap(), &x);
    for dtype in [DType::BF16, DType::F16] {
        let b = tempfile::tempdir().unwrap();
        write_tiny_llama_with(b.path(), 4, &FixtureOptions { shards: 1, dtype }).unwrap();
        let m = Model::load(b.path()).unwrap();
        assert_eq!(m.embedding_table().dtype(), DType::F32);
        let l = logits(&m, &x);
        // Rounded weights: close to, but not bit-equal with, the f32 checkpoint.
        assert!(cosine(&full, &l) > 0.999, "{dtype:?}");
        assert!(max_abs_diff(&full, &l) > 0.0, "{dtype:?}");
    }
}

#[test]
fn gpt2_names_with_or_without_transformer_prefix() {
    let a = tempfile::tempdir().unwrap();
    write_tiny_gpt2(a.path(), 5).unwrap();
    let b = tempfile::tempdir().unwrap();
    write_tiny_gpt2(b.path(), 5).unwrap();
    let st = b.path().join("model.safetensors");
    let w = candle_core::safetensors::load(&st, &Device::Cpu).unwrap();
    assert!(w.keys().all(|k| k.starts_with("transformer.")));
    let mut bare: HashMap<String, Tensor> = w
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches("transformer.").to_string(), v))
        .collect();
    // HF GPT-2 checkpoints carry the causal-mask buffer; it is not a weight.
    let buf = Tensor::ones((1, 1, 128, 128), DType::F32, &Device::Cpu).unwrap();
    bare.insert("h.0.attn.bias".into(), buf);
    candle_core::safetensors::save(&bare, &st).unwrap();
    let x = ids(6, 280, 5);
    assert_eq!(
        logits(&Model::load(a.path()).unwrap(), &x),
        logits(&Model::load(b.path()).unwrap(), &x)
    );
}

#[test]
fn tokenizer_round_trip_and_bos_defaults() {
    let f = llama(6);
    let t = f.model.tokenizer();
    let text = "the cat sat on the mat";
    let with = f.model.encode(text, None).unwrap();
    let bos = f.model.config().bos_token_id.unwrap();
    assert!(
        f.model.config().add_bos,
        "the fixture's post-processor adds <s>"
    );
    assert_eq!(with[0], bos);
    let without = f.model.encode(text, Some(false)).unwrap();
    assert_eq!(&with[1..], &without[..]);
    assert_eq!(t.decode(&without).unwrap(), text);
    // The merges Ġ+t, h+e, Ġt+he make " the" one token.
    assert!(
        without.iter().any(|&id| t.token_text(id) == "Ġthe"),
        "{without:?}"
    );
    assert_eq!(t.token_text(b'a' as u32), "a");
    // labels show the decoded piece, not the byte-level vocabulary string
    let the = without
        .iter()
        .copied()
        .find(|&id| t.token_text(id) == "Ġthe")
        .unwrap();
    assert_eq!(t.token_piece(the), " the");

    let g = common::gpt2(6);
    assert!(!g.model.config().add_bos);
    let ids = g.model.encode("hello", None).unwrap();
    assert_eq!(g.model.tokenizer().decode(&ids).unwrap(), "hello");
    assert_eq!(ids.len(), 5 - 1, "h e l l o with the h+e merge");

    // tokenizer_config.json's add_bos_token overrides the post-processor.
    std::fs::write(
        f.path().join("tokenizer_config.json"),
        r#"{"add_bos_token": false}"#,
    )
    .unwrap();
    let m = Model::load(&f.path()).unwrap();
    assert!(!m.config().add_bos);
    assert_ne!(m.encode(text, None).unwrap()[0], bos);
    assert_eq!(m.encode(text, Some(true)).unwrap()[0], bos);
}

fn edit_config(dir: &std::path::Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

#[test]
fn mistral_loads_like_llama_and_qwen2_needs_biases() {
    let f = llama(7);
    let x = ids(6, 300, 7);
    let base = logits(&f.model, &x);
    edit_config(&f.path(), |v| {
        v["architectures"] = serde_json::json!(["MistralForCausalLM"])
    });
    assert_eq!(logits(&Model::load(&f.path()).unwrap(), &x), base);
    // Sliding-window attention is not modelled: the window caps the context instead.
    edit_config(&f.path(), |v| v["sliding_window"] = serde_json::json!(32));
    assert_eq!(Model::load(&f.path()).unwrap().config().max_position, 32);

    edit_config(&f.path(), |v| {
        v["architectures"] = serde_json::json!(["Qwen2ForCausalLM"])
    });
    let e = Model::load(&f.path()).unwrap_err();
    assert!(
        matches!(&e, Error::MissingTensor { name, .. } if name.ends_with("q_proj.bias")),
        "{e}"
    );

    // With biases, Qwen2 loads and the biases take part in the forward.
    let mut parts = hf::load(&f.path()).unwrap();
    assert!(parts.config.qkv_bias);
    for i in 0..2 {
        for (n, d) in [("q", 64), ("k", 32), ("v", 32)] {
            let b = Tensor::full(0.3f32, d, &Device::Cpu).unwrap();
            parts
                .weights
                .insert(format!("model.layers.{i}.self_attn.{n}_proj.bias"), b);
        }
    }
    let q = Model::from_parts(parts.config, parts.weights, parts.tokenizer).unwrap();
    assert!(max_abs_diff(&logits(&q, &x), &base) > 1e-3);
}

#[test]
fn tied_when_the_config_says_so() {
    let f = llama(8);
    let mut parts = hf::load(&f.path()).unwrap();
    let emb = parts.weights["model.embed_tokens.weight"].clone();
    parts.weights.remove("lm_head.weight");
    // an untied config without its projection is refused (issue 21: it used to fall back to
    // the embedding without a word)
    let e = Model::from_parts(
        parts.config.clone(),
        parts.weights.clone(),
        parts.tokenizer.clone(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("tie_word_embeddings"), "{e}");
    let mut tied_config = parts.config.clone();
    tied_config.tie_embeddings = true;
    let tied =
        Model::from_parts(tied_config, parts.weights.clone(), parts.tokenizer.clone()).unwrap();
    parts.weights.insert("lm_head.weight".into(), emb);
    let explicit = Model::from_parts(parts.config, parts.weights, parts.tokenizer).unwrap();
    let x = ids(5, 300, 8);
    assert_eq!(logits(&tied, &x), logits(&explicit, &x));
    assert!(max_abs_diff(&logits(&tied, &x), &logits(&f.model, &x)) > 1e-3);
}

#[test]
fn int8_weights_are_close_but_not_equal() {
    for (name, f) in common::both() {
        let x = ids(10, f.model.config().vocab_size, 9);
        let q = f.model.with_int8_weights().unwrap();
        let (a, b) = (logits(&f.model, &x), logits(&q, &x));
        assert!(max_abs_diff(&a, &b) > 1e-5, "{name}: int8 changed nothing");
        assert!(cosine(&a, &b) > 0.999, "{name}: cos {}", cosine(&a, &b));
        // Embeddings stay f32.
        let (e0, e1) = (f.model.embedding_table(), q.embedding_table());
        assert_eq!(
            e0.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            e1.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
    }
}

/// Block order (kv head q % n_kv) on a model = HF order on the same model whose *query* heads are
/// reordered so that HF head j is block-order head π(j): π = [0, 2, 1, 3] for 4 heads on 2 KV heads.
/// (With n_kv = 2 and 4 heads no permutation of the KV heads alone can turn AABB into ABAB.)
#[test]
fn gqa_block_order_equals_permuted_query_heads() {
    let f = llama(10);
    let c = f.model.config().clone();
    let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
    // HF head j serves kv j / n_rep; pick the block-order head with that kv in order.
    let perm: Vec<usize> = (0..nkv)
        .flat_map(|kv| (0..nh).filter(move |q| q % nkv == kv))
        .collect();
    assert_eq!(perm, vec![0, 2, 1, 3]);
    let mut parts = hf::load(&f.path()).unwrap();
    for i in 0..c.n_layers {
        let qn = format!("model.layers.{i}.self_attn.q_proj.weight");
        let on = format!("model.layers.{i}.self_attn.o_proj.weight");
        let q = parts.weights[&qn].clone(); // [nh*hd, hidden]: head blocks of rows
        let o = parts.weights[&on].clone(); // [hidden, nh*hd]: head blocks of columns
        let qs: Vec<Tensor> = perm
            .iter()
            .map(|&h| q.narrow(0, h * hd, hd).unwrap())
            .collect();
        let os: Vec<Tensor> = perm
            .iter()
            .map(|&h| o.narrow(1, h * hd, hd).unwrap())
            .collect();
        parts.weights.insert(qn, Tensor::cat(&qs, 0).unwrap());
        parts.weights.insert(on, Tensor::cat(&os, 1).unwrap());
    }
    let permuted = Model::from_parts(parts.config, parts.weights, parts.tokenizer).unwrap();
    let x = ids(9, 300, 10);
    let block = f
        .model
        .forward(
            &x,
            &ForwardOptions {
                graph: GraphOptions {
                    heads: HeadWiring {
                        kv_head: |q, n_kv, _| q % n_kv,
                        ..HeadWiring::CLEAN
                    },
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .unwrap()
        .logits;
    let hf_order = logits(&f.model, &x);
    assert!(
        max_abs_diff(&block, &hf_order) > 1e-2,
        "block order changed nothing"
    );
    common::assert_close(
        "block order vs permuted heads",
        &block,
        &logits(&permuted, &x),
    );
}
