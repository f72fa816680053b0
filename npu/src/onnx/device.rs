//! [`OnnxDevice`]: a GenAI folder behind the [`Device`] contract, as the generic stateful driver
//! sees it (mod.rs). Each run maps the driver's rows to GenAI's inputs (host.rs), rewinds the
//! past to the run's first position when the driver stepped back, runs the graph and keeps the
//! presents as the next past.

use std::collections::BTreeMap;

use kvprobe_reference::Model;
use kvprobe_schema::{DeviceDescription, DeviceLimit, GroupKind};

use super::config::GenaiConfig;
#[cfg(feature = "onnx")]
use super::describe::description;
use super::describe::{MASK, POSITIONS, ROWS};
#[cfg(feature = "onnx")]
use super::faults::HostFault;
#[cfg(feature = "onnx")]
use super::open_checks::{
    check_faults, check_pairing, declared_provider, kv_format, kv_scales, shared_length,
};
use super::wcache::WindowCache;
use super::window;
#[cfg(feature = "onnx")]
use super::window::WindowGeom;
use super::window::WindowState;
use super::{host, OnnxOptions, CAPABILITIES};
use crate::{Buffer, Capabilities, Device, Error, Result, RunOutput, SavedState};

pub struct OnnxDevice {
    desc: DeviceDescription,
    cfg: GenaiConfig,
    lookup: host::TokenLookup,
    #[cfg(feature = "onnx")]
    rt: super::runtime::Runtime,
    /// The execution provider the session runs on (provenance).
    #[cfg(feature = "onnx")]
    ep: super::Ep,
    /// Per cache id (2l K, 2l+1 V): `[H, stride, D]` f32, GenAI's past (`stride` = past_len with
    /// separate buffers, the buffer's length with a shared one).
    past: Vec<Vec<f32>>,
    past_len: usize,
    /// GenAI's shared past/present buffer (H12): its length S, or None for separate buffers.
    shared: Option<usize>,
    /// Convention (b): GenAI's windowed bookkeeping and the entries (None for (a)).
    win: Option<(WindowState, WindowCache)>,
    /// The run's provider is not the one genai_config.json declares (open_checks.rs).
    substitute: Option<String>,
    /// The graph reads the mask as a length (GroupQueryAttention, graph_ops.rs): why a mask
    /// with holes is refused.
    length_mask: Option<String>,
    /// `--fault dec-layer-swap` (faults.rs).
    #[cfg(feature = "onnx")]
    swap_layers: bool,
    /// What the device computes that the matched reference does not (`Device::unmodelled_precision`).
    unmodelled: Option<String>,
    /// The same graph on the CPU EP measuring that arithmetic per run (control.rs): then the
    /// precision is measured, not declared unmodelled.
    control: Option<Box<super::control::Control>>,
}

