//! [`SharedRuns`]: a device whose request state is host memory computes nothing new when a
//! request repeats an earlier one run for run. Every probe of `diagnose` starts from a reset and
//! most of them prefill the same prompt and step the same tokens; this wrapper keeps each real
//! run's outputs and the state after it, keyed by the request's runs since its reset (a tree:
//! one node per distinct history), and answers a run whose history and inputs it already holds
//! by restoring that state instead of running the device again.
//!
//! That answer is what the device computed for those inputs, but it is not a new run: it stands
//! for one only on a device that repeats itself after a reset. So nothing is shared until the
//! caller turns it on ([`Device::share_identical_runs`]), which `diagnose` does after its repeat
//! and back-to-back checks ran for real and found bit-identical outputs. A real run that repeats
//! a kept history with other outputs turns sharing off for good. A device that cannot save its
//! state (it lives on the device) is driven as it is: every run is real.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use kvprobe_schema::{DeviceDescription, DeviceLimit, GroupKind};

use crate::contract::device::SavedState;
use crate::{Buffer, Capabilities, Device, Result, RunOutput};

/// What the kept runs may hold (outputs, inputs and states): past it no new run is kept, so the
/// memory stays bounded whatever the probes run.
const KEEP_BYTES: usize = 512 << 20;

/// One kept run: its outputs, the device's state after it, and how long it took.
struct Node {
    out: RunOutput,
    state: SavedState,
    seconds: f64,
}

pub struct SharedRuns<'d> {
    inner: &'d mut dyn Device,
    /// Sharing allowed at all (`diagnose --no-shared-runs` forbids it).
    allowed: bool,
    /// Runs are answered from the kept ones (turned on by the caller).
    serving: bool,
    /// A real run repeated a kept history with other outputs: never share again.
    diverged: bool,
    /// The request's place in the tree: `Some(ROOT)` right after a reset, None once something
    /// not keyed by runs (a cache write, a batch, a failure) changed the state.
    at: Option<usize>,
    /// (node, group and inputs of the next run) → the node after it.
    children: HashMap<(usize, Vec<u8>), usize>,
    /// Kept runs, by node − 1 (node ROOT is the reset state, which needs no copy).
    nodes: Vec<Node>,
    kept_bytes: usize,
    /// Runs answered from kept ones, by group (prefill, tbt), and the device time they stand for.
    shared: [usize; 2],
    shared_seconds: f64,
}

const ROOT: usize = 0;

