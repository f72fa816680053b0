//! `layout --infer` through a device whose ring bytes no strided map explains: the emulator's
//! rings, then permuted at random or replaced by noise on the way out of `cache_buffers()`.
//! The probe must call every edge unexplained, and still solve the untouched device.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvprobe_npu::sim::{SimDevice, SimOptions};
use kvprobe_npu::{Buffer, Device, RunOutput};
use kvprobe_probes::{layout_infer, NoProgress, Session};
use kvprobe_reference::Model;
use kvprobe_schema::{DeviceDescription, GroupKind};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scramble {
    None,
    Permute,
    Noise,
}

struct Scrambled {
    inner: SimDevice,
    how: Scramble,
}

fn lcg(s: &mut u64) -> u64 {
    *s = s
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *s >> 33
}

impl Device for Scrambled {
    fn describe(&self) -> &DeviceDescription {
        self.inner.describe()
    }
    fn run(&mut self, g: GroupKind, inputs: &[(String, Buffer)]) -> kvprobe_npu::Result<RunOutput> {
        self.inner.run(g, inputs)
    }
    fn init_cache(&mut self, r: u32) -> kvprobe_npu::Result<()> {
        self.inner.init_cache(r)
    }
    fn update_cache_offset(&mut self, d: i32) -> kvprobe_npu::Result<()> {
        self.inner.update_cache_offset(d)
    }
    fn cache_buffers(&mut self) -> kvprobe_npu::Result<BTreeMap<u32, Vec<u8>>> {
        let mut rings = self.inner.cache_buffers()?;
        let mut s = 12345u64;
        for ring in rings.values_mut() {
            match self.how {
                Scramble::None => {}
                Scramble::Permute => {
                    for i in (1..ring.len()).rev() {
                        let j = lcg(&mut s) as usize % (i + 1);
                        ring.swap(i, j);
                    }
                }
                Scramble::Noise => {
                    for b in ring.iter_mut() {
                        *b = lcg(&mut s) as u8;
                    }
                }
            }
        }
        Ok(rings)
    }
    fn write_cache_buffer(&mut self, id: u32, bytes: &[u8]) -> kvprobe_npu::Result<()> {
        self.inner.write_cache_buffer(id, bytes)
    }
}

fn run(how: Scramble) -> kvprobe_schema::LayoutInferFinding {
    let dir = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 7).unwrap();
    let model = Arc::new(Model::load(dir.path()).unwrap());
    let opts = SimOptions {
        cache_len: 40,
        prefill_len: 16,
        ..SimOptions::default()
    };
    let mut dev = Scrambled {
        inner: SimDevice::new(model.clone(), opts).unwrap(),
        how,
    };
    let ids = vec![1, 5, 9, 22, 41, 17, 3, 99, 150, 200, 12, 7, 8];
    let mut s = Session::new(&model, &mut dev, ids, &NoProgress).unwrap();
    layout_infer::run(&mut s).unwrap()
}

#[test]
fn permuted_or_noisy_rings_are_unexplained_and_clean_ones_solved() {
    let clean = run(Scramble::None);
    assert_eq!(clean.unexplained, 0, "{clean:#?}");
    assert_eq!(clean.writer_shift, Some(0));
    assert!(clean.caches.iter().all(|c| c.fraction_explained > 0.95));
    for how in [Scramble::Permute, Scramble::Noise] {
        let f = run(how);
        assert_eq!(f.unexplained, f.caches.len(), "{f:#?}");
        assert!(f.writer_formula.is_none());
        for c in &f.caches {
            assert!(!c.explained && c.fraction_explained < layout_infer::THRESHOLD);
        }
        let best = f
            .caches
            .iter()
            .map(|c| c.fraction_explained)
            .fold(0.0, f64::max);
        eprintln!("{how:?}: best fraction explained {best:.3}");
        let e = layout_infer::evidence(&f);
        assert!(e.contains("no cache edge explained"), "{e}");
    }
}