impl OnnxDevice {
    /// Opens `opts.dir` for the reference `model` (whose embedding rows the driver will send).
    #[cfg(feature = "onnx")]
    pub fn open(model: &Model, opts: &OnnxOptions) -> Result<OnnxDevice> {
        let cfg = GenaiConfig::load(&opts.dir)?;
        let substitute = declared_provider(&cfg, opts.ep, opts.ep_given)?;
        check_faults(&cfg, opts)?;
        // win-capacity-silent: the runner takes a context past search.max_length (it believes
        // the model's positions, not the compiled cache) and never refuses
        let silent = cfg.window.is_some() && opts.faults.contains(&HostFault::CapacitySilent);
        let limit = if silent {
            4 * cfg.max_length
        } else {
            cfg.max_length
        };
        let ctx = match opts.max_ctx {
            Some(n) if n < 2 || n > limit => {
                return Err(Error::BadOption {
                    flag: format!("--max-ctx {n}"),
                    detail: format!(
                        "must be 2..={} (search.max_length of {})",
                        limit,
                        cfg.path.display()
                    ),
                })
            }
            Some(n) => n,
            None if silent => 2 * cfg.max_length,
            None => cfg.max_length.min(128),
        };
        let lookup = host::TokenLookup::new(model.embedding_source())?;
        let rt = super::runtime::Runtime::open(&opts.dir, &cfg, opts)?;
        let length_mask = super::graph_ops::mask_by_length(&opts.dir.join(&cfg.filename))?;
        // after the graph's own check, so a config that disagrees with its graph is named as such
        check_pairing(&cfg, model)?;
        let shared = shared_length(&cfg, rt.fixed_seq, ctx)?;
        let name = opts
            .dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let win = match &cfg.window {
            None => None,
            Some(w) => {
                let u8 = rt.kv == super::runtime::KvType::U8;
                if !u8 && opts.faults.contains(&HostFault::U16Runner) {
                    return Err(Error::BadOption {
                        flag: "--fault win-u16-runner".into(),
                        detail: format!("{} has a float32 cache; the fault needs the uint8 variant (--kv-dtype uint8)", opts.dir.display()),
                    });
                }
                let scales = if u8 {
                    kv_scales(&opts.dir, cfg.n_layers)?
                } else {
                    vec![1.0; 2 * cfg.n_layers]
                };
                let geom = WindowGeom {
                    window: w.window_size,
                    context: cfg.context_length,
                    max_length: cfg.max_length,
                    pad_value: w.pad_value,
                    pad_token: cfg.pad_token_id,
                    heads: cfg.n_kv_heads,
                    head_dim: cfg.head_size,
                };
                Some((
                    WindowState::new(geom, opts.faults.clone()),
                    WindowCache::new(2 * cfg.n_layers, cfg.n_kv_heads, cfg.head_size, u8, scales),
                ))
            }
        };
        let mut desc = description(
            name,
            &cfg,
            &kv_format(rt.kv.name(), shared, rt.has_positions),
            ctx,
            win.as_ref().map(|w| &w.1),
            opts.faults.contains(&HostFault::U16Runner),
        );
        let fp16_kv = matches!(rt.kv, super::values::KvType::F16);
        let unmodelled = super::declared::precision(&mut desc, &cfg, opts, fp16_kv)?;
        let control = match &unmodelled {
            Some(_) => Some(Box::new(super::control::Control::open(model, opts)?)),
            None => None,
        };
        Ok(OnnxDevice {
            control,
            desc,
            past: vec![
                vec![0.0; shared.unwrap_or(0) * cfg.n_kv_heads * cfg.head_size];
                2 * cfg.n_layers
            ],
            past_len: 0,
            shared,
            ep: opts.ep,
            win,
            substitute,
            length_mask,
            swap_layers: opts.faults.contains(&HostFault::LayerSwap),
            unmodelled,
            cfg,
            lookup,
            rt,
        })
    }

    /// A build without the feature says so before anything else (no flag fixes that; exit 3).
    #[cfg(not(feature = "onnx"))]
    pub fn open(_model: &Model, _opts: &OnnxOptions) -> Result<OnnxDevice> {
        Err(no_feature())
    }

    pub fn config(&self) -> &GenaiConfig {
        &self.cfg
    }

    /// Positions the device holds K/V for (GenAI's current sequence length, pads not counted).
    pub fn past_len(&self) -> usize {
        match &self.win {
            Some((st, _)) => st.real_len(),
            None => self.past_len,
        }
    }

    /// Convention (b): the driver's run as GenAI's windowed runs (window.rs), the past tensors cut
    /// from the entries (wcache.rs). A step back inside the generated tokens restores GenAI's
    /// bookkeeping; inside the prompt the shorter prompt is replayed (GenAI refuses RewindTo on
    /// this cache; the replay builds the cache it would have built for the shorter request).
    fn run_window(&mut self, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let real = self.past_len();
        let (ids, logical, first) = self.genai_inputs_at(inputs, real)?;
        let Some((st, cache)) = &mut self.win else {
            return Err(Error::Device("not a windowed folder".into()));
        };
        if first < real {
            if first > 0 && st.rewind(first).is_some() {
                cache.truncate(st.seq.len());
            } else {
                let prompt = st.seq[st.npad..st.npad + first.min(st.prompt_len)].to_vec();
                let rest = st.seq[st.npad + prompt.len()..st.npad + first].to_vec();
                *st = WindowState::new(st.geom, st.faults.clone());
                cache.truncate(0);
                if !prompt.is_empty() {
                    let all: Vec<i64> = vec![1; first];
                    self.window_runs(&prompt, &all)?;
                    for t in rest {
                        self.window_runs(&[t], &all)?;
                    }
                }
            }
        }
        let logits = self.window_runs(&ids, &logical)?;
        Ok(RunOutput {
            logits,
            taps: BTreeMap::new(),
        })
    }

