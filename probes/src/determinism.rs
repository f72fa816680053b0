//! `determinism`: the same request (the prompt, then greedy tbt steps) twice in this process and
//! once in a second OS process, compared bit for bit: logits at every step and, where the device
//! can read them, the cache bytes after every step. A device is a function of its inputs; one
//! that differs run to run with identical inputs (apple/coreai-models#84: stateful prefill that
//! is not deterministic across processes) makes every other comparison a coin toss, and this
//! names where it starts: the first step, then the first layer and slot (ring slot, or state
//! row) whose bytes differ.
//!
//! Identical inputs: each run starts from a reset and the host window the first run started from
//! (a fresh driver's, in the second process); a ring device's rings are zeroed first (a reset
//! keeps ring bytes and the window, contract §2.10) and read back, a stateful device's states must
//! read all zero after its reset (`clean_reset`; a device that keeps its state is the back-to-back check's case, not
//! this one). The second run and the second process are fed the first run's tokens, so a
//! difference is never the echo of an earlier one.
//!
//! The second process is the caller's: the CLI re-runs itself with a hidden subcommand that
//! calls [`record`] and writes [`Recording::encode`] to a file ([`crate::probe::SecondProcess`]);
//! this crate never depends on the CLI.

use std::collections::BTreeMap;

use kvprobe_npu::MaskMode;
use kvprobe_schema::{DeterminismFinding, DeviceDescription, Divergence, RunComparison};

use crate::cache_io;
use crate::metrics::top1;
use crate::probe::SecondProcess;
use crate::session::Session;
use crate::{Error, Result};

/// One run of the request: logits per step, cache bytes after each step (empty maps when the
/// device cannot read them).
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    pub ids: Vec<u32>,
    /// Tokens fed to the tbt steps.
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub caches: Vec<BTreeMap<u32, Vec<u8>>>,
    /// Every state (stateful) or ring (after the host zeroed it) read all zero before the run;
    /// None when the device cannot be read back (or, a ring, cannot be cleared).
    pub clean_reset: Option<bool>,
}

const MAGIC: &[u8; 8] = b"KVDET01\n";

/// Zero the rings (ring devices) or check the states are zero (stateful ones) after a reset.
pub(crate) fn fresh_start(s: &mut Session) -> Result<Option<bool>> {
    s.driver.reset(s.dev)?;
    // the host window a new process starts with, not the one earlier probes left (a reset keeps
    // it, contract §2.10): a fault that reads never-written rows or slots sees what a fresh
    // `kvprobe` run of the same request sees (issue 34: the reproducer command is that run)
    let fresh = s.driver.fresh_host_state();
    s.driver.set_host_state(fresh);
    let caps = s.dev.capabilities();
    if caps.stateful {
        if !caps.read_cache {
            return Ok(None);
        }
        let bufs = cache_io::read(s.dev, "after a state reset (determinism probe)")?;
        return Ok(Some(bufs.values().all(|b| b.iter().all(|&x| x == 0))));
    }
    if !caps.write_cache {
        return Ok(None);
    }
    s.clear_rings()?;
    if !caps.read_cache {
        return Ok(None);
    }
    let bufs = cache_io::read(s.dev, "after the caches were zeroed (determinism probe)")?;
    Ok(Some(bufs.values().all(|b| b.iter().all(|&x| x == 0))))
}

fn snapshot(s: &mut Session) -> Result<BTreeMap<u32, Vec<u8>>> {
    if s.dev.capabilities().read_cache {
        cache_io::read(s.dev, "after a recorded run (determinism probe)")
    } else {
        Ok(BTreeMap::new())
    }
}

/// One request from a fresh start: the prompt's prefill, then `steps − 1` tbt steps on `tokens`
/// (or, past their end, on the device's own argmax).
pub fn record(s: &mut Session, steps: usize, tokens: &[u32]) -> Result<Recording> {
    let steps = steps.max(1);
    if steps > 1 {
        s.require_tbt("determinism")?;
    }
    let clean_reset = fresh_start(s)?;
    let ids = s.ids.clone();
    let out = s.driver.prefill(s.dev, &ids)?;
    let mut rec = Recording {
        ids,
        tokens: Vec::with_capacity(steps),
        logits: vec![out.logits],
        caches: vec![snapshot(s)?],
        clean_reset,
    };
    s.progress.inc(1);
    for step in 1..steps {
        let token = tokens
            .get(step - 1)
            .copied()
            .unwrap_or_else(|| top1(&rec.logits[step - 1]));
        rec.tokens.push(token);
        let out = s.driver.step(s.dev, token, &MaskMode::Ring)?;
        rec.logits.push(out.logits);
        rec.caches.push(snapshot(s)?);
        s.progress.inc(1);
    }
    Ok(rec)
}

