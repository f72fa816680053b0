//! The healthy sweep (issue 18): fault-free cases on both emulated device families over prompts
//! a user would type — 1 to 64 tokens of questions, code, digits and lists, chat templates with
//! special tokens, other languages and scripts, repeated tokens — in every geometry class. Every
//! case must come out `healthy`.

use super::case::{Case, ModelSpec};
use super::rng::Rng;

/// Everyday prompts, deliberately unlike one another (tokenised by the model's tokenizer).
pub const PROMPTS: &[&str] = &[
    "Hi",
    "Why?",
    "Hello, how are you?",
    "Who wrote Hamlet?",
    "Name a color.",
    "What is 2 plus 2?",
    "Tell me a joke.",
    "What's the weather like in London today?",
    "Can you explain how a rainbow forms, in two sentences?",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "Summarize: the meeting moved to Thursday at 3 pm because the room was booked.",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY age;",
    "fn main() { println!(\"hello\"); }",
    "<html><body><p>Hello</p></body></html>",
    "{\"name\": \"Ada\", \"born\": 1815, \"tags\": [\"math\", \"poetry\"]}",
    "3.14159 2.71828 1.41421 1.73205",
    "1. eggs\n2. milk\n3. bread\n4. butter\n",
    "- red\n- green\n- blue\n",
    "2024-01-15, 2024-02-20, 2024-03-25",
    "+1 (555) 010-9999",
    "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
    "hello hello hello hello hello hello hello hello",
    "the the the the the the the the the the the the",
    "!!!!!!!!!!!!!!!!!!!!",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>Once upon a time",
    "Bonjour, comment ça va ?",
    "Wie spät ist es?",
    "¿Dónde está la estación de tren?",
    "Привет, как дела?",
    "こんにちは、元気ですか？",
    "你好，今天天气怎么样？",
    "مرحبا كيف حالك؟",
    "Γειά σου κόσμε",
    "🙂🚀🔥 emoji test ✨",
    "Ünïcödé àccénts: naïve café résumé",
    "A",
    "The",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Translate to German: I would like a cup of coffee, please.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "If a train leaves at 9:00 and travels 120 km at 80 km/h, when does it arrive?",
    "Pros and cons of remote work:",
    "Dear Sir or Madam,\n\nI am writing to apply for",
    "user@example.com https://example.org/path?q=1&r=2",
    "Step 1: preheat the oven to 180°C. Step 2:",
    "ERROR 2024-05-01 12:00:03 connection refused (errno 111)",
    "Roses are red,\nviolets are blue,",
    "Is 17 a prime number? Explain.",
    "What does DNA stand for?",
    "List the planets of the solar system in order from the sun: Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune. Now list them in reverse order, separated by commas, and then tell me which one is the largest and which one has the most moons, with a short reason for each.",
    "x = np.linspace(0, 1, 100)\ny = np.sin(2 * np.pi * x)\nplt.plot(x, y)\nplt.show()",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "Thanks!",
    "I am hungry.",
];

/// How the prompt of `n` tokens sits against the prefill length P (or the ANE's max_query) and
/// the cache length L.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeometryClass {
    /// n < P: one padded chunk.
    Shorter,
    /// n = P: one full chunk.
    Equal,
    /// n > P: several chunks, the later ones read the cache.
    Longer,
    /// The ring wraps during the steps (n + steps > L); genai ring only.
    Wraps,
}

impl GeometryClass {
    pub fn name(self) -> &'static str {
        match self {
            GeometryClass::Shorter => "shorter than P",
            GeometryClass::Equal => "equal to P",
            GeometryClass::Longer => "longer than P",
            GeometryClass::Wraps => "wraps during steps",
        }
    }

    /// The class a case falls in (wrap first: it says most about the cache).
    pub fn of(c: &Case) -> GeometryClass {
        let n = c.ids.len();
        if c.device.is_none() && c.onnx.is_none() && n + c.steps > c.cache_len {
            GeometryClass::Wraps
        } else if n < c.prefill_len {
            GeometryClass::Shorter
        } else if n == c.prefill_len {
            GeometryClass::Equal
        } else {
            GeometryClass::Longer
        }
    }
}

