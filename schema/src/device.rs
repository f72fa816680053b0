//! What a device says about itself: network groups, inputs, outputs, cache edges.

use serde::{Deserialize, Serialize};

/// HailoRT's `hailo_quant_info_t` (contract §4): `y = (q - zero_point) * scale`,
/// inputs clipped to `[min, max]` before quantisation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuantInfo {
    pub scale: f32,
    pub zero_point: f32,
    pub min: f32,
    pub max: f32,
}

impl QuantInfo {
    /// A float edge: identity quantisation (HailoRT's identity shortcut, contract §4).
    pub const IDENTITY: QuantInfo = QuantInfo {
        scale: 1.0,
        zero_point: 0.0,
        min: f32::MIN,
        max: f32::MAX,
    };
}

/// Element type of a buffer as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    U8,
    U16,
    F32,
    /// IEEE binary16 (stateful fp16 devices, issue 9): host buffers carry the bits as `u16`.
    F16,
}

impl DType {
    pub fn bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::U16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

/// Memory order of a cache edge's stream (contract §7.2, §7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// NHWC / tf_rgb: one token's features contiguous. Ring-safe.
    TokenMajor,
    /// NHCW with tokens on the width axis: one feature across all tokens, then the next.
    FeatureMajor,
    /// F8CR: groups of 8 features, each group spanning all tokens.
    F8cr,
    /// Test layout (emulator only, not in [`Layout::ALL`]): one KV head's `[token][dim]` block
    /// after the other.
    HeadMajor,
    /// Test layout (emulator only, not in [`Layout::ALL`]): tokens in tiles of 16, each tile
    /// feature-major (a transposed 16-token group).
    Tile16,
}

impl Layout {
    /// The named layouts a real compile is known to produce; the `layout` probe tries these.
    pub const ALL: [Layout; 3] = [Layout::TokenMajor, Layout::FeatureMajor, Layout::F8cr];
    /// Layouts the emulator can also write, hidden from the named `layout` probe so that
    /// `layout --infer` is tested on orders it was never told about.
    pub const TEST: [Layout; 2] = [Layout::HeadMajor, Layout::Tile16];

    pub fn name(self) -> &'static str {
        match self {
            Layout::TokenMajor => "token-major",
            Layout::FeatureMajor => "feature-major",
            Layout::F8cr => "f8cr",
            Layout::HeadMajor => "head-major",
            Layout::Tile16 => "tile16",
        }
    }

    /// A named layout ([`Layout::ALL`]) by name.
    pub fn parse(s: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == s)
    }

    /// Any layout the emulator can write, named or test.
    pub fn parse_any(s: &str) -> Option<Layout> {
        Layout::ALL
            .into_iter()
            .chain(Layout::TEST)
            .find(|l| l.name() == s)
    }
}

/// Which of the two genai network groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    Prefill,
    Tbt,
}

impl GroupKind {
    pub fn suffix(self) -> &'static str {
        match self {
            GroupKind::Prefill => "prefill",
            GroupKind::Tbt => "tbt",
        }
    }
}

/// What the genai server puts into an input (contract §2.1, §3.1 suffix map).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputRole {
    /// Raw uint16 rows of `embeddings.bin` (not quantised by the runtime).
    Embeddings,
    /// Raw uint8 `[token][head][key]` 1/0 mask.
    AttentionMask,
    PeQCos,
    PeQSin,
    PeKCos,
    PeKSin,
    /// Learned-position models (GPT-2 family): float32 absolute position per row.
    PositionIds,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoDescription {
    pub name: String,
    /// Role for inputs; `None` for outputs and unknown inputs.
    pub role: Option<InputRole>,
    /// Host shape (height, width, features).
    pub shape: [usize; 3],
    /// Type the host buffer has (after the server's FLOAT32 overrides, contract §2.1).
    pub host_dtype: DType,
    /// Type on the device side of the edge.
    pub device_dtype: DType,
    pub quant: QuantInfo,
}

impl IoDescription {
    pub fn elements(&self) -> usize {
        self.shape[0] * self.shape[1] * self.shape[2]
    }
}

/// Direction of a cache edge, from the core's point of view (contract §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheDirection {
    /// H2D: the core reads the cache.
    Input,
    /// D2H: the core writes the cache.
    Output,
}

