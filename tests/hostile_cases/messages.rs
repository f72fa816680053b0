//! Corpus cases of issue 38 (f): a refusal names the real cause and its fix, never a
//! neighbouring one ("missing" for a file that is there but is not a regular file, "folder not
//! found" for a file that exists).

use super::{s, strings, Corpus};

pub fn wrong_causes(c: &mut Corpus) {
    // model.safetensors that is there, but not a file of weights (each said "missing")
    let weights = |c: &Corpus, name: &str, make: &dyn Fn(&std::path::Path)| {
        c.model_copy(name, |d| {
            let p = d.join("model.safetensors");
            std::fs::remove_file(&p).unwrap();
            make(&p);
        })
    };
    let link = |to: &str| {
        let to = to.to_string();
        move |p: &std::path::Path| std::os::unix::fs::symlink(&to, p).unwrap()
    };
    for (name, make, needle) in [
        (
            "st-dev-zero",
            Box::new(link("/dev/zero")) as Box<dyn Fn(&std::path::Path)>,
            "is not a regular file (a device, FIFO or socket)",
        ),
        (
            "st-folder",
            Box::new(|p: &std::path::Path| std::fs::create_dir(p).unwrap()),
            "is a folder, not a file",
        ),
        (
            "st-link-loop",
            Box::new(link("model.safetensors")),
            "is a link that does not resolve",
        ),
        (
            "st-dangling",
            Box::new(link("gone.safetensors")),
            "is a link that does not resolve",
        ),
    ] {
        let m = weights(c, name, &*make);
        c.refused_model(&format!("hf {name}"), &m, Some(needle));
    }
    // `report FILE`: a file is not "not found"
    let a = strings(&["report", &s(&c.model().join("config.json"))]);
    c.add("report on a file", 2, Some("a file, not a run folder"), &a);
    let run = c.root().join("msg-run");
    std::fs::create_dir_all(&run).unwrap();
    let results = c.file("msg-run/results.json", b"{}");
    let a = strings(&["report", &s(&results)]);
    c.add(
        "report on a run's results.json",
        2,
        Some("pass the folder that holds it"),
        &a,
    );
}

/// GGUF files llama.cpp refuses are refused, naming the key or tensor (they loaded: a duplicate
/// tensor's later copy won and the output changed).
pub fn gguf_as_llama_cpp(c: &mut Corpus) {
    use crate::hostile_corpus::gguf_support::{base_meta, base_tensors, encode, vocab, Meta};
    let n = vocab().0.len();
    let with = |key: &'static str, v: Meta| {
        let mut m = base_meta("llama", n);
        m.retain(|(k, _)| *k != key);
        m.push((key, v));
        m
    };
    let mut dup_key = base_meta("llama", n);
    dup_key.push(("llama.block_count", Meta::U32(2)));
    let mut dup_tensor = base_tensors(n, true);
    let mut twin = base_tensors(n, true).swap_remove(1);
    twin.data.iter_mut().for_each(|b| *b = 0);
    dup_tensor.push(twin);
    // token_embd's data 32 bytes longer (a gap before the next tensor) or shorter (the next
    // tensor starts inside it): candle reads either, llama.cpp refuses both
    let mut gap = base_tensors(n, true);
    gap[0].data.extend([0u8; 32]);
    let mut overlap = base_tensors(n, true);
    let short = overlap[0].data.len() - 32;
    overlap[0].data.truncate(short);
    // a Q8_0 tensor (blocks of 32) with rows of 16
    let mut ragged = base_tensors(n, true);
    ragged[1].dims = vec![16, 2];
    ragged[1].type_id = 8;
    let cases = [
        (
            "tensor-gap",
            base_meta("llama", n),
            gap,
            "the tensors before it end at",
        ),
        (
            "tensor-overlap",
            base_meta("llama", n),
            overlap,
            "the tensors before it end at",
        ),
        (
            "q8-row-16",
            base_meta("llama", n),
            ragged,
            "not a multiple of its block of 32",
        ),
        (
            "align-3",
            with("general.alignment", Meta::U32(3)),
            base_tensors(n, true),
            "`general.alignment` is 3",
        ),
        (
            "align-i32",
            with("general.alignment", Meta::I32(32)),
            base_tensors(n, true),
            "must be a uint32",
        ),
        (
            "align-1m",
            with("general.alignment", Meta::U32(1 << 20)),
            base_tensors(n, true),
            "not a multiple of the alignment",
        ),
        (
            "dup-key",
            dup_key,
            base_tensors(n, true),
            "key `llama.block_count` appears twice",
        ),
        (
            "dup-tensor",
            base_meta("llama", n),
            dup_tensor,
            "appears twice",
        ),
    ];
    for (name, meta, tensors, needle) in cases {
        let p = c.file(&format!("llamacpp-{name}.gguf"), &encode(&meta, &tensors));
        c.refused_model(
            &format!("gguf {name} (llama.cpp refuses it)"),
            &p,
            Some(needle),
        );
    }
}