/// The first step of [`record`]'s request, its logits only: a fresh start, then the prompt's
/// prefill. [`next_logits`] continues it (a replay compares logits only, step by step).
pub fn start_logits(s: &mut Session) -> Result<Vec<f32>> {
    fresh_start(s)?;
    let ids = s.ids.clone();
    let out = s.driver.prefill(s.dev, &ids)?;
    s.progress.inc(1);
    Ok(out.logits)
}

/// The request's next tbt step on `token`, its logits only.
pub fn next_logits(s: &mut Session, token: u32) -> Result<Vec<f32>> {
    s.require_tbt("determinism")?;
    let out = s.driver.step(s.dev, token, &MaskMode::Ring)?;
    s.progress.inc(1);
    Ok(out.logits)
}

/// Step `step` of [`record`]'s request, its logits only: at 0 the prompt's prefill from a fresh
/// start ([`start_logits`]), then the tbt step on `tokens[step − 1]`. Past the tokens' end, the
/// argmax of `before` (the step before's logits) where given, as [`record`] goes on; else `None`,
/// the request ending with the tokens. One stepping for every request that is compared with
/// another: the device's recorded again and a hypothesis' replay (`diagnose::replay`), a
/// replay's rings read for the residual (`diagnose::residual`), the scorer's record.
pub fn request_step(
    s: &mut Session,
    step: usize,
    tokens: &[u32],
    before: Option<&[f32]>,
) -> Result<Option<Vec<f32>>> {
    let Some(t) = step.checked_sub(1) else {
        return start_logits(s).map(Some);
    };
    let token = match (tokens.get(t), before) {
        (Some(&token), _) => token,
        (None, Some(before)) => top1(before),
        (None, None) => return Ok(None),
    };
    next_logits(s, token).map(Some)
}

/// The logits of [`record`]'s request without its cache bytes.
pub fn record_logits(s: &mut Session, steps: usize, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let mut logits: Vec<Vec<f32>> = Vec::with_capacity(steps.max(1));
    for step in 0..steps.max(1) {
        let before = logits.last().map_or(&[][..], Vec::as_slice);
        if let Some(next) = request_step(s, step, tokens, Some(before))? {
            logits.push(next);
        }
    }
    Ok(logits)
}

fn put_u32s(out: &mut Vec<u8>, v: impl IntoIterator<Item = u32>) {
    let v: Vec<u32> = v.into_iter().collect();
    out.extend((v.len() as u64).to_le_bytes());
    for x in v {
        out.extend(x.to_le_bytes());
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend((b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads the length-prefixed fields [`Recording::encode`] wrote.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() < n {
            return Err(Error::Device(
                "the second process's recording is truncated; re-run `determinism`".into(),
            ));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn len(&mut self) -> Result<usize> {
        let b = self.take(8)?;
        let n = u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8]));
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.b.len())
            .ok_or_else(|| Error::Device("the second process's recording is corrupt".into()))
    }
    fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.len()?;
        let b = self.take(4 * n.min(self.b.len() / 4))?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.len()?;
        Ok(self.take(n)?.to_vec())
    }
}

impl Recording {
    /// Little-endian, length-prefixed; what the second process writes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        put_u32s(&mut out, self.ids.iter().copied());
        put_u32s(&mut out, self.tokens.iter().copied());
        out.push(match self.clean_reset {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        });
        out.extend((self.logits.len() as u64).to_le_bytes());
        for (l, c) in self.logits.iter().zip(&self.caches) {
            put_u32s(&mut out, l.iter().map(|x| x.to_bits()));
            put_u32s(&mut out, c.keys().copied());
            for b in c.values() {
                put_bytes(&mut out, b);
            }
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Recording> {
        let mut r = Reader { b };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(Error::Device(
                "the second process wrote no determinism recording (another kvprobe version?)"
                    .into(),
            ));
        }
        let ids = r.u32s()?;
        let tokens = r.u32s()?;
        let clean_reset = match r.take(1)?[0] {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        };
        let steps = r.len()?;
        let mut rec = Recording {
            ids,
            tokens,
            logits: Vec::with_capacity(steps),
            caches: Vec::with_capacity(steps),
            clean_reset,
        };
        for _ in 0..steps {
            rec.logits
                .push(r.u32s()?.into_iter().map(f32::from_bits).collect());
            let mut c = BTreeMap::new();
            for id in r.u32s()? {
                c.insert(id, r.bytes()?);
            }
            rec.caches.push(c);
        }
        Ok(rec)
    }
}

