//! What the emulated compile fixes before the first run: the options a manifest reproduces, the
//! faults checked against the model, the quant infos and the theta table it ships.

use std::path::PathBuf;
use std::sync::Arc;

use kvprobe_reference::Model;
use kvprobe_schema::{ModelIdentity, SimManifest, SCHEMA_VERSION};

use super::{
    calibrate, faults, manifest, CacheHeads, CacheQuant, Fault, FaultKind, RopeTheta, SimDevice,
    SimOptions, SimQuant, SimWeights,
};
use crate::driver::theta_from_inv_freq;
use crate::layout::{self, StreamShape};
use crate::{Error, Result};

/// With `opts.manifest_value` or `opts.manifest` (read here): check it is a Hailo emulator
/// manifest made for these weights, and take geometry, quantisation, weights, taps, RoPE
/// convention and (unless `opts.faults_replace_manifest`) faults from it.
pub(super) fn apply_manifest(
    opts: &mut SimOptions,
    identity: &ModelIdentity,
) -> Result<Option<(SimManifest, PathBuf)>> {
    let (m, path) = match (&opts.manifest_value, &opts.manifest) {
        (Some((m, path)), _) => (m.clone(), path.clone()),
        (None, Some(path)) => (manifest::read(path)?, path.clone()),
        (None, None) => return Ok(None),
    };
    if m.device != "hailo-sim" {
        return Err(Error::Manifest {
            path: path.clone(),
            detail: format!("written by the `{}` emulator, not the Hailo emulator (--sim); use it with --device {}", m.device, m.device),
        });
    }
    manifest::check_model(&m, identity, &path)?;
    let bad = |what: &str| Error::Manifest {
        path: path.clone(),
        detail: format!("unknown {what}; write a new manifest"),
    };
    opts.cache_len = m.cache_len;
    opts.prefill_len = m.prefill_len;
    opts.cache_quant = CacheQuant::parse(&m.cache_quant).ok_or_else(|| bad("cache_quant"))?;
    opts.cache_heads = CacheHeads::parse(&m.cache_heads).ok_or_else(|| bad("cache_heads"))?;
    opts.weights = SimWeights::parse(&m.weights).ok_or_else(|| bad("weights"))?;
    opts.taps = m.taps;
    opts.rope_theta = RopeTheta::parse(&m.rope_theta).ok_or_else(|| bad("rope_theta"))?;
    if !opts.faults_replace_manifest {
        opts.faults = m.faults.clone();
    }
    Ok(Some((m, path)))
}

/// The faults of `opts`, parsed and refused where they change nothing on this model and
/// geometry (`shape`: one cache entry's stream format).
pub(super) fn checked_faults(
    model: &Model,
    opts: &SimOptions,
    shape: StreamShape,
) -> Result<Vec<Fault>> {
    let cfg = model.config();
    let mut faults = Vec::with_capacity(opts.faults.len());
    for text in &opts.faults {
        faults.push(faults::parse(text)?);
    }
    let items: Vec<_> = faults
        .iter()
        .map(|f| (f.text.as_str(), &f.kind, Some(&f.scope)))
        .collect();
    crate::contract::faults::refuse_conflicts(&items)?;
    let (l, p) = (opts.cache_len, opts.prefill_len);
    let shape_for = move |n: usize| StreamShape { tokens: n, ..shape };
    let cx = faults::FaultContext {
        n_layers: cfg.n_layers,
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        entry_size: shape.features * shape.elem_bytes,
        rope_theta: model.rope_inv_freq().map(|_| opts.rope_theta),
        head_dim: cfg.head_dim,
        layout_noop: Box::new(move |f: &Fault| match f.kind {
            FaultKind::TbtReadLayout(lay) => layout::equals_token_major(lay, shape_for(l - 1)),
            FaultKind::PrefillWriteLayout(lay) => layout::equals_token_major(lay, shape_for(p)),
            _ => false,
        }),
    };
    for f in &faults {
        faults::validate(f, &cx)?;
        faults::check_capacity(f, l, p)?;
        if let FaultKind::TbtReadLayout(lay) | FaultKind::PrefillWriteLayout(lay) = f.kind {
            layout::check_supported(lay, shape.features)?;
        }
    }
    Ok(faults)
}

