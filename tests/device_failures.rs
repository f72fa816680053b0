//! What a device does wrong is the device's, typed `Error::ByDevice` (issue 38): the driver names
//! the device and the step, the CLI exits 3, and nothing advises the user to change a flag.

use crate::common::fixture;

use std::collections::BTreeMap;
use std::sync::Arc;

use kvprobe_npu::sim::{SimDevice, SimOptions};

use kvprobe_npu::{Buffer, Capabilities, Device, Error, MaskMode, Origin, Result, RunOutput};
use kvprobe_schema::{DeviceDescription, GroupKind};

/// How a wrapped device misbehaves from its `after`-th run on.
#[derive(Clone, Copy)]
enum Misbehave {
    /// Logits one short of the declared vocabulary.
    ShortLogits,
    /// A runtime refusal mid-run.
    Refuse,
    /// A context-full answer although the host's positions fit.
    ContextFull,
    /// A refused state reset (`init_cache`: OpenVINO's reset_state, a runtime's cleared state).
    RefuseReset,
    /// A refused cache read (`get_cache_buffers`) from the `after`-th on.
    RefuseCacheRead,
    /// A refused cache write (`update_cache_buffer`) from the `after`-th on.
    RefuseCacheWrite,
    /// A refused offset move (`update_cache_offset`) from the `after`-th on.
    RefuseOffset,
}

/// A working device that starts to misbehave at its `after`-th run.
struct Wrapped<D> {
    inner: D,
    how: Misbehave,
    after: usize,
    runs: usize,
}

impl<D: Device> Wrapped<D> {
    /// A runtime status for a call of kind `how` once `after` of them went through.
    fn refuses(&mut self, how: Misbehave) -> Result<()> {
        if std::mem::discriminant(&self.how) != std::mem::discriminant(&how) {
            return Ok(());
        }
        if self.after == 0 {
            return Err(Error::Device("the runtime returned status 74".into()));
        }
        self.after -= 1;
        Ok(())
    }

    fn answer(&mut self, out: Result<RunOutput>) -> Result<RunOutput> {
        self.runs += 1;
        if self.runs <= self.after {
            return out;
        }
        match self.how {
            Misbehave::ShortLogits => out.map(|mut o| {
                o.logits.pop();
                o
            }),
            Misbehave::Refuse => Err(Error::Device("the runtime returned status 74".into())),
            Misbehave::ContextFull => Err(Error::ContextFull { max_ctx: 48 }),
            _ => out,
        }
    }
}

impl<D: Device> Device for Wrapped<D> {
    fn describe(&self) -> &DeviceDescription {
        self.inner.describe()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn run(&mut self, group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let out = self.inner.run(group, inputs);
        self.answer(out)
    }
    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        if let Misbehave::RefuseReset = self.how {
            self.after = self.after.saturating_sub(1);
            if self.after == 0 {
                return Err(Error::Device("the runtime returned status 74".into()));
            }
        }
        self.inner.init_cache(read_offset)
    }
    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        self.refuses(Misbehave::RefuseOffset)?;
        self.inner.update_cache_offset(delta)
    }
    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        self.refuses(Misbehave::RefuseCacheRead)?;
        self.inner.cache_buffers()
    }
    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        self.refuses(Misbehave::RefuseCacheWrite)?;
        self.inner.write_cache_buffer(cache_id, bytes)
    }
}

/// The error is the device's: exit 3, names the device and the step, no flag advice.
fn is_the_devices(e: &Error, device: &str, step: &str) {
    let s = e.to_string();
    assert_eq!(e.origin(), Origin::Device, "{s}");
    assert_eq!(e.exit_code(), 3, "{s}");
    assert!(matches!(e, Error::ByDevice { .. }), "{s}");
    assert!(s.contains(device) && s.contains(step), "{s}");
    assert!(!s.contains("--"), "advice about a flag: {s}");
    assert!(!s.contains('\n'), "{s}");
}

#[test]
fn the_hailo_emulator_misbehaving_is_the_devices_error() {
    let m = Arc::new(kvprobe_reference::Model::load(&fixture("llama", 5)).unwrap());
    let v = m.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..10).map(|i| (i * 37 + 7) % v).collect();
    for (how, after, step) in [
        (Misbehave::ShortLogits, 0, "prefill chunk"),
        (Misbehave::Refuse, 2, "tbt step at position 10"),
        (Misbehave::ContextFull, 3, "tbt step at position 11"),
    ] {
        let opts = SimOptions {
            cache_len: 48,
            prefill_len: 8,
            ..SimOptions::default()
        };
        let dev = SimDevice::new(m.clone(), opts).unwrap();
        let mut drv = dev.driver().unwrap();
        let mut dev = Wrapped {
            inner: dev,
            how,
            after,
            runs: 0,
        };
        drv.reset(&mut dev).unwrap();
        let r = drv
            .prefill(&mut dev, &prompt)
            .and_then(|_| drv.step(&mut dev, 1, &MaskMode::Ring))
            .and_then(|_| drv.step(&mut dev, 2, &MaskMode::Ring));
        is_the_devices(&r.unwrap_err(), "emulator", step);
    }
}