/// How cache `id`'s bytes map to slots: its layer, the bytes of one slot's row and the slots
/// per row block (a stateful state is `[kv_heads, ctx, head_dim]` fp16: rows of `2·head_dim`
/// bytes, `ctx` per head; a ring is `L` slots of `Ep` bytes).
fn slot_map(desc: &DeviceDescription, id: u32) -> (Option<usize>, usize, usize) {
    let edge = desc
        .groups
        .iter()
        .flat_map(|g| g.cache_edges.iter())
        .find(|e| e.cache_id == id);
    let layer = edge.and_then(|e| e.layer);
    match desc.runtime {
        kvprobe_schema::RuntimeKind::Stateful => {
            (layer, 2 * desc.shape.head_dim.max(1), desc.cache_len.max(1))
        }
        _ => (
            layer,
            edge.map_or(1, |e| e.padded_entry_size.max(1)),
            usize::MAX,
        ),
    }
}

/// Slots whose bytes differ between two copies of cache `id`.
fn differing_slots(desc: &DeviceDescription, id: u32, a: &[u8], b: &[u8]) -> Vec<usize> {
    let (_, row, per) = slot_map(desc, id);
    let mut slots: Vec<usize> = a
        .chunks(row)
        .zip(b.chunks(row))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i % per)
        .collect();
    slots.sort_unstable();
    slots.dedup();
    slots
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> Option<f64> {
    let mut m = 0f64;
    for (x, y) in a.iter().zip(b) {
        if x.to_bits() == y.to_bits() {
            continue;
        }
        let d = (*x as f64 - *y as f64).abs();
        if !d.is_finite() {
            return None;
        }
        m = m.max(d);
    }
    Some(m)
}

/// The first differing cache of a step: (layer, cache id, slot).
type FirstCache = (Option<usize>, u32, usize);

/// One step's cache difference: per layer the slots differing, and the first (layer, id, slot).
fn cache_step(
    desc: &DeviceDescription,
    a: &BTreeMap<u32, Vec<u8>>,
    b: &BTreeMap<u32, Vec<u8>>,
) -> (Vec<usize>, Option<FirstCache>) {
    let layers = desc.shape.n_layers;
    let mut per_layer: Vec<Vec<usize>> = vec![Vec::new(); layers];
    let mut first: Option<FirstCache> = None;
    for (id, x) in a {
        let Some(y) = b.get(id) else { continue };
        let slots = differing_slots(desc, *id, x, y);
        let Some(&slot) = slots.first() else { continue };
        let (layer, _, _) = slot_map(desc, *id);
        let key = (layer.unwrap_or(usize::MAX), slot);
        if first.is_none_or(|(l, _, s)| key < (l.unwrap_or(usize::MAX), s)) {
            first = Some((layer, *id, slot));
        }
        if let Some(l) = layer.filter(|&l| l < layers) {
            per_layer[l].extend(slots);
        }
    }
    let counts = per_layer
        .into_iter()
        .map(|mut v| {
            v.sort_unstable();
            v.dedup();
            v.len()
        })
        .collect();
    (counts, first)
}

/// Two recordings of the same request, bit for bit.
pub fn compare(
    desc: &DeviceDescription,
    a: &Recording,
    b: &Recording,
    against: &str,
) -> RunComparison {
    let mut first: Option<Divergence> = None;
    let mut step_max_abs_diff = Vec::with_capacity(a.logits.len());
    let mut slots_differing = Vec::new();
    let caches = a.caches.iter().any(|c| !c.is_empty());
    for (step, (la, lb)) in a.logits.iter().zip(&b.logits).enumerate() {
        step_max_abs_diff.push(max_abs_diff(la, lb));
        let logit = la
            .iter()
            .zip(lb)
            .position(|(x, y)| x.to_bits() != y.to_bits())
            .or((la.len() != lb.len()).then_some(la.len().min(lb.len())));
        let (counts, cache) = match (a.caches.get(step), b.caches.get(step)) {
            (Some(ca), Some(cb)) if caches => cache_step(desc, ca, cb),
            _ => (Vec::new(), None),
        };
        if caches {
            slots_differing.push(counts);
        }
        if first.is_none() && (logit.is_some() || cache.is_some()) {
            first = Some(Divergence {
                step,
                logit,
                layer: cache.and_then(|c| c.0),
                cache_id: cache.map(|c| c.1),
                slot: cache.map(|c| c.2),
            });
        }
    }
    let steps_differ = a.logits.len() != b.logits.len();
    RunComparison {
        against: against.to_string(),
        identical: first.is_none() && !steps_differ,
        first,
        step_max_abs_diff,
        slots_differing,
    }
}

