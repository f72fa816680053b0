//! One ONNX Runtime session on the QNN plugin provider (feature `onnx`): the plugin registered
//! once per process, the provider's EP device chosen, the options of `qnn.rs` appended, CPU
//! fallback off unless allowed, and the provider's compile log read back for the refusal line,
//! the placement and the versions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ort::environment::Environment;
use ort::logging::LogLevel;
use ort::session::Session;

use super::qnn::{self, CompileLog, LogCapture, QnnOptions, EP_NAME, PLUGIN, QNN_BACKEND_BUILD};
use super::qnn_cache;
use super::OnnxOptions;
use crate::{Error, Result};

fn device(msg: String) -> Error {
    Error::Device(crate::error::one_line(&msg))
}

/// What a QNN session was built with and what the provider said while compiling it.
#[derive(Debug, Clone)]
pub struct QnnInfo {
    pub options: QnnOptions,
    pub log: CompileLog,
    pub fallback_allowed: bool,
    pub plugin: PathBuf,
    /// Per graph (file name): compiled this run or loaded from the context cache (qnn_cache.rs).
    pub context: Vec<(String, qnn_cache::Origin)>,
}

impl QnnInfo {
    /// "partial NPU: …" when nodes ran on the CPU (only possible with fallback allowed).
    pub fn partial(&self) -> Option<String> {
        if self.log.on_cpu.is_empty() {
            return None;
        }
        let shown: Vec<&str> = self.log.on_cpu.iter().take(6).map(String::as_str).collect();
        Some(format!(
            "partial NPU: {} node(s) ran on ONNX Runtime's CPU EP, not on QNN {} (--allow-cpu-fallback): {}{}",
            self.log.on_cpu.len(),
            self.options.backend.name(),
            shown.join(", "),
            if self.log.on_cpu.len() > shown.len() { ", …" } else { "" }
        ))
    }

    /// The decode graph's session folded into the prefill's (static-shape folders).
    pub fn merge(&mut self, other: QnnInfo) {
        self.log.on_qnn += other.log.on_qnn;
        self.log.on_cpu.extend(other.log.on_cpu);
        self.context.extend(other.context);
    }