/// Whether a cache holds keys or values, when the device knows (the emulator does; a HEF may
/// only say it through layer names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    K,
    V,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheEdgeDescription {
    pub cache_id: u32,
    pub direction: CacheDirection,
    /// `E`: bytes of one entry as streamed (contract §1.2).
    pub entry_size: usize,
    /// `Ep`: slot stride in the ring.
    pub padded_entry_size: usize,
    /// Entries read (input) or written (output) per run.
    pub length: usize,
    /// Bytes per element (1 or 2).
    pub data_bytes: usize,
    /// Declared numeric info of the edge (from the HEF; HailoRT itself never reads it).
    pub quant: QuantInfo,
    /// Declared memory order, if the device says (a HEF's format code; the emulator does not
    /// reveal its layout faults here, as a real HEF would not).
    pub format: Option<String>,
    /// Layer and K/V role, when known.
    pub layer: Option<usize>,
    pub kind: Option<CacheKind>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupDescription {
    pub name: String,
    pub kind: GroupKind,
    /// Token rows per run (`P` for prefill, 1 for tbt).
    pub rows: usize,
    pub inputs: Vec<IoDescription>,
    pub outputs: Vec<IoDescription>,
    pub cache_edges: Vec<CacheEdgeDescription>,
    /// Extra debug outputs exposing what the graph read from the cache (by cache_id).
    #[serde(default)]
    pub taps: Vec<u32>,
}

/// The KV-cache runtime a device implements; the [`DeviceDescription`] says which, and the
/// driver builds inputs for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeKind {
    /// HailoRT genai: a ring of `L` entries per cache, read offset moved by the host, P-row
    /// prefill windows and 1-row tbt runs, uint8 mask (contract §1-§2).
    #[default]
    GenaiRing,
    /// Core ML / ANE style: K/V states `[kv_heads, max_ctx, head_dim]` fp16 updated in-graph at
    /// absolute positions, explicit additive fp16 mask `[1,1,q,max_ctx]`, no wrap.
    Stateful,
    /// ONNX Runtime GenAI style: the host owns the cache as `past_key_values.*` inputs and
    /// `present.*` outputs of one graph (no ring offset, no in-graph state).
    HostCache,
}

impl RuntimeKind {
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::GenaiRing => "genai-ring",
            RuntimeKind::Stateful => "stateful",
            RuntimeKind::HostCache => "host-cache",
        }
    }
}

/// The ring and prefill geometry of one run (contract §1.3, §2.3): `L`, `P` and the prompt
/// length `n`, and what follows from them. Every crate uses this one definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// `L`: entries per ring.
    pub cache_len: usize,
    /// `P`: prefill rows.
    pub prefill_len: usize,
    /// `n`: prompt tokens.
    pub prompt_len: usize,
}

impl Geometry {
    /// Entries of the tbt read window (`in = L − 1`, contract §1.3).
    pub fn tbt_window(&self) -> usize {
        self.cache_len - 1
    }

    /// Absolute position held by read-window column `j` of the first tbt step. With `T = n + 1`
    /// tokens submitted, column j holds position `T − L + j` (prior art §1.7 invariant: entry
    /// index ≡ position mod L); `None` = never written.
    pub fn first_window_position(&self, j: usize) -> Option<usize> {
        let p = (self.prompt_len + 1 + j) as i64 - self.cache_len as i64;
        (p >= 0 && (p as usize) < self.prompt_len).then_some(p as usize)
    }

    /// Lowest (negative) position whose slot a prefill padding row wrote: a short first chunk of
    /// `r = n mod P` tokens runs all `P` rows, so positions `r − P … −1` hold padding K/V
    /// (contract §2.4); below that, slots were never written since the rings were cleared.
    pub fn padding_floor(&self) -> i64 {
        let r = self.prompt_len % self.prefill_len;
        if self.prompt_len < self.prefill_len || r != 0 {
            let r = if self.prompt_len < self.prefill_len {
                self.prompt_len
            } else {
                r
            };
            r as i64 - self.prefill_len as i64
        } else {
            0
        }
    }

    /// Read-window column j of the first tbt step was never written (not even by padding rows).
    pub fn first_window_never_written(&self, j: usize) -> bool {
        ((self.prompt_len + 1 + j) as i64 - (self.cache_len as i64)) < self.padding_floor()
    }

    /// Column of the first tbt window holding prompt position `p`.
    pub fn first_window_column(&self, p: usize) -> usize {
        self.cache_len + p - self.prompt_len - 1
    }

    /// Prefill chunks the driver runs for a prefix of `k` tokens (remainder first, contract §2.3).
    pub fn chunks(&self, k: usize) -> usize {
        k.div_ceil(self.prefill_len)
    }
}