/// The quant infos: the manifest's, identity for float edges, or calibrated on `graph_model`.
pub(super) fn quant(
    model: &Model,
    graph_model: &Arc<Model>,
    opts: &SimOptions,
    identity: &ModelIdentity,
    from_manifest: &Option<(SimManifest, PathBuf)>,
) -> Result<SimQuant> {
    let n_layers = model.config().n_layers;
    Ok(match (from_manifest, opts.cache_quant) {
        (Some((m, path)), _) => SimQuant::from_named(&m.quant, n_layers, path)?,
        (None, CacheQuant::Float) => SimQuant::float(n_layers),
        (None, cq) => {
            // in-memory weights are identified by their configuration only: never cached
            let sha = model.source().exists().then_some(identity.sha256.as_str());
            let ranges = calibrate::measure_cached(graph_model, 96, sha, opts.weights.name())?;
            let bits = if cq == CacheQuant::U16 { 16 } else { 8 };
            SimQuant::calibrated(&ranges, bits, opts.calibration_margin)
        }
    })
}

/// The theta table the compile ships: the graph's convention unless a fault says otherwise.
pub(super) fn shipped_theta(
    model: &Model,
    opts: &SimOptions,
    faults: &[Fault],
) -> Option<Vec<f32>> {
    let table_convention = faults
        .iter()
        .find_map(|f| match f.kind {
            FaultKind::RopeTheta(t) => Some(t),
            _ => None,
        })
        .unwrap_or(opts.rope_theta);
    let table = model
        .rope_inv_freq()
        .map(|f| table_convention.table(&theta_from_inv_freq(&f)));
    let scaling = faults.iter().find_map(|f| match f.kind {
        FaultKind::RopeScaling(x) => Some(x),
        _ => None,
    });
    table.map(|t| super::rope_faults::scaled(t, scaling))
}

/// The manifest before the device describes itself (layouts, quant infos and calibration
/// prompts are filled in by [`SimDevice::finish_manifest`]).
pub(super) fn manifest_of(opts: &SimOptions, identity: ModelIdentity) -> SimManifest {
    SimManifest {
        device: "hailo-sim".into(),
        schema_version: SCHEMA_VERSION,
        model: identity,
        cache_len: opts.cache_len,
        prefill_len: opts.prefill_len,
        cache_quant: opts.cache_quant.name().into(),
        cache_heads: opts.cache_heads.name().into(),
        weights: opts.weights.name().into(),
        taps: opts.taps,
        rope_theta: opts.rope_theta.name().into(),
        layouts: Vec::new(),
        calibration_prompts: Vec::new(),
        quant: Vec::new(),
        faults: opts.faults.clone(),
    }
}

impl SimDevice {
    /// Layouts, quant infos and calibration prompts into the manifest; a manifest the run came
    /// from keeps its calibration prompts and must agree on the layouts, unless other faults
    /// replace its own (then the layouts follow from those faults).
    pub(super) fn finish_manifest(
        &mut self,
        from_manifest: Option<&(SimManifest, PathBuf)>,
    ) -> Result<()> {
        self.manifest.layouts = self.layouts();
        self.manifest.quant = self.quant.named();
        self.manifest.calibration_prompts = if self.opts.cache_quant == CacheQuant::Float {
            Vec::new()
        } else {
            calibrate::CALIBRATION_PROMPTS
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        if let Some((m, path)) = from_manifest {
            if !self.opts.faults_replace_manifest && m.layouts != self.manifest.layouts {
                return Err(Error::Manifest {
                    path: path.clone(),
                    detail: "its layouts do not follow from its faults; it was edited or written by another version, write a new one".into(),
                });
            }
            self.manifest.calibration_prompts = m.calibration_prompts.clone();
        }
        Ok(())
    }
}
