//! Model hyper-parameters shared by the Llama and GPT-2 code paths (design.md "reference crate API").

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    /// Llama (incl. Llama-3 RoPE scaling), SmolLM/SmolLM2, Mistral, Qwen2, Qwen3 (QK-norm):
    /// RMSNorm, RoPE, GQA, SwiGLU.
    Llama,
    /// GPT-2, distilgpt2: learned positions, LayerNorm, GELU (tanh), Conv1D.
    Gpt2,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub family: Family,
    /// e.g. "LlamaForCausalLM", "gguf:llama".
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub norm_eps: f64,
    /// Llama only.
    pub rope_theta: f64,
    /// Context limit (n_positions / max_position_embeddings / GGUF context_length).
    pub max_position: usize,
    pub tie_embeddings: bool,
    pub qkv_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub add_bos: bool,
    /// Qwen3: RMSNorm over each head of q and k (weights `[head_dim]`) before RoPE.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// Per-frequency divisors of the RoPE inverse frequencies (length head_dim / 2): Llama-3
    /// `rope_scaling` computed from config.json, or GGUF's `rope_freqs` tensor as stored. None =
    /// plain RoPE. Kept as data, not a formula, so both sources feed one code path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl ModelConfig {
    /// Query heads served by one KV head.
    pub fn n_rep(&self) -> usize {
        self.n_heads / self.n_kv_heads.max(1)
    }
}
