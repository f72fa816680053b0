//! The public model: loading dispatch and the thin wrappers (forward, prefix_state, step, step_many)
//! over the graph engine.

use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::graph::{GraphInput, GraphOutput};
use crate::kv::{KeySet, KvState, LayerKv};
use crate::{Error, ModelConfig, Result, TextTokenizer, Weights};

/// Options of a full forward.
#[derive(Debug, Clone, Default)]
pub struct ForwardOptions {
    /// Row-major `[T*T]` "may attend"; None = causal.
    pub mask: Option<Vec<bool>>,
    /// Absolute positions; None = 0..T.
    pub positions: Option<Vec<usize>>,
    /// Return per-layer K (after RoPE) and V.
    pub taps: bool,
}

#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `[rows, vocab]` row-major.
    pub logits: Vec<f32>,
    pub rows: usize,
    pub vocab: usize,
    /// Per layer `[n_kv_heads, T, head_dim]` when taps were asked for.
    pub taps: Option<Vec<LayerKv>>,
}

pub struct Model {
    config: ModelConfig,
    tokenizer: TextTokenizer,
    embed: Tensor,
    source: PathBuf,
}

impl Model {
    pub fn load(path: &Path) -> Result<Model> {
        Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: "model loading not built yet".into(),
        })
    }

    pub fn from_parts(
        config: ModelConfig,
        weights: Weights,
        tokenizer: TextTokenizer,
    ) -> Result<Model> {
        let embed = weights
            .get("model.embed_tokens.weight")
            .cloned()
            .ok_or_else(|| Error::InvalidInput("not built yet".into()))?;
        Ok(Model {
            config,
            tokenizer,
            embed,
            source: PathBuf::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }
    pub fn source(&self) -> &Path {
        &self.source
    }
    pub fn encode(&self, text: &str, bos: Option<bool>) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, bos.unwrap_or(self.config.add_bos))
    }
    pub fn embedding_table(&self) -> &Tensor {
        &self.embed
    }
    pub fn rope_inv_freq(&self) -> Option<Vec<f32>> {
        None
    }
    pub fn forward(&self, _ids: &[u32], _opts: &ForwardOptions) -> Result<ForwardOutput> {
        Err(Error::InvalidInput("not built yet".into()))
    }
    pub fn prefix_state(&self, _ids: &[u32], _positions: &[usize]) -> Result<KvState> {
        Err(Error::InvalidInput("not built yet".into()))
    }
    pub fn step(
        &self,
        _state: &KvState,
        _token: u32,
        _position: usize,
        _keys: &KeySet,
    ) -> Result<Vec<f32>> {
        Err(Error::InvalidInput("not built yet".into()))
    }
    pub fn step_many(
        &self,
        _state: &KvState,
        _token: u32,
        _position: usize,
        _keys: &[KeySet],
    ) -> Result<Vec<Vec<f32>>> {
        Err(Error::InvalidInput("not built yet".into()))
    }
    pub fn run_graph(&self, _input: &GraphInput) -> Result<GraphOutput> {
        Err(Error::InvalidInput("not built yet".into()))
    }
    pub fn with_int8_weights(&self) -> Result<Model> {
        Err(Error::InvalidInput("not built yet".into()))
    }
}
