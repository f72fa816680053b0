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

use crate::{Error, Result};

pub const KNOWN: &[&str] = &[
    "ane-write-offset",
    "ane-state-layout",
    "ane-mask-01",
    "ane-scale-after-qk",
    "ane-stale-state",
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AneFault {
    WriteOffset,
    StateLayout,
    Mask01,
    /// The stand-in magnitude gain (see the module doc).
    ScaleAfterQk(f64),
    StaleState,
}

/// Default gain of `ane-scale-after-qk`.
pub const DEFAULT_OVERFLOW_GAIN: f64 = 8192.0;

/// One `--fault` argument. A Hailo emulator fault gets an error naming `--sim`.
pub fn parse(text: &str) -> Result<AneFault> {
    let (body, scope) = match text.split_once('@') {
        Some((b, s)) => (b, Some(s)),
        None => (text, None),
    };
    let (name, value) = match body.split_once('=') {
        Some((n, v)) => (n.trim(), Some(v.trim())),
        None => (body.trim(), None),
    };
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
        _ if crate::sim::faults::KNOWN.contains(&name) => {
            return Err(Error::WrongDeviceFault {
                fault: name.to_string(),
                device: "--sim",
                here: "--device ane-sim",
                known: KNOWN.join(", "),
            })
        }
        _ => {
            return Err(Error::UnknownFault {
                name: name.to_string(),
                known: KNOWN.join(", "),
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
    fn parses_names_and_refuses_values_scopes_and_hailo_faults() {
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
        let e = parse("kv-swap").unwrap_err();
        assert!(matches!(e, Error::WrongDeviceFault { .. }), "{e}");
        assert!(e.to_string().contains("--sim"), "{e}");
        assert!(matches!(parse("nope"), Err(Error::UnknownFault { .. })));
        // and the Hailo emulator refuses ours
        let e = crate::sim::faults::parse("ane-mask-01").unwrap_err();
        assert!(e.to_string().contains("--device ane-sim"), "{e}");
    }
}