/// One line for a comparison: bit-identical, or where it first differs.
pub fn describe(c: &RunComparison) -> String {
    let Some(d) = &c.first else {
        return format!("{}: bit-identical", c.against);
    };
    let mut s = format!("{}: differs first at step {}", c.against, d.step);
    if let Some(l) = d.logit {
        s.push_str(&format!(" (logit {l})"));
    }
    match (d.layer, d.cache_id, d.slot) {
        (Some(l), Some(id), Some(slot)) => {
            s.push_str(&format!(", cache {id} of layer {l}, slot {slot}"))
        }
        (None, Some(id), Some(slot)) => s.push_str(&format!(", cache {id}, slot {slot}")),
        _ => {}
    }
    s
}

/// Two runs from all-zero states (or cleared rings) with identical inputs differed.
pub fn repeat_differs(r: &DeterminismFinding) -> bool {
    r.clean_reset == Some(true) && !r.identical()
}

/// The evidence line of `diagnose`'s repeat.
pub fn repeat_evidence(r: &DeterminismFinding) -> String {
    if r.clean_reset == Some(false) {
        return "repeat: not compared as identical inputs: the caches were not all zero after a reset (the back-to-back check follows)".into();
    }
    let found: Vec<String> = r.comparisons.iter().map(describe).collect();
    format!(
        "repeat: the same request ({} steps: the prefill, then tbt) twice in this process from all-zero caches; {}; no second process inside diagnose (`kvprobe determinism` runs one)",
        r.steps,
        found.join("; ")
    )
}

/// The repeat `diagnose` runs (cheap: the prompt and `steps − 1` tbt steps twice in this
/// process, no second process).
pub fn repeat(s: &mut Session, steps: usize) -> Result<DeterminismFinding> {
    let steps = if s.has_tbt() { steps.max(1) } else { 1 };
    let start = s.driver.host_state();
    let a = record(s, steps, &[])?;
    s.driver.set_host_state(start);
    let b = record(s, steps, &a.tokens)?;
    let c = compare(s.describe(), &a, &b, "same process");
    Ok(finding(s, steps, &[&a, &b], vec![c]))
}

/// The finding of `runs` (the first is the one the others were compared with).
fn finding(
    s: &Session,
    steps: usize,
    runs: &[&Recording],
    comparisons: Vec<RunComparison>,
) -> DeterminismFinding {
    let clean = runs.iter().all(|r| r.clean_reset == Some(true));
    // a ring device that could not clear and read back its rings says nothing about it
    let known = s.dev.capabilities().stateful || runs.iter().all(|r| r.clean_reset.is_some());
    DeterminismFinding {
        steps,
        caches_compared: runs[0].caches.iter().any(|c| !c.is_empty()),
        clean_reset: known.then_some(clean),
        comparisons,
        second_process_skipped: None,
    }
}

/// The probe: two runs here, one in a second process when `second` is given.
pub fn run(
    s: &mut Session,
    steps: usize,
    second: Option<&dyn SecondProcess>,
) -> Result<DeterminismFinding> {
    let steps = steps.max(1);
    s.progress.phase("determinism", 2 * steps as u64);
    let start = s.driver.host_state();
    let a = record(s, steps, &[])?;
    s.driver.set_host_state(start);
    let b = record(s, steps, &a.tokens)?;
    let mut comparisons = vec![compare(s.describe(), &a, &b, "same process")];
    let Some(h) = second else {
        let mut f = finding(s, steps, &[&a, &b], comparisons);
        f.second_process_skipped = Some("no second process available (library use)".into());
        return Ok(f);
    };
    let c = Recording::decode(&h.record(steps, &a.tokens)?)?;
    if c.ids != a.ids {
        return Err(Error::Device(
            "the second process encoded another prompt; pass the prompt with --ids".into(),
        ));
    }
    comparisons.push(compare(s.describe(), &a, &c, "second process"));
    Ok(finding(s, steps, &[&a, &b, &c], comparisons))
}

