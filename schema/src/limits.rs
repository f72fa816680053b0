//! The limits a device declares (issue 20): how long a prompt, a context or a window may be, and
//! what the documented runtime does past each one. A device states them through the device
//! contract (`kvprobe_npu::Device::limits`); the `capacity` probe sweeps up to and past them.

use serde::{Deserialize, Serialize};

/// Which limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitKind {
    /// Rows of one prefill run: Hailo's `P` (`prefill_input_tokens_count`), a Core ML graph's
    /// largest query length. The host splits a longer prompt into runs.
    PrefillLen,
    /// Entries of the KV cache: Hailo's ring length `L`, an ONNX past/present length.
    CacheLen,
    /// Positions one request may reach: a Core ML state's length, ONNX `context_length` /
    /// `search.max_length`.
    MaxContext,
    /// Keys one query attends to in a sliding-window cache (ONNX `decoder.sliding_window`).
    Window,
    /// The prompt length a static graph was compiled for (OpenVINO NPUW `MAX_PROMPT_LEN`, an
    /// ONNX static prompt graph).
    PromptLen,
}

impl LimitKind {
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::PrefillLen => "prefill-len",
            LimitKind::CacheLen => "cache-len",
            LimitKind::MaxContext => "max-context",
            LimitKind::Window => "window",
            LimitKind::PromptLen => "prompt-len",
        }
    }
}

/// What the documented runtime does with a request that goes past a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PastLimit {
    /// The host splits the request into runs that fit: the output equals the reference's.
    Split,
    /// A typed error from the host or the runtime; no output.
    Refused,
    /// Attention slides over the newest `value` tokens (a ring that wraps, a windowed cache):
    /// the output equals the reference attending to that window only.
    Slides,
}

impl PastLimit {
    pub fn name(self) -> &'static str {
        match self {
            PastLimit::Split => "split",
            PastLimit::Refused => "refused",
            PastLimit::Slides => "slides",
        }
    }
}

/// One declared limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLimit {
    pub kind: LimitKind,
    /// Tokens (prompt rows, cache entries, positions, window keys).
    pub value: usize,
    /// A prompt of more than `value` tokens; `None`: this limit does not bound prompts.
    pub prompt: Option<PastLimit>,
    /// Generation once the context holds more than `value` tokens; `None`: this limit does not
    /// bound generation.
    pub generation: Option<PastLimit>,
    /// Where that behaviour is documented (a contract section, the runtime's source).
    pub source: String,
}
