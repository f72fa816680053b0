//! `--ep qnn`: Qualcomm's QNN execution provider as the plugin library the registries'
//! `onnxruntime-qnn` wheel ships (`scripts/fetch-onnxruntime-qnn.sh`), registered with ONNX Runtime
//! through the EP-device API (`RegisterExecutionProviderLibrary`,
//! `SessionOptionsAppendExecutionProvider_V2`). The options the provider takes are resolved
//! here (backend → library, the HTP defaults), and what the provider logs while it compiles is
//! read back: the nodes it could not take, the QNN / HTP versions it loaded.
//!
//! CPU fallback is off unless asked for (`session.disable_cpu_ep_fallback`): a graph that does
//! not compile entirely on the NPU is refused in one line naming the nodes, and an allowed
//! partial run is marked "partial NPU" in every output (`OnnxDevice::warnings`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::{Error, Result};

/// The pinned wheel (`scripts/fetch-onnxruntime-qnn.sh`).
pub const QNN_WHEEL_VERSION: &str = "2.7.0";
/// The QNN SDK build of that wheel's backends (what `libQnnHtp.so` reports as its build); a
/// library of another build is refused: the options and the fp16 behaviour documented for
/// the pinned one are what kvprobe was checked against.
pub const QNN_BACKEND_BUILD: &str = "v2.51.0";
/// ONNX Runtime's name of the provider (the EP devices' `ep` and the options' prefix).
pub const EP_NAME: &str = "QNNExecutionProvider";

/// Folder holding the plugin and the backends: `KVPROBE_QNN_DIR`, else
/// `.cache/onnxruntime-qnn/<ver>/onnxruntime_qnn` in the working folder or above the executable.
pub fn plugin_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("KVPROBE_QNN_DIR") {
        let p = PathBuf::from(p);
        return std::fs::canonicalize(&p).unwrap_or(p);
    }
    let rel = PathBuf::from(".cache/onnxruntime-qnn")
        .join(QNN_WHEEL_VERSION)
        .join("onnxruntime_qnn");
    // absolute: ONNX Runtime resolves a relative plugin path against its own library's folder
    crate::cache_lookup::near_checkout(&rel, Path::is_dir)
        .and_then(|p| std::fs::canonicalize(p).ok())
        .unwrap_or(rel)
}

pub const PLUGIN: &str = "libonnxruntime_providers_qnn.so";

/// The QNN backend a session compiles for (`backend` option: htp default, cpu, gpu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QnnBackend {
    Htp,
    Cpu,
    Gpu,
}

impl QnnBackend {
    fn parse(s: &str) -> Result<QnnBackend> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "htp" | "npu" => QnnBackend::Htp,
            "cpu" => QnnBackend::Cpu,
            "gpu" => QnnBackend::Gpu,
            _ => {
                return Err(Error::BadOption {
                    flag: format!("--ep-option backend={s}"),
                    detail: "unknown QNN backend; use htp (default), cpu or gpu".into(),
                })
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            QnnBackend::Htp => "htp",
            QnnBackend::Cpu => "cpu",
            QnnBackend::Gpu => "gpu",
        }
    }

    fn library(self) -> &'static str {
        match self {
            QnnBackend::Htp => "libQnnHtp.so",
            QnnBackend::Cpu => "libQnnCpu.so",
            QnnBackend::Gpu => "libQnnGpu.so",
        }
    }
}

/// HTP defaults kvprobe sets unless the user gives them: a float graph runs in fp16 (HTP has no
/// fp32 arithmetic), and the provider refuses fp16 without `soc_model` and `htp_arch`; 73 / 60
/// are the v73 HTP of a Snapdragon 8 Gen 2 class SoC, which the simulator implements.
const HTP_DEFAULTS: [(&str, &str); 3] = [
    ("htp_arch", "73"),
    ("soc_model", "60"),
    ("enable_htp_fp16_precision", "1"),
];

/// HTP architectures the x86 simulator of the pinned wheel accepts (QNN's `QnnHtpDevice_Arch_t`
/// values); the provider only warns about another and compiles for its default.
const HTP_ARCHES: [&str; 6] = ["68", "69", "73", "75", "79", "81"];

/// The provider options of one session, resolved: `backend` (kvprobe's key) turned into the
/// backend library's path, the HTP defaults added, everything else passed as is.
#[derive(Debug, Clone, PartialEq)]
pub struct QnnOptions {
    pub backend: QnnBackend,
    pub dir: PathBuf,
    /// As handed to the provider (keys without the `QNNExecutionProvider.` prefix).
    pub provider: Vec<(String, String)>,
}

