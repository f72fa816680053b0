//! The first tbt step of the healthy hypothesis with its attention scale multiplied: what the
//! attention-scale fit measures a device against (`scalefit::tbt_matched`, issue 34).
//!
//! The f32 reference is not what a healthy device computes. On the emulator's uint8 rings
//! (SmolLM2, L 45 / P 16, 30-token prompt) a healthy first tbt step fits ×1.08 against f32
//! (0.99956 against 0.99855 at ×1), and `tbt-attn-scale=1.65` fits ×1.90, whose replay misses
//! the device by 5.97e-3 against a declared precision of 7.60e-4. The precision-matched
//! reference reproduces that healthy step (0.99853 against f32, as the device's 0.99855), so a
//! multiplier fitted against it is the graph's own, not the graph's times the precision's.

use kvprobe_reference::Model;
use kvprobe_schema::DeviceDescription;

use crate::matched::{drive_from, run_rows, Precision, TBT};
use crate::matched_store::{DriveMemo, Store};
use crate::Result;

/// The matched reference after the prompt's prefill, ready to run the first tbt step.
pub struct FirstTbt<'a> {
    model: &'a Model,
    p: Precision,
    store: Store,
    /// The prompt, then the step's token.
    seq: Vec<u32>,
    /// First stored position the step reads (a ring reads the last `L − 1`).
    from: usize,
}

impl<'a> FirstTbt<'a> {
    /// `None` when the device declares no precision other than f32's (the f32 reference is
    /// then the healthy hypothesis).
    pub fn of(
        (model, memo): (&'a Model, &DriveMemo),
        desc: &DeviceDescription,
        ids: &[u32],
        token: u32,
    ) -> Result<Option<FirstTbt<'a>>> {
        let Some(p) = Precision::of(desc, model)? else {
            return Ok(None);
        };
        let n = ids.len();
        let seq: Vec<u32> = ids.iter().copied().chain([token]).collect();
        let geometry = (n, 1, desc.cache_len, desc.prefill_len);
        // the prompt's prefill, as greedy's drive of the same prompt ran it (when it did)
        let (_, kept) = memo.resume(&seq[..n], (n, desc.cache_len, desc.prefill_len), 1);
        let resume = kept.map(|store| (store, 1));
        let store = drive_from(model, &p, &seq, geometry, resume, &mut |_, _, _| Ok(()))?;
        let from = if p.ring {
            n.saturating_sub(desc.cache_len.saturating_sub(1))
        } else {
            0
        };
        Ok(Some(FirstTbt {
            model,
            p,
            store,
            seq,
            from,
        }))
    }

    /// The step's logits, the tbt graph's attention scale multiplied by `attn_scale`.
    pub fn logits(&self, attn_scale: f32) -> Result<Vec<f32>> {
        let n = self.seq.len() - 1;
        let mut store = self.store.clone();
        let model = self.p.model(self.model);
        run_rows(
            model,
            &self.p,
            &mut store,
            (&self.seq, None),
            n..n + 1,
            self.from,
            TBT,
            attn_scale,
        )
    }
}
