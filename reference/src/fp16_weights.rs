//! Weights as an fp16 graph holds them: every linear weight, bias and norm weight rounded to fp16
//! (round to nearest even), as a float32 checkpoint exported at fp16 (the model builder's
//! `-p fp16`) or compiled for HTP fp16 (`enable_htp_fp16_precision`) stores them. The embedding
//! rows are rounded where they enter the graph (arith.rs, op "embeddings").

use candle_core::{DType, Tensor};

use crate::blocks::{Linear, Norm};
use crate::store::Weight;
use crate::{Model, Result};

fn half(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F16)?.to_dtype(DType::F32)?)
}

fn linear(l: &mut Linear) -> Result<()> {
    l.w = l.w.to_f16()?;
    if let Some(b) = &l.b {
        l.b = Some(half(b)?);
    }
    Ok(())
}

fn norm(n: &mut Norm) -> Result<()> {
    match n {
        Norm::Rms { w, .. } => *w = half(w)?,
        Norm::Layer { w, b, .. } => {
            *w = half(w)?;
            *b = half(b)?;
        }
    }
    Ok(())
}

impl Model {
    /// This model with its weights rounded to fp16 (held as fp16, two bytes a value). A tied
    /// lm_head gets its own fp16 copy of the embedding table.
    pub fn with_fp16_weights(&self) -> Result<Model> {
        let mut m = self.clone();
        m.int8 = Default::default();
        m.declared = Default::default();
        for b in &mut m.blocks {
            for lin in b.linears_mut() {
                linear(lin)?;
            }
            for n in [&mut b.norm1, &mut b.norm2] {
                norm(n)?;
            }
            for n in [&mut b.q_norm, &mut b.k_norm].into_iter().flatten() {
                norm(n)?;
            }
        }
        norm(&mut m.final_norm)?;
        linear(&mut m.lm_head)?;
        Ok(m)
    }
}

impl Weight {
    /// The values rounded to fp16 and stored as fp16, a tile at a time (no f32 copy).
    pub(crate) fn to_f16(&self) -> Result<Weight> {
        let mut bytes = Vec::with_capacity(2 * self.rows() * self.cols());
        self.for_each_tile(|_, buf| {
            for v in buf {
                bytes.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        })?;
        Ok(Weight::raw(
            crate::store::Bytes::Owned(std::sync::Arc::new(bytes)),
            crate::store::Kind::F16,
            self.dims().to_vec(),
        ))
    }
}