/// Files whose refusal blamed a neighbouring cause (issue 38): each names the key or count that is
/// wrong. Before: context 0 → "shorten the prompt to at most 0 tokens"; heads that do not divide
/// the embedding → "partial RoPE"; a BOS id past the vocabulary → "pass ids below N" with no
/// `--ids`; an empty vocabulary → "--prompt encodes to no tokens".
pub fn gguf_wrong_causes(c: &mut Corpus) {
    use crate::hostile_corpus::gguf_support::{
        base_meta, base_tensors, encode, vocab, Meta, HEAD_DIM,
    };
    let n = vocab().0.len();
    let with = |edits: Vec<(&'static str, Meta)>| {
        let mut m = base_meta("llama", n);
        m.retain(|(k, _)| edits.iter().all(|(e, _)| e != k));
        m.extend(edits);
        m
    };
    let cases = [
        (
            "context-0",
            with(vec![("llama.context_length", Meta::U64(0))]),
            "context length is 0",
        ),
        (
            "heads-1e6",
            with(vec![
                ("llama.attention.head_count", Meta::U32(1_000_000)),
                ("llama.attention.head_count_kv", Meta::U64(1_000_000)),
                ("llama.rope.dimension_count", Meta::U32(HEAD_DIM as u32)),
            ]),
            "heads do not divide",
        ),
        (
            "bos-past-vocab",
            with(vec![(
                "tokenizer.ggml.bos_token_id",
                Meta::U32(n as u32 + 5),
            )]),
            "BOS token id",
        ),
        (
            "empty-vocab",
            with(vec![
                ("tokenizer.ggml.tokens", Meta::StrArr(Vec::new())),
                ("tokenizer.ggml.token_type", Meta::I32Arr(Vec::new())),
                ("tokenizer.ggml.merges", Meta::StrArr(Vec::new())),
            ]),
            "vocabulary is empty",
        ),
    ];
    for (name, meta, needle) in cases {
        let p = c.file(
            &format!("cause-{name}.gguf"),
            &encode(&meta, &base_tensors(n, true)),
        );
        c.refused_model(&format!("gguf {name} names the cause"), &p, Some(needle));
    }
}