    /// The windowed runs of `ids` appended to the request; the last run's logits.
    #[cfg(feature = "onnx")]
    fn window_runs(&mut self, ids: &[u32], logical: &[i64]) -> Result<Vec<f32>> {
        let Some((st, cache)) = &mut self.win else {
            return Err(Error::Device("not a windowed folder".into()));
        };
        let plans = if st.seq.is_empty() {
            st.prompt(ids)?
        } else {
            ids.iter()
                .map(|&t| st.token(t))
                .collect::<Result<Vec<_>>>()?
        };
        let mut logits = Vec::new();
        for mut plan in plans {
            window::apply_logical_mask(st, &mut plan, logical)?;
            let pad = st.geom.pad_value;
            let past: Vec<window::Elems> = (0..cache.entries.len())
                .map(|c| cache.past(st, c, plan.first, plan.past_len, pad))
                .collect();
            let (l, presents) = self.rt.run_window(&plan, &past)?;
            for (c, p) in presents.into_iter().enumerate() {
                cache.append(st, c, p, plan.ids.len())?;
            }
            logits = l;
        }
        Ok(logits)
    }

    #[cfg(not(feature = "onnx"))]
    fn window_runs(&mut self, _ids: &[u32], _logical: &[i64]) -> Result<Vec<f32>> {
        Err(no_feature())
    }

    /// The graph's input names (as ONNX Runtime lists them).
    #[cfg(feature = "onnx")]
    pub fn graph_inputs(&self) -> &[String] {
        self.rt.inputs()
    }

    fn take<'a>(inputs: &'a [(String, Buffer)], name: &str) -> Result<&'a Buffer> {
        inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| Error::InvalidArgument(format!("missing input `{name}`")))
    }

    /// GenAI's inputs for one run from the driver's buffers: (ids, attention_mask, first position).
    fn genai_inputs(&mut self, inputs: &[(String, Buffer)]) -> Result<(Vec<u32>, Vec<i64>, usize)> {
        self.genai_inputs_at(inputs, self.past_len)
    }

    /// (ids, attention_mask over positions 0..first + q, first position) over a past of `past_len`.
    fn genai_inputs_at(
        &self,
        inputs: &[(String, Buffer)],
        past_len: usize,
    ) -> Result<(Vec<u32>, Vec<i64>, usize)> {
        let (Buffer::F32(rows), Buffer::F32(pos), Buffer::U16(mask)) = (
            Self::take(inputs, ROWS)?,
            Self::take(inputs, POSITIONS)?,
            Self::take(inputs, MASK)?,
        ) else {
            return Err(Error::InvalidArgument(
                "input buffers of the wrong types".into(),
            ));
        };
        let ids = self.lookup.ids(rows)?;
        let q = ids.len();
        let first = pos.first().copied().unwrap_or(-1.0);
        let consecutive =
            pos.len() == q && pos.iter().enumerate().all(|(i, &p)| p == first + i as f32);
        if !consecutive || first < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "position ids {pos:?} are not consecutive from the request's length; GenAI sets them itself"
            )));
        }
        let first = first as usize;
        if first > past_len {
            return Err(Error::InvalidArgument(format!(
                "a run at position {first} over a past of {past_len} positions; GenAI can only append or rewind"
            )));
        }
        let rows = host::rows_from_additive(mask, q)?;
        let attention = host::attention_mask_from_rows(&rows, first)?;
        Ok((ids, attention, first))
    }

    fn shape(&self) -> (usize, usize, usize) {
        (self.cfg.n_kv_heads, self.desc.cache_len, self.cfg.head_size)
    }

    /// Positions between one head's rows in a host past: the buffer's length when shared.
    fn stride(&self) -> usize {
        self.shared.unwrap_or(self.past_len)
    }
}

#[cfg(not(feature = "onnx"))]
fn no_feature() -> Error {
    Error::Device("--onnx: built without ONNX Runtime support: rebuild with --features onnx".into())
}