/// `per_model` healthy cases for each model on each device family, cycling through the prompts
/// (`prompts` = the model's token sequences, at most 64 tokens used) and the geometry classes.
/// `ane` adds the stateful ANE emulator (Llama-family models only).
pub fn healthy_cases(
    seed: u64,
    models: &[(ModelSpec, Vec<Vec<u32>>)],
    per_model: usize,
    ane: bool,
) -> Vec<Case> {
    let mut rng = Rng::new(seed ^ 0x18);
    let mut out = Vec::new();
    for (m, prompts) in models {
        let devices: &[Option<&'static str>] = if ane && m.rope {
            &[None, Some("ane-sim")]
        } else {
            &[None]
        };
        for &device in devices {
            for i in 0..per_model {
                let prompt = &prompts[(i + rng.range(0, prompts.len() - 1)) % prompts.len()];
                let ids: Vec<u32> = prompt.iter().take(64).copied().collect();
                if ids.is_empty() {
                    continue;
                }
                let classes: &[GeometryClass] = if device.is_some() {
                    &[
                        GeometryClass::Shorter,
                        GeometryClass::Equal,
                        GeometryClass::Longer,
                    ]
                } else {
                    &[
                        GeometryClass::Shorter,
                        GeometryClass::Equal,
                        GeometryClass::Longer,
                        GeometryClass::Wraps,
                    ]
                };
                let class = classes[i % classes.len()];
                let id = out.len();
                if let Some(c) = geometry(&mut rng, m, ids, class, device, id) {
                    out.push(c);
                }
            }
        }
    }
    out
}

/// L, P and steps for the class; `None` when the prompt cannot take it (a one-token prompt has
/// no longer-than-P geometry).
fn geometry(
    rng: &mut Rng,
    m: &ModelSpec,
    ids: Vec<u32>,
    class: GeometryClass,
    device: Option<&'static str>,
    id: usize,
) -> Option<Case> {
    let n = ids.len();
    let steps = rng.range(4, m.max_steps.max(4));
    let p = match class {
        GeometryClass::Shorter => n + rng.range(1, 16),
        GeometryClass::Equal => n,
        GeometryClass::Longer | GeometryClass::Wraps if n >= 2 => rng.range((n / 4).max(1), n - 1),
        _ => return None,
    };
    let l = match class {
        // the ring wraps: n < L ≤ n + steps − 1, and L > P
        GeometryClass::Wraps => {
            let lo = (n + 1).max(p + 1);
            let hi = n + steps - 1;
            if lo > hi {
                return None;
            }
            rng.range(lo, hi)
        }
        // no wrap (a stateful context must hold prompt and steps)
        _ => (n + steps + 1).max(p + 1) + rng.range(0, 16),
    };
    if l > m.max_position || (device.is_some() && p >= l) {
        return None;
    }
    Some(Case {
        id,
        model: m.label.clone(),
        model_path: m.path.clone(),
        cache_len: l,
        prefill_len: p,
        ids,
        steps,
        fault: None,
        expect: "healthy",
        family: "healthy".into(),
        device,
        onnx: None,
    })
}

/// `per_folder` healthy cases on an ONNX GenAI folder exported from `m`, cycling through the
/// prompts. A windowed folder (W, C) takes prompts shorter than, equal to and longer than one
/// window (P = W in the tables), padded to whole windows with the steps inside C; the default
/// decoder runs the whole prompt in one run (its prefill group has L − 1 rows) with
/// `--max-ctx L` drawn to hold prompt and steps.
pub fn onnx_healthy_cases(
    seed: u64,
    m: &ModelSpec,
    prompts: &[Vec<u32>],
    folder: &super::OnnxFolder,
    per_folder: usize,
) -> Vec<Case> {
    let mut rng = Rng::new(seed ^ 0x22);
    let mut out = Vec::new();
    for i in 0..per_folder {
        let prompt = &prompts[(i + rng.range(0, prompts.len() - 1)) % prompts.len()];
        let steps = rng.range(4, m.max_steps.max(4));
        let (ids, cache_len, prefill_len) = match folder.window {
            Some(w) => {
                // room for the padded prompt and every step: ceil(n / W) * W + steps < C
                let room = folder.max_length.saturating_sub(steps + 1);
                let longest = (room / w * w).min(prompt.len()).min(64);
                let n = match i % 3 {
                    0 => rng.range(1, (w - 1).min(longest).max(1)),
                    1 => w,
                    _ => rng.range(w + 1, longest.max(w + 1)),
                };
                if n > longest || n == 0 {
                    continue;
                }
                (prompt[..n].to_vec(), folder.max_length, w)
            }
            None => {
                let n = prompt.len().min(64);
                let l = (n + steps + 1 + rng.range(0, 16)).min(folder.max_length);
                if n == 0 || n + steps + 1 > l {
                    continue;
                }
                (prompt[..n].to_vec(), l, l - 1)
            }
        };
        out.push(Case {
            id: out.len(),
            model: m.label.clone(),
            model_path: m.path.clone(),
            cache_len,
            prefill_len,
            ids,
            steps,
            fault: None,
            expect: "healthy",
            family: "healthy".into(),
            device: Some(folder.label()),
            onnx: Some(folder.clone()),
        });
    }
    out
}