/// More refusals that blamed a neighbouring cause (issue 38). Before: a prompt past the context
/// → "pass --steps 0 or fewer"; token_embd.weight with fewer rows than the token list → blamed
/// output.weight (and with more rows, under tied embeddings, loaded); a safetensors weight
/// stored as I32 → "is missing"; a manifest's bad geometry → named `--cache-len` /
/// `--prefill-len`, flags never passed.
pub fn more_wrong_causes(c: &mut Corpus) {
    use crate::hostile_corpus::gguf_support::{base_meta, base_tensors, encode, vocab};
    // 120 KiB: an argument may hold at most 128 KiB (MAX_ARG_STRLEN)
    let long = "hello world ".repeat(10_000);
    let mut a = c.sim_args("long-prompt", &["--prompt", &long]);
    let i = a.iter().position(|x| x == "--ids").expect("a default flag");
    a.drain(i..i + 2);
    c.add("cli 120 KiB prompt", 2, Some("shorten --prompt"), &a);
    let n = vocab().0.len();
    let mut fewer = base_tensors(n, true);
    fewer[0] = base_tensors(n - 4, false).swap_remove(0);
    let more = base_tensors(n + 4, false);
    for (name, tensors) in [("fewer", fewer), ("more-tied", more)] {
        let p = c.file(
            &format!("embd-rows-{name}.gguf"),
            &encode(&base_meta("llama", n), &tensors),
        );
        c.refused_model(
            &format!("gguf token_embd rows {name} than tokens"),
            &p,
            Some("`token_embd.weight` has"),
        );
    }
    let m = c.model_copy("st-norm-i32", |d| {
        let p = d.join("model.safetensors");
        let b = std::fs::read(&p).unwrap();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let h = std::str::from_utf8(&b[8..8 + n]).unwrap();
        let key = "\"model.norm.weight\":{\"dtype\":\"F32\"";
        assert!(h.contains(key), "the fixture's header spells {key}");
        let h = h.replace(key, "\"model.norm.weight\":{\"dtype\":\"I32\"");
        let mut out = b[..8].to_vec();
        out.extend(h.as_bytes());
        out.extend(&b[8 + n..]);
        std::fs::write(p, out).unwrap();
    });
    c.refused_model(
        "safetensors norm stored as I32",
        &m,
        Some("`model.norm.weight` is stored as I32"),
    );
    let good: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.root().join("good-manifest.json")).unwrap())
            .unwrap();
    for (key, value, needle) in [
        ("cache_len", 100_000u64, "cache_len 100000 entries"),
        (
            "cache_len",
            4,
            "prefill_len 8 must be at least 1 and below cache_len 4",
        ),
        ("prefill_len", 0, "prefill_len 0 must be"),
    ] {
        let mut v = good.clone();
        v[key] = serde_json::json!(value);
        let p = c.file(
            &format!("manifest-geometry-{key}-{value}.json"),
            v.to_string().as_bytes(),
        );
        let mut a = c.sim_args(
            &format!("manifest-geometry-{key}-{value}"),
            &["--sim-manifest", &s(&p)],
        );
        // the manifest's geometry alone: no flag the error could name
        for flag in ["--cache-len", "--prefill-len"] {
            let i = a.iter().position(|x| x == flag).expect("a default flag");
            a.drain(i..i + 2);
        }
        c.add(
            &format!("manifest {key} {value} names the manifest's key"),
            2,
            Some(needle),
            &a,
        );
    }
}

/// An ane-sim manifest's bad context or query length names its keys (it named `--max-ctx` /
/// `--max-query`, flags never passed; issue 38).
pub fn ane_manifest_causes(c: &mut Corpus) {
    let good = c.ane_manifest();
    for (key, value, needle) in [
        ("cache_len", 100_000u64, "cache_len 100000 is beyond"),
        ("cache_len", 4, "(cache_len 4)"),
        ("prefill_len", 0, "cache_len/prefill_len 32 and 0"),
    ] {
        let mut v = good.clone();
        v[key] = serde_json::json!(value);
        let p = c.file(
            &format!("ane-manifest-{key}-{value}.json"),
            v.to_string().as_bytes(),
        );
        let a = strings(&[
            "diagnose",
            "--device",
            "ane-sim",
            "--model",
            &s(c.model()),
            "--ids",
            "1,5,9",
            "--steps",
            "2",
            "--sim-manifest",
            &s(&p),
        ]);
        c.add(
            &format!("ane manifest {key} {value} names the manifest's key"),
            2,
            Some(needle),
            &a,
        );
    }
}
