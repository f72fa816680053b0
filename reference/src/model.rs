//! The public model: loading dispatch and the thin wrappers (forward, prefix_state, step,
//! step_many, decode_step) over the one graph engine in `graph.rs`.

use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::blocks::{Block, Linear, Norm};
use crate::graph::{GraphInput, GraphOptions, PositionInput};
use crate::kv::{KeySet, KvState, LayerKv};
use crate::store::Weight;
use crate::weights::{StoredWeights, WeightGetter};
use crate::{gpt2, hf, llama, mask};
use crate::{Error, Family, LoadedParts, ModelConfig, Result, StoredParts, TextTokenizer, Weights};

/// Options of a full forward.
#[derive(Debug, Clone, Default)]
pub struct ForwardOptions {
    /// Row-major `[T*T]` "may attend"; None = causal.
    pub mask: Option<Vec<bool>>,
    /// Absolute positions; None = 0..T.
    pub positions: Option<Vec<usize>>,
    /// Return per-layer K (after RoPE) and V.
    pub taps: bool,
    /// Graph faults (default = correct math).
    pub graph: GraphOptions,
}

#[derive(Debug, Clone)]
pub struct ForwardOutput {
    /// `[rows, vocab]` row-major.
    pub logits: Vec<f32>,
    pub rows: usize,
    pub vocab: usize,
    /// Per layer `[n_kv_heads, T, head_dim]` (K after RoPE) when taps were asked for.
    pub taps: Option<Vec<LayerKv>>,
    /// Under fp16 arithmetic, the first op output that left the declared range.
    pub overflow: Option<crate::OverflowAt>,
}

impl ForwardOutput {
    /// Logits of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// Rows of one batched `step_many` run; bounds the `[rows, vocab]` logits buffer.
const STEP_MANY_CHUNK: usize = 64;

#[derive(Debug, Clone)]
pub struct Model {
    pub(crate) config: ModelConfig,
    pub(crate) tokenizer: TextTokenizer,
    pub(crate) source: PathBuf,
    pub(crate) embed: Weight,
    /// An f32 copy of the embedding made only when a caller asks for [`Model::embedding_table`].
    embed_f32: std::sync::OnceLock<Tensor>,
    pub(crate) wpe: Option<Tensor>,
    pub(crate) inv_freq: Option<Vec<f32>>,
    pub(crate) blocks: Vec<Block>,
    pub(crate) final_norm: Norm,
    pub(crate) lm_head: Linear,
    /// lm_head is the embedding table (tied): int8 leaves it alone like the embeddings.
    pub(crate) lm_head_tied: bool,
    /// [`Model::int8_weights`], made once and shared by every clone of this model.
    pub(crate) int8: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<Model>>>,
    /// [`Model::onnx_block_weights`]: the last model file's weights, shared the same way.
    pub(crate) declared: crate::onnx_weights::DeclaredCache,
    /// RoPE tables a device declares (an OpenVINO IR's compressed `cos_cache` / `sin_cache`) in
    /// place of the ones computed from `inv_freq`.
    pub(crate) stored_rope: Option<std::sync::Arc<crate::stored_rope::StoredRope>>,
    /// A QDQ graph's activation grids (`onnx_qdq.rs`), fake-quantised at the reference's sites.
    pub(crate) qdq: Option<std::sync::Arc<crate::qdq::QdqGrids>>,
}

impl Model {
    /// A Hugging Face folder (config.json + safetensors + tokenizer.json) or a `.gguf` file.
    pub fn load(path: &Path) -> Result<Model> {
        if !path.exists() {
            return Err(Error::NotFound {
                path: path.to_path_buf(),
            });
        }
        if !path.is_dir() && !path.is_file() {
            // a pipe would block the read of the magic below until a writer came
            return Err(Error::Unsupported {
                path: path.to_path_buf(),
                what: "neither a folder nor a regular file (a pipe or a device); pass the model folder or a .gguf file".into(),
            });
        }
        let parts = stored_parts(path)?;
        // a loaded file's tokenizer must fit its embedding (in-memory parts may pair a test
        // tokenizer with a tiny vocabulary on purpose)
        parts.tokenizer.check_fits(parts.config.vocab_size)?;
        Self::from_stored(parts, path)
    }

    pub fn from_parts(
        config: ModelConfig,
        weights: Weights,
        tokenizer: TextTokenizer,
    ) -> Result<Model> {
        Self::from_parts_at(
            LoadedParts {
                config,
                weights,
                tokenizer,
            },
            Path::new("(in-memory weights)"),
        )
    }

