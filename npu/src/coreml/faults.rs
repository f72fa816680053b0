//! Faults of the Core ML / ANE stateful emulator (`--device ane-sim`), parsed with the same
//! `NAME[=VALUE][@SCOPE]` syntax as the Hailo emulator's. None takes a scope; only
//! `ane-scale-after-qk`, `ane-norm-fp16`, `ane-state-wrap` and `ane-query-truncate` take a value.
//!
//! `ane-scale-after-qk=GAIN` (default 8192): the literal fault (`=1`) overflows fp16 only where
//! the raw Q·Kᵀ passes 65504, which needs the activations of multi-billion-parameter models; the
//! raw peaks of the models we test are far below (SmolLM2: under ~300, the tiny fixtures: ~13-20).
//! GAIN multiplies q before the unscaled product to stand in for that magnitude, and the scale
//! divides it out again, so wherever the product stays finite the math is the healthy one and
//! only the overflow differs. Where the first inf appears depends on where the product peaks
//! (on SmolLM2 often the first position, the attention sink), not only on the prompt length.
//!
//! | fault | what the converted graph or app does wrong | verdict |
//! |---|---|---|
//! | `ane-write-offset` | slice_update writes the new K/V at position + 1 (off by one) | cache-offset |
//! | `ane-state-layout` | the attention reads the state as `[ctx, kv_heads, d]` although it is written `[kv_heads, ctx, d]` | cache-layout-mismatch |
//! | `ane-mask-01` | the graph turns the additive mask into 0 (allowed) / +1 (blocked) instead of 0 / −inf | mask-convention |
//! | `ane-scale-after-qk` | the softmax scale is applied after Q·Kᵀ instead of to Q before it: fp16 scores overflow | numeric-overflow |
//! | `ane-stale-state` | a new request reuses the previous MLState and its length: it continues after the old context | stale-cache |
//! | `ane-state-wrap=N` | the state holds N positions, fewer than the max_ctx declared: position p is written to slot p mod N and column j reads slot j mod N (no error) | capacity-overflow |
//! | `ane-query-truncate=N` | the graph takes at most N query rows, fewer than the max_query declared: a longer chunk keeps its first N rows and returns the last of them (no error) | capacity-overflow |
//! | `ane-mask-fp32-min` | prefill calls padded to the compiled query length with rows that attend to nothing, masked with the fp32 minimum (−inf in fp16): their softmax is 0/0 | numeric-overflow |
//! | `ane-norm-fp16` | RMSNorm's fp32 cast stripped: the sum of squares overflows fp16 and the row normalises to zero | numeric-overflow |
//! | `ane-state-race` | a call writing more than 16 rows writes the rows past the 16th with low bits that change run to run | nondeterministic |
//!
//! `ane-mask-fp32-min` (coremltools PR#2669): the ANE runs enumerated shapes, so the app pads a
//! short prefill call to `max_query` rows (zero embeddings, positions after the call's last row,
//! a mask row that allows nothing) and builds the mask from `finfo(float32).min`, which rounds to
//! −inf in fp16. A pad row's scores are all −inf, `exp(s − max)` is `exp(NaN)`; its layer-0
//! output is NaN, so from layer 1 on its K/V in the state are NaN and every row reads them
//! (NaN · 0 = NaN). With the fp16-safe sentinel the pad rows stay finite and masked: the healthy
//! graph (flexible query length) has no pad rows at all, so the fault brings the padding with it.
//! One-row (tbt) calls are a shape of their own and are not padded.
//!
//! `ane-norm-fp16=GAIN` (default 1, the literal fault; executorch PR#19523): `x · rsqrt(mean(x²) + eps)`
//! all in fp16, the mean a sum in fp16 divided by the width, so a row whose sum of squares passes
//! 65504 gets `rsqrt(inf) = 0` and normalises to zero (its K and V are exactly zero; an
//! activation past 65504 itself gives inf · 0 = NaN). GAIN multiplies x (and eps by GAIN²)
//! before the norm, exact in real arithmetic, to stand in for a larger model's activations on
//! the small fixtures, as `ane-scale-after-qk` does.
//!
//! `ane-state-race` (apple/coreai-models#84): only calls that write more than 16 rows; the rows
//! past the 16th land with their two lowest mantissa bits drawn from a generator seeded per
//! process (clock and process id) and advanced per call, so the same request differs run to
//! run and process to process. Rows 0..16, and every one-row call, are exact.

