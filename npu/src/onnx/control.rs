//! The control of a device whose arithmetic the precision-matched reference does not compute
//! (QNN HTP running a QDQ graph in its integer kernels): the same graph on ONNX Runtime's CPU EP,
//! fed every run the device gets, with its own host cache. The CPU EP applies each Q/DQ pair in
//! float32 as the graph writes it, which is what the matched reference models; so per run the
//! distance between the device and its control is the device's own arithmetic on this prompt and
//! model, measured instead of declared, while a fault of the graph (rope-offset, present-shift) is
//! computed by both and still shows against the matched reference (docs/qnn.md, "The CPU EP
//! control"). The control is a measurement of the device's precision: its logits are never
//! reported as the device's.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use kvprobe_reference::Model;
use kvprobe_schema::GroupKind;

use super::{Ep, OnnxDevice, OnnxOptions};
use crate::{Buffer, Device, Error, Result, SavedState};

/// What the kept control logits may hold; past it a run's control is still run (the state must
/// follow the device's) but its logits are not kept, and the rows that need them say so.
const KEEP_BYTES: usize = 512 << 20;

pub(super) struct Control {
    dev: Box<OnnxDevice>,
    /// Control logits by the device logits of the same run (`key`).
    by_device: HashMap<u64, Vec<f32>>,
    kept_bytes: usize,
    runs: usize,
    dropped: usize,
    seconds: f64,
}

/// A run's device logits as a key (their bits: two runs that return the same logits are the same
/// request answered again, whose control answered the same).
fn key(logits: &[f32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    logits.len().hash(&mut h);
    for x in logits {
        x.to_bits().hash(&mut h);
    }
    h.finish()
}

impl Control {
    /// The folder of `opts` on the CPU EP, every Q/DQ pair as written (`OnnxOptions::as_written`),
    /// with the device's host rules (`--max-ctx`, host faults).
    // called only where the device opens a real ONNX Runtime session (feature `onnx`)
    #[cfg_attr(not(feature = "onnx"), allow(dead_code))]
    pub(super) fn open(model: &Model, opts: &OnnxOptions) -> Result<Control> {
        let mut o = opts.clone();
        o.ep = Ep::Cpu;
        o.ep_options.clear();
        o.ep_given = true;
        o.allow_cpu_fallback = false;
        o.as_written = true;
        let dev = OnnxDevice::open(model, &o).map_err(|e| {
            Error::Device(format!(
                "the CPU EP control of the QDQ graph (the same folder on ONNX Runtime's CPU EP, which measures HTP's own arithmetic) did not open: {e}"
            ))
        })?;
        Ok(Control {
            dev: Box::new(dev),
            by_device: HashMap::new(),
            kept_bytes: 0,
            runs: 0,
            dropped: 0,
            seconds: 0.0,
        })
    }

    /// The device's run with `inputs` returned `device`: the control runs the same inputs.
    pub(super) fn run(
        &mut self,
        group: GroupKind,
        inputs: &[(String, Buffer)],
        device: &[f32],
    ) -> Result<()> {
        let t = Instant::now();
        let out = self.dev.run(group, inputs).map_err(|e| {
            Error::Device(format!(
                "the CPU EP control failed on a run the device took: {e}"
            ))
        })?;
        self.seconds += t.elapsed().as_secs_f64();
        self.runs += 1;
        let bytes = 4 * out.logits.len();
        if self.kept_bytes + bytes > KEEP_BYTES {
            self.dropped += 1;
            return Ok(());
        }
        if self.by_device.insert(key(device), out.logits).is_none() {
            self.kept_bytes += bytes;
        }
        Ok(())
    }

    /// The control's logits of the run whose device logits were `device`.
    pub(super) fn logits(&self, device: &[f32]) -> Option<Vec<f32>> {
        self.by_device
            .get(&key(device))
            .filter(|c| c.len() == device.len())
            .cloned()
    }

    pub(super) fn init_cache(&mut self) -> Result<()> {
        self.dev.init_cache(0)
    }

    pub(super) fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        self.dev.write_cache_buffer(cache_id, bytes)
    }

    pub(super) fn save_state(&self) -> Option<SavedState> {
        self.dev.save_state()
    }

    pub(super) fn restore_state(&mut self, state: &SavedState) -> Result<()> {
        self.dev.restore_state(state)
    }

    /// What every output says about the control: what it is, where its cost is, that it is not
    /// the device (said when the device opens, before any run: the counts are in the timings).
    pub(super) fn note(&self, unmodelled: &str) -> String {
        format!(
            "QNN precision: {unmodelled}; measured by a control, not declared: the same graph on ONNX Runtime's CPU EP with the same feeds (one CPU EP run per device run, its time under 'control' in the timings), whose distance from the device is the device's own arithmetic (`matched.stray`); the prefill and greedy controls judge the graph by the control against the precision-matched reference (`matched.control_vs_matched`, at that reference's own band) and the device by its distance from the control, rows where the control leaves that reference listed in the evidence; the control is never reported as the device"
        )
    }

    /// The control's runs and time, by kind, as the device's timings name its own.
    // called only where the device opens a real ONNX Runtime session (feature `onnx`)
    #[cfg_attr(not(feature = "onnx"), allow(dead_code))]
    pub(super) fn timings(&self) -> Vec<(String, f64)> {
        let dropped = match self.dropped {
            0 => String::new(),
            n => format!(", {n} of them with logits not kept (memory bound)"),
        };
        let mut v = vec![(
            format!(
                "control: {} requests on the CPU EP (the same graph and feeds, not the device{dropped})",
                self.runs
            ),
            self.seconds,
        )];
        for (what, s) in self.dev.timings() {
            let what = what.strip_prefix("device: ").unwrap_or(&what);
            v.push((format!("control: {what}"), s));
        }
        v
    }
}
