//! ONNX Runtime through `ort` (feature `onnx`): the library loaded at run time, one session of
//! the GenAI folder's `model.onnx` with the chosen execution provider, the graph's inputs checked
//! against `genai_config.json`, and one run of the default decoder.

use std::path::{Path, PathBuf};

use ort::ep::{self, ExecutionProvider};
use ort::session::Session;
use ort::value::{DynValue, TensorElementType};

use super::config::{GenaiConfig, IoNames};
use super::kv_inputs::check_kv;
use super::values::{float_value, floats, id_type, int_value, kv_value};
pub(super) use super::values::{IdType, KvType};
use super::{Ep, OnnxOptions};
use crate::{Error, Result};

/// The ONNX Runtime version `scripts/fetch-onnxruntime.sh` fetches (`ort` rc.15 needs API ≥ 31).
pub const ORT_VERSION: &str = "1.31.1";

/// Where the library is looked for: `ORT_DYLIB_PATH` (ort's own variable), else
/// `.cache/onnxruntime/libonnxruntime.so.<ver>` in the working folder or above the executable
/// (target/<profile>/kvprobe sits two levels under the checkout).
pub fn library_path() -> PathBuf {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return PathBuf::from(p);
    }
    let rel = PathBuf::from(".cache/onnxruntime").join(format!("libonnxruntime.so.{ORT_VERSION}"));
    crate::cache_lookup::near_checkout(&rel, Path::is_file).unwrap_or(rel)
}

pub(super) fn device(msg: String) -> Error {
    Error::Device(crate::error::one_line(&msg))
}

/// The process's one environment (ONNX Runtime allows one per process): loads the library
/// (`ort` keeps the first it loads) and builds it on first use; later devices share it.
pub(super) fn environment() -> Result<ort::environment::Environment> {
    static ENV: std::sync::Mutex<Option<ort::environment::Environment>> =
        std::sync::Mutex::new(None);
    let mut env = ENV
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(e) = env.as_ref() {
        return Ok(e.clone());
    }
    let e = new_environment()?;
    *env = Some(e.clone());
    Ok(e)
}

fn new_environment() -> Result<ort::environment::Environment> {
    let lib = library_path();
    if !lib.is_file() {
        return Err(device(format!(
            "{}: libonnxruntime not found; run scripts/fetch-onnxruntime.sh (or set ORT_DYLIB_PATH to an ONNX Runtime {ORT_VERSION}+ library)",
            lib.display()
        )));
    }
    let builder = ort::init_from(&lib).map_err(|e| {
        device(format!(
            "{}: cannot load ONNX Runtime ({e}); kvprobe needs ONNX Runtime {ORT_VERSION}+, scripts/fetch-onnxruntime.sh fetches it",
            lib.display()
        ))
    })?;
    let env = builder
        .with_name("kvprobe")
        .build()
        .map_err(|e| device(format!("ONNX Runtime environment: {e}")))?;
    // a failed run's status already carries the runtime's message into kvprobe's one-line
    // error: its own log line would be a second, coloured line on stderr (ORT_LOG still wins)
    if std::env::var_os("ORT_LOG").is_none() {
        env.set_log_level(ort::logging::LogLevel::Fatal);
    }
    Ok(env)
}

/// What the loaded library says it is: the release branch of its build info
/// (`git-branch=rel-1.31.1` → `1.31.1`) and commit, else the branch and commit, else the first
/// line of the info as is. Never
/// fatal: a library that answers with a non-UTF-8 string is reported as such.
pub fn loaded_version() -> String {
    let Ok(info) = std::panic::catch_unwind(ort::info) else {
        return "unknown (the library's build info is not UTF-8)".into();
    };
    let field = |key: &str| {
        info.split(',').map(str::trim).find_map(|f| {
            f.split_once('=')
                .filter(|(k, _)| k.ends_with(key))
                .map(|(_, v)| v.trim())
        })
    };
    // a release build names its version in the branch; a wheel built from a tag says HEAD,
    // and the library's file name (provenance's "onnxruntime library") carries the version
    match (field("git-branch"), field("git-commit-id")) {
        (Some(b), c) if b.starts_with("rel-") => format!(
            "{}{}",
            &b["rel-".len()..],
            c.map_or(String::new(), |c| format!(" (commit {c})"))
        ),
        (b, Some(c)) => format!("build of branch {}, commit {c}", b.unwrap_or("?")),
        _ => info
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect(),
    }
}

fn with_options<E: ep::ArbitrarilyConfigurableExecutionProvider>(
    mut e: E,
    opts: &[(String, String)],
) -> E {
    for (k, v) in opts {
        e = e.with_arbitrary_config(k, v);
    }
    e
}

