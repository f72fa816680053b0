//! Emulator options and the plain flag struct the CLI fills (`--cache-len`, `--prefill-len`,
//! `--fault`, `--sim-quant`, `--sim-cache-bits`, `--sim-cache`, `--sim-weights`, `--sim-taps`,
//! `--sim-rope-theta`, `--sim-manifest`).

use std::path::PathBuf;

use kvprobe_schema::SimManifest;

pub use crate::rope::RopeTheta;
use crate::{Error, Result};

/// Numeric format of the cache edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheQuant {
    U8,
    U16,
    /// `--sim-quant none`: every edge float (cache bytes are little-endian f32).
    Float,
}

impl CacheQuant {
    pub fn name(self) -> &'static str {
        match self {
            CacheQuant::U8 => "uint8",
            CacheQuant::U16 => "uint16",
            CacheQuant::Float => "none",
        }
    }
    pub fn parse(s: &str) -> Option<CacheQuant> {
        [CacheQuant::U8, CacheQuant::U16, CacheQuant::Float]
            .into_iter()
            .find(|c| c.name() == s)
    }
    pub fn elem_bytes(self) -> usize {
        match self {
            CacheQuant::U8 => 1,
            CacheQuant::U16 => 2,
            CacheQuant::Float => 4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHeads {
    /// KV heads × head dim per entry (the official topology).
    Unexpanded,
    /// Query heads × head dim per entry (K/V after repeat_kv).
    Expanded,
}

impl CacheHeads {
    pub fn name(self) -> &'static str {
        match self {
            CacheHeads::Unexpanded => "un-expanded",
            CacheHeads::Expanded => "expanded",
        }
    }
    pub fn parse(s: &str) -> Option<CacheHeads> {
        match s {
            "un-expanded" | "unexpanded" => Some(CacheHeads::Unexpanded),
            "expanded" => Some(CacheHeads::Expanded),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimWeights {
    F32,
    Int8,
}

impl SimWeights {
    pub fn name(self) -> &'static str {
        match self {
            SimWeights::F32 => "f32",
            SimWeights::Int8 => "int8",
        }
    }
    pub fn parse(s: &str) -> Option<SimWeights> {
        match s {
            "f32" => Some(SimWeights::F32),
            "int8" => Some(SimWeights::Int8),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    pub cache_len: usize,
    pub prefill_len: usize,
    /// `--fault` values, in order, exactly as given.
    pub faults: Vec<String>,
    pub cache_quant: CacheQuant,
    pub cache_heads: CacheHeads,
    pub weights: SimWeights,
    pub taps: bool,
    /// `--sim-rope-theta`: the graph's RoPE sign convention (and its theta table's).
    pub rope_theta: RopeTheta,
    /// Reproduce a previous run (`--sim-manifest FILE`): geometry, quant infos and faults come from it.
    pub manifest: Option<PathBuf>,
    /// A manifest already read (a HEF's description, `hef::describe::to_sim_manifest`, or a
    /// replay's device), with the file its errors name; used instead of `manifest`.
    pub manifest_value: Option<(SimManifest, PathBuf)>,
    /// `faults` replace the manifest's (a replay's hypothesis, `--fault` beside
    /// `--sim-manifest`): the layouts then follow from them, the quant infos stay the manifest's.
    pub faults_replace_manifest: bool,
    /// Group prefix (`<model_name>__prefill`); defaults to the model file's stem.
    pub model_name: Option<String>,
    /// Relative margin added to each side of a calibrated range.
    pub calibration_margin: f32,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            cache_len: 128,
            prefill_len: 32,
            faults: Vec::new(),
            cache_quant: CacheQuant::U8,
            cache_heads: CacheHeads::Unexpanded,
            weights: SimWeights::F32,
            taps: false,
            rope_theta: RopeTheta::Plain,
            manifest: None,
            manifest_value: None,
            faults_replace_manifest: false,
            model_name: None,
            calibration_margin: 0.15,
        }
    }
}

/// The raw command-line values, as the CLI collected them (all optional).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimFlags {
    pub cache_len: Option<usize>,
    pub prefill_len: Option<usize>,
    pub faults: Vec<String>,
    /// `--sim-quant none|edges`
    pub sim_quant: Option<String>,
    /// `--sim-cache-bits 8|16`
    pub sim_cache_bits: Option<u32>,
    /// `--sim-cache un-expanded|expanded`
    pub sim_cache: Option<String>,
    /// `--sim-weights f32|int8`
    pub sim_weights: Option<String>,
    pub sim_taps: bool,
    /// `--sim-rope-theta plain|sign-folded`
    pub sim_rope_theta: Option<String>,
    pub sim_manifest: Option<PathBuf>,
}

fn bad(flag: &str, detail: impl Into<String>) -> Error {
    Error::BadOption {
        flag: flag.to_string(),
        detail: detail.into(),
    }
}

impl SimOptions {
    /// Validate and combine the flags (fault texts are parsed when the device is built).
    pub fn from_flags(f: &SimFlags) -> Result<SimOptions> {
        let mut o = SimOptions::default();
        if let Some(l) = f.cache_len {
            o.cache_len = l;
        }
        if let Some(p) = f.prefill_len {
            o.prefill_len = p;
        }
        o.faults = f.faults.clone();
        match f.sim_quant.as_deref() {
            None | Some("edges") | Some("int") => {}
            Some("none") => o.cache_quant = CacheQuant::Float,
            Some(x) => {
                return Err(bad(
                    "--sim-quant",
                    format!("unknown value `{x}`; use none or edges"),
                ))
            }
        }
        match f.sim_cache_bits {
            None | Some(8) => {}
            Some(16) => {
                if o.cache_quant == CacheQuant::Float {
                    return Err(bad(
                        "--sim-cache-bits",
                        "conflicts with --sim-quant none; drop one of them",
                    ));
                }
                o.cache_quant = CacheQuant::U16;
            }
            Some(b) => return Err(bad("--sim-cache-bits", format!("{b} bits; use 8 or 16"))),
        }
        if let Some(c) = &f.sim_cache {
            o.cache_heads = CacheHeads::parse(c).ok_or_else(|| {
                bad(
                    "--sim-cache",
                    format!("unknown value `{c}`; use un-expanded or expanded"),
                )
            })?;
        }
        if let Some(w) = &f.sim_weights {
            o.weights = SimWeights::parse(w).ok_or_else(|| {
                bad(
                    "--sim-weights",
                    format!("unknown value `{w}`; use f32 or int8"),
                )
            })?;
        }
        if let Some(r) = &f.sim_rope_theta {
            o.rope_theta = RopeTheta::parse(r).ok_or_else(|| {
                bad(
                    "--sim-rope-theta",
                    format!("unknown value `{r}`; use plain or sign-folded"),
                )
            })?;
        }
        o.taps = f.sim_taps;
        o.manifest = f.sim_manifest.clone();
        // `--fault` beside `--sim-manifest` names the faults to run instead of the manifest's
        o.faults_replace_manifest = !f.faults.is_empty();
        o.check_geometry()?;
        Ok(o)
    }

    pub fn check_geometry(&self) -> Result<()> {
        match self.geometry_problem("--cache-len", "--prefill-len") {
            None => Ok(()),
            Some(detail) => Err(Error::Geometry(detail)),
        }
    }

    /// What is wrong with the geometry, its two lengths called `cache` and `prefill` (the
    /// flags, or a manifest's keys: a manifest's error must not name flags the user never
    /// passed, issue 38).
    pub fn geometry_problem(&self, cache: &str, prefill: &str) -> Option<String> {
        let l = self.cache_len;
        if l < 2 {
            return Some(format!("{cache} {l} entries; use at least 2"));
        }
        if l > 65535 {
            // contract §1.2: in and out are narrowed to 16 bits
            return Some(format!(
                "{cache} {l} entries; HailoRT keeps window lengths ≤ 65535"
            ));
        }
        if self.prefill_len == 0 || self.prefill_len >= l {
            return Some(format!(
                "{prefill} {} must be at least 1 and below {cache} {l} (HailoRT needs 0 < out < L, contract §1.3)",
                self.prefill_len
            ));
        }
        None
    }
}
