//! The GGUF tokenizer against an independent tokenizer: expected ids below were produced by
//! llama.cpp (llama-cpp-python 0.3.36, `Llama(model, vocab_only=True).tokenize(text, add_bos=False,
//! special=True)`) on the SmolLM2-135M-Instruct Q4_1 GGUF, not by this crate.

mod gguf_support;

use gguf_support::*;
use kvprobe_reference::gguf;

#[rustfmt::skip]
const LLAMA_CPP_IDS: &[(&str, &[u32])] = &[
    ("The capital of France is", &[504, 3575, 282, 4649, 314]),
    ("Hello world", &[19556, 905]),
    (" leading space", &[2899, 1898]),
    ("  two leading spaces", &[216, 827, 2899, 5600]),
    ("12345 and 3.14159, 2024-11-29", &[33, 34, 35, 36, 37, 284, 216, 35, 30, 33, 36, 33, 37, 41, 28, 216, 34, 32, 34, 36, 29, 33, 33, 29, 34, 41]),
    ("line one\nline two\n\n\ttabbed", &[1311, 582, 198, 1311, 827, 1116, 197, 15999, 5776]),
    ("naïve café — “quotes” 日本語 🙂 Ünïcödé", &[3546, 46494, 37366, 1841, 619, 385, 2346, 573, 17097, 241, 115, 40993, 179, 120, 248, 47526, 5549, 246, 94, 25972, 83, 7466, 84, 2756]),
    ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", &[1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]),
    ("don't can't it's I'm we'll", &[12420, 982, 416, 982, 357, 506, 339, 5248, 392, 3060]),
    ("trailing spaces   ", &[4861, 4966, 5600, 333]),
    ("x=1000000;y=-42", &[104, 45, 33, 32, 32, 32, 32, 32, 32, 43, 105, 15196, 36, 34]),
    ("<|endoftext|>after", &[0, 9110]),
    ("mixed<|im_end|>inline<|im_start|>tokens", &[35781, 2, 254, 1311, 1, 20986]),
    ("   \n  \n", &[333, 11181, 198]),
    ("a", &[81]),
];

#[test]
fn smollm2_ids_match_llama_cpp() {
    let Some(p) = smollm2() else { return };
    let tok = gguf::load(&p).unwrap().tokenizer;
    for (text, want) in LLAMA_CPP_IDS {
        let got = tok.encode(text, false).unwrap();
        assert_eq!(&got, want, "text {text:?}");
    }
}

#[test]
fn smollm2_decode_round_trips_and_bos_is_opt_in() {
    let Some(p) = smollm2() else { return };
    let tok = gguf::load(&p).unwrap().tokenizer;
    for (text, ids) in LLAMA_CPP_IDS {
        assert_eq!(tok.decode(ids).unwrap(), *text);
    }
    // add_bos_token=false in the file; asking for BOS prepends id 1 (<|im_start|>, bos_token_id).
    assert!(!tok.default_add_bos());
    assert_eq!(tok.encode("a", true).unwrap(), vec![1, 81]);
    assert_eq!(tok.token_text(2), "<|im_end|>");
}

/// Tiny vocabulary (see gguf_support::vocab): ids 0,1 control; 2..=27 'a'..'z'; 28 "ab"; 29 "Ġ";
/// 30..=39 '0'..'9'; one merge "a b".
#[test]
fn tiny_vocab_merges_splits_digits_and_keeps_control_tokens_whole() {
    let n = vocab().0.len();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.gguf");
    write(&p, &base_meta("llama", n), &base_tensors(n, false));
    let tok = gguf::load(&p).unwrap().tokenizer;
    let letter = |c: char| 2 + (c as u32 - 'a' as u32);
    // "ab" merges; "ba" has no merge.
    assert_eq!(
        tok.encode("abba", false).unwrap(),
        vec![28, letter('b'), letter('a')]
    );
    // No prefix space is added; a space becomes the byte-level symbol Ġ.
    assert_eq!(
        tok.encode("c d", false).unwrap(),
        vec![letter('c'), 29, letter('d')]
    );
    // Digits are single tokens.
    assert_eq!(tok.encode("12", false).unwrap(), vec![31, 32]);
    // Control tokens are matched whole.
    assert_eq!(tok.encode("<|im_start|>ab", false).unwrap(), vec![1, 28]);
    // add_bos_token=true and bos_token_id=1 in this file.
    assert!(tok.default_add_bos());
    assert_eq!(tok.encode("a", true).unwrap(), vec![1, letter('a')]);
    assert_eq!(tok.decode(&[28, 29, 31]).unwrap(), "ab 1");
}

/// `tokenizer.ggml.pre` qwen2 and llama-bpe split text with llama.cpp's regexes before BPE:
/// qwen2 makes every digit its own pre-token (`\p{N}`), llama-bpe groups up to three
/// (`\p{N}{1,3}`). A merge "1 2" shows the difference: it can only apply inside one pre-token.
#[test]
fn qwen2_and_llama_bpe_pre_tokenizers_split_digits_as_llama_cpp() {
    let (mut tokens, mut types, mut merges) = vocab();
    tokens.push("12".into());
    types.push(1);
    merges.push("1 2".into());
    let twelve = (tokens.len() - 1) as u32;
    let digit = |d: u32| 30 + d;
    let n = tokens.len();
    let load = |pre: &str| {
        let mut meta = base_meta("llama", vocab().0.len());
        for (k, v) in meta.iter_mut() {
            match *k {
                "tokenizer.ggml.pre" => *v = Meta::Str(pre.into()),
                "tokenizer.ggml.tokens" => *v = Meta::StrArr(tokens.clone()),
                "tokenizer.ggml.token_type" => *v = Meta::I32Arr(types.clone()),
                "tokenizer.ggml.merges" => *v = Meta::StrArr(merges.clone()),
                _ => {}
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gguf");
        write(&p, &meta, &base_tensors(n, false));
        gguf::load(&p).unwrap().tokenizer
    };
    let qwen = load("qwen2");
    assert_eq!(
        qwen.encode("1234", false).unwrap(),
        vec![digit(1), digit(2), digit(3), digit(4)]
    );
    let llama3 = load("llama-bpe");
    // "1234" → pre-tokens "123", "4" → BPE "12" "3", "4"
    assert_eq!(
        llama3.encode("1234", false).unwrap(),
        vec![twelve, digit(3), digit(4)]
    );
    // a space before letters stays with them; control tokens are still matched whole
    for tok in [&qwen, &llama3] {
        assert_eq!(
            tok.encode("<|im_start|>ab c", false).unwrap(),
            vec![1, 28, 29, 2 + 2]
        );
    }
}