/// The execution provider as a dispatch that fails loudly (`ort` otherwise falls back to the CPU
/// silently, contract doc §6), after asking the library whether it was built with it.
fn provider(
    ep_kind: Ep,
    opts: &[(String, String)],
) -> Result<Option<ep::ExecutionProviderDispatch>> {
    let (available, dispatch) = match ep_kind {
        Ep::Cpu => return Ok(None),
        // the plugin library of onnxruntime-qnn, through the EP-device API (qnn_session.rs)
        Ep::Qnn => return Ok(None),
        Ep::OpenVino => (
            ep::OpenVINO::is_available(),
            with_options(ep::OpenVINO::default(), opts).build(),
        ),
        Ep::VitisAi => (
            ep::Vitis::is_available(),
            with_options(ep::Vitis::default(), opts).build(),
        ),
        Ep::CoreMl => (
            ep::CoreML::is_available(),
            with_options(ep::CoreML::default(), opts).build(),
        ),
    };
    match available {
        Ok(true) => Ok(Some(dispatch.error_on_failure())),
        Ok(false) => Err(device(format!(
            "--ep {}: {} was built without the {} execution provider; install an ONNX Runtime build that has it (e.g. the onnxruntime-qnn / onnxruntime-openvino / Ryzen AI packages) and set ORT_DYLIB_PATH",
            ep_kind.name(),
            library_path().display(),
            ep_kind.ort_name()
        ))),
        Err(e) => Err(device(format!("--ep {}: {e}", ep_kind.name()))),
    }
}

pub(super) struct Runtime {
    session: Session,
    pub(super) kv: KvType,
    names: IoNames,
    layers: usize,
    heads: usize,
    hd: usize,
    ids: IdType,
    /// attention_mask and position_ids share one type (G:pos).
    positions: IdType,
    /// The graph takes `position_ids` (GenAI feeds it only then, G:pos `has_posid_input_`; the
    /// builder's GroupQueryAttention exports derive positions from the mask's lengths instead).
    pub(super) has_positions: bool,
    /// Every past input's sequence dim is the same fixed number: GenAI then forces the shared
    /// buffer at that length (G:kv `DetectAndConfigureFixedKvShape`).
    pub(super) fixed_seq: Option<usize>,
    inputs: Vec<String>,
    /// Static-shape folders: the decode graph (one token); `session` is then the prefill graph.
    decode: Option<Session>,
    /// `--ep qnn`: what the provider compiled and with which options (provenance, warnings).
    pub(super) qnn: Option<super::qnn_session::QnnInfo>,
    /// Graph-run time so far: (runs, seconds) of multi-token runs and of one-token runs.
    pub(super) times: [(usize, f64); 2],
}

impl Runtime {
    /// The runtime that ran the graph, for the provenance: a bug write-up needs its exact build
    /// and provider.
    pub(super) fn versions(&self, ep: Ep) -> Vec<(String, String)> {
        let lib = library_path();
        let mut v: Vec<(String, String)> = vec![
            ("onnxruntime".into(), loaded_version()),
            (
                "onnxruntime library".into(),
                std::fs::canonicalize(&lib)
                    .unwrap_or(lib)
                    .display()
                    .to_string(),
            ),
            ("execution provider".into(), ep.name().to_string()),
            (
                "host side".into(),
                format!(
                    "kvprobe-npu {} (GenAI's generator rules, docs/onnx-genai.md)",
                    env!("CARGO_PKG_VERSION")
                ),
            ),
        ];
        if let Some(q) = &self.qnn {
            v.extend(q.versions());
        }
        v
    }

    pub(super) fn open(dir: &Path, cfg: &GenaiConfig, opts: &OnnxOptions) -> Result<Runtime> {
        let model = dir.join(&cfg.filename);
        if !model.is_file() {
            return Err(Error::Io {
                path: model,
                detail: "missing; genai_config.json names it as decoder.filename".into(),
            });
        }
        let env = environment()?;
        let mut ep_opts = cfg
            .provider_options
            .iter()
            .filter(|(ep, _)| opts.ep.config_names().contains(&ep.as_str()))
            .flat_map(|(_, kv)| kv.clone())
            .collect::<Vec<_>>();
        ep_opts.extend(opts.ep_options.iter().cloned());
        let graphs = super::static_graphs::StaticGraphs::load(
            dir,
            cfg.window.as_ref().map(|w| w.window_size),
            cfg.context_length,
        )?;
        let Some(graphs) = graphs else {
            let (session, qnn) = Self::session(&env, &model, &ep_opts, opts)?;
            let mut rt = Self::checked(session, cfg, &model)?;
            rt.qnn = qnn;
            return Ok(rt);
        };
        // static shapes: the prompt chunks on the prefill graph, the tokens on the decode graph
        let (session, qnn) = Self::session(&env, &graphs.prefill, &ep_opts, opts)?;
        let mut rt = Self::checked(session, cfg, &graphs.prefill)?;
        let (decode, dq) = Self::session(&env, &graphs.decode, &ep_opts, opts)?;
        let decode = Self::checked(decode, cfg, &graphs.decode)?.session;
        rt.qnn = match (qnn, dq) {
            (Some(mut p), Some(d)) => {
                p.merge(d);
                Some(p)
            }
            (p, d) => p.or(d),
        };
        rt.decode = Some(decode);
        Ok(rt)
    }

