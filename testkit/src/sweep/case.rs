//! What the generator knows of a model and one generated case.

use std::path::{Path, PathBuf};

use kvprobe_reference::Model;

use super::rng::Rng;

/// What the generator needs to know about a model.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Short name used in the tables ("llama-fixture", "smollm2").
    pub label: String,
    pub path: PathBuf,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Bytes per (un-expanded, uint8) cache entry.
    pub entry_bytes: usize,
    pub max_position: usize,
    /// RoPE positions (a theta table the emulator ships); false for learned positions (GPT-2).
    pub rope: bool,
    /// Token-id sequences prompts are cut from (different content per case).
    pub prompts: Vec<Vec<u32>>,
    /// Largest cache length / steps drawn for this model (SmolLM2 is slow at L = 128).
    pub max_cache_len: usize,
    pub max_steps: usize,
}

/// Natural-text prompts for real models (tokenised by the model's own tokenizer).
pub const TEXTS: &[&str] = &[
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid, and the capital of Germany is Berlin, a city on the river Spree.",
    "Once upon a time there was a little fox who lived at the edge of a dark forest. Every morning she walked to the river to drink and to watch the fish jump in the cold water.",
    "To bake bread, mix flour, water, salt and yeast, knead the dough for ten minutes, let it rise for an hour, shape the loaf and bake it in a hot oven until the crust is brown.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint([fibonacci(i) for i in range(10)])\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose and oxygen. It takes place mainly in the leaves of the plant.",
    "Q: What is the largest planet in the solar system? A: Jupiter. Q: What is the smallest planet? A: Mercury. Q: Which planet is known as the red planet? A:",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32",
    "Dear customer, thank you for your order. Your package has been shipped today and should arrive within three to five business days. Please contact us if you have any questions.",
];

impl ModelSpec {
    /// Reads the shape from the model; prompts from `texts` through its tokenizer, or random ids
    /// (fixtures: their tiny tokenizers make any id a token).
    pub fn load(
        label: &str,
        path: &Path,
        texts: Option<&[&str]>,
        max_cache_len: usize,
        max_steps: usize,
    ) -> anyhow::Result<Self> {
        let model = Model::load(path)?;
        let c = model.config();
        let prompts = match texts {
            Some(ts) => ts
                .iter()
                .map(|t| model.encode(t, None))
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let mut rng = Rng::new(c.vocab_size as u64);
                // skip the few special tokens at the start of the fixture vocabularies
                (0..8)
                    .map(|_| {
                        (0..160)
                            .map(|_| rng.range(3, c.vocab_size - 1) as u32)
                            .collect()
                    })
                    .collect()
            }
        };
        Ok(ModelSpec {
            label: label.into(),
            path: path.to_path_buf(),
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            entry_bytes: c.n_kv_heads * c.head_dim,
            max_position: c.max_position,
            rope: model.rope_inv_freq().is_some(),
            prompts,
            max_cache_len,
            max_steps,
        })
    }
}

/// One diagnose run and the verdict it should get.
#[derive(Debug, Clone)]
pub struct Case {
    pub id: usize,
    pub model: String,
    pub model_path: PathBuf,
    pub cache_len: usize,
    pub prefill_len: usize,
    pub ids: Vec<u32>,
    pub steps: usize,
    pub fault: Option<String>,
    pub expect: &'static str,
    /// Fault family (the fault name without value and scope), "healthy" for none.
    pub family: String,
    /// The emulated device family: `None` = the HailoRT emulator (`--sim`), `Some("ane-sim")`
    /// = the stateful ANE emulator (`cache_len` = max_ctx, `prefill_len` = max_query), or the
    /// label of an ONNX folder (`onnx` set).
    pub device: Option<&'static str>,
    /// An ONNX Runtime GenAI folder run by the real runtime (`--onnx DIR`) instead of an emulator.
    pub onnx: Option<OnnxFolder>,
}

/// A GenAI model folder exported from the case's model (scripts/export-onnx.py).
#[derive(Debug, Clone)]
pub struct OnnxFolder {
    pub dir: PathBuf,
    /// `window_size` of an NPU-style windowed cache; `None`: GenAI's default decoder.
    pub window: Option<usize>,
    /// `search.max_length`: the request's context, pads included.
    pub max_length: usize,
}

impl OnnxFolder {
    /// The device label in the sweep's tables.
    pub fn label(&self) -> &'static str {
        if self.window.is_some() {
            "onnx-windowed"
        } else {
            "onnx-default"
        }
    }
}

impl Case {
    pub fn args(&self) -> Vec<String> {
        let ids: Vec<String> = self.ids.iter().map(u32::to_string).collect();
        if let Some(o) = &self.onnx {
            let mut a: Vec<String> = vec![
                "diagnose".into(),
                "--onnx".into(),
                o.dir.to_string_lossy().into_owned(),
                "--model".into(),
                self.model_path.to_string_lossy().into_owned(),
            ];
            // a windowed folder's context is compiled in; the default decoder takes --max-ctx
            if o.window.is_none() {
                a.extend(["--max-ctx".into(), self.cache_len.to_string()]);
            }
            a.extend([
                "--ids".into(),
                ids.join(","),
                "--steps".into(),
                self.steps.to_string(),
            ]);
            return a;
        }
        let (device, l_flag, p_flag) = match self.device {
            Some(d) => (["--device", d].to_vec(), "--max-ctx", "--max-query"),
            None => (["--sim"].to_vec(), "--cache-len", "--prefill-len"),
        };
        let mut a: Vec<String> = ["diagnose"]
            .into_iter()
            .chain(device)
            .map(str::to_string)
            .collect();
        a.extend(
            [
                "--model",
                &self.model_path.to_string_lossy(),
                l_flag,
                &self.cache_len.to_string(),
                p_flag,
                &self.prefill_len.to_string(),
                "--ids",
                &ids.join(","),
                "--steps",
                &self.steps.to_string(),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        if let Some(f) = &self.fault {
            a.push("--fault".into());
            a.push(f.clone());
        }
        a
    }
    /// The exact command line that reproduces the case.
    pub fn command(&self) -> String {
        let args: Vec<String> = self.args().into_iter().map(|a| shell_quote(&a)).collect();
        format!("kvprobe {}", args.join(" "))
    }
    /// Prompt tokens wrap the ring during the steps.
    pub fn wraps(&self) -> bool {
        self.ids.len() + self.steps > self.cache_len
    }
    pub fn has_remainder(&self) -> bool {
        !self.ids.len().is_multiple_of(self.prefill_len)
    }
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_=+.,/@:".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
