//! Faults of the Core ML / ANE stateful emulator (`--device ane-sim`), parsed with the same
//! `NAME[=VALUE][@SCOPE]` syntax as the Hailo emulator's. None takes a scope; only
//! `ane-scale-after-qk` takes a value.
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

use kvprobe_schema::Verdict;

use crate::contract::faults::{Expected, FaultDecl, FaultTable, FaultText, SweepValue, Values};
use crate::{Error, Result};

const fn decl(name: &'static str, bug_class: &'static str, verdict: Verdict) -> FaultDecl {
    FaultDecl {
        name,
        values: Values::None,
        scopes: &[],
        default_groups: &[],
        bug_class,
        expected: Expected::Always(verdict),
        sweep: SweepValue::None,
    }
}

/// The ANE emulator's fault table (`--device ane-sim`); the README's table is generated from it.
pub const TABLE: FaultTable = FaultTable {
    faults: &[
        decl(
            "ane-write-offset",
            "slice_update writes the new K/V at position + 1",
            Verdict::CacheOffset,
        ),
        decl(
            "ane-state-layout",
            "the attention reads the state as `[ctx, kv_heads, d]`, written `[kv_heads, ctx, d]`",
            Verdict::CacheLayoutMismatch,
        ),
        decl(
            "ane-mask-01",
            "the additive mask becomes 0 / +1 instead of 0 / −inf",
            Verdict::MaskConvention,
        ),
        FaultDecl {
            values: Values::OptionalNumber("GAIN"),
            ..decl(
                "ane-scale-after-qk",
                "the softmax scale comes after Q·Kᵀ: fp16 scores overflow (GAIN, default 8192, stands in for a larger model's activations; `=1` is the literal fault; evidence: layer and first position)",
                Verdict::NumericOverflow,
            )
        },
        decl(
            "ane-stale-state",
            "a new request reuses the previous state and its length",
            Verdict::StaleCache,
        ),
        FaultDecl {
            values: Values::Number("N"),
            ..decl(
                "ane-state-wrap",
                "the state holds N positions, fewer than the max_ctx declared: from N on each write silently lands on position − N",
                Verdict::CapacityOverflow,
            )
        },
        FaultDecl {
            values: Values::Number("N"),
            ..decl(
                "ane-query-truncate",
                "the graph takes N query rows, fewer than the max_query declared: the rest of a longer chunk is silently dropped",
                Verdict::CapacityOverflow,
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
}

/// Default gain of `ane-scale-after-qk`.
pub const DEFAULT_OVERFLOW_GAIN: f64 = 8192.0;

/// One `--fault` argument. A fault of another family is `UnknownFault` here; the device table
/// (`families`) names the family it belongs to.
pub fn parse(text: &str) -> Result<AneFault> {
    let FaultText {
        name, value, scope, ..
    } = FaultText::split(text);
    let fault = match name {
        "ane-write-offset" => AneFault::WriteOffset,
        "ane-state-layout" => AneFault::StateLayout,
        "ane-mask-01" => AneFault::Mask01,
        "ane-scale-after-qk" => {
            let gain = match value {
                None => DEFAULT_OVERFLOW_GAIN,
                Some(v) => match v.parse::<f64>() {
                    Ok(g) if g.is_finite() && g >= 1.0 => g,
                    _ => {
                        return Err(Error::BadFault {
                            fault: text.to_string(),
                            detail: format!("`{v}` is not a gain of at least 1, e.g. =256"),
                        })
                    }
                },
            };
            if let Some(s) = scope {
                return Err(Error::FaultScope {
                    fault: name.to_string(),
                    scope: s.to_string(),
                    allowed: "no scope (the fault applies to every layer)".into(),
                });
            }
            return Ok(AneFault::ScaleAfterQk(gain));
        }
        "ane-stale-state" => AneFault::StaleState,
        "ane-state-wrap" | "ane-query-truncate" => {
            let n = match value.map(str::parse::<usize>) {
                Some(Ok(n)) if n > 0 => n,
                _ => {
                    return Err(Error::BadFault {
                        fault: text.to_string(),
                        detail: "needs a positive number of positions, e.g. =96".into(),
                    })
                }
            };
            if let Some(s) = scope {
                return Err(Error::FaultScope {
                    fault: name.to_string(),
                    scope: s.to_string(),
                    allowed: "no scope (the fault applies to every layer)".into(),
                });
            }
            return Ok(if name == "ane-state-wrap" {
                AneFault::StateWrap(n)
            } else {
                AneFault::QueryTruncate(n)
            });
        }
        _ => {
            return Err(Error::UnknownFault {
                name: name.to_string(),
                known: TABLE.known(),
            })
        }
    };
    if let Some(v) = value {
        return Err(Error::BadFault {
            fault: text.to_string(),
            detail: format!("takes no value (got `{v}`); write `{name}`"),
        });
    }
    if let Some(s) = scope {
        return Err(Error::FaultScope {
            fault: name.to_string(),
            scope: s.to_string(),
            allowed: "no scope (the fault applies to every layer)".into(),
        });
    }
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
