//! HailoRT backend (feature `hailo`): the device contract over a real Hailo-10H.
//!
//! * `hailort-sys` for what the C API offers: library version, device scan, status messages.
//! * A thin C++ shim (`npu/shim`, built by `npu/build.rs` only when `hailo/hailort.h` exists) for
//!   the infer-model and KV-cache calls the C API lacks (contract §6.3, §6.4).
//! * Geometry, roles and cache-edge quant infos come from the offline HEF reader (HailoRT does not
//!   parse cache quant infos, contract §4).
//!
//! Without the shim (no headers at build time) [`HailoDevice::open`] returns
//! [`HailoError::ShimNotBuilt`].

pub mod backend;
pub mod error;
#[cfg(kvprobe_hailort_shim)]
mod ffi;
pub mod status;
pub mod sys;

pub use backend::{open_paired, HailoDevice};
pub use error::{HailoError, Result};

/// The server's inference timeout (contract §2.3, `INFERENCE_TIMEOUT`).
pub const RUN_TIMEOUT_MS: u32 = 15_000;

/// The HailoRT major version the shim's C++ calls were written against (contract: 5.2.0); a
/// library of another major version is refused before any device call.
pub const SUPPORTED_MAJOR: u32 = 5;

/// Whether this build contains the C++ shim.
pub const SHIM_BUILT: bool = cfg!(kvprobe_hailort_shim);