impl<'d> SharedRuns<'d> {
    /// Wraps `inner`; `allowed` false drives it exactly as it is.
    pub fn new(inner: &'d mut dyn Device, allowed: bool) -> SharedRuns<'d> {
        SharedRuns {
            inner,
            allowed,
            serving: false,
            diverged: false,
            at: None,
            children: HashMap::new(),
            nodes: Vec::new(),
            kept_bytes: 0,
            shared: [0; 2],
            shared_seconds: 0.0,
        }
    }

    /// Runs answered from kept ones: (prefill runs, tbt runs).
    pub fn shared_runs(&self) -> (usize, usize) {
        (self.shared[0], self.shared[1])
    }

    fn answer(&mut self, group: GroupKind, key: &(usize, Vec<u8>)) -> Result<Option<RunOutput>> {
        if !self.serving || self.diverged {
            return Ok(None);
        }
        let Some(&child) = self.children.get(key) else {
            return Ok(None);
        };
        let n = &self.nodes[child - 1];
        self.inner.restore_state(&n.state)?;
        self.shared[group_index(group)] += 1;
        self.shared_seconds += n.seconds;
        self.at = Some(child);
        Ok(Some(n.out.clone()))
    }

    /// After a real run from the kept history `key.0`: keep it, or check it against the run
    /// kept for the same history.
    fn keep(&mut self, key: (usize, Vec<u8>), out: &RunOutput, seconds: f64) {
        if let Some(&child) = self.children.get(&key) {
            if !same_bits(&self.nodes[child - 1].out, out) {
                self.diverged = true;
                self.at = None;
                return;
            }
            self.at = Some(child);
            return;
        }
        if self.kept_bytes >= KEEP_BYTES {
            self.at = None;
            return;
        }
        let Some(state) = self.inner.save_state() else {
            self.at = None;
            return;
        };
        let bytes = state.bytes + key.1.len() + 4 * out.logits.len();
        if self.kept_bytes + bytes > KEEP_BYTES {
            self.at = None;
            return;
        }
        self.kept_bytes += bytes;
        self.nodes.push(Node {
            out: out.clone(),
            state,
            seconds,
        });
        let child = self.nodes.len();
        self.children.insert(key, child);
        self.at = Some(child);
    }
}

fn group_index(g: GroupKind) -> usize {
    match g {
        GroupKind::Prefill => 0,
        GroupKind::Tbt => 1,
    }
}

/// The group and the inputs of a run, byte for byte (names, types, lengths, values).
fn encode(group: GroupKind, inputs: &[(String, Buffer)]) -> Vec<u8> {
    let mut b = vec![group_index(group) as u8];
    for (name, buf) in inputs {
        b.extend_from_slice(&(name.len() as u64).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(buf.len() as u64).to_le_bytes());
        match buf {
            Buffer::U8(v) => {
                b.push(0);
                b.extend_from_slice(v);
            }
            Buffer::U16(v) => {
                b.push(1);
                v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
            }
            Buffer::F32(v) => {
                b.push(2);
                v.iter()
                    .for_each(|x| b.extend_from_slice(&x.to_bits().to_le_bytes()));
            }
        }
    }
    b
}

/// Bit for bit (two equal NaNs are the same output).
fn same_bits(a: &RunOutput, b: &RunOutput) -> bool {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    bits(&a.logits) == bits(&b.logits)
        && a.taps.len() == b.taps.len()
        && a.taps
            .iter()
            .zip(&b.taps)
            .all(|((i, x), (j, y))| i == j && bits(x) == bits(y))
}

impl Device for SharedRuns<'_> {
    fn describe(&self) -> &DeviceDescription {
        self.inner.describe()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn versions(&self) -> Vec<(String, String)> {
        self.inner.versions()
    }

    fn mask_by_length(&self) -> Option<String> {
        self.inner.mask_by_length()
    }

    fn warnings(&self) -> Vec<String> {
        self.inner.warnings()
    }

    fn unmodelled_precision(&self) -> Option<String> {
        self.inner.unmodelled_precision()
    }

    fn control_logits(&self, logits: &[f32]) -> Option<Vec<f32>> {
        self.inner.control_logits(logits)
    }

    /// The device's own timings (real runs only), then what the shared runs stand for.
    fn timings(&self) -> Vec<(String, f64)> {
        let mut v = self.inner.timings();
        if self.shared != [0, 0] {
            v.push((
                format!(
                    "shared: {} prefill and {} one-row runs answered from identical earlier requests (no device run; the seconds their first runs took)",
                    self.shared[0], self.shared[1]
                ),
                self.shared_seconds,
            ));
        }
        v
    }

    fn limits(&self) -> Vec<DeviceLimit> {
        self.inner.limits()
    }

    fn host_window(&self) -> Option<crate::onnx::window::WindowGeom> {
        self.inner.host_window()
    }

    fn run(&mut self, group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let key = self
            .at
            .filter(|_| self.allowed)
            .map(|at| (at, encode(group, inputs)));
        if let Some(k) = &key {
            if let Some(out) = self.answer(group, k)? {
                return Ok(out);
            }
        }
        let t = Instant::now();
        let out = self.inner.run(group, inputs);
        let seconds = t.elapsed().as_secs_f64();
        match (&out, key) {
            (Ok(o), Some(k)) => self.keep(k, o, seconds),
            _ => self.at = None,
        }
        out
    }

    fn run_batch(
        &mut self,
        group: GroupKind,
        batch: &[Vec<(String, Buffer)>],
    ) -> Result<Vec<RunOutput>> {
        self.at = None;
        self.inner.run_batch(group, batch)
    }

    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        let r = self.inner.init_cache(read_offset);
        self.at = (r.is_ok() && read_offset == 0).then_some(ROOT);
        r
    }

    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        self.at = None;
        self.inner.update_cache_offset(delta)
    }

    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        self.inner.cache_buffers()
    }

    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        self.at = None;
        self.inner.write_cache_buffer(cache_id, bytes)
    }

    fn save_state(&self) -> Option<SavedState> {
        self.inner.save_state()
    }

    fn restore_state(&mut self, state: &SavedState) -> Result<()> {
        self.at = None;
        self.inner.restore_state(state)
    }

    fn share_identical_runs(&mut self, on: bool) -> bool {
        let was = self.serving;
        self.serving = on && self.allowed;
        was
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::Cell;
    use std::rc::Rc;

    /// A host-cache toy: the state is the list of every input value since the reset; a run's
    /// logits are (its inputs' sum, the state's sum), so a wrong state shows in the second;
    /// `real` counts the device's own runs.
    struct Toy {
        desc: DeviceDescription,
        state: Vec<f32>,
        real: Rc<Cell<usize>>,
        /// Adds this times the device's run count to every output (a device that does not
        /// repeat itself).
        drift: f32,
    }

    impl Toy {
        fn new() -> Toy {
            Toy {
                desc: crate::contract::describe::unit_description(
                    kvprobe_schema::RuntimeKind::HostCache,
                    8,
                    4,
                ),
                state: Vec::new(),
                real: Rc::new(Cell::new(0)),
                drift: 0.0,
            }
        }
    }

    impl Device for Toy {
        fn describe(&self) -> &DeviceDescription {
            &self.desc
        }
        fn run(&mut self, _g: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
            let Buffer::F32(x) = &inputs[0].1 else {
                unreachable!()
            };
            self.state.extend_from_slice(x);
            self.real.set(self.real.get() + 1);
            Ok(RunOutput {
                logits: vec![
                    x.iter().sum::<f32>() + self.drift * self.real.get() as f32,
                    self.state.iter().sum(),
                ],
                taps: BTreeMap::new(),
            })
        }
        fn init_cache(&mut self, _r: u32) -> Result<()> {
            self.state.clear();
            Ok(())
        }
        fn update_cache_offset(&mut self, _d: i32) -> Result<()> {
            Ok(())
        }
        fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
            Ok(BTreeMap::new())
        }
        fn write_cache_buffer(&mut self, _c: u32, bytes: &[u8]) -> Result<()> {
            self.state.push(bytes.len() as f32);
            Ok(())
        }
        fn save_state(&self) -> Option<SavedState> {
            Some(SavedState::new(self.state.clone(), 4 * self.state.len()))
        }
        fn restore_state(&mut self, s: &SavedState) -> Result<()> {
            self.state = s.get::<Vec<f32>>()?.clone();
            Ok(())
        }
    }

    fn x(v: &[f32]) -> Vec<(String, Buffer)> {
        vec![("x".into(), Buffer::F32(v.to_vec()))]
    }

    /// A request: reset, then each run; the logits of each.
    fn request(d: &mut dyn Device, runs: &[&[f32]]) -> Vec<Vec<f32>> {
        d.init_cache(0).unwrap();
        runs.iter()
            .map(|r| d.run(GroupKind::Prefill, &x(r)).unwrap().logits)
            .collect()
    }

    #[test]
    fn a_repeated_request_is_answered_with_the_state_it_left() {
        let mut toy = Toy::new();
        let real = toy.real.clone();
        let mut d = SharedRuns::new(&mut toy, true);
        let first = request(&mut d, &[&[1.0, 2.0], &[3.0]]);
        assert_eq!(first, vec![vec![3.0, 3.0], vec![3.0, 6.0]]);
        // not yet on: the same request runs again
        assert_eq!(request(&mut d, &[&[1.0, 2.0]])[0], vec![3.0, 3.0]);
        assert_eq!(real.get(), 3);
        assert!(!d.share_identical_runs(true));
        // on: both runs answered (no device run), the state restored: a new run after them
        // reads [1, 2, 3] (sum 6) and adds 4
        let again = request(&mut d, &[&[1.0, 2.0], &[3.0], &[4.0]]);
        assert_eq!(again[..2], first[..]);
        assert_eq!(again[2], vec![4.0, 10.0]);
        assert_eq!((d.shared_runs(), real.get()), ((2, 0), 4));
        assert!(d.timings()[0]
            .0
            .starts_with("shared: 2 prefill and 0 one-row runs"));
        // another history is never answered from this one: [3] first is a new run
        assert_eq!(request(&mut d, &[&[3.0]])[0], vec![3.0, 3.0]);
        assert_eq!(real.get(), 5);
    }

    #[test]
    fn a_cache_write_or_a_device_that_drifts_ends_the_sharing() {
        let mut toy = Toy::new();
        let mut d = SharedRuns::new(&mut toy, true);
        d.share_identical_runs(true);
        request(&mut d, &[&[1.0], &[2.0]]);
        // a write changes the state outside the runs: the next run is real, not the kept one
        d.init_cache(0).unwrap();
        d.run(GroupKind::Prefill, &x(&[1.0])).unwrap();
        d.write_cache_buffer(0, &[0; 5]).unwrap();
        let out = d.run(GroupKind::Prefill, &x(&[2.0])).unwrap();
        assert_eq!(out.logits, vec![2.0, 8.0], "real, over 1 + 5 + 2");
        drop(d);
        // a device whose repeat differs (its outputs drift run by run): the second real run
        // of a kept history differs, and nothing is shared after it
        let mut toy = Toy::new();
        toy.drift = 0.5;
        let mut d = SharedRuns::new(&mut toy, true);
        request(&mut d, &[&[1.0]]);
        request(&mut d, &[&[1.0]]);
        d.share_identical_runs(true);
        assert_eq!(
            request(&mut d, &[&[1.0]])[0][0],
            2.5,
            "a real run (the third)"
        );
        assert_eq!(d.shared_runs(), (0, 0));
    }

    #[test]
    fn not_allowed_is_the_device_itself() {
        let mut toy = Toy::new();
        let real = toy.real.clone();
        let mut d = SharedRuns::new(&mut toy, false);
        assert!(!d.share_identical_runs(true));
        request(&mut d, &[&[1.0]]);
        assert_eq!(request(&mut d, &[&[1.0]])[0], vec![1.0, 1.0]);
        assert_eq!((d.shared_runs(), real.get()), ((0, 0), 2));
        assert!(d.timings().is_empty());
    }
}