    /// `source` names the model in error messages.
    pub fn from_parts_at(parts: LoadedParts, source: &Path) -> Result<Model> {
        let LoadedParts {
            config,
            weights,
            tokenizer,
        } = parts;
        let weights = weights
            .into_iter()
            .map(|(k, v)| Ok((k, Weight::from_tensor(v)?)))
            .collect::<Result<StoredWeights>>()?;
        Self::from_stored(
            StoredParts {
                config,
                weights,
                tokenizer,
            },
            source,
        )
    }

    pub(crate) fn from_stored(parts: StoredParts, source: &Path) -> Result<Model> {
        let StoredParts {
            config,
            weights,
            tokenizer,
        } = parts;
        check_config(&config, source)?;
        crate::finite::check_weights(&weights, source)?;
        match config.family {
            Family::Llama => {
                let g = WeightGetter::new(&weights, source);
                let p = llama::build(&config, &g)?;
                g.check_all_used(&config.architecture, ignorable)?;
                Ok(Model {
                    inv_freq: Some(llama::inv_freq_scaled(
                        config.rope_theta,
                        config.head_dim,
                        config.rope_freq_factors.as_deref(),
                    )),
                    config,
                    tokenizer,
                    source: source.to_path_buf(),
                    embed: p.embed,
                    embed_f32: Default::default(),
                    int8: Default::default(),
                    declared: Default::default(),
                    stored_rope: None,
                    qdq: None,
                    wpe: None,
                    blocks: p.blocks,
                    final_norm: p.final_norm,
                    lm_head: p.lm_head,
                    lm_head_tied: p.tied,
                })
            }
            Family::Gpt2 => {
                let weights: StoredWeights = weights
                    .into_iter()
                    .map(|(k, v)| (gpt2::canonical_name(&k).to_string(), v))
                    .collect();
                let g = WeightGetter::new(&weights, source);
                let p = gpt2::build(&config, &g, crate::blocks::Activation::GeluTanh)?;
                g.check_all_used(&config.architecture, ignorable)?;
                Ok(Model {
                    config,
                    tokenizer,
                    source: source.to_path_buf(),
                    embed: p.wte,
                    embed_f32: Default::default(),
                    int8: Default::default(),
                    declared: Default::default(),
                    stored_rope: None,
                    qdq: None,
                    wpe: Some(p.wpe),
                    inv_freq: None,
                    blocks: p.blocks,
                    final_norm: p.final_norm,
                    lm_head: p.lm_head,
                    lm_head_tied: true,
                })
            }
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The path the model was loaded from (used in error messages).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// `bos` None = the model's default (`config.add_bos`).
    pub fn encode(&self, text: &str, bos: Option<bool>) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, bos.unwrap_or(self.config.add_bos))
    }

    /// `[vocab, hidden]` f32. A copy of the whole table unless the checkpoint's embedding is
    /// already f32 in memory; the emulators read it through [`Model::embedding_rows`] instead.
    pub fn embedding_table(&self) -> &Tensor {
        self.embed_f32.get_or_init(|| {
            // the conversion of stored values cannot fail once the model is built (every
            // tensor's byte length was checked at load); an empty table would fail loudly at use
            self.embed.to_tensor().unwrap_or_else(|_| {
                Tensor::zeros(
                    (0, self.config.hidden_size),
                    candle_core::DType::F32,
                    &Device::Cpu,
                )
                .expect("an empty tensor")
            })
        })
    }

    /// `(vocab, hidden)` of the embedding table.
    pub fn embedding_dims(&self) -> (usize, usize) {
        (self.embed.rows(), self.embed.cols())
    }

    /// Rows `r0..r1` of the embedding table as f32, row-major (converted from the stored type).
    pub fn embedding_rows(&self, r0: usize, r1: usize) -> Result<Vec<f32>> {
        if r0 > r1 || r1 > self.embed.rows() {
            return Err(Error::InvalidInput(format!(
                "embedding rows {r0}..{r1} outside the table of {}",
                self.embed.rows()
            )));
        }
        let mut v = Vec::new();
        self.embed.rows_into(r0, r1, &mut v)?;
        Ok(v)
    }

    /// The embedding table as stored, shared with the model (a cheap handle, no copy).
    pub fn embedding_source(&self) -> crate::EmbeddingRows {
        crate::EmbeddingRows(self.embed.clone())
    }

    /// Bytes of all weights as stored (a tied lm_head counted once).
    pub fn stored_weight_bytes(&self) -> usize {
        self.weight_bytes(Weight::stored_bytes)
    }

    /// Bytes of weights one decode step reads: as stored, or the blocks a weight dequantised at
    /// load keeps for its one-row products (`Weight::one_row_bytes`).
    pub fn decode_step_weight_bytes(&self) -> usize {
        self.weight_bytes(Weight::one_row_bytes)
    }