    /// One session of `model` on the chosen execution provider (QNN: the plugin, qnn_session.rs).
    fn session(
        env: &ort::environment::Environment,
        model: &Path,
        ep_opts: &[(String, String)],
        opts: &OnnxOptions,
    ) -> Result<(Session, Option<super::qnn_session::QnnInfo>)> {
        if let Some(line) = super::graph_ops::qdq_refusal(model)? {
            return Err(Error::Io {
                path: model.to_path_buf(),
                detail: line,
            });
        }
        if opts.ep == Ep::Qnn {
            let (s, info) = super::qnn_session::open(env, model, ep_opts, opts, &loaded_version())?;
            return Ok((s, Some(info)));
        }
        let mut builder =
            Session::builder(env).map_err(|e| device(format!("session options: {e}")))?;
        if opts.as_written {
            // the CPU EP otherwise rewrites a QDQ graph's weight MatMuls into MatMulNBits with
            // int8 inputs (docs/qnn.md, "The 0.006 on SmolLM2"): level 1 keeps them as written;
            // on the CPU EP's device explicitly: beside a device on the QNN plugin, a session
            // without a device asks the plugin for a default backend and fails
            let cpu: Vec<_> = env
                .devices()
                .filter(|d| d.ep().is_ok_and(|n| n == "CPUExecutionProvider"))
                .collect();
            builder = builder
                .with_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
                .map_err(|e| device(format!("session options: {e}")))?
                .with_devices(cpu, None)
                .map_err(|e| device(format!("session options: the CPU EP's device: {e}")))?;
        }
        if let Some(d) = provider(opts.ep, ep_opts)? {
            builder = builder.with_execution_providers([d]).map_err(|e| {
                device(format!(
                    "--ep {}: the execution provider failed to register ({e})",
                    opts.ep.name()
                ))
            })?;
        }
        let session = builder
            .commit_from_file(model)
            .map_err(|e| super::open_checks::load_failure(model, &e))?;
        Ok((session, None))
    }