impl QnnOptions {
    pub fn resolve(dir: &Path, opts: &[(String, String)]) -> Result<QnnOptions> {
        let mut backend = QnnBackend::Htp;
        let mut provider: Vec<(String, String)> = Vec::new();
        for (k, v) in opts {
            match k.as_str() {
                "backend" | "backend_type" => backend = QnnBackend::parse(v)?,
                _ => {
                    provider.retain(|(pk, _)| pk != k);
                    provider.push((k.clone(), v.clone()));
                }
            }
        }
        let has = |p: &[(String, String)], k: &str| p.iter().any(|(pk, _)| pk == k);
        if backend == QnnBackend::Htp {
            for (k, v) in HTP_DEFAULTS {
                if !has(&provider, k) {
                    provider.push((k.into(), v.into()));
                }
            }
            if let Some((_, a)) = provider.iter().find(|(k, _)| k == "htp_arch") {
                if !HTP_ARCHES.contains(&a.as_str()) {
                    return Err(Error::BadOption {
                        flag: format!("--ep-option htp_arch={a}"),
                        detail: format!(
                            "the HTP backend of onnxruntime-qnn {QNN_WHEEL_VERSION} has no architecture v{a}; use one of {}",
                            HTP_ARCHES.join(", ")
                        ),
                    });
                }
            }
        }
        if !has(&provider, "backend_path") {
            provider.push((
                "backend_path".into(),
                dir.join(backend.library()).display().to_string(),
            ));
        }
        Ok(QnnOptions {
            backend,
            dir: dir.to_path_buf(),
            provider,
        })
    }

    /// The libraries the session needs, present, else one line naming the missing one.
    pub fn check_files(&self) -> Result<()> {
        let plugin = self.dir.join(PLUGIN);
        let backend = self
            .provider
            .iter()
            .find(|(k, _)| k == "backend_path")
            .map(|(_, v)| PathBuf::from(v))
            .unwrap_or_else(|| self.dir.join(self.backend.library()));
        for (f, what) in [
            (plugin, "the QNN execution provider plugin"),
            (backend, "the QNN backend"),
        ] {
            if !f.is_file() {
                let hint = if self.backend == QnnBackend::Cpu {
                    format!(" (the onnxruntime-qnn {QNN_WHEEL_VERSION} wheel ships no QNN CPU backend; use backend=htp or gpu)")
                } else {
                    String::new()
                };
                return Err(Error::Device(format!(
                    "{}: {what} not found{hint}; run scripts/fetch-onnxruntime-qnn.sh (or set KVPROBE_QNN_DIR to a folder holding {PLUGIN} and the libQnn*.so backends of onnxruntime-qnn {QNN_WHEEL_VERSION})",
                    f.display()
                )));
            }
        }
        Ok(())
    }

    /// HTP computing a float graph in fp16 (`enable_htp_fp16_precision=1`, the default).
    pub fn htp_fp16(&self) -> bool {
        self.backend == QnnBackend::Htp
            && self
                .provider
                .iter()
                .any(|(k, v)| k == "enable_htp_fp16_precision" && v == "1")
    }

