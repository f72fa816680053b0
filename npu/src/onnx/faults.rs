//! Faults of the ONNX Runtime GenAI family (`--onnx DIR --fault NAME`): host-driver bugs, each a
//! field bug of the contract doc §7 class. The model and ONNX Runtime stay healthy; kvprobe's own
//! GenAI host side is made to do what a buggy runner does. `win-*` act on the NPU-style windowed
//! cache (convention (b), `window.rs`), `dec-*` on GenAI's default decoder (convention (a): our
//! exporter's and the model builder's folders, int4 / fp16 weights included); a fault on the
//! other convention is one line, exit 2.
//!
//! | fault | what the runner does wrong | verdict |
//! |---|---|---|
//! | `win-mask-all-valid` | the window mask leaves every slot holding an entry (the prompt's pads included) visible to every row, whatever mask the request asked for | mask-convention |
//! | `win-position-stall` | position ids are not advanced after a window slide: every generated token (each slides the window by one) gets the last prompt position again | position-mismatch |
//! | `win-write-left` | entries are written at the left end of the right-aligned cache (the mask still marks the right end) | cache-offset |
//! | `win-k-layout` | K, stored `[H, 1, D, T]`, is copied as if `[H, 1, T, D]` | cache-layout-mismatch |
//! | `win-u16-runner` | a uint16 runner over the uint8 cache: byte pairs are taken as one uint16, rescaled to uint8 and written back | cache-quantization |
//! | `win-capacity-silent` | a prompt past the compiled length or generation past `max_length` continues silently (the oldest entries slide out) instead of being refused | capacity-overflow |
//! | `dec-layer-swap` | layer 0's past is bound to layer 1's input and layer 1's to layer 0's (the presents are written back by their own index) | kv-binding |

use kvprobe_schema::Verdict;

use crate::contract::faults::{FaultDecl, FaultTable, FaultText};
use crate::{Error, Result};

/// The ONNX GenAI family's fault table (`--onnx DIR` with a windowed folder).
pub const TABLE: FaultTable = FaultTable {
    faults: &[
        FaultDecl::plain(
            "win-mask-all-valid",
            "the window mask leaves every written slot (pads included) visible to every row",
            Verdict::MaskConvention,
        ),
        FaultDecl::plain(
            "win-position-stall",
            "position ids not advanced after a window slide",
            Verdict::PositionMismatch,
        ),
        FaultDecl::plain(
            "win-write-left",
            "new entries written at the wrong (left) end of the right-aligned cache",
            Verdict::CacheOffset,
        ),
        FaultDecl::plain(
            "win-k-layout",
            "K stored `[H, 1, D, T]` copied as `[H, 1, T, D]`",
            Verdict::CacheLayoutMismatch,
        ),
        FaultDecl::plain(
            "win-u16-runner",
            "a uint16 runner over the uint8 cache",
            Verdict::CacheQuantization,
        ),
        FaultDecl::plain(
            "win-capacity-silent",
            "a prompt past the compiled length or generation past capacity continues silently",
            Verdict::CapacityOverflow,
        ),
        FaultDecl::plain(
            "dec-layer-swap",
            "the past of layers 0 and 1 bound to each other's inputs (default decoder)",
            Verdict::KvBinding,
        ),
    ],
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostFault {
    MaskAllValid,
    PositionStall,
    WriteLeft,
    KLayout,
    U16Runner,
    CapacitySilent,
    LayerSwap,
}

impl HostFault {
    /// Acts on the windowed cache (`win-*`), else on the default decoder (`dec-*`).
    pub fn windowed(self) -> bool {
        self != HostFault::LayerSwap
    }
}

/// One `--fault` argument. A fault of another family is `UnknownFault` here.
pub fn parse(text: &str) -> Result<HostFault> {
    let ft = FaultText::split(text);
    let name = ft.name;
    let fault = match name {
        "win-mask-all-valid" => HostFault::MaskAllValid,
        "win-position-stall" => HostFault::PositionStall,
        "win-write-left" => HostFault::WriteLeft,
        "win-k-layout" => HostFault::KLayout,
        "win-u16-runner" => HostFault::U16Runner,
        "win-capacity-silent" => HostFault::CapacitySilent,
        "dec-layer-swap" => HostFault::LayerSwap,
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
        assert_eq!(parse("win-write-left").unwrap(), HostFault::WriteLeft);
        assert_eq!(parse("win-u16-runner").unwrap(), HostFault::U16Runner);
        assert!(matches!(
            parse("win-k-layout=1"),
            Err(Error::BadFault { .. })
        ));
        assert!(matches!(
            parse("win-mask-all-valid@tbt"),
            Err(Error::FaultScope { .. })
        ));
        assert!(matches!(parse("kv-swap"), Err(Error::UnknownFault { .. })));
        assert_eq!(parse("dec-layer-swap").unwrap(), HostFault::LayerSwap);
        assert!(!HostFault::LayerSwap.windowed() && HostFault::KLayout.windowed());
        assert_eq!(TABLE.faults.len(), 7);
    }
}
