//! ONNX Runtime GenAI decoder models (issue 22): a GenAI model folder (model.onnx + external
//! data, genai_config.json, tokenizer.json) run by ONNX Runtime through `ort` (feature `onnx`,
//! library loaded at run time), with kvprobe doing what GenAI's `Generator` does on the host
//! (`host.rs`, docs/onnx-genai.md).
//!
//! Seen from the generic driver the device is stateful: it keeps the request's K/V itself (the
//! past/present tensors GenAI moves between runs), positions are absolute, `init_cache(0)` starts
//! a request and the context ends at `max_ctx` with no wrap. So `driver/stateful.rs` drives it
//! unchanged and `diagnose` runs its stateful rules.

use std::path::{Path, PathBuf};

use crate::contract::{Capabilities, Family};
use crate::{Error, Result};

pub mod config;
mod control;
#[cfg(feature = "onnx")]
mod declared;
mod describe;
mod device;
pub mod export;
pub mod faults;
#[cfg(feature = "onnx")]
mod graph_ops;
pub mod host;
#[cfg(feature = "onnx")]
mod kv_inputs;
#[cfg(feature = "onnx")]
mod open_checks;
#[cfg(feature = "onnx")]
mod ort_cpu_fp16;
pub mod qnn;
#[cfg(feature = "onnx")]
mod qnn_cache;
#[cfg(feature = "onnx")]
mod qnn_session;
#[cfg(feature = "onnx")]
mod runtime;
pub mod static_graphs;
#[cfg(feature = "onnx")]
mod values;
mod wcache;
pub mod window;
pub mod window_feed;

pub use config::GenaiConfig;
pub use device::OnnxDevice;
#[cfg(feature = "onnx")]
pub use runtime::{library_path, ORT_VERSION};

/// The ONNX Runtime GenAI family in the device table.
pub const FAMILY: Family = Family {
    name: "onnx-genai",
    flag: "--onnx DIR",
    about: "an ONNX Runtime GenAI model folder run by ONNX Runtime (host-owned past/present KV tensors; build with --features onnx)",
    capabilities: CAPABILITIES,
    faults: faults::TABLE,
    implemented: true,
};

const CAPABILITIES: Capabilities = Capabilities {
    ring_offset: false,
    stateful: true,
    taps: false,
    read_cache: true,
    write_cache: true,
};

/// Execution providers `--ep` selects (contract doc §6: the names ONNX Runtime appends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ep {
    #[default]
    Cpu,
    Qnn,
    OpenVino,
    VitisAi,
    CoreMl,
}

impl Ep {
    pub const CHOICES: &'static str = "cpu, qnn, openvino, vitisai, coreml";

    pub fn parse(s: &str) -> Result<Ep> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "cpu" => Ep::Cpu,
            "qnn" => Ep::Qnn,
            "openvino" => Ep::OpenVino,
            "vitisai" | "vitis" => Ep::VitisAi,
            "coreml" => Ep::CoreMl,
            _ => {
                return Err(Error::BadOption {
                    flag: format!("--ep {s}"),
                    detail: format!("unknown execution provider; use one of {}", Self::CHOICES),
                })
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Ep::Cpu => "cpu",
            Ep::Qnn => "qnn",
            Ep::OpenVino => "openvino",
            Ep::VitisAi => "vitisai",
            Ep::CoreMl => "coreml",
        }
    }

    /// ONNX Runtime's name for it (`SessionOptionsAppendExecutionProvider`).
    pub fn ort_name(self) -> &'static str {
        match self {
            Ep::Cpu => "CPU",
            Ep::Qnn => "QNN",
            Ep::OpenVino => "OpenVINO",
            Ep::VitisAi => "VitisAI",
            Ep::CoreMl => "CoreML",
        }
    }

    /// Keys of `provider_options` in genai_config.json that configure it (G:cfg, G:so).
    pub fn config_names(self) -> &'static [&'static str] {
        match self {
            Ep::Cpu => &[],
            Ep::Qnn => &["qnn", "QNN"],
            Ep::OpenVino => &["OpenVINO", "openvino"],
            Ep::VitisAi => &["VitisAI", "vitisai"],
            Ep::CoreMl => &["coreml", "CoreML"],
        }
    }
}

/// `KEY=VALUE` of `--ep-option`.
pub fn parse_ep_option(s: &str) -> Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(Error::BadOption {
            flag: format!("--ep-option {s}"),
            detail: "expected KEY=VALUE (passed to the execution provider as is)".into(),
        }),
    }
}

/// How to open a GenAI folder.
#[derive(Debug, Clone, Default)]
pub struct OnnxOptions {
    pub dir: PathBuf,
    pub ep: Ep,
    /// `--ep-option KEY=VALUE`, after genai_config.json's provider_options for the same EP.
    pub ep_options: Vec<(String, String)>,
    /// Context kvprobe drives (`--max-ctx`); default min(128, search.max_length).
    pub max_ctx: Option<usize>,
    /// `--fault`: host-driver faults of the windowed cache or the default decoder (faults.rs).
    pub faults: Vec<faults::HostFault>,
    /// `--allow-cpu-fallback` (`--ep qnn`): nodes QNN cannot take run on ONNX Runtime's CPU EP,
    /// and every output says "partial NPU"; off, such a graph is refused (qnn.rs).
    pub allow_cpu_fallback: bool,
    /// `--ep` was given: a folder whose genai_config.json declares another provider runs on
    /// `ep` with a warning in every output; without it, it is refused (never a silent CPU run).
    pub ep_given: bool,
    /// The CPU EP computes every Q/DQ pair as the graph writes it (no MatMulNBits rewrite of its
    /// weight MatMuls), on its device chosen explicitly (the process may have the QNN plugin
    /// registered): the control of a QDQ graph on HTP (control.rs).
    pub as_written: bool,
}

impl OnnxOptions {
    pub fn new(dir: &Path) -> OnnxOptions {
        OnnxOptions {
            dir: dir.to_path_buf(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_or_say_what_is_accepted() {
        assert_eq!(Ep::parse("OpenVINO").unwrap(), Ep::OpenVino);
        let e = Ep::parse("tpu").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ep tpu: unknown execution provider; use one of cpu, qnn, openvino, vitisai, coreml"
        );
        assert_eq!(
            parse_ep_option("backend_path=libQnnHtp.so").unwrap(),
            ("backend_path".into(), "libQnnHtp.so".into())
        );
        assert!(parse_ep_option("=x").is_err() && parse_ep_option("novalue").is_err());
        assert!(crate::families::family("onnx-genai").is_some_and(|f| f.implemented));
        let caps = crate::families::family("onnx-genai").map(|f| f.capabilities);
        assert_eq!(caps, Some(CAPABILITIES));
    }
}
