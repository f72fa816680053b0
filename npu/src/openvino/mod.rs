//! OpenVINO (issue 37): a stateful LLM IR (openvino_model.xml/.bin with input_ids,
//! attention_mask, position_ids, beam_idx in and logits out, the K/V in the request's variables)
//! run by OpenVINO's runtime through the `openvino` crate (feature `openvino`, libopenvino_c
//! loaded at run time), with kvprobe doing what openvino.genai's stateful LLM pipeline does on
//! the host (`host.rs`, docs/openvino.md).
//!
//! Two plugins: `CPU` (OpenVINO's CPU plugin, dynamic shapes) and `NPU` = the NPU plugin's NPUW
//! LLM pipeline (`NPU_USE_NPUW`, `NPUW_LLM`) with its partitions on `NPUW_DEVICES` (here the CPU:
//! no NPU is needed, which is how openvino.genai's own tests run its static pipeline). NPUW
//! compiles a static prefill model and a static KV-cache model whose capacity is derived from
//! `NPUW_LLM_MAX_PROMPT_LEN` and `NPUW_LLM_MIN_RESPONSE_LEN` (host.rs).
//!
//! Seen from the generic driver the device is stateful: it keeps the K/V itself, positions are
//! absolute, `init_cache(0)` starts a request (a fresh infer request: the 2026.4 C API has no
//! `reset_state`), the context ends at its capacity with no wrap. The states are not readable:
//! the C API has no `query_state` either, so `read_cache`/`write_cache` are false.

use std::path::PathBuf;

use crate::contract::{Capabilities, Family};
use crate::{Error, Result};

mod describe;
mod device;
pub mod faults;
#[cfg(feature = "openvino")]
mod ffi;
pub mod host;
#[cfg(feature = "openvino")]
mod runtime;

pub use device::OvDevice;
#[cfg(feature = "openvino")]
pub use runtime::{library_path, OV_VERSION};

/// The OpenVINO family in the device table.
pub const FAMILY: Family = Family {
    name: "openvino",
    flag: "--openvino DIR",
    about: "a stateful OpenVINO IR run by OpenVINO's CPU plugin or its NPU plugin's NPUW LLM pipeline (states held by the runtime; build with --features openvino)",
    capabilities: CAPABILITIES,
    faults: faults::TABLE,
    implemented: true,
};

pub(crate) const CAPABILITIES: Capabilities = Capabilities {
    ring_offset: false,
    stateful: true,
    taps: false,
    // the C API (ov_infer_request_*) of 2026.4 has no query_state / get_state
    read_cache: false,
    write_cache: false,
};

/// `--ov-device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OvTarget {
    #[default]
    Cpu,
    /// The NPU plugin with NPUW's LLM pipeline; its partitions run on `NPUW_DEVICES`.
    Npu,
    Gpu,
}

impl OvTarget {
    pub const CHOICES: &'static str = "CPU, NPU, GPU";

    pub fn parse(s: &str) -> Result<OvTarget> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "CPU" => OvTarget::Cpu,
            "NPU" => OvTarget::Npu,
            "GPU" => OvTarget::Gpu,
            _ => {
                return Err(Error::BadOption {
                    flag: format!("--ov-device {s}"),
                    detail: format!("unknown OpenVINO device; use one of {}", Self::CHOICES),
                })
            }
        })
    }

    /// OpenVINO's device name.
    pub fn name(self) -> &'static str {
        match self {
            OvTarget::Cpu => "CPU",
            OvTarget::Npu => "NPU",
            OvTarget::Gpu => "GPU",
        }
    }
}

/// `KEY=VALUE` of `--ov-config`.
pub fn parse_config(s: &str) -> Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(Error::BadOption {
            flag: format!("--ov-config {s}"),
            detail: "expected KEY=VALUE (an OpenVINO property of the device, passed as is)".into(),
        }),
    }
}

/// How to open an IR folder.
#[derive(Debug, Clone, Default)]
pub struct OvOptions {
    pub dir: PathBuf,
    pub target: OvTarget,
    /// `--ov-config KEY=VALUE`, after the pipeline's own keys (a user key replaces the default).
    pub config: Vec<(String, String)>,
    /// `--max-ctx`: the context kvprobe drives on CPU/GPU (default 128); on NPU the capacity is
    /// NPUW's (host.rs) and `--max-ctx` sets `NPUW_LLM_MAX_PROMPT_LEN` + response.
    pub max_ctx: Option<usize>,
    /// `--fault NAME`: the host side's bugs (faults.rs); the plugins stay real.
    pub faults: Vec<faults::OvFault>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_or_say_what_is_accepted() {
        assert_eq!(OvTarget::parse("npu").unwrap(), OvTarget::Npu);
        let e = OvTarget::parse("tpu").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ov-device tpu: unknown OpenVINO device; use one of CPU, NPU, GPU"
        );
        assert_eq!(
            parse_config("NPUW_LLM_MAX_PROMPT_LEN=128").unwrap(),
            ("NPUW_LLM_MAX_PROMPT_LEN".into(), "128".into())
        );
        assert!(parse_config("=x").is_err() && parse_config("KEY=").is_err());
        assert!(crate::families::family("openvino").is_some_and(|f| f.implemented));
    }
}
