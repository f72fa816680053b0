//! Bad input gives a typed, one-line error that names the file and the fix; never a panic.

mod common;

use std::path::Path;

use common::{gpt2, ids, llama};
use kvprobe_reference::fixtures::write_tiny_llama;
use kvprobe_reference::{Error, ForwardOptions, KeySet, Model};

fn one_line_naming(e: &Error, needle: &str) {
    let s = e.to_string();
    assert!(!s.contains('\n'), "multi-line: {s}");
    assert!(s.contains(needle), "`{s}` does not name `{needle}`");
}

fn fixture() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_tiny_llama(d.path(), 1).unwrap();
    d
}

#[test]
fn missing_path() {
    let e = Model::load(Path::new("/nonexistent/kvprobe-model")).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }));
    one_line_naming(&e, "/nonexistent/kvprobe-model");
    assert!(e.to_string().contains("--model"));
}

#[test]
fn folder_without_config() {
    let d = tempfile::tempdir().unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::MissingFile { .. }), "{e}");
    one_line_naming(&e, "config.json");
    one_line_naming(&e, &d.path().display().to_string());
}

#[test]
fn folder_without_tokenizer_or_weights() {
    let d = fixture();
    std::fs::remove_file(d.path().join("tokenizer.json")).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    one_line_naming(&e, "tokenizer.json");
    let d = fixture();
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    one_line_naming(&e, "model.safetensors");
}

#[test]
fn truncated_safetensors() {
    let d = fixture();
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e}");
    one_line_naming(&e, "model.safetensors");
    assert!(e.to_string().contains("download it again"), "{e}");
}

#[test]
fn corrupt_safetensors_header() {
    let d = fixture();
    let p = d.path().join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    for b in bytes.iter_mut().skip(8).take(40) {
        *b = b'#';
    }
    std::fs::write(&p, &bytes).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::Format { .. }), "{e}");
    one_line_naming(&e, "model.safetensors");
    // Tiny garbage file too.
    std::fs::write(&p, b"xx").unwrap();
    one_line_naming(&Model::load(d.path()).unwrap_err(), "model.safetensors");
}

#[test]
fn corrupt_json_files() {
    let d = fixture();
    std::fs::write(d.path().join("config.json"), "{ not json").unwrap();
    let e = Model::load(d.path()).unwrap_err();
    one_line_naming(&e, "config.json");
    let d = fixture();
    std::fs::write(d.path().join("tokenizer.json"), "{}").unwrap();
    let e = Model::load(d.path()).unwrap_err();
    one_line_naming(&e, "tokenizer.json");
}

#[test]
fn unsupported_architecture() {
    let d = fixture();
    let p = d.path().join("config.json");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("LlamaForCausalLM", "BertForMaskedLM");
    std::fs::write(&p, text).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    one_line_naming(&e, "BertForMaskedLM");
    one_line_naming(&e, "config.json");
}

#[test]
fn config_that_does_not_match_the_weights() {
    let d = fixture();
    let p = d.path().join("config.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(
        &p,
        text.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::MissingTensor { .. }), "{e}");
    one_line_naming(&e, "model.layers.2");
    std::fs::write(
        &p,
        text.replace("\"intermediate_size\": 128", "\"intermediate_size\": 100"),
    )
    .unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::BadTensor { .. }), "{e}");
}

#[test]
fn a_file_that_is_not_a_model() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("notes.txt");
    std::fs::write(&p, "hello").unwrap();
    let e = Model::load(&p).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    one_line_naming(&e, "notes.txt");
}

#[test]
fn ids_outside_the_vocabulary() {
    for f in [llama(2), gpt2(2)] {
        let v = f.model.config().vocab_size as u32;
        let e = f
            .model
            .forward(&[1, v], &ForwardOptions::default())
            .unwrap_err();
        assert!(
            matches!(e, Error::TokenOutOfRange { id, .. } if id == v),
            "{e}"
        );
        one_line_naming(&e, &f.path().display().to_string());
        let st = f.model.prefix_state(&[1, 2], &[0, 1]).unwrap();
        assert!(f.model.step(&st, v + 5, 2, &KeySet::All).is_err());
    }
}