    /// The graph against the config: every name GenAI feeds is a graph input, KV inputs are
    /// float32 `[B, H, S, D]` with the config's H and D where the graph fixes them (G:kv).
    fn checked(session: Session, cfg: &GenaiConfig, model: &Path) -> Result<Runtime> {
        let inputs: Vec<String> = session
            .inputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        let find = |name: &str| session.inputs().iter().find(|o| o.name() == name);
        let missing =
            |name: &str| Error::Io {
                path: cfg.path.clone(),
                detail: format!(
                "names input `{name}`, which {} does not have (its inputs: {}); fix decoder.inputs",
                model.display(),
                inputs.iter().take(6).cloned().collect::<Vec<_>>().join(", ")
            ),
            };
        let n = &cfg.names;
        let ids_in = find(&n.input_ids).ok_or_else(|| missing(&n.input_ids))?;
        let mask_in = find(&n.attention_mask).ok_or_else(|| missing(&n.attention_mask))?;
        let ids = id_type(ids_in.dtype(), &n.input_ids, model)?;
        let positions = id_type(mask_in.dtype(), &n.attention_mask, model)?;
        let has_positions = find(&n.position_ids).is_some();
        // the windowed cache (b) always gets positions (G:pos WindowedPositionInputs)
        if !has_positions && cfg.window.is_some() {
            return Err(missing(&n.position_ids));
        }
        for l in 0..cfg.n_layers {
            for t in [&n.past_key, &n.past_value] {
                let name = IoNames::layer(t, l);
                let o = find(&name).ok_or_else(|| missing(&name))?;
                check_kv(o.dtype(), &name, cfg, model, t == &n.past_key)?;
            }
        }
        let extra = IoNames::layer(&n.past_key, cfg.n_layers);
        if find(&extra).is_some() {
            return Err(Error::Io {
                path: cfg.path.clone(),
                detail: format!(
                    "num_hidden_layers is {} but {} has input `{extra}` too; fix the config",
                    cfg.n_layers,
                    model.display()
                ),
            });
        }
        let fed = |name: &str| {
            [&n.input_ids, &n.attention_mask, &n.position_ids].contains(&&name.to_string())
                || (0..cfg.n_layers).any(|l| {
                    name == IoNames::layer(&n.past_key, l)
                        || name == IoNames::layer(&n.past_value, l)
                })
        };
        // GenAI's default decoder feeds these inputs only; another (inputs_embeds of an
        // exclude_embeds export, cache_indirection, a quantised cache's scales, …) would be
        // left unfed or fed by a rule kvprobe does not compute
        if let Some(other) = inputs.iter().find(|i| !fed(i)) {
            return Err(Error::Io {
                path: model.to_path_buf(),
                detail: format!(
                    "graph input `{other}` is not one kvprobe feeds (input_ids, attention_mask, position_ids, the past K/V of genai_config.json's names); re-export without the option that adds it (e.g. the builder's exclude_embeds or a quantised KV cache)"
                ),
            });
        }
        let first = IoNames::layer(&n.past_key, 0);
        let kv = match find(&first).and_then(|o| o.dtype().tensor_type()) {
            Some(TensorElementType::Uint8) => KvType::U8,
            Some(TensorElementType::Float16) => KvType::F16,
            Some(TensorElementType::Bfloat16) => KvType::Bf16,
            _ => KvType::F32,
        };
        let seq_dims: Vec<i64> = (0..cfg.n_layers)
            .map(|l| {
                find(&IoNames::layer(&n.past_key, l))
                    .and_then(|o| o.dtype().tensor_shape().map(|s| s.to_vec()))
                    .and_then(|d| d.get(2).copied())
                    .unwrap_or(-1)
            })
            .collect();
        let fixed_seq = match seq_dims.first() {
            Some(&s) if cfg.window.is_none() && s > 0 && seq_dims.iter().all(|&x| x == s) => {
                Some(s as usize)
            }
            _ => None,
        };
        Ok(Runtime {
            session,
            kv,
            names: cfg.names.clone(),
            layers: cfg.n_layers,
            heads: cfg.n_kv_heads,
            hd: cfg.head_size,
            ids,
            positions,
            has_positions,
            fixed_seq,
            inputs,
            decode: None,
            qnn: None,
            times: [(0, 0.0); 2],
        })
    }

    /// One run of the default decoder: `ids` new tokens; `past[c]` = `[H, past_seq, D]` for cache
    /// c = 2l (K), 2l + 1 (V), held as f32 (an f16 / bf16 cache round-trips through f32 exactly)
    /// and fed in the graph's KV type. `past_seq` is the request's length with separate buffers
    /// and the buffer's length with a shared one. Returns the last row's logits, the presents
    /// (`[H, present_seq, D]` as f32) and `present_seq`.
    pub(super) fn run(
        &mut self,
        ids: &[u32],
        mask: &[i64],
        positions: &[i64],
        past: &[Vec<f32>],
        past_seq: usize,
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>, usize)> {
        let s = ids.len();
        let mut feed: Vec<(String, DynValue)> = Vec::with_capacity(3 + past.len());
        let ids64: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        feed.push((
            self.names.input_ids.clone(),
            int_value(self.ids, &[1, s], &ids64)?,
        ));
        feed.push((
            self.names.attention_mask.clone(),
            int_value(self.positions, &[1, mask.len()], mask)?,
        ));
        if self.has_positions {
            feed.push((
                self.names.position_ids.clone(),
                int_value(self.positions, &[1, s], positions)?,
            ));
        }
        let shape = [1usize, self.heads, past_seq, self.hd];
        for l in 0..self.layers {
            for (t, c) in [
                (&self.names.past_key, 2 * l),
                (&self.names.past_value, 2 * l + 1),
            ] {
                feed.push((IoNames::layer(t, l), float_value(self.kv, shape, &past[c])?));
            }
        }
        let t0 = std::time::Instant::now();
        let out = self.session.run(feed).map_err(ort_err)?;
        timed(&mut self.times, s, t0);
        let (lshape, logits) = floats(
            out.get(&self.names.logits).ok_or_else(|| {
                device(format!("the graph has no output `{}`", self.names.logits))
            })?,
            &self.names.logits,
        )?;
        let vocab = *lshape.last().unwrap_or(&0) as usize;
        if vocab == 0 || logits.len() < vocab {
            return Err(device(format!("logits of shape {lshape:?}")));
        }
        let last = logits[logits.len() - vocab..].to_vec();
        let mut presents = Vec::with_capacity(2 * self.layers);
        let mut present_seq = None;
        for l in 0..self.layers {
            for t in [&self.names.present_key, &self.names.present_value] {
                let name = IoNames::layer(t, l);
                let (shape, v) = floats(
                    out.get(&name)
                        .ok_or_else(|| device(format!("the graph has no output `{name}`")))?,
                    &name,
                )?;
                let ok = shape.len() == 4
                    && shape[0] == 1
                    && shape[1] as usize == self.heads
                    && shape[3] as usize == self.hd
                    && present_seq.is_none_or(|p| p == shape[2] as usize);
                if !ok {
                    return Err(device(format!(
                        "output `{name}` has shape {shape:?}, not [1, {}, S, {}] like the other presents",
                        self.heads, self.hd
                    )));
                }
                present_seq = Some(shape[2] as usize);
                presents.push(v);
            }
        }
        Ok((last, presents, present_seq.unwrap_or(0)))
    }