/// Model-level numbers the driver needs (hailo-config.json `pre_process_params`, or the
/// reference model's config for the emulator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelShape {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// RoPE theta vector (length `head_dim`), `None` for learned positions.
    pub rope_theta: Option<Vec<f32>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceDescription {
    /// "emulator", "hailo" or "ane-emulator".
    pub backend: String,
    /// How the host drives the cache: a genai ring (HailoRT) or absolute-position states (Core ML).
    #[serde(default)]
    pub runtime: RuntimeKind,
    /// Model scope, e.g. `smollm2` for groups `smollm2__prefill` / `smollm2__tbt`.
    pub model_name: String,
    /// `L`: entries per ring, equal for every cache.
    pub cache_len: usize,
    /// `P`: prefill rows.
    pub prefill_len: usize,
    pub shape: ModelShape,
    pub groups: Vec<GroupDescription>,
    /// The weight values the device computes with, as far as it declares them (descriptions
    /// written before the field existed declare the checkpoint's).
    #[serde(default)]
    pub weights: DeclaredWeights,
    /// The arithmetic inside the graph, as far as the device declares it (descriptions written
    /// before the field existed, and devices that do not say, declare float32).
    #[serde(default)]
    pub arithmetic: DeclaredArithmetic,
}

/// The arithmetic a device declares its graph computes in; the precision-matched reference
/// computes in it (kvprobe_reference::arith documents which op outputs are rounded).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclaredArithmetic {
    #[default]
    Float32,
    /// fp16 op outputs with float32 accumulation; `saturate_at` None = IEEE (±inf beyond
    /// 65504), Some(limit) = values clamped at ±limit (HTP: 131008).
    Fp16 {
        saturate_at: Option<f32>,
        norm: DeclaredNorm,
        /// The reference's sites (kvprobe_reference::arith::SITES) held in fp16; None (and
        /// descriptions written before the field) = every op output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rounded: Option<Vec<String>>,
        /// Each norm after a residual add reads the float32 sum of its inputs (ONNX Runtime's
        /// fp16 SkipSimplifiedLayerNormalization), the sum carried on is rounded.
        #[serde(default, skip_serializing_if = "is_false")]
        norm_reads_f32_sum: bool,
        /// The RoPE cos/sin tables are fp16 values.
        #[serde(default, skip_serializing_if = "is_false")]
        rope_tables_fp16: bool,
        /// A norm's mean and softmax's denominator accumulate in fp16, term by term in index
        /// order (the ANE emulator's reductions); matrix products accumulate wider.
        #[serde(default, skip_serializing_if = "is_false")]
        fp16_sums: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !b
}

/// How the graph computes RMSNorm's statistic (where fp16 can overflow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclaredNorm {
    /// mean(x·x) from the squares of x.
    Squares,
    /// The squares of x / √max|x|.
    MaxScaled,
    /// One fused op computing in float32 (SimplifiedLayerNormalization).
    Fused,
    /// x / max|x|, then the mean of its squares and eps / max|x|² (the ANE-port form).
    MaxDivided,
}

/// What a device declares about its weights; the precision-matched reference computes with
/// what is declared, nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclaredWeights {
    /// The checkpoint's values (or nothing declared: a HEF does not say how its compiler
    /// quantised the weights, so its cost is not modelled).
    #[default]
    Checkpoint,
    /// Per-output-channel symmetric int8, `max|w| / 127` a channel (the emulator's
    /// `--sim-weights int8`).
    Int8PerChannel,
    /// Block-quantised linear weights (n-bit levels, one scale and zero point per block of input
    /// features) as the model file `model` holds them: ONNX `MatMulNBits` (issue 35).
    Blocks {
        /// The model file the weights are read from.
        model: std::path::PathBuf,
        /// One line: how many, bits, block size, the input path (e.g. `accuracy_level` 4).
        summary: String,
    },
    /// The weights an OpenVINO IR stores compressed (f16 from `compress_to_fp16`), as its
    /// decompression subgraphs widen them (issue 37).
    OpenvinoIr {
        /// The IR's xml (its .bin beside it).
        xml: std::path::PathBuf,
        /// One line: how many constants of which type, and how they are widened.
        summary: String,
    },
}

impl DeviceDescription {
    pub fn group(&self, kind: GroupKind) -> Option<&GroupDescription> {
        self.groups.iter().find(|g| g.kind == kind)
    }
}
