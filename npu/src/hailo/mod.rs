//! The Hailo family: HailoRT genai devices with a KV-cache ring. The emulator (`sim`), the offline
//! HEF reader (`hef`), the ring arithmetic (`ring`) and the hardware backend (`hw`, cargo feature
//! `hailo`; its items are re-exported here so `kvprobe_npu::hailo::HailoDevice` names it).

use crate::contract::{Capabilities, Family, FaultTable};

pub mod hef;
pub mod ring;
pub mod sim;

#[cfg(feature = "hailo")]
pub mod hw;
#[cfg(feature = "hailo")]
pub use hw::{
    backend, error, open_paired, status, sys, HailoDevice, HailoError, Result, RUN_TIMEOUT_MS,
    SHIM_BUILT, SUPPORTED_MAJOR,
};

/// A compiled HEF on a Hailo-10H through HailoRT (needs a `--features hailo` build).
pub const HEF_FAMILY: Family = Family {
    name: "hef",
    flag: "--hef FILE",
    about: "a compiled HEF on a Hailo-10H through HailoRT (a --features hailo build)",
    capabilities: Capabilities::GENAI_RING,
    faults: FaultTable::NONE,
    implemented: true,
};