impl OnnxDevice {
    /// One run of the graph as GenAI's host feeds it (the device without its control).
    fn run_graph(&mut self, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        if self.win.is_some() {
            return self.run_window(inputs);
        }
        let (ids, mask, first) = self.genai_inputs(inputs)?;
        if let Some(why) = self.length_mask.as_ref().filter(|_| mask.contains(&0)) {
            // the host never builds this for a probe (they check mask_by_length first): a
            // caller that does gets a refusal, never the op's answer to another request
            return Err(Error::InvalidArgument(format!("a mask with holes: {why}")));
        }
        let (h, _, d) = self.shape();
        if first < self.past_len {
            // the driver stepped back: GenAI's RewindTo(first); a shared buffer only moves its
            // length (the entries past it are overwritten by the next run, G:kv)
            if self.shared.is_none() {
                for c in &mut self.past {
                    *c = host::rewind(c, h, self.past_len, d, first);
                }
            }
            self.past_len = first;
        }
        let total = host::present_length(self.past_len, ids.len());
        if total > self.desc.cache_len {
            return Err(Error::ContextFull {
                max_ctx: self.desc.cache_len,
            });
        }
        let positions = host::position_ids(total, ids.len());
        #[cfg(feature = "onnx")]
        {
            let stride = self.stride();
            let (logits, presents, present_seq) = if self.swap_layers {
                // dec-layer-swap: a runner binding the pasts by a wrong layer index
                let mut fed = self.past.clone();
                fed.swap(0, 2);
                fed.swap(1, 3);
                self.rt.run(&ids, &mask, &positions, &fed, stride)?
            } else {
                self.rt.run(&ids, &mask, &positions, &self.past, stride)?
            };
            match self.shared {
                None if present_seq == total => self.past = presents,
                Some(s) if present_seq == s => {
                    // in place: the buffer takes what the run wrote over the request
                    for (buf, p) in self.past.iter_mut().zip(&presents) {
                        host::write_in_place(buf, p, h, s, d, total);
                    }
                }
                _ => {
                    return Err(Error::Device(format!(
                        "the graph's presents hold {present_seq} positions after a run to length {total} over a {} past; GenAI's {} needs {}",
                        stride,
                        if self.shared.is_some() { "shared buffer" } else { "separate buffers" },
                        self.shared.unwrap_or(total)
                    )))
                }
            }
            self.past_len = total;
            Ok(RunOutput {
                logits,
                taps: BTreeMap::new(),
            })
        }
        #[cfg(not(feature = "onnx"))]
        {
            let _ = (mask, positions);
            Err(no_feature())
        }
    }

    /// `init_cache(0)` of the device itself (its control resets beside it).
    fn reset(&mut self, read_offset: u32) -> Result<()> {
        if read_offset != 0 {
            return Err(Error::InvalidArgument(format!(
                "init_cache({read_offset}): a GenAI request starts at 0 (there is no ring offset)"
            )));
        }
        // a new request: separate buffers start empty, a shared one zero-filled (G:kv)
        match self.shared {
            None => self.past.iter_mut().for_each(Vec::clear),
            Some(_) => self.past.iter_mut().for_each(|c| c.fill(0.0)),
        }
        self.past_len = 0;
        if let Some((st, cache)) = &mut self.win {
            *st = WindowState::new(st.geom, st.faults.clone());
            cache.truncate(0);
        }
        Ok(())
    }
}