    /// `bytes` of every weight, a tied lm_head counted once (as the lm_head: the embedding
    /// lookup reads a row a step), biases as f32.
    fn weight_bytes(&self, bytes: impl Fn(&Weight) -> usize) -> usize {
        let mut n = bytes(if self.lm_head_tied {
            &self.lm_head.w
        } else {
            &self.embed
        });
        if !self.lm_head_tied {
            n += bytes(&self.lm_head.w);
        }
        let small = |t: &Tensor| 4 * t.elem_count();
        for b in &self.blocks {
            for l in b.linears() {
                n += bytes(&l.w) + l.b.as_ref().map_or(0, small);
            }
        }
        n
    }

    /// HF `theta^(-2i/hd)`, i < hd/2; None for GPT-2.
    pub fn rope_inv_freq(&self) -> Option<Vec<f32>> {
        self.inv_freq.clone()
    }

    /// Token embeddings `[T, hidden]` (GPT-2: without positions; the graph adds them).
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let vocab = self.config.vocab_size;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::TokenOutOfRange {
                path: self.source.clone(),
                id,
                vocab,
            });
        }
        self.embed.gather_rows(ids)
    }

    /// Full forward: `mask` None = causal, `positions` None = 0..T; logits `[T, vocab]`.
    pub fn forward(&self, ids: &[u32], opts: &ForwardOptions) -> Result<ForwardOutput> {
        let t = ids.len();
        if t == 0 {
            return Err(Error::InvalidInput("empty token sequence".into()));
        }
        let positions: Vec<usize> = match &opts.positions {
            Some(p) if p.len() != t => {
                return Err(Error::InvalidInput(format!(
                    "{} positions for {t} tokens",
                    p.len()
                )))
            }
            Some(p) => p.clone(),
            None => (0..t).collect(),
        };
        self.check_positions(&positions)?;
        let m = match &opts.mask {
            Some(m) if m.len() != t * t => {
                return Err(Error::InvalidInput(format!(
                    "mask has {} entries, expected {t}x{t}",
                    m.len()
                )))
            }
            Some(m) => m.clone(),
            None => mask::causal(t),
        };
        let out = self.run_graph(&GraphInput {
            hidden: self.embed(ids)?,
            positions: PositionInput::Ids(positions.iter().map(|&p| p as f32).collect()),
            past: Vec::new(),
            mask: mask::per_head(&m, t, self.config.n_heads),
            graph: opts.graph,
            last_only: false,
        })?;
        Ok(ForwardOutput {
            logits: out.logits,
            rows: out.rows,
            vocab: self.config.vocab_size,
            taps: opts.taps.then_some(out.new_kv),
            overflow: out.overflow,
        })
    }

    /// Keys/values of a causal pass over `ids` at `positions`.
    pub fn prefix_state(&self, ids: &[u32], positions: &[usize]) -> Result<KvState> {
        if ids.len() != positions.len() {
            return Err(Error::InvalidInput(format!(
                "{} positions for {} tokens",
                positions.len(),
                ids.len()
            )));
        }
        if ids.is_empty() {
            return self.empty_state();
        }
        self.check_positions(positions)?;
        let t = ids.len();
        let out = self.run_graph(&GraphInput {
            hidden: self.embed(ids)?,
            positions: PositionInput::Ids(positions.iter().map(|&p| p as f32).collect()),
            past: Vec::new(),
            mask: mask::per_head(&mask::causal(t), t, self.config.n_heads),
            graph: GraphOptions::default(),
            last_only: true,
        })?;
        Ok(KvState {
            layers: out.new_kv,
            positions: positions.to_vec(),
            ids: ids.to_vec(),
        })
    }

    /// A state with no entries (`[n_kv, 0, hd]` per layer).
    pub fn empty_state(&self) -> Result<KvState> {
        let c = &self.config;
        let z = Tensor::zeros(
            (c.n_kv_heads, 0, c.head_dim),
            candle_core::DType::F32,
            &Device::Cpu,
        )?;
        Ok(KvState {
            layers: (0..c.n_layers)
                .map(|_| LayerKv {
                    k: z.clone(),
                    v: z.clone(),
                })
                .collect(),
            positions: Vec::new(),
            ids: Vec::new(),
        })
    }

    /// One token at absolute `position` attending to `keys` of the state plus itself; logits `[vocab]`.
    pub fn step(
        &self,
        state: &KvState,
        token: u32,
        position: usize,
        keys: &KeySet,
    ) -> Result<Vec<f32>> {
        let mut rows = self.step_rows(state, token, position, std::slice::from_ref(keys))?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// The same query against several key sets in one batched pass (colmap): the rows are
    /// identical copies of the token, row i sees key set i plus its own copy only.
    pub fn step_many(
        &self,
        state: &KvState,
        token: u32,
        position: usize,
        keys: &[KeySet],
    ) -> Result<Vec<Vec<f32>>> {
        let mut all = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(STEP_MANY_CHUNK) {
            all.extend(self.step_rows(state, token, position, chunk)?);
        }
        Ok(all)
    }

    /// Greedy-decoding helper: attend to the whole state, then append the token's K/V to it.
    pub fn decode_step(
        &self,
        state: &mut KvState,
        token: u32,
        position: usize,
    ) -> Result<Vec<f32>> {
        let out = self.step_graph(
            state,
            token,
            position,
            &[KeySet::All],
            GraphOptions::default(),
        )?;
        if state.is_empty() {
            state.layers = out.new_kv;
        } else {
            for (l, n) in state.layers.iter_mut().zip(&out.new_kv) {
                l.k = Tensor::cat(&[&l.k, &n.k], 1)?;
                l.v = Tensor::cat(&[&l.v, &n.v], 1)?;
            }
        }
        state.positions.push(position);
        state.ids.push(token);
        Ok(out.logits)
    }

    fn step_rows(
        &self,
        state: &KvState,
        token: u32,
        position: usize,
        keys: &[KeySet],
    ) -> Result<Vec<Vec<f32>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let out = self.step_graph(state, token, position, keys, GraphOptions::default())?;
        let v = self.config.vocab_size;
        Ok(out.logits.chunks(v).map(<[f32]>::to_vec).collect())
    }

    /// [`Model::step`] with `graph`'s variants (a mask hypothesis' blocked columns, a scale).
    pub fn step_in(
        &self,
        state: &KvState,
        token: u32,
        position: usize,
        keys: &KeySet,
        graph: GraphOptions,
    ) -> Result<Vec<f32>> {
        let out = self.step_graph(state, token, position, std::slice::from_ref(keys), graph)?;
        Ok(out.logits)
    }

    pub(crate) fn check_positions(&self, p: &[usize]) -> Result<()> {
        let max = self.config.max_position;
        match p.iter().find(|&&x| x >= max) {
            Some(&position) => Err(Error::TooLong {
                path: self.source.clone(),
                position,
                max,
            }),
            None => Ok(()),
        }
    }
}

