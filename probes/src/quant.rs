//! `quant`: the declared quant infos of all four edges of every cache_id (prefill in/out, tbt
//! in/out), plus the mask and embeddings inputs (contract §4; Finding 9 checked these first).
//! Reads the description only; runs nothing.

use kvprobe_npu::quant::quantize_u8;
use kvprobe_schema::{
    DeviceDescription, GroupKind, InputRole, QuantCacheRow, QuantFinding, QuantInfo,
};

use crate::rings::cache_infos;
use crate::thresholds::QUANT_SCALE_TOLERANCE;
use crate::Result;

pub fn run(desc: &DeviceDescription) -> Result<QuantFinding> {
    let mut caches = Vec::new();
    for c in cache_infos(desc)? {
        let all: Vec<QuantInfo> = [c.prefill_in, c.prefill_out, c.tbt_in, c.tbt_out]
            .into_iter()
            .flatten()
            .collect();
        let mut ratio = 1f64;
        let mut zp_equal = true;
        for a in &all {
            for b in &all {
                let r = (a.scale as f64 / b.scale as f64).abs();
                if r.is_finite() {
                    ratio = ratio.max(r);
                }
                zp_equal &= a.zero_point == b.zero_point;
            }
        }
        caches.push(QuantCacheRow {
            cache_id: c.cache_id,
            layer: Some(c.layer),
            kind: Some(c.kind),
            prefill_input: c.prefill_in,
            prefill_output: c.prefill_out,
            tbt_input: c.tbt_in,
            tbt_output: c.tbt_out,
            consistent: zp_equal && ratio - 1.0 <= QUANT_SCALE_TOLERANCE,
            max_scale_ratio: ratio,
        });
    }
    let prefill = desc.group(GroupKind::Prefill);
    let input = |role| {
        prefill
            .and_then(|g| g.inputs.iter().find(|i| i.role == Some(role)))
            .map(|i| i.quant)
    };
    let mask = input(InputRole::AttentionMask);
    let inconsistent_caches = caches.iter().filter(|c| !c.consistent).count();
    Ok(QuantFinding {
        mask_allowed_value: mask.map(|q| quantize_u8(1.0, &q)),
        mask,
        embeddings: input(InputRole::Embeddings),
        inconsistent_caches,
        caches,
    })
}

/// `kvprobe quant`.
pub struct QuantProbe;

impl crate::probe::Probe for QuantProbe {
    fn name(&self) -> &'static str {
        "quant"
    }

    fn about(&self) -> &'static str {
        "Declared quant infos of every cache edge, the mask and the embeddings"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.quant = Some(run(s.describe())?);
        Ok(())
    }
}
