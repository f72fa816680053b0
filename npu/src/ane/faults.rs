//! Faults of the Core ML / ANE stateful emulator (`--device ane-sim`), parsed with the same
//! `NAME[=VALUE][@SCOPE]` syntax as the Hailo emulator's. None takes a value or a scope.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AneFault {
    WriteOffset,
    StateLayout,
    Mask01,
    ScaleAfterQk,
    StaleState,
}

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
        "ane-scale-after-qk" => AneFault::ScaleAfterQk,
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
