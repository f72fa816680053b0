//! Faults of the ONNX Runtime GenAI family (`--onnx DIR --fault NAME`): host-driver bugs of the
//! NPU-style windowed cache (convention (b), `window.rs`), each a field bug of the contract doc
//! §7 class. The model and ONNX Runtime stay healthy; kvprobe's own GenAI host side is made to
//! do what a buggy runner does. Convention (a) folders take none (one line, exit 2).
//!
//! | fault | what the runner does wrong | verdict |
//! |---|---|---|
//! | `win-mask-all-valid` | the window mask leaves every slot holding an entry (the prompt's pads included) visible to every row, whatever mask the request asked for | mask-convention |
//! | `win-position-stall` | position ids are not advanced after a window slide: every generated token (each slides the window by one) gets the last prompt position again | position-mismatch |
//! | `win-write-left` | entries are written at the left end of the right-aligned cache (the mask still marks the right end) | cache-offset |
//! | `win-k-layout` | K, stored `[H, 1, D, T]`, is copied as if `[H, 1, T, D]` | cache-layout-mismatch |
//! | `win-u16-runner` | a uint16 runner over the uint8 cache: byte pairs are taken as one uint16, rescaled to uint8 and written back | cache-quantization |
//! | `win-capacity-silent` | a prompt past the compiled length or generation past `max_length` continues silently (the oldest entries slide out) instead of being refused | capacity-overflow |

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

/// The ONNX GenAI family's fault table (`--onnx DIR` with a windowed folder).
pub const TABLE: FaultTable = FaultTable {
    faults: &[
        decl(
            "win-mask-all-valid",
            "the window mask leaves every written slot (pads included) visible to every row",
            Verdict::MaskConvention,
        ),
        decl(
            "win-position-stall",
            "position ids not advanced after a window slide",
            Verdict::PositionMismatch,
        ),
        decl(
            "win-write-left",
            "new entries written at the wrong (left) end of the right-aligned cache",
            Verdict::CacheOffset,
        ),
        decl(
            "win-k-layout",
            "K stored `[H, 1, D, T]` copied as `[H, 1, T, D]`",
            Verdict::CacheLayoutMismatch,
        ),
        decl(
            "win-u16-runner",
            "a uint16 runner over the uint8 cache",
            Verdict::CacheQuantization,
        ),
        decl(
            "win-capacity-silent",
            "a prompt past the compiled length or generation past capacity continues silently",
            Verdict::CapacityOverflow,
        ),
    ],
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinFault {
    MaskAllValid,
    PositionStall,
    WriteLeft,
    KLayout,
    U16Runner,
    CapacitySilent,
}

/// One `--fault` argument. A fault of another family is `UnknownFault` here.
pub fn parse(text: &str) -> Result<WinFault> {
    let ft = FaultText::split(text);
    let name = ft.name;
    let fault = match name {
        "win-mask-all-valid" => WinFault::MaskAllValid,
        "win-position-stall" => WinFault::PositionStall,
        "win-write-left" => WinFault::WriteLeft,
        "win-k-layout" => WinFault::KLayout,
        "win-u16-runner" => WinFault::U16Runner,
        "win-capacity-silent" => WinFault::CapacitySilent,
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
        assert_eq!(parse("win-write-left").unwrap(), WinFault::WriteLeft);
        assert_eq!(parse("win-u16-runner").unwrap(), WinFault::U16Runner);
        assert!(matches!(
            parse("win-k-layout=1"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(
            parse("win-mask-all-valid@tbt"),
            Err(Error::FaultScope { .. })
        ));
        assert!(matches!(parse("kv-swap"), Err(Error::UnknownFault { .. })));
        assert_eq!(TABLE.faults.len(), 6);
    }
}