    /// Provenance entries.
    pub fn versions(&self) -> Vec<(String, String)> {
        let placement = match self.partial() {
            Some(p) => p,
            None => format!(
                "every node on QNN {} ({} partition(s)); CPU fallback {}",
                self.options.backend.name(),
                self.log.on_qnn,
                if self.fallback_allowed {
                    "allowed, unused"
                } else {
                    "disabled"
                }
            ),
        };
        vec![
            (
                "qnn plugin".into(),
                format!(
                    "{} (onnxruntime-qnn {})",
                    self.plugin.display(),
                    qnn::QNN_WHEEL_VERSION
                ),
            ),
            (
                "qnn backend".into(),
                format!(
                    "{} ({}, build {})",
                    self.options.backend.name(),
                    self.log
                        .interface
                        .as_deref()
                        .unwrap_or("interface not logged"),
                    self.log.build.as_deref().unwrap_or("not logged")
                ),
            ),
            ("qnn options".into(), self.options.describe()),
            ("qnn placement".into(), placement),
            (
                "qnn context".into(),
                self.context
                    .iter()
                    .map(|(g, o)| format!("{g}: {}", o.describe()))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        ]
    }
}

/// Registers the plugin once per process (ONNX Runtime refuses a second registration of a name).
fn register(env: &Environment, plugin: &Path) -> Result<()> {
    static DONE: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut done = DONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match done.as_ref() {
        Some(p) if p == plugin => return Ok(()),
        Some(p) => {
            return Err(device(format!(
                "{}: this process already loaded the QNN plugin from {}",
                plugin.display(),
                p.display()
            )))
        }
        None => {}
    }
    env.register_ep_library(EP_NAME, plugin).map_err(|e| {
        device(format!(
            "{}: ONNX Runtime cannot load the QNN plugin ({e}); it needs ONNX Runtime >= 1.24.2 (scripts/fetch-onnxruntime.sh fetches {}) and the libraries of onnxruntime-qnn {} (scripts/fetch-onnxruntime-qnn.sh)",
            plugin.display(),
            super::ORT_VERSION,
            qnn::QNN_WHEEL_VERSION
        ))
    })?;
    *done = Some(plugin.to_path_buf());
    Ok(())
}

/// The graph's symbolic input axes, each with the first input that has it (the axes to fix for HTP).
fn symbolic_inputs(env: &Environment, model: &Path) -> Vec<String> {
    // on the CPU EP's device explicitly: with the plugin registered, a session without a device
    // asks the plugin for a default backend and fails
    let cpu: Vec<_> = env
        .devices()
        .filter(|d| d.ep().is_ok_and(|n| n == "CPUExecutionProvider"))
        .collect();
    let s = match Session::builder(env)
        .and_then(|b| b.with_devices(cpu, None).map_err(Into::into))
        .and_then(|mut b| b.commit_from_file(model))
    {
        Ok(s) => s,
        Err(e) => return vec![format!("(the graph's inputs unread: {e})")],
    };
    // each symbolic axis once, with the first input that carries it
    let mut axes: Vec<(String, String)> = Vec::new();
    for o in s.inputs() {
        let ort::value::ValueType::Tensor {
            shape,
            dimension_symbols,
            ..
        } = o.dtype()
        else {
            continue;
        };
        for (&d, n) in shape.iter().zip(dimension_symbols.iter()) {
            let n = if n.is_empty() { "?" } else { n.as_str() };
            if d < 0 && !axes.iter().any(|(a, _)| a == n) {
                axes.push((n.to_string(), o.name().to_string()));
            }
        }
    }
    axes.into_iter()
        .map(|(a, i)| format!("{a} (of {i})"))
        .collect()
}

/// Points fd 1 at /dev/null while it lives. QNN's HTP library prints a banner (`# LIBNATIVE: No
/// alternate configuration present …`) on the process's stdout when it loads; kvprobe's stdout
/// carries its results (`--json`) and its stderr one line per error, so the banner goes nowhere.
struct QuietStdout(Option<i32>);

impl QuietStdout {
    fn new() -> QuietStdout {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // SAFETY: plain descriptor calls on fd 1 and a fresh /dev/null, each checked
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
            if null < 0 {
                return QuietStdout(None);
            }
            let saved = libc::dup(1);
            let ok = saved >= 0 && libc::dup2(null, 1) >= 0;
            libc::close(null);
            if !ok {
                if saved >= 0 {
                    libc::close(saved);
                }
                return QuietStdout(None);
            }
            QuietStdout(Some(saved))
        }
    }
}

impl Drop for QuietStdout {
    fn drop(&mut self) {
        if let Some(saved) = self.0 {
            // SAFETY: C stdio flushed while fd 1 is still /dev/null, then fd 1 restored
            unsafe {
                libc::fflush(std::ptr::null_mut());
                libc::dup2(saved, 1);
                libc::close(saved);
            }
        }
    }
}

pub(super) fn open(
    env: &Environment,
    model: &Path,
    ep_opts: &[(String, String)],
    opts: &OnnxOptions,
) -> Result<(Session, QnnInfo)> {
    let _quiet = QuietStdout::new();
    open_quiet(env, model, ep_opts, opts)
}