#[test]
fn prompt_longer_than_the_context() {
    for f in [llama(3), gpt2(3)] {
        let max = f.model.config().max_position;
        let x = ids(max + 1, 200, 3);
        let e = f.model.forward(&x, &ForwardOptions::default()).unwrap_err();
        assert!(matches!(e, Error::TooLong { .. }), "{e}");
        one_line_naming(&e, &f.path().display().to_string());
        one_line_naming(&e, &format!("at most {max} tokens"));
        // Exactly max fits.
        assert!(f
            .model
            .forward(&x[..max], &ForwardOptions::default())
            .is_ok());
        let st = f.model.prefix_state(&x[..3], &[0, 1, 2]).unwrap();
        assert!(matches!(
            f.model.step(&st, 1, max, &KeySet::All),
            Err(Error::TooLong { .. })
        ));
    }
}

#[test]
fn api_misuse_is_an_error_not_a_panic() {
    let f = llama(4);
    let x = ids(4, 300, 4);
    assert!(f.model.forward(&[], &ForwardOptions::default()).is_err());
    let bad_mask = ForwardOptions {
        mask: Some(vec![true; 3]),
        ..Default::default()
    };
    assert!(f.model.forward(&x, &bad_mask).is_err());
    let bad_pos = ForwardOptions {
        positions: Some(vec![0]),
        ..Default::default()
    };
    assert!(f.model.forward(&x, &bad_pos).is_err());
    let st = f.model.prefix_state(&x[..3], &[0, 1, 2]).unwrap();
    let e = f
        .model
        .step(&st, 1, 3, &KeySet::Subset(vec![3]))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert!(f.model.prefix_state(&x, &[0]).is_err());
    // An empty state works: the step attends to itself only.
    let empty = f.model.prefix_state(&[], &[]).unwrap();
    let a = f.model.step(&empty, x[0], 0, &KeySet::All).unwrap();
    let b = f
        .model
        .forward(&x[..1], &ForwardOptions::default())
        .unwrap();
    common::assert_close("empty state", &a, b.row(0));
}

/// Rewrites one field of the fixture's config.json.
fn set_config(dir: &Path, key: &str, value: serde_json::Value) {
    let p = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    c[key] = value;
    std::fs::write(&p, c.to_string()).unwrap();
}

#[test]
fn config_claiming_a_billion_layers_is_refused_before_allocating_them() {
    // issue 19: a config.json with 1e9 layers used to abort on a 216 GB allocation; the weights
    // present decide, so it must end at the first missing layer with a typed error
    let d = fixture();
    set_config(
        d.path(),
        "num_hidden_layers",
        serde_json::json!(1_000_000_000u64),
    );
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::MissingTensor { .. }), "{e}");
    one_line_naming(&e, "model.layers.2");
}

#[test]
fn shard_names_outside_the_model_folder_are_refused() {
    // issue 19: a safetensors index may not point at files outside the model folder
    for shard in [
        "/etc/hostname",
        "../model.safetensors",
        "sub/../../x.safetensors",
    ] {
        let d = fixture();
        std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": shard}});
        std::fs::write(
            d.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let e = Model::load(d.path()).unwrap_err();
        assert!(matches!(e, Error::Format { .. }), "{shard}: {e}");
        one_line_naming(&e, "model.safetensors.index.json");
        one_line_naming(&e, shard);
    }
}

#[test]
fn a_tokenizer_larger_than_the_vocabulary_is_refused() {
    let d = fixture();
    // the tiny tokenizer's largest id is 269; an embedding of 200 rows cannot serve it
    set_config(d.path(), "vocab_size", serde_json::json!(200));
    let st = d.path().join("model.safetensors");
    let mut w = candle_core::safetensors::load(&st, &candle_core::Device::Cpu).unwrap();
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        let t = w[name].narrow(0, 0, 200).unwrap().contiguous().unwrap();
        w.insert(name.into(), t);
    }
    candle_core::safetensors::save(&w, &st).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    assert!(matches!(e, Error::Tokenizer { .. }), "{e}");
    one_line_naming(&e, "200 rows");
}

#[test]
fn an_untied_config_without_lm_head_is_refused() {
    // it used to run with the embedding as the output projection without a word; HF would run
    // it with a freshly initialised lm_head, so neither is the model
    let d = fixture();
    let st = d.path().join("model.safetensors");
    let mut w = candle_core::safetensors::load(&st, &candle_core::Device::Cpu).unwrap();
    w.remove("lm_head.weight").unwrap();
    candle_core::safetensors::save(&w, &st).unwrap();
    let e = Model::load(d.path()).unwrap_err();
    one_line_naming(&e, "lm_head.weight");
    one_line_naming(&e, "tie_word_embeddings");
    // declared tied, the embedding is the projection
    set_config(d.path(), "tie_word_embeddings", serde_json::json!(true));
    Model::load(d.path()).unwrap();
}
