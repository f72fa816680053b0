//! The named root cause a diagnosis ends in.

use serde::{Deserialize, Serialize};

/// Named root cause. Order of the variants = stage order used to pick the headline verdict when
/// several faults are found (prefill graph, then tbt graph, then the cache path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Healthy,
    PrefillGraph,
    TbtGraph,
    CacheLayoutMismatch,
    CacheTruncation,
    MaskConvention,
    CacheOffset,
    CacheQuantization,
    PositionMismatch,
    KvBinding,
    /// fp16 overflow (inf/NaN) inside the graph: a stateful fp16 device (issue 9).
    NumericOverflow,
    /// State left over from a previous request changes the next one (issue 9).
    StaleCache,
    /// A prompt or a generation past a limit the device declares came back without the runtime
    /// refusing it (issues 20, 22).
    CapacityOverflow,
    /// The same request on the same device gives different results run to run (issue 20).
    Nondeterministic,
    Unknown,
}

impl Verdict {
    pub const ALL: [Verdict; 15] = [
        Verdict::Healthy,
        Verdict::PrefillGraph,
        Verdict::TbtGraph,
        Verdict::CacheLayoutMismatch,
        Verdict::CacheTruncation,
        Verdict::MaskConvention,
        Verdict::CacheOffset,
        Verdict::CacheQuantization,
        Verdict::PositionMismatch,
        Verdict::KvBinding,
        Verdict::NumericOverflow,
        Verdict::StaleCache,
        Verdict::CapacityOverflow,
        Verdict::Nondeterministic,
        Verdict::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::PrefillGraph => "prefill-graph",
            Verdict::TbtGraph => "tbt-graph",
            Verdict::CacheLayoutMismatch => "cache-layout-mismatch",
            Verdict::CacheTruncation => "cache-truncation",
            Verdict::MaskConvention => "mask-convention",
            Verdict::CacheOffset => "cache-offset",
            Verdict::CacheQuantization => "cache-quantization",
            Verdict::PositionMismatch => "position-mismatch",
            Verdict::KvBinding => "kv-binding",
            Verdict::NumericOverflow => "numeric-overflow",
            Verdict::StaleCache => "stale-cache",
            Verdict::CapacityOverflow => "capacity-overflow",
            Verdict::Nondeterministic => "nondeterministic",
            Verdict::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.name() == s)
    }
}