fn open_quiet(
    env: &Environment,
    model: &Path,
    ep_opts: &[(String, String)],
    opts: &OnnxOptions,
) -> Result<(Session, QnnInfo)> {
    let dir = qnn::plugin_dir();
    let options = QnnOptions::resolve(&dir, ep_opts)?;
    options.check_files()?;
    let plugin = dir.join(PLUGIN);
    register(env, &plugin)?;
    let with = qnn_cache::compiled_with(
        &options,
        opts.allow_cpu_fallback,
        &super::runtime::loaded_version(),
    );
    let entry = match qnn_cache::root() {
        Some(root) => Some(qnn_cache::Entry::new(&root, &qnn_cache::key(model, &with)?)),
        None => None,
    };
    let mut rebuilt = None;
    if let Some(e) = &entry {
        match e.check() {
            Ok(Some(m)) => match open_cached(env, model, e, &m, &options, opts, &plugin) {
                Ok(found) => return Ok(found),
                Err(why) => rebuilt = Some(why),
            },
            Ok(None) => {}
            Err(why) => rebuilt = Some(why),
        }
        if rebuilt.is_some() {
            e.remove();
        }
    }
    let staging = match &entry {
        Some(e) => Some(e.staging()?),
        None => None,
    };
    let t0 = std::time::Instant::now();
    let (result, log) = compile(env, model, &options, opts, staging.as_deref())?;
    let seconds = t0.elapsed().as_secs_f64();
    let checked = qnn::check_build(&log, &dir).and_then(|()| match log.invalid.first() {
        Some(w) => Err(Error::BadOption {
            flag: "--ep-option".into(),
            detail: format!("the QNN provider ignored an option: {w}"),
        }),
        None => Ok(()),
    });
    let session = match (checked, result) {
        (Err(e), _) => Err(e),
        (Ok(()), Ok(s)) => Ok(s),
        (Ok(()), Err(e)) => Err(compile_error(env, model, &log, &options, &e.to_string())),
    };
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            if let Some(s) = &staging {
                let _ = std::fs::remove_dir_all(s);
            }
            return Err(e);
        }
    };
    let kept = match (&entry, &staging) {
        (Some(e), Some(s)) if log.on_cpu.is_empty() => {
            let m = qnn_cache::Manifest {
                format: 0, // set by seal
                key: e.key.clone(),
                model: model.display().to_string(),
                compiled_with: with,
                compile_seconds: seconds,
                partitions: log.on_qnn,
                signature: signature(&session),
                files: Vec::new(),
            };
            e.seal(s, m).map(|()| e.dir.clone())
        }
        (Some(_), Some(s)) => {
            let _ = std::fs::remove_dir_all(s);
            Err("part of the graph ran on the CPU (a partial run is never cached)".into())
        }
        _ => Err("no .cache folder (set KVPROBE_QNN_CACHE to a folder to keep it)".into()),
    };
    let context = qnn_cache::Origin::Compiled {
        seconds,
        kept,
        rebuilt,
    };
    Ok((
        session,
        QnnInfo {
            options,
            log,
            fallback_allowed: opts.allow_cpu_fallback,
            plugin,
            context: vec![(graph_name(model), context)],
        },
    ))
}