/// The weights of a model folder or `.gguf` file in their storage type, under HF names.
pub(crate) fn stored_parts(path: &Path) -> Result<crate::StoredParts> {
    if path.is_dir() {
        hf::load_stored(path)
    } else if is_gguf(path)? {
        crate::gguf::load_stored(path)
    } else {
        Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: "not a model folder or .gguf file; pass the folder holding config.json or a .gguf file".into(),
        })
    }
}

fn is_gguf(path: &Path) -> Result<bool> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Ok(true);
    }
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(f.read_exact(&mut magic).is_ok() && &magic == b"GGUF")
}

/// Tensors a checkpoint may hold that the original model ignores too: the stored copy of a tied
/// output projection (HF overwrites it with the embedding; untied models ask for it) and the RoPE
/// frequency buffers old Llama conversions saved (HF recomputes them from the config).
fn ignorable(name: &str) -> bool {
    name == "lm_head.weight" || name.ends_with(".rotary_emb.inv_freq")
}

fn check_config(c: &ModelConfig, path: &Path) -> Result<()> {
    let fail = |detail: String| Error::Format {
        path: path.to_path_buf(),
        detail,
    };
    if c.n_heads == 0 || c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(fail(format!(
            "{} attention heads cannot share {} KV heads; fix num_attention_heads/num_key_value_heads",
            c.n_heads, c.n_kv_heads
        )));
    }
    if c.head_dim == 0
        || !c.head_dim.is_multiple_of(2)
        || c.vocab_size == 0
        || c.hidden_size == 0
        || c.n_layers == 0
    {
        return Err(fail(format!(
            "implausible sizes (hidden {}, head_dim {}, vocab {}, layers {}); fix the model config",
            c.hidden_size, c.head_dim, c.vocab_size, c.n_layers
        )));
    }
    if c.max_position == 0 {
        return Err(fail(
            "the model's context length is 0 (GGUF `<arch>.context_length`, config.json `max_position_embeddings` or `n_positions`); fix the model config".into(),
        ));
    }
    crate::finite::check_scalars(c, path)?;
    if let Some(f) = &c.rope_freq_factors {
        if f.len() != c.head_dim / 2 || f.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err(fail(format!(
                "RoPE frequency factors must be {} positive numbers (head_dim / 2), got {} values; fix rope_scaling / the rope_freqs tensor",
                c.head_dim / 2,
                f.len()
            )));
        }
    }
    if c.family == Family::Gpt2 && c.n_heads * c.head_dim != c.hidden_size {
        return Err(fail(
            "GPT-2 needs n_head * head_dim == n_embd; fix the config".into(),
        ));
    }
    Ok(())
}