use kvprobe_schema::Verdict;

use crate::contract::faults::{FaultDecl, FaultTable, FaultText, SweepValue, Values};
use crate::{Error, Result};

/// The ANE emulator's fault table (`--device ane-sim`); the README's table is generated from it.
pub const TABLE: FaultTable = FaultTable {
    faults: &[
        FaultDecl::plain(
            "ane-write-offset",
            "slice_update writes the new K/V at position + 1",
            Verdict::CacheOffset,
        ),
        FaultDecl::plain(
            "ane-state-layout",
            "the attention reads the state as `[ctx, kv_heads, d]`, written `[kv_heads, ctx, d]`",
            Verdict::CacheLayoutMismatch,
        ),
        FaultDecl::plain(
            "ane-mask-01",
            "the additive mask becomes 0 / +1 instead of 0 / −inf",
            Verdict::MaskConvention,
        ),
        FaultDecl {
            values: Values::OptionalNumber("GAIN"),
            ..FaultDecl::plain(
                "ane-scale-after-qk",
                "the softmax scale comes after Q·Kᵀ: fp16 scores overflow (GAIN, default 8192, stands in for a larger model's activations; `=1` is the literal fault; evidence: layer and first position)",
                Verdict::NumericOverflow,
            )
        },
        FaultDecl::plain(
            "ane-stale-state",
            "a new request reuses the previous state and its length",
            Verdict::StaleCache,
        ),
        FaultDecl {
            values: Values::Number("N"),
            ..FaultDecl::plain(
                "ane-state-wrap",
                "the state holds N positions, fewer than the max_ctx declared: from N on each write silently lands on position − N",
                Verdict::CapacityOverflow,
            )
        },
        FaultDecl {
            values: Values::Number("N"),
            ..FaultDecl::plain(
                "ane-query-truncate",
                "the graph takes N query rows, fewer than the max_query declared: the rest of a longer chunk is silently dropped",
                Verdict::CapacityOverflow,
            )
        },
        // the faulty sweep draws the Hailo table only: these are verified by their end-to-end
        // tests (tests/determinism_ane.rs)
        FaultDecl {
            sweep: SweepValue::NotSampled,
            ..FaultDecl::plain(
                "ane-mask-fp32-min",
                "short prefill calls padded with rows that attend to nothing, masked with the fp32 minimum (−inf in fp16): 0/0 NaN in their softmax reaches every row through the state (evidence: the mask, a position past the prompt)",
                Verdict::NumericOverflow,
            )
        },
        FaultDecl {
            values: Values::OptionalNumber("GAIN"),
            sweep: SweepValue::NotSampled,
            ..FaultDecl::plain(
                "ane-norm-fp16",
                "RMSNorm without its fp32 cast: the sum of squares overflows fp16, the row normalises to zero (GAIN, default 1 = the literal fault, stands in for larger activations; evidence: the layer)",
                Verdict::NumericOverflow,
            )
        },
        FaultDecl {
            sweep: SweepValue::NotSampled,
            ..FaultDecl::plain(
                "ane-state-race",
                "a call writing more than 16 rows writes the rows past the 16th with low bits that change run to run (seeded per process and call)",
                Verdict::Nondeterministic,
            )
        },
    ],
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AneFault {
    WriteOffset,
    StateLayout,
    Mask01,
    /// The stand-in magnitude gain (see the module doc).
    ScaleAfterQk(f64),
    StaleState,
    /// The state's real length.
    StateWrap(usize),
    /// The graph's real largest query length.
    QueryTruncate(usize),
    MaskFp32Min,
    /// The stand-in magnitude gain (see the module doc).
    NormFp16(f64),
    StateRace,
}

/// Default gain of `ane-scale-after-qk`.
pub const DEFAULT_OVERFLOW_GAIN: f64 = 8192.0;

/// One `--fault` argument. A fault of another family is `UnknownFault` here; the device table
/// (`families`) names the family it belongs to.
pub fn parse(text: &str) -> Result<AneFault> {
    let ft = FaultText::split(text);
    let (name, value) = (ft.name, ft.value);
    let fault = match name {
        "ane-write-offset" => AneFault::WriteOffset,
        "ane-state-layout" => AneFault::StateLayout,
        "ane-mask-01" => AneFault::Mask01,
        "ane-scale-after-qk" | "ane-norm-fp16" => {
            let default = if name == "ane-norm-fp16" {
                1.0
            } else {
                DEFAULT_OVERFLOW_GAIN
            };
            let gain = match value {
                None => default,
                Some(v) => match v.parse::<f64>() {
                    Ok(g) if g.is_finite() && g >= 1.0 => g,
                    _ => {
                        return Err(ft.bad(format!("`{v}` is not a gain of at least 1, e.g. =256")))
                    }
                },
            };
            ft.unscoped()?;
            return Ok(if name == "ane-norm-fp16" {
                AneFault::NormFp16(gain)
            } else {
                AneFault::ScaleAfterQk(gain)
            });
        }
        "ane-stale-state" => AneFault::StaleState,
        "ane-state-wrap" | "ane-query-truncate" => {
            let n = match value.map(str::parse::<usize>) {
                Some(Ok(n)) if n > 0 => n,
                _ => return Err(ft.bad("needs a positive number of positions, e.g. =96")),
            };
            ft.unscoped()?;
            return Ok(if name == "ane-state-wrap" {
                AneFault::StateWrap(n)
            } else {
                AneFault::QueryTruncate(n)
            });
        }
        "ane-mask-fp32-min" => AneFault::MaskFp32Min,
        "ane-state-race" => AneFault::StateRace,
        _ => {
            return Err(Error::UnknownFault {
                name: name.to_string(),
                known: TABLE.known(),
            })
        }
    };
    ft.bare()?;
    Ok(fault)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_refuses_values_and_scopes() {
        assert_eq!(parse("ane-mask-01").unwrap(), AneFault::Mask01);
        assert_eq!(parse("ane-stale-state").unwrap(), AneFault::StaleState);
        assert_eq!(
            parse("ane-scale-after-qk").unwrap(),
            AneFault::ScaleAfterQk(DEFAULT_OVERFLOW_GAIN)
        );
        assert_eq!(
            parse("ane-scale-after-qk=4096").unwrap(),
            AneFault::ScaleAfterQk(4096.0)
        );
        assert!(parse("ane-scale-after-qk=0.5").is_err());
        assert_eq!(parse("ane-norm-fp16").unwrap(), AneFault::NormFp16(1.0));
        assert_eq!(parse("ane-norm-fp16=64").unwrap(), AneFault::NormFp16(64.0));
        assert!(parse("ane-norm-fp16=0").is_err());
        assert!(parse("ane-norm-fp16@1").is_err());
        assert_eq!(parse("ane-mask-fp32-min").unwrap(), AneFault::MaskFp32Min);
        assert_eq!(parse("ane-state-race").unwrap(), AneFault::StateRace);
        assert!(parse("ane-state-race=2").is_err());
        assert!(matches!(
            parse("ane-mask-01=1"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(
            parse("ane-write-offset@tbt"),
            Err(Error::FaultScope { .. })
        ));
        assert!(matches!(parse("nope"), Err(Error::UnknownFault { .. })));
        assert_eq!(parse("ane-state-wrap=96").unwrap(), AneFault::StateWrap(96));
        assert_eq!(
            parse("ane-query-truncate=16").unwrap(),
            AneFault::QueryTruncate(16)
        );
        assert!(matches!(
            parse("ane-state-wrap"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(
            parse("ane-query-truncate=0"),
            Err(Error::BadFault { .. })
        ));
    }
}