fn graph_name(model: &Path) -> String {
    model.file_name().map_or_else(
        || model.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

/// The one line for a session the provider did not build.
fn compile_error(
    env: &Environment,
    model: &Path,
    log: &CompileLog,
    options: &QnnOptions,
    msg: &str,
) -> Error {
    if !log.refused.is_empty() || msg.contains("fallback to CPU EP has been explicitly disabled") {
        let symbolic = symbolic_inputs(env, model);
        return Error::Device(qnn::fallback_line(log, &symbolic, options.backend));
    }
    Error::Io {
        path: model.to_path_buf(),
        detail: crate::error::one_line(&format!(
            "QNN {} cannot compile it: {msg}",
            options.backend.name()
        )),
    }
}

/// The session's inputs and outputs as `name: type`, what a cached context must still take.
fn signature(s: &Session) -> Vec<String> {
    let io = s.inputs().iter().map(|o| ("in", o.name(), o.dtype()));
    let io = io.chain(s.outputs().iter().map(|o| ("out", o.name(), o.dtype())));
    io.map(|(k, n, t)| format!("{k} {n}: {t:?}")).collect()
}

/// A session builder on the provider's EP device with the resolved options; with `ctx_dir`,
/// ONNX Runtime writes the EP context model (the compiled QNN context) into it.
fn compile(
    env: &Environment,
    model: &Path,
    options: &QnnOptions,
    opts: &OnnxOptions,
    ctx_dir: Option<&Path>,
) -> Result<(ort::Result<Session>, CompileLog)> {
    let capture = LogCapture::default();
    let sink = capture.clone();
    let mut builder = builder(env, options, opts, sink)?;
    if let Some(d) = ctx_dir {
        let ctx = d.join(qnn_cache::CTX_MODEL);
        let err = |e: String| device(format!("--ep qnn: EP context options: {e}"));
        builder = builder
            .with_config_entry("ep.context_enable", "1")
            .map_err(|e| err(e.to_string()))?
            .with_config_entry("ep.context_file_path", ctx.display().to_string())
            .map_err(|e| err(e.to_string()))?
            .with_config_entry("ep.context_embed_mode", "0")
            .map_err(|e| err(e.to_string()))?;
    }
    let result = builder.commit_from_file(model);
    Ok((result, CompileLog::parse(&capture.messages())))
}

fn builder(
    env: &Environment,
    options: &QnnOptions,
    opts: &OnnxOptions,
    sink: LogCapture,
) -> Result<ort::session::builder::SessionBuilder> {
    let devices: Vec<_> = env
        .devices()
        .filter(|d| d.ep().is_ok_and(|n| n == EP_NAME))
        .collect();
    if devices.is_empty() {
        return Err(device(format!(
            "{}: the QNN plugin registered but offers no device",
            options.dir.join(PLUGIN).display()
        )));
    }
    let prefixed: Vec<(String, String)> = options
        .provider
        .iter()
        .map(|(k, v)| (format!("{EP_NAME}.{k}"), v.clone()))
        .collect();
    let session_err = |e: String| device(format!("--ep qnn: session options: {e}"));
    let mut builder = Session::builder(env)
        .map_err(|e| session_err(e.to_string()))?
        .with_log_level(LogLevel::Verbose)
        .map_err(|e| session_err(e.to_string()))?
        .with_logger(Arc::new(move |_l, _c, _i, _loc, msg: &str| sink.push(msg)))
        .map_err(|e| session_err(e.to_string()))?;
    if !opts.allow_cpu_fallback {
        builder = builder
            .with_config_entry("session.disable_cpu_ep_fallback", "1")
            .map_err(|e| session_err(e.to_string()))?;
    }
    builder.with_devices(devices, Some(&prefixed)).map_err(|e| {
        device(format!(
            "--ep qnn: the QNN provider refused its options ({}): {e}",
            options.describe()
        ))
    })
}

/// The entry's context model opened on the provider: Err(why) when it cannot be (the caller
/// removes the entry and compiles again) or takes other inputs than the compiled graph did.
fn open_cached(
    env: &Environment,
    model: &Path,
    entry: &qnn_cache::Entry,
    m: &qnn_cache::Manifest,
    options: &QnnOptions,
    opts: &OnnxOptions,
    plugin: &Path,
) -> std::result::Result<(Session, QnnInfo), String> {
    let t0 = std::time::Instant::now();
    let (result, log) =
        compile(env, &entry.ctx_model(), options, opts, None).map_err(|e| e.to_string())?;
    let session = result.map_err(|e| crate::error::one_line(&format!("ONNX Runtime: {e}")))?;
    if !log.on_cpu.is_empty() {
        return Err("ONNX Runtime placed part of the cached context model on the CPU".into());
    }
    if let Some(b) = log
        .build
        .as_deref()
        .filter(|b| !b.starts_with(QNN_BACKEND_BUILD))
    {
        return Err(format!("the backend reports build {b}"));
    }
    if signature(&session) != m.signature {
        return Err("its inputs and outputs differ from the compiled graph's".into());
    }
    let log = CompileLog {
        on_qnn: m.partitions,
        ..log
    };
    let context = qnn_cache::Origin::Cached {
        entry: entry.dir.clone(),
        compile_seconds: m.compile_seconds,
        seconds: t0.elapsed().as_secs_f64(),
    };
    Ok((
        session,
        QnnInfo {
            options: options.clone(),
            log,
            fallback_allowed: opts.allow_cpu_fallback,
            plugin: plugin.to_path_buf(),
            context: vec![(graph_name(model), context)],
        },
    ))
}