#[test]
fn a_reset_the_device_refuses_mid_run_is_the_devices_error() {
    // the second request's state reset fails: it was the bare "device error: …", naming no step
    let m = Arc::new(kvprobe_reference::Model::load(&fixture("llama", 5)).unwrap());
    let opts = SimOptions {
        cache_len: 48,
        prefill_len: 8,
        ..SimOptions::default()
    };
    let dev = SimDevice::new(m, opts).unwrap();
    let mut drv = dev.driver().unwrap();
    let mut dev = Wrapped {
        inner: dev,
        how: Misbehave::RefuseReset,
        after: 2,
        runs: 0,
    };
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &[3, 4, 5]).unwrap();
    let e = drv.reset(&mut dev).unwrap_err();
    is_the_devices(&e, "emulator", "state reset");
}

#[test]
fn a_context_full_answer_is_still_a_capacity_refusal() {
    // the capacity probe counts refusals; the wrapper keeps what kind of refusal it was
    let e = Error::ContextFull { max_ctx: 9 }.by_device("x", "decode step at position 3");
    assert!(e.is_capacity_refusal());
    assert!(!Error::Device("x".into())
        .by_device("x", "y")
        .is_capacity_refusal());
    // the driver's own check (the user's --steps past the context) stays the user's
    assert_eq!(Error::ContextFull { max_ctx: 9 }.origin(), Origin::User);
}

/// The emulator behind `how`, refusing from its `after`-th call of that kind on.
fn refusing(how: Misbehave, after: usize) -> (Arc<kvprobe_reference::Model>, Wrapped<SimDevice>) {
    let m = Arc::new(kvprobe_reference::Model::load(&fixture("llama", 5)).unwrap());
    let opts = SimOptions {
        cache_len: 48,
        prefill_len: 8,
        ..SimOptions::default()
    };
    let inner = SimDevice::new(m.clone(), opts).unwrap();
    let dev = Wrapped {
        inner,
        how,
        after,
        runs: 0,
    };
    (m, dev)
}

/// A probe's error that must be the device's, named with the step.
fn probe_error_is_the_devices(e: kvprobe_probes::Error, step: &str) {
    assert_eq!(e.exit_code(), 3, "{e}");
    match e {
        kvprobe_probes::Error::Npu(e) => is_the_devices(&e, "emulator", step),
        e => panic!("not the device's typed error: {e}"),
    }
}

#[test]
fn a_cache_read_the_device_refuses_is_the_devices_error_naming_the_step() {
    // the layout probe reads the rings after the prompt's prefill: it was "device error: …"
    let (m, mut dev) = refusing(Misbehave::RefuseCacheRead, 0);
    let ids = vec![3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    let mut s =
        kvprobe_probes::Session::new(&m, &mut dev, ids, &kvprobe_probes::NoProgress).unwrap();
    let e = kvprobe_probes::layout::run(&mut s).unwrap_err();
    probe_error_is_the_devices(e, "cache read after the prompt's prefill (layout probe)");
}

#[test]
fn a_cache_write_the_device_refuses_is_the_devices_error_naming_the_step() {
    // zeroing the rings (every probe that reads never-written entries starts there): the second
    // cache's write fails
    let (m, mut dev) = refusing(Misbehave::RefuseCacheWrite, 1);
    let ids = vec![3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    let mut s =
        kvprobe_probes::Session::new(&m, &mut dev, ids, &kvprobe_probes::NoProgress).unwrap();
    let e = s.clear_rings().unwrap_err();
    probe_error_is_the_devices(e, "cache write of cache 1 zeroing the caches");
}

#[test]
fn a_step_back_the_device_refuses_is_the_devices_error() {
    // the driver's update_cache_offset(-1) after a trial step: it was a bare "device error: …"
    let (_, mut dev) = refusing(Misbehave::RefuseOffset, usize::MAX);
    let mut drv = dev.inner.driver().unwrap();
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &[3, 4, 5]).unwrap();
    drv.step(&mut dev, 6, &MaskMode::Ring).unwrap();
    dev.after = 0;
    let e = drv.step_back(&mut dev).unwrap_err();
    is_the_devices(&e, "emulator", "step back");
}
