//! The emulator's manifest: everything needed to reproduce a sim run exactly.

use crate::device::{GroupKind, Layout, QuantInfo};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimManifest {
    pub schema_version: u32,
    /// Which emulator wrote it: "hailo-sim" (older manifests have no field) or "ane-sim".
    #[serde(default = "default_device")]
    pub device: String,
    /// Model identity (path as given, sha256 of the weights file(s)) the manifest was made for.
    pub model: ModelIdentity,
    pub cache_len: usize,
    pub prefill_len: usize,
    /// "uint8" | "uint16" | "none"
    pub cache_quant: String,
    /// "un-expanded" | "expanded"
    pub cache_heads: String,
    /// "f32" | "int8"
    pub weights: String,
    /// Whether graph taps are exposed.
    pub taps: bool,
    /// RoPE sign convention of the compiled graph and its theta table: "plain" | "sign-folded"
    /// (manifests written before it existed are plain).
    #[serde(default = "plain_rope")]
    pub rope_theta: String,
    /// Layout per (group, cache kind or edge) actually used by the emulated compile.
    pub layouts: Vec<EdgeLayout>,
    /// Calibration prompts (never the probed prompt).
    pub calibration_prompts: Vec<String>,
    /// Quant infos of every edge, by name (cache edges `prefill/k3/out` etc.).
    pub quant: Vec<NamedQuant>,
    /// Faults exactly as given on the command line, in order.
    pub faults: Vec<String>,
}

fn plain_rope() -> String {
    "plain".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub path: String,
    pub sha256: String,
    pub architecture: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeLayout {
    pub group: GroupKind,
    pub cache_id: u32,
    /// "input" (read side) or "output" (write side)
    pub direction: String,
    pub layout: Layout,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedQuant {
    pub name: String,
    pub quant: QuantInfo,
}

fn default_device() -> String {
    "hailo-sim".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_written_before_rope_theta_existed_reads_as_plain() {
        let old = r#"{"schema_version":1,"model":{"path":"m.gguf","sha256":"ab","architecture":"llama"},
            "cache_len":24,"prefill_len":8,"cache_quant":"uint8","cache_heads":"un-expanded",
            "weights":"f32","taps":false,"layouts":[],"calibration_prompts":[],"quant":[],"faults":[]}"#;
        let m: SimManifest = serde_json::from_str(old).unwrap();
        assert_eq!(m.rope_theta, "plain");
        let back: SimManifest = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