/// `kvprobe determinism`.
pub struct DeterminismProbe;

impl crate::probe::Probe for DeterminismProbe {
    fn name(&self) -> &'static str {
        "determinism"
    }

    fn about(&self) -> &'static str {
        "The same request twice here and once in a second process: bit-exact, or the first step, layer and slot that differ"
    }

    fn run(
        &self,
        s: &mut Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.determinism = Some(run(s, opts.steps, opts.second_process)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvprobe_npu::ane::{AneDevice, AneOptions};
    use kvprobe_npu::sim::{SimDevice, SimOptions};
    use kvprobe_reference::Model;

    use super::*;
    use crate::NoProgress;

    fn tiny() -> Arc<Model> {
        let dir = tempfile::tempdir().expect("tempdir");
        kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 7).expect("fixture");
        Arc::new(Model::load(dir.path()).expect("load"))
    }

    fn ane(model: &Arc<Model>, faults: &[&str]) -> AneDevice {
        let opts = AneOptions {
            max_ctx: 64,
            max_query: 32,
            faults: faults.iter().map(|f| f.to_string()).collect(),
            ..AneOptions::default()
        };
        AneDevice::new(model.clone(), opts).expect("device")
    }

    /// 20 prompt tokens: one call writes rows 0..20, four of them past the 16th.
    fn ids() -> Vec<u32> {
        (0..20).map(|i| 3 + 11 * i).collect()
    }

    #[test]
    fn a_healthy_stateful_device_repeats_bit_for_bit_and_the_recording_round_trips() {
        let model = tiny();
        let mut dev = ane(&model, &[]);
        let mut s = Session::new(&model, &mut dev, ids(), &NoProgress).expect("session");
        let a = record(&mut s, 4, &[]).expect("first");
        let b = record(&mut s, 4, &a.tokens).expect("second");
        assert_eq!(a.clean_reset, Some(true));
        assert_eq!(a.logits.len(), 4);
        assert_eq!(a.caches[0].len(), 2 * model.config().n_layers);
        let c = compare(s.describe(), &a, &b, "same process");
        assert!(c.identical, "{c:?}");
        assert_eq!(c.step_max_abs_diff, vec![Some(0.0); 4]);
        assert_eq!(Recording::decode(&a.encode()).expect("decode"), a);
        assert!(Recording::decode(&a.encode()[..40]).is_err());
        assert!(Recording::decode(b"not a recording").is_err());
    }

    #[test]
    fn a_ring_device_repeats_bit_for_bit() {
        let model = tiny();
        let opts = SimOptions {
            cache_len: 32,
            prefill_len: 8,
            ..SimOptions::default()
        };
        let mut dev = SimDevice::new(model.clone(), opts).expect("sim");
        let mut s = Session::new(&model, &mut dev, ids(), &NoProgress).expect("session");
        let f = run(&mut s, 3, None).expect("run");
        assert!(f.identical(), "{f:?}");
        assert!(f.caches_compared);
        // the host cleared the rings and read them back as zeros
        assert_eq!(f.clean_reset, Some(true));
        assert!(f.second_process_skipped.is_some());
    }

    #[test]
    fn a_state_race_differs_first_at_the_seventeenth_row() {
        let model = tiny();
        let mut dev = ane(&model, &["ane-state-race"]);
        let mut s = Session::new(&model, &mut dev, ids(), &NoProgress).expect("session");
        let f = repeat(&mut s, 3).expect("repeat");
        assert_eq!(f.clean_reset, Some(true));
        let c = &f.comparisons[0];
        assert!(!c.identical);
        // rows 0..16 of a call are written exactly; the prompt's 17th row is slot 16
        let d = c.first.as_ref().expect("a difference");
        assert_eq!(
            (d.step, d.layer, d.cache_id, d.slot),
            (0, Some(0), Some(0), Some(16))
        );
        // the 4 rows past the 16th differ in layer 0; one-row tbt calls add none of their own
        assert_eq!(c.slots_differing[0][0], 4);
        assert!(repeat_evidence(&f).contains("differs first at step 0"));
    }
}
