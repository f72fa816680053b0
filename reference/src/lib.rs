//! kvprobe-reference: float32 reference models (Llama family, GPT-2 family) on candle-core.
//!
//! Everything here is the ground truth the probes compare an NPU against, so every path (full
//! forward, KV steps, emulator graph runs) goes through one engine, [`Model::run_graph`].

pub mod arch_fixtures;
pub mod arith;
mod block_gemv;
pub mod blockquant;
mod blocks;
pub mod config;
pub mod error;
pub mod export;
mod finite;
pub mod fixtures;
pub mod fixtures_gguf;
mod float_scan;
mod fp16_weights;
pub mod generate;
pub mod gguf;
mod gguf_config;
mod gguf_meta;
mod gguf_pending;
mod gguf_scan;
pub mod gguf_tokenizer;
mod gpt2;
pub mod graph;
pub mod hf;
pub mod int8;
mod jitter;
pub mod kv;
pub mod llama;
pub mod mask;
mod matmul;
pub mod model;
mod model_step;
pub mod onnx_proto;
pub mod onnx_qdq;
pub mod onnx_qdq_model;
mod onnx_qdq_names;
pub mod onnx_weights;
mod openvino_decompress;
mod openvino_ir;
pub mod openvino_weights;
pub mod pieces;
pub mod qdq;
mod store;
mod stored_rope;
mod streamed_gemv;
pub mod support;
pub mod tokenizer;
mod weights;

pub use arith::{Arithmetic, Fp16, NormStatistic, Overflow, OverflowAt};
pub use config::{Family, ModelConfig};
pub use error::{Error, Result};
pub use graph::{
    Blocked, GraphInput, GraphOptions, GraphOutput, HeadWiring, PositionInput, Resume, Stream,
    Streams,
};
pub use kv::{KeySet, KvState, LayerKv};
pub use model::{ForwardOptions, ForwardOutput, Model};
pub use pieces::PiecedRows;
pub use store::EmbeddingRows;
pub use tokenizer::TextTokenizer;

/// Weights by canonical Hugging Face tensor name, already f32 (GGUF dequantised, q/k un-permuted).
pub type Weights = std::collections::HashMap<String, candle_core::Tensor>;

/// What a loader (HF folder or GGUF file) produces; [`Model::from_parts`] turns it into a model.
pub struct LoadedParts {
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: TextTokenizer,
}

/// [`LoadedParts`] with the weights in their storage type (what [`Model::load`] builds from).
pub(crate) struct StoredParts {
    pub config: ModelConfig,
    pub weights: weights::StoredWeights,
    pub tokenizer: TextTokenizer,
}

impl StoredParts {
    /// Every weight as an f32 tensor (the public loaders' [`LoadedParts`]).
    pub(crate) fn into_loaded(self) -> Result<LoadedParts> {
        let weights = self
            .weights
            .into_iter()
            .map(|(k, w)| Ok((k, w.to_tensor()?)))
            .collect::<Result<Weights>>()?;
        Ok(LoadedParts {
            config: self.config,
            weights,
            tokenizer: self.tokenizer,
        })
    }
}
