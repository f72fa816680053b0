//! How the emulated graphs see their host inputs: embeddings, positions and the mask through the
//! input quantisation, with the position and mask faults applied; and N tbt runs as one batch.

use candle_core::{Device as CDevice, Tensor};
use kvprobe_reference::{GraphInput, LayerKv, PositionInput};
use kvprobe_schema::{DType, GroupDescription, GroupKind, InputRole, IoDescription, QuantInfo};

use super::compile_quant::PE_BITS;
use super::{FaultKind, GroupGeom, RopeTheta, SimDevice};
use crate::quant::{self, dequantize};
use crate::{Buffer, Error, Result};

/// One run's inputs as the graph sees them.
pub(super) struct Decoded {
    pub(super) hidden: Vec<f32>,
    pub(super) positions: PositionInput,
    pub(super) mask: Vec<bool>,
}

impl SimDevice {
    pub(super) fn input<'a>(
        &self,
        inputs: &'a [(String, Buffer)],
        d: &IoDescription,
    ) -> Result<&'a Buffer> {
        let b = inputs
            .iter()
            .find(|(n, _)| *n == d.name)
            .map(|(_, b)| b)
            .ok_or_else(|| Error::InvalidArgument(format!("missing input `{}`", d.name)))?;
        if b.dtype() != d.host_dtype || b.len() != d.elements() {
            return Err(Error::InvalidArgument(format!(
                "input `{}` needs {} {:?} values, got {} {:?}",
                d.name,
                d.elements(),
                d.host_dtype,
                b.len(),
                b.dtype()
            )));
        }
        Ok(b)
    }

    /// Host float → what the graph sees after HailoRT's input quantisation (contract §4).
    pub(super) fn through_input_quant(
        &self,
        xs: &[f32],
        q: &QuantInfo,
        bits: u32,
        device: DType,
    ) -> Vec<f32> {
        let mut v = xs.to_vec();
        if device != DType::F32 {
            quant::fake_quantize_in_place(&mut v, q, bits);
        }
        v
    }

    pub(super) fn positions(
        &self,
        g: GroupKind,
        gd: &GroupDescription,
        inputs: &[(String, Buffer)],
        t: usize,
    ) -> Result<PositionInput> {
        let shift = self
            .faults
            .iter()
            .find_map(|f| match (&f.kind, g) {
                (FaultKind::TbtPosition(n), GroupKind::Tbt)
                | (FaultKind::PrefillPosition(n), GroupKind::Prefill) => Some(*n),
                _ => None,
            })
            .unwrap_or(0);
        let by_role = |role: InputRole| gd.inputs.iter().find(|i| i.role == Some(role));
        if let Some(theta) = &self.theta {
            let get = |role: InputRole| -> Result<Vec<f32>> {
                let d = by_role(role).ok_or_else(|| Error::Device("pe input missing".into()))?;
                match self.input(inputs, d)? {
                    Buffer::F32(v) => {
                        Ok(self.through_input_quant(v, &d.quant, PE_BITS, d.device_dtype))
                    }
                    _ => Err(Error::InvalidArgument(format!(
                        "input `{}` must be float32",
                        d.name
                    ))),
                }
            };
            let (mut qc, mut qs) = (get(InputRole::PeQCos)?, get(InputRole::PeQSin)?);
            let (mut kc, mut ks) = (get(InputRole::PeKCos)?, get(InputRole::PeKSin)?);
            if shift != 0 {
                // the graph's positional wiring is `shift` positions off: rotate (cos, sin) by θ·shift
                for (c, s) in [(&mut qc, &mut qs), (&mut kc, &mut ks)] {
                    let d = theta.len();
                    for i in 0..c.len() {
                        let a = theta[i % d] as f64 * shift as f64;
                        let (ca, sa) = (a.cos() as f32, a.sin() as f32);
                        let (x, y) = (c[i], s[i]);
                        c[i] = x * ca - y * sa;
                        s[i] = y * ca + x * sa;
                    }
                }
            }
            if self.opts.rope_theta == RopeTheta::SignFolded {
                // This graph swaps the halves without a sign, trusting the table's folded first
                // half; the reference graph rotates half with the sign, so its sine is the
                // graph's with the first half of each head negated.
                let d = theta.len();
                for s in [&mut qs, &mut ks] {
                    for (i, x) in s.iter_mut().enumerate() {
                        if i % d < d / 2 {
                            *x = -*x;
                        }
                    }
                }
            }
            if let Some(f) = self.find_fault(g, |k| matches!(k, FaultKind::RopeKTile(_))) {
                if let FaultKind::RopeKTile(w) = f.kind {
                    super::rope_faults::tile_heads(&mut kc, theta.len(), w);
                    super::rope_faults::tile_heads(&mut ks, theta.len(), w);
                }
            }
            Ok(PositionInput::Rope {
                q_cos: qc,
                q_sin: qs,
                k_cos: kc,
                k_sin: ks,
            })
        } else {
            let d = by_role(InputRole::PositionIds)
                .ok_or_else(|| Error::Device("position-ids input missing".into()))?;
            let v = match self.input(inputs, d)? {
                Buffer::F32(v) => v,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "input `{}` must be float32",
                        d.name
                    )))
                }
            };
            let mut ids: Vec<f32> = v
                .iter()
                .map(|&x| quant::quantize_value(x, &d.quant))
                .collect();
            ids.iter_mut()
                .for_each(|x| *x = (*x + shift as f32).max(0.0));
            debug_assert_eq!(ids.len(), t);
            Ok(PositionInput::Ids(ids))
        }
    }

    /// The graph's boolean mask `[T][NH][L]` from the raw uint8 input (dequantised through the
    /// group's mask quant info; allowed = value ≥ 0.5), with the mask faults applied.
    pub(super) fn mask(
        &self,
        g: GroupKind,
        gd: &GroupDescription,
        inputs: &[(String, Buffer)],
        geom: GroupGeom,
    ) -> Result<Vec<bool>> {
        let d = gd
            .inputs
            .iter()
            .find(|i| i.role == Some(InputRole::AttentionMask))
            .ok_or_else(|| Error::Device("mask input missing".into()))?;
        let raw = match self.input(inputs, d)? {
            Buffer::U8(v) => v,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "input `{}` must be uint8",
                    d.name
                )))
            }
        };
        let (t, nh, kv) = (geom.rows, self.desc.shape.n_heads, self.desc.cache_len);
        let allowed: Vec<bool> = raw
            .iter()
            .map(|&c| dequantize(c as f32, &d.quant) >= 0.5)
            .collect();
        let mut m = allowed.clone();
        if self
            .find_fault(g, |k| *k == FaultKind::MaskRepeat)
            .is_some()
        {
            // F4: head 0's row widened element-wise (AABB) where heads need tiling (ABAB)
            for r in 0..t {
                for h in 0..nh {
                    for k in 0..kv {
                        m[(r * nh + h) * kv + k] = allowed[r * nh * kv + (h * kv + k) / nh];
                    }
                }
            }
        }
        if self
            .find_fault(g, |k| *k == FaultKind::MaskLeftValid)
            .is_some()
        {
            // the graph expects valid cache entries on the left: past key c takes column W−1−c
            let w = geom.input_len;
            let src = m.clone();
            for r in 0..t {
                for h in 0..nh {
                    let o = (r * nh + h) * kv;
                    for c in 0..w {
                        m[o + c] = src[o + w - 1 - c];
                    }
                }
            }
        }
        Ok(m)
    }

    /// Check the input names and decode embeddings, positions and mask (with the mask faults).
    pub(super) fn decode_inputs(
        &self,
        g: GroupKind,
        gd: &GroupDescription,
        inputs: &[(String, Buffer)],
        geom: GroupGeom,
    ) -> Result<Decoded> {
        if let Some((name, _)) = inputs
            .iter()
            .find(|(n, _)| !gd.inputs.iter().any(|i| &i.name == n))
        {
            return Err(Error::InvalidArgument(format!(
                "group `{}` has no input `{name}`",
                gd.name
            )));
        }
        // embeddings: raw uint16 rows dequantised by the graph (contract §2.11)
        let ed = gd
            .inputs
            .iter()
            .find(|i| i.role == Some(InputRole::Embeddings))
            .ok_or_else(|| Error::Device("embeddings input missing".into()))?;
        let hidden: Vec<f32> = match self.input(inputs, ed)? {
            Buffer::U16(v) => v.iter().map(|&c| dequantize(c as f32, &ed.quant)).collect(),
            Buffer::F32(v) => v.clone(),
            Buffer::U8(_) => {
                return Err(Error::InvalidArgument("embeddings must be uint16".into()))
            }
        };
        let positions = self.positions(g, gd, inputs, geom.rows)?;
        let mask = self.mask(g, gd, inputs, geom)?;
        Ok(Decoded {
            hidden,
            positions,
            mask,
        })
    }

    /// N single-row tbt runs over the same past as one `[N]`-row graph input: row r keeps its
    /// own mask over the W past columns and sees only its own new column.
    pub(super) fn batched_input(
        &self,
        rows: &[Decoded],
        past: &[LayerKv],
        geom: GroupGeom,
        g: GroupKind,
    ) -> Result<GraphInput> {
        let n = rows.len();
        let (nh, w) = (self.desc.shape.n_heads, geom.input_len);
        let kv = self.desc.cache_len; // W + 1 columns per single-run mask row
        let cols = w + n;
        let mut mask = vec![false; n * nh * cols];
        for (r, d) in rows.iter().enumerate() {
            for h in 0..nh {
                let src = &d.mask[h * kv..(h + 1) * kv];
                let dst = &mut mask[(r * nh + h) * cols..(r * nh + h + 1) * cols];
                dst[..w].copy_from_slice(&src[..w]);
                dst[w + r] = src[w];
            }
        }
        let mut hidden = Vec::with_capacity(n * self.desc.shape.hidden_size);
        for d in rows {
            hidden.extend_from_slice(&d.hidden);
        }
        let positions = match &rows[0].positions {
            PositionInput::Ids(_) => {
                let mut ids = Vec::with_capacity(n);
                for d in rows {
                    if let PositionInput::Ids(v) = &d.positions {
                        ids.extend_from_slice(v);
                    }
                }
                PositionInput::Ids(ids)
            }
            PositionInput::Rope { .. } => {
                let (mut qc, mut qs, mut kc, mut ks) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for d in rows {
                    if let PositionInput::Rope {
                        q_cos,
                        q_sin,
                        k_cos,
                        k_sin,
                    } = &d.positions
                    {
                        qc.extend_from_slice(q_cos);
                        qs.extend_from_slice(q_sin);
                        kc.extend_from_slice(k_cos);
                        ks.extend_from_slice(k_sin);
                    }
                }
                PositionInput::Rope {
                    q_cos: qc,
                    q_sin: qs,
                    k_cos: kc,
                    k_sin: ks,
                }
            }
        };
        Ok(GraphInput {
            hidden: Tensor::from_vec(hidden, (n, self.desc.shape.hidden_size), &CDevice::Cpu)?,
            positions,
            past: past.to_vec(),
            mask,
            graph: self.graph_options(g),
            last_only: false,
        })
    }
}