    /// `key=value, …` for the provenance (paths shortened to their file name).
    pub fn describe(&self) -> String {
        self.provider
            .iter()
            .map(|(k, v)| {
                let v = if k.ends_with("_path") {
                    Path::new(v)
                        .file_name()
                        .map_or(v.clone(), |f| f.to_string_lossy().into_owned())
                } else {
                    v.clone()
                };
                format!("{k}={v}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What the provider and ONNX Runtime log while a session is built: kept messages only (the
/// ones this module reads), at most [`LogCapture::MAX`].
#[derive(Debug, Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<String>>>);

impl LogCapture {
    const MAX: usize = 4000;
    const KEEP: [&'static str; 7] = [
        "Validation FAILED",
        "Unsupported nodes",
        "placed on [",
        "interface version",
        "Backend build version",
        "Invalid",
        "fallback",
    ];

    pub fn push(&self, msg: &str) {
        if !Self::KEEP.iter().any(|k| msg.contains(k)) {
            return;
        }
        let mut v = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if v.len() < Self::MAX {
            v.push(msg.to_string());
        }
    }

    pub fn messages(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// What the log says about one session build.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompileLog {
    /// Nodes the provider refused: `OpType name (reason)`.
    pub refused: Vec<String>,
    /// Nodes ONNX Runtime placed on the CPU EP (with fallback allowed): `OpType (name)`.
    pub on_cpu: Vec<String>,
    /// Nodes ONNX Runtime placed on QNN (its own count, fused nodes count once).
    pub on_qnn: usize,
    /// `HTP_QTI_AISW interface 2.40.0`
    pub interface: Option<String>,
    /// `v2.51.0.260929181845`
    pub build: Option<String>,
    /// The provider's warnings about an option it ignored (`Invalid HTP architecture: 99`).
    pub invalid: Vec<String>,
}

impl CompileLog {
    pub fn parse(messages: &[String]) -> CompileLog {
        let mut out = CompileLog::default();
        for m in messages {
            if m.contains("Validation FAILED") {
                // "Validation FAILED for 1 nodes in OrtNodeUnit (MatMul) :\n\tOperator type:
                // MatMul Node name: mm Node index: 0\n\tREASON : Cannot get shape"
                let mut ty = "";
                let mut name = "";
                for line in m.lines().map(str::trim) {
                    if let Some(rest) = line.strip_prefix("Operator type:") {
                        let (t, r) = rest.split_once("Node name:").unwrap_or((rest, ""));
                        ty = t.trim();
                        name = r.split("Node index:").next().unwrap_or("").trim();
                    } else if let Some(reason) = line.strip_prefix("REASON :") {
                        out.refused.push(format!("{ty} {name} ({})", reason.trim()));
                    }
                }
            } else if let Some(rest) = m.split("Unsupported nodes in QNN EP:").nth(1) {
                // "{ name: erf, type: Erf }" — kept only when no validation line named it
                for item in rest.split('}') {
                    let f = |k: &str| {
                        item.split(k)
                            .nth(1)
                            .map(|s| s.split(',').next().unwrap_or("").trim().to_string())
                    };
                    if let (Some(n), Some(t)) = (f("name:"), f("type:")) {
                        let t = t.trim_end_matches('}').trim().to_string();
                        if !out.refused.iter().any(|r| r.contains(&format!(" {n} "))) {
                            out.refused.push(format!("{t} {n} (unsupported op)"));
                        }
                    }
                }
            } else if m.contains("placed on [CPUExecutionProvider]") {
                out.on_cpu.extend(
                    m.lines()
                        .skip(1)
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_string),
                );
                if out.on_cpu.is_empty() {
                    out.on_cpu.push(m.trim().to_string());
                }
            } else if m.contains(&format!("placed on [{EP_NAME}]")) {
                out.on_qnn += m
                    .rsplit("Number of nodes:")
                    .next()
                    .and_then(|s| s.split_whitespace().next())
                    .and_then(|s| s.parse::<usize>().ok())
                    .unwrap_or(0);
            } else if let Some(rest) = m.split("interface version:").nth(1) {
                // "… interface version: 2.40.0 backend provider name: HTP_QTI_AISW backend id: 6"
                let ver = rest.split_whitespace().next().unwrap_or("?");
                let name = rest
                    .split("backend provider name:")
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next());
                if out.interface.is_none() || name.is_some() {
                    out.interface = Some(match name {
                        Some(n) => format!("{n} interface {ver}"),
                        None => format!("interface {ver}"),
                    });
                }
            } else if let Some(rest) = m.split("Backend build version:").nth(1) {
                out.build = Some(rest.trim().to_string());
            } else if m.contains("Invalid") && !m.contains("fallback") {
                out.invalid.push(m.trim().to_string());
            }
        }
        out.refused.dedup();
        out
    }
}

/// The one line for a graph that does not compile entirely on the NPU: the refused nodes (the
/// first few, and how many), and for shapes the provider could not get, the graph inputs whose
/// symbolic axes to fix.
pub fn fallback_line(log: &CompileLog, symbolic: &[String], backend: QnnBackend) -> String {
    const SHOWN: usize = 4;
    let mut nodes: Vec<String> = log.refused.iter().take(SHOWN).cloned().collect();
    if log.refused.len() > SHOWN {
        nodes.push(format!("… {} more", log.refused.len() - SHOWN));
    }
    let what = if nodes.is_empty() {
        "some nodes (the provider named none)".to_string()
    } else {
        format!("{} node(s): {}", log.refused.len(), nodes.join(", "))
    };
    let shapes = log.refused.iter().any(|r| r.contains("Cannot get shape"));
    let fix = if shapes && !symbolic.is_empty() {
        format!(
            "; QNN {} needs static shapes: fix the symbolic axes {} (scripts/export-onnx.sh --static, docs/qnn.md)",
            backend.name(),
            symbolic.join(", ")
        )
    } else {
        String::new()
    };
    format!(
        "--ep qnn: the graph does not compile entirely on QNN {}: {what} would fall back to the CPU{fix}; --allow-cpu-fallback runs it anyway, marked partial NPU",
        backend.name()
    )
}

/// The backend build check: a library of another QNN build than the pinned wheel's is refused.
pub fn check_build(log: &CompileLog, dir: &Path) -> Result<()> {
    match &log.build {
        Some(b) if !b.starts_with(QNN_BACKEND_BUILD) => Err(Error::Device(format!(
            "{}: QNN backend build {b}, kvprobe is pinned to {QNN_BACKEND_BUILD} (onnxruntime-qnn {QNN_WHEEL_VERSION}); run scripts/fetch-onnxruntime-qnn.sh or point KVPROBE_QNN_DIR at that wheel's libraries",
            dir.display()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_resolve_backend_defaults_and_refuse_unknown_arches() {
        let dir = Path::new("/q");
        let o = QnnOptions::resolve(dir, &[]).unwrap();
        assert_eq!(o.backend, QnnBackend::Htp);
        assert_eq!(
            o.describe(),
            "htp_arch=73, soc_model=60, enable_htp_fp16_precision=1, backend_path=libQnnHtp.so"
        );
        let o = QnnOptions::resolve(
            dir,
            &[
                ("backend".into(), "gpu".into()),
                ("foo".into(), "1".into()),
                ("foo".into(), "2".into()),
            ],
        )
        .unwrap();
        assert_eq!(o.describe(), "foo=2, backend_path=libQnnGpu.so");
        let o = QnnOptions::resolve(dir, &[("htp_arch".into(), "75".into())]).unwrap();
        assert!(o.describe().starts_with("htp_arch=75, soc_model=60"));
        let e = QnnOptions::resolve(dir, &[("htp_arch".into(), "99".into())]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--ep-option htp_arch=99: the HTP backend of onnxruntime-qnn 2.7.0 has no architecture v99; use one of 68, 69, 73, 75, 79, 81"
        );
        assert!(QnnOptions::resolve(dir, &[("backend".into(), "dsp".into())]).is_err());
        let e = QnnOptions::resolve(dir, &[("backend".into(), "cpu".into())])
            .unwrap()
            .check_files()
            .unwrap_err();
        assert!(e.to_string().contains("ships no QNN CPU backend"), "{e}");
    }

    #[test]
    fn the_compile_log_names_refused_nodes_placement_and_versions() {
        // messages as ONNX Runtime 1.31 and the onnxruntime-qnn 2.7.0 plugin log them
        let msgs: Vec<String> = [
            "/x/libQnnHtp.so interface version: 2.40.0 backend provider name: HTP_QTI_AISW backend id: 6",
            "Backend build version: v2.51.0.260929181845",
            "Validation FAILED for 1 nodes in OrtNodeUnit (MatMul) :\n\tOperator type: MatMul Node name: mm Node index: 0\n\tREASON : Cannot get shape",
            "Unsupported nodes in QNN EP: { name: erf, type: Erf }",
            "Unsupported nodes in QNN EP: { name: mm, type: MatMul }",
            " Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2\n  MatMul (mm)\n  Erf (erf)\n",
            " Node(s) placed on [QNNExecutionProvider]. Number of nodes: 3",
            "Invalid HTP architecture: 99",
        ]
        .map(String::from)
        .to_vec();
        let log = CompileLog::parse(&msgs);
        assert_eq!(
            log.refused,
            vec!["MatMul mm (Cannot get shape)", "Erf erf (unsupported op)"]
        );
        assert_eq!(log.on_cpu, vec!["MatMul (mm)", "Erf (erf)"]);
        assert_eq!(log.on_qnn, 3);
        assert_eq!(
            log.interface.as_deref(),
            Some("HTP_QTI_AISW interface 2.40.0")
        );
        assert_eq!(log.build.as_deref(), Some("v2.51.0.260929181845"));
        assert_eq!(log.invalid, vec!["Invalid HTP architecture: 99"]);
        let line = fallback_line(
            &log,
            &["sequence_length (of input_ids)".into()],
            QnnBackend::Htp,
        );
        assert_eq!(line, "--ep qnn: the graph does not compile entirely on QNN htp: 2 node(s): MatMul mm (Cannot get shape), Erf erf (unsupported op) would fall back to the CPU; QNN htp needs static shapes: fix the symbolic axes sequence_length (of input_ids) (scripts/export-onnx.sh --static, docs/qnn.md); --allow-cpu-fallback runs it anyway, marked partial NPU");
        assert!(check_build(&log, Path::new("/q")).is_ok());
        let other = CompileLog {
            build: Some("v2.45.0.1".into()),
            ..log
        };
        assert!(check_build(&other, Path::new("/q"))
            .unwrap_err()
            .to_string()
            .contains("pinned to v2.51.0"));
    }
}