    /// One run of convention (b): `past[c]` is cache c's past input as the graph takes it (K
    /// `[H, 1, D, P]`, V `[H, 1, P, D]`). Returns the last row's logits and the presents (K
    /// `[H, 1, D, q]`, V `[H, 1, q, D]`) in the cache's type.
    pub(super) fn run_window(
        &mut self,
        plan: &super::window::RunPlan,
        past: &[super::window::Elems],
    ) -> Result<(Vec<f32>, Vec<super::window::Elems>)> {
        let q = plan.ids.len();
        let p = plan.past_len;
        let ids: Vec<i64> = plan.ids.iter().map(|&i| i64::from(i)).collect();
        let mask: Vec<i64> = plan.mask.iter().map(|&m| i64::from(m)).collect();
        let mut feed: Vec<(String, DynValue)> = vec![
            (
                self.names.input_ids.clone(),
                int_value(self.ids, &[1, q], &ids)?,
            ),
            (
                self.names.attention_mask.clone(),
                int_value(self.positions, &[1, mask.len()], &mask)?,
            ),
            (
                self.names.position_ids.clone(),
                int_value(self.positions, &[1, q], &plan.positions)?,
            ),
        ];
        for l in 0..self.layers {
            let (k, v) = (&past[2 * l], &past[2 * l + 1]);
            feed.push((
                IoNames::layer(&self.names.past_key, l),
                kv_value([self.heads, 1, self.hd, p], k)?,
            ));
            feed.push((
                IoNames::layer(&self.names.past_value, l),
                kv_value([self.heads, 1, p, self.hd], v)?,
            ));
        }
        let session = match &mut self.decode {
            Some(d) if q == 1 => d,
            _ => &mut self.session,
        };
        let t0 = std::time::Instant::now();
        let out = session.run(feed).map_err(ort_err)?;
        timed(&mut self.times, q, t0);
        let (lshape, logits) = out
            .get(&self.names.logits)
            .ok_or_else(|| device(format!("the graph has no output `{}`", self.names.logits)))?
            .try_extract_tensor::<f32>()
            .map_err(ort_err)?;
        let vocab = *lshape.last().unwrap_or(&0) as usize;
        if vocab == 0 || logits.len() < vocab {
            return Err(device(format!("logits of shape {lshape:?}")));
        }
        let last = logits[logits.len() - vocab..].to_vec();
        let mut presents = Vec::with_capacity(2 * self.layers);
        for l in 0..self.layers {
            for t in [&self.names.present_key, &self.names.present_value] {
                let name = IoNames::layer(t, l);
                let o = out
                    .get(&name)
                    .ok_or_else(|| device(format!("the graph has no output `{name}`")))?;
                presents.push(match self.kv {
                    KvType::U8 => super::window::Elems::U8(
                        o.try_extract_tensor::<u8>().map_err(ort_err)?.1.to_vec(),
                    ),
                    _ => super::window::Elems::F32(
                        o.try_extract_tensor::<f32>().map_err(ort_err)?.1.to_vec(),
                    ),
                });
            }
        }
        Ok((last, presents))
    }

    pub(super) fn inputs(&self) -> &[String] {
        &self.inputs
    }
}

/// Adds a graph run of `tokens` tokens that started at `t0` to the run times.
fn timed(times: &mut [(usize, f64); 2], tokens: usize, t0: std::time::Instant) {
    let t = &mut times[usize::from(tokens == 1)];
    t.0 += 1;
    t.1 += t0.elapsed().as_secs_f64();
}

fn ort_err(e: ort::Error) -> Error {
    device(format!("ONNX Runtime: {e}"))
}