impl Device for OnnxDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// The runtime that ran the graph: a bug write-up needs its exact build and provider.
    fn versions(&self) -> Vec<(String, String)> {
        #[cfg(feature = "onnx")]
        {
            self.rt.versions(self.ep)
        }
        #[cfg(not(feature = "onnx"))]
        Vec::new()
    }

    /// A QNN session with nodes on the CPU says "partial NPU" in every output.
    fn mask_by_length(&self) -> Option<String> {
        self.length_mask.clone()
    }

    /// A run on another provider than genai_config.json declares says so too.
    fn warnings(&self) -> Vec<String> {
        let v = self.substitute.iter().cloned();
        #[cfg(feature = "onnx")]
        let v = v.chain(self.rt.qnn.as_ref().and_then(|q| q.partial()));
        // what the controls cannot judge at the declared precision (as OpenVINO's bf16 says it),
        // or the control that measures it
        let v = v.chain(self.unmodelled.iter().map(|n| match &self.control {
            Some(c) => c.note(n),
            None => format!("QNN precision: {n}"),
        }));
        v.collect()
    }

    fn unmodelled_precision(&self) -> Option<String> {
        self.unmodelled.clone().filter(|_| self.control.is_none())
    }

    fn control_logits(&self, logits: &[f32]) -> Option<Vec<f32>> {
        self.control.as_ref()?.logits(logits)
    }

    /// The QNN compile (or context-cache load) per graph, then the graph runs by kind.
    fn timings(&self) -> Vec<(String, f64)> {
        #[cfg(feature = "onnx")]
        {
            let mut v: Vec<(String, f64)> = Vec::new();
            for (g, o) in self.rt.qnn.iter().flat_map(|q| q.context.iter()) {
                v.push(o.timing(g));
            }
            let [(wn, ws), (sn, ss)] = self.rt.times;
            v.push((format!("device: prompt windows ({wn} runs)"), ws));
            v.push((format!("device: decode steps ({sn} runs)"), ss));
            v.extend(self.control.iter().flat_map(|c| c.timings()));
            v
        }
        #[cfg(not(feature = "onnx"))]
        Vec::new()
    }

    fn host_window(&self) -> Option<window::WindowGeom> {
        self.win.as_ref().map(|(st, _)| st.geom)
    }

    fn limits(&self) -> Vec<DeviceLimit> {
        super::describe::limits(&self.desc, self.win.as_ref().map(|(st, _)| st.geom))
    }

    fn run(&mut self, group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let out = self.run_graph(inputs)?;
        if let Some(c) = &mut self.control {
            c.run(group, inputs, &out.logits)?;
        }
        Ok(out)
    }

    /// The request is host memory: the pasts, their length and the windowed bookkeeping.
    fn save_state(&self) -> Option<SavedState> {
        let entries = self.win.iter().flat_map(|w| &w.1.entries);
        let bytes = 4 * self.past.iter().map(Vec::len).sum::<usize>()
            + entries.map(window::Elems::bytes).sum::<usize>();
        let control = self.control.as_ref().and_then(|c| c.save_state());
        let extra = control.as_ref().map_or(0, |c| c.bytes);
        let state = (
            (self.past.clone(), self.past_len, self.win.clone()),
            control,
        );
        Some(SavedState::new(state, bytes + extra))
    }

    fn restore_state(&mut self, state: &SavedState) -> Result<()> {
        type Request = (Vec<Vec<f32>>, usize, Option<(WindowState, WindowCache)>);
        let (request, control) = state.get::<(Request, Option<SavedState>)>()?;
        (self.past, self.past_len, self.win) = request.clone();
        match (&mut self.control, control) {
            (Some(c), Some(saved)) => c.restore_state(saved),
            _ => Ok(()),
        }
    }

    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        if let Some(c) = &mut self.control {
            c.init_cache()?;
        }
        self.reset(read_offset)
    }

    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "update_cache_offset({delta}): a GenAI decoder has no ring offset"
        )))
    }

    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        let (h, ctx, d) = self.shape();
        if let Some((st, cache)) = &self.win {
            let pad = st.geom.pad_value;
            return Ok((0..2 * self.cfg.n_layers)
                .map(|c| (c as u32, cache.view(st, c, ctx, pad)))
                .collect());
        }
        let (n, stride) = (self.past_len, self.stride());
        Ok(self
            .past
            .iter()
            .enumerate()
            .map(|(id, past)| {
                let mut st = vec![0u8; h * ctx * d * 2];
                for hh in 0..h {
                    for t in 0..n {
                        for c in 0..d {
                            let x = half::f16::from_f32(past[(hh * stride + t) * d + c]);
                            let o = ((hh * ctx + t) * d + c) * 2;
                            st[o..o + 2].copy_from_slice(&x.to_le_bytes());
                        }
                    }
                }
                (id as u32, st)
            })
            .collect())
    }

    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        if let Some(c) = &mut self.control {
            c.write_cache_buffer(cache_id, bytes)?;
        }
        let (h, ctx, d) = self.shape();
        let (n, stride) = (self.past_len, self.stride());
        if bytes.len() != h * ctx * d * 2 {
            return Err(Error::InvalidArgument(format!(
                "cache {cache_id}: {} bytes, the state is {h}×{ctx}×{d} fp16 = {} bytes",
                bytes.len(),
                h * ctx * d * 2
            )));
        }
        if cache_id as usize >= self.past.len() {
            return Err(Error::InvalidArgument(format!("no cache {cache_id}")));
        }
        if let Some((st, cache)) = &mut self.win {
            cache.write(st, cache_id as usize, ctx, bytes);
            return Ok(());
        }
        let past = &mut self.past[cache_id as usize];
        // the first past_len positions are the request's past; the rest is not part of it
        for hh in 0..h {
            for t in 0..n {
                for c in 0..d {
                    let o = ((hh * ctx + t) * d + c) * 2;
                    past[(hh * stride + t) * d + c] =
                        half::f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32();
                }
            }
        }
        Ok(())
    }
}
