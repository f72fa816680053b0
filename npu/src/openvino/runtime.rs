//! OpenVINO's runtime (feature `openvino`): libopenvino_c loaded at run time, the IR read, its
//! inputs checked against what openvino.genai's stateful pipeline feeds, the model compiled for
//! the device with every configuration key, and one infer request whose variables hold the K/V.

use std::path::{Path, PathBuf};

use super::ffi::{self, Compiled, Core, Request};
use super::host;
use crate::{Error, Result};

/// The OpenVINO release scripts/fetch-openvino.sh fetches.
pub const OV_VERSION: &str = "2026.4.1";
const SONAME: &str = "2641";

/// The inputs a stateful LLM IR must have (openvino.genai feeds exactly these).
pub const INPUTS: [&str; 4] = ["input_ids", "attention_mask", "position_ids", "beam_idx"];

/// Where libopenvino_c is looked for: `KVPROBE_OPENVINO_LIB`, else
/// `.cache/openvino/<ver>/libopenvino_c.so.<soname>` in the working folder or above the
/// executable (target/<profile>/kvprobe sits two levels under the checkout).
pub fn library_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KVPROBE_OPENVINO_LIB") {
        return PathBuf::from(p);
    }
    let rel = PathBuf::from(".cache/openvino")
        .join(OV_VERSION)
        .join(format!("libopenvino_c.so.{SONAME}"));
    crate::cache_lookup::near_checkout(&rel, Path::is_file).unwrap_or(rel)
}

fn device(msg: String) -> Error {
    Error::Device(crate::error::one_line(&msg))
}

/// Loads the library once per process (openvino-sys keeps the first it loads).
fn load() -> Result<PathBuf> {
    static LOADED: std::sync::OnceLock<std::result::Result<PathBuf, String>> =
        std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let lib = library_path();
            if !lib.is_file() {
                return Err(format!(
                    "{}: libopenvino_c not found; run scripts/fetch-openvino.sh (or set KVPROBE_OPENVINO_LIB to an OpenVINO {OV_VERSION} libopenvino_c)",
                    lib.display()
                ));
            }
            let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
            ffi::load(&lib).map(|()| lib.clone()).map_err(|e| {
                format!(
                    "{}: cannot load OpenVINO ({e}); scripts/fetch-openvino.sh fetches {OV_VERSION}",
                    lib.display()
                )
            })
        })
        .clone()
        .map_err(device)
}

/// The loaded library's build (`2026.4.1-22982-…`).
pub fn loaded_version() -> String {
    match load().and_then(|_| ffi::version().map_err(device)) {
        Ok(v) => v,
        Err(e) => format!("unknown ({e})"),
    }
}

/// The device's full name as the plugin reports it.
pub fn device_name(target: super::OvTarget) -> String {
    let name = Core::new().and_then(|c| c.property(target.name(), "FULL_DEVICE_NAME"));
    name.unwrap_or_else(|e| format!("unknown ({})", crate::error::one_line(&e)))
}

pub struct Runtime {
    compiled: Compiled,
    request: Request,
    /// Whether the request has run since it was made (a fresh one has its initial states).
    used: bool,
    /// [`EFFECTIVE`] as the plugin resolved them (the keys it does not report are left out).
    pub effective: Vec<(String, String)>,
}

/// Properties that set the arithmetic a CPU-plugin run computes with, whose defaults depend on
/// the CPU (bf16 and a u8 K/V cache on one with bf16 units; int8 activations for compressed
/// weights): read back from the compiled model so every output says what ran.
pub const EFFECTIVE: [&str; 3] = [
    "INFERENCE_PRECISION_HINT",
    "KV_CACHE_PRECISION",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
];

impl Runtime {
    /// Reads `xml`, checks it is a stateful LLM IR, compiles it on `target` with `config`.
    pub fn open(
        xml: &Path,
        target: super::OvTarget,
        config: &[(String, String)],
    ) -> Result<Runtime> {
        let lib = load()?;
        let core = Core::new().map_err(device)?;
        let model = core
            .read_model(xml, &xml.with_extension("bin"))
            .map_err(|e| Error::Io {
                path: xml.to_path_buf(),
                detail: crate::error::one_line(&format!(
                    "OpenVINO cannot read this IR ({e}); pass a folder with openvino_model.xml and .bin (scripts/export-openvino.sh)"
                )),
            })?;
        check_io(
            &model.input_names().map_err(device)?,
            &model.output_names().map_err(device)?,
            xml,
        )?;
        let name = target.name();
        let available = core.available_devices().map_err(device)?;
        // NPUW runs the NPU pipeline without an NPU (its partitions go to NPUW_DEVICES): the
        // NPU plugin must be in the library folder, an NPU need not be present
        let npu_plugin = lib
            .parent()
            .is_some_and(|d| d.join("libopenvino_intel_npu_plugin.so").is_file());
        let present = available.iter().any(|d| d.starts_with(name))
            || (target == super::OvTarget::Npu && npu_plugin);
        if !present {
            return Err(device(format!(
                "OpenVINO has no {name} device here (it lists {}); use --ov-device CPU, or NPU (NPUW on the CPU)",
                available.join(", ")
            )));
        }
        let compiled = core
            .compile(&lib, &model, name, config)
            .map_err(|e| compile_error(name, config, &e))?;
        let request = compiled.request().map_err(device)?;
        let mut effective: Vec<(String, String)> = EFFECTIVE
            .iter()
            .filter_map(|k| Some((k.to_string(), compiled.property(k).ok()?)))
            .collect();
        if target == super::OvTarget::Npu && npuw_on_cpu(config) {
            effective.extend(npuw_cpu_partitions(config, |k| {
                core.property("CPU", k).ok()
            }));
        }
        Ok(Runtime {
            compiled,
            request,
            used: false,
            effective,
        })
    }

    /// A new conversation: a fresh request (its variables start at their initial values, as
    /// `reset_state()` sets them; the 2026.4 C API has no `reset_state`).
    pub fn reset(&mut self) -> Result<()> {
        if self.used {
            self.request = self.compiled.request().map_err(device)?;
            self.used = false;
        }
        Ok(())
    }

    /// One run of `ids` at `pos` under `mask` (healthy: `total − q … total − 1` and `[1, total]`,
    /// `faults::feed`); every row's logits.
    pub fn run(&mut self, ids: &[u32], mut mask: Vec<i64>, mut pos: Vec<i64>) -> Result<Vec<f32>> {
        let mut ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let mut beam = host::BEAM_IDX;
        // the tensors wrap these buffers, which live until the run below returns
        let r = &mut self.request;
        r.set("input_ids", &mut ids, true).map_err(device)?;
        r.set("attention_mask", &mut mask, true).map_err(device)?;
        r.set("position_ids", &mut pos, true).map_err(device)?;
        r.set("beam_idx", &mut beam, false).map_err(device)?;
        self.used = true;
        r.infer().map_err(device)?;
        r.output_f32("logits").map_err(device)
    }
}

/// Whether NPUW's partitions include the CPU (`NPUW_DEVICES`, kvprobe's default `CPU`).
fn npuw_on_cpu(config: &[(String, String)]) -> bool {
    config
        .iter()
        .any(|(k, v)| k == "NPUW_DEVICES" && v.split(',').any(|d| d.trim() == "CPU"))
}

/// The arithmetic NPUW's CPU partitions compute with, which the NPU plugin does not report: the
/// NPU compile's own key where the user set one (NPUW passes it on), else the CPU plugin's
/// default (`cpu_default`), which follows the host. Measured 2026-12-04 on an AVX512_BF16 host: an
/// int4 IR on NPUW at the defaults met the int4-reading reference at 6.2e-4, with
/// INFERENCE_PRECISION_HINT=f32 at 1.4e-4, with DYNAMIC_QUANTIZATION_GROUP_SIZE=0 too at 2.4e-7.
/// The K/V cache is NPUW's own fp16 state (the matched reference models it), so the CPU plugin's
/// KV_CACHE_PRECISION is not among them.
fn npuw_cpu_partitions(
    config: &[(String, String)],
    cpu_default: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    [
        "INFERENCE_PRECISION_HINT",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE",
    ]
    .into_iter()
    .filter_map(|k| {
        let v = config
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .or_else(|| cpu_default(k))?;
        Some((k.to_string(), v))
    })
    .collect()
}

/// What the compiled model computes that the precision-matched reference does not model (bf16
/// or f16 arithmetic, a K/V cache below f32, int8 activations), with the keys that turn it off.
pub fn unmodelled(effective: &[(String, String)]) -> Option<String> {
    let get = |k: &str| {
        effective
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let mut said = Vec::new();
    let mut fix = Vec::new();
    if let Some(v) = get("INFERENCE_PRECISION_HINT").filter(|v| !v.contains("32")) {
        said.push(format!("{v} arithmetic"));
        fix.push("--ov-config INFERENCE_PRECISION_HINT=f32");
    }
    if let Some(v) = get("KV_CACHE_PRECISION").filter(|v| !v.contains("32")) {
        said.push(format!("a {v} K/V cache"));
        fix.push("--ov-config KV_CACHE_PRECISION=f32");
    }
    if let Some(v) = get("DYNAMIC_QUANTIZATION_GROUP_SIZE").filter(|v| *v != "0") {
        said.push(format!(
            "activations quantised to int8 in groups of {v} for compressed weights"
        ));
        fix.push("--ov-config DYNAMIC_QUANTIZATION_GROUP_SIZE=0");
    }
    (!said.is_empty()).then(|| {
        format!(
            "the plugin runs {}, which the precision-matched reference does not model; {} run it at the reference's precision",
            said.join(", "),
            fix.join(" ")
        )
    })
}

/// A compile error that names a configuration key: the plugin rejected the user's flag (exit 2);
/// anything else is the device's (exit 3).
fn compile_error(device_name: &str, config: &[(String, String)], e: &str) -> Error {
    match config.iter().find(|(k, _)| e.contains(k.as_str())) {
        Some((k, v)) => Error::BadOption {
            flag: format!("--ov-config {k}={v}"),
            detail: crate::error::one_line(&format!("the {device_name} plugin rejects it: {e}")),
        },
        None => device(format!("OpenVINO {e}")),
    }
}

/// The IR must take exactly openvino.genai's inputs (a `past_key_values.*` input means the
/// K/V were not made states) and give `logits`.
fn check_io(inputs: &[String], outputs: &[String], xml: &Path) -> Result<()> {
    let bad = |detail: String| Error::Io {
        path: xml.to_path_buf(),
        detail,
    };
    if let Some(p) = inputs.iter().find(|n| n.starts_with("past_key_values")) {
        return Err(bad(format!(
            "input `{p}`: the IR keeps its K/V as inputs, not as states; make it stateful (scripts/export-openvino.sh applies OpenVINO's make-stateful transformation)"
        )));
    }
    if let Some(missing) = INPUTS.iter().find(|i| !inputs.iter().any(|n| n == *i)) {
        return Err(bad(format!(
            "no input `{missing}` (it has {}); a stateful LLM IR takes {}",
            inputs.join(", "),
            INPUTS.join(", ")
        )));
    }
    if let Some(extra) = inputs.iter().find(|n| !INPUTS.contains(&n.as_str())) {
        return Err(bad(format!(
            "input `{extra}` is not one openvino.genai feeds ({}); kvprobe drives text LLM IRs only",
            INPUTS.join(", ")
        )));
    }
    if !outputs.iter().any(|o| o == "logits") {
        return Err(bad(format!(
            "no output `logits` (it has {}); a stateful LLM IR gives logits",
            outputs.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ir_inputs_are_genai_s_or_named() {
        let p = Path::new("m.xml");
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let ok = s(&INPUTS);
        assert!(check_io(&ok, &s(&["logits"]), p).is_ok());
        let mut stateless = ok.clone();
        stateless.push("past_key_values.0.key".into());
        let e = check_io(&stateless, &s(&["logits"]), p).unwrap_err();
        assert!(e.to_string().contains("not as states"), "{e}");
        let e = check_io(&ok[..3], &s(&["logits"]), p).unwrap_err();
        assert!(e.to_string().contains("no input `beam_idx`"), "{e}");
        let e = check_io(&ok, &s(&["hidden"]), p).unwrap_err();
        assert!(e.to_string().contains("no output `logits`"), "{e}");
        let cfg = vec![("NPUW_LLM_MAX_PROMPT_LEN".to_string(), "x".to_string())];
        let e = compile_error("NPU", &cfg, "compile: bad NPUW_LLM_MAX_PROMPT_LEN value");
        assert_eq!(e.exit_code(), 2, "{e}");
        assert_eq!(compile_error("NPU", &cfg, "out of memory").exit_code(), 3);
    }

    #[test]
    fn a_precision_below_the_reference_is_named_and_f32_is_silent() {
        let kv = |v: [&str; 3]| -> Vec<(String, String)> {
            EFFECTIVE
                .iter()
                .zip(v)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // what the 2026.4.1 CPU plugin reported by default on a CPU with AMX (2026-12-04)
        let n = unmodelled(&kv(["bf16", "u8", "32"])).expect("named");
        assert!(
            n.contains(
                "bf16 arithmetic, a u8 K/V cache, activations quantised to int8 in groups of 32"
            ),
            "{n}"
        );
        assert_eq!(unmodelled(&kv(["f32", "f32", "0"])), None);
        assert_eq!(unmodelled(&[]), None);
    }

    #[test]
    fn npuw_cpu_partitions_take_the_users_key_else_the_cpu_default() {
        let cfg = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(npuw_on_cpu(&cfg(&[("NPUW_DEVICES", "NPU,CPU")])));
        assert!(!npuw_on_cpu(&cfg(&[("NPUW_DEVICES", "NPU")])));
        // a host whose CPU plugin defaults to bf16 and int8 activations in groups of 32
        let host = |k: &str| {
            Some(
                if k == "INFERENCE_PRECISION_HINT" {
                    "bf16"
                } else {
                    "32"
                }
                .to_string(),
            )
        };
        let d = npuw_cpu_partitions(&cfg(&[("NPUW_DEVICES", "CPU")]), host);
        let n = unmodelled(&d).expect("named");
        assert!(
            n.contains("bf16 arithmetic") && n.contains("groups of 32"),
            "{n}"
        );
        assert!(!n.contains("KV_CACHE_PRECISION"), "{n}");
        let pinned = cfg(&[
            ("NPUW_DEVICES", "CPU"),
            ("INFERENCE_PRECISION_HINT", "f32"),
            ("DYNAMIC_QUANTIZATION_GROUP_SIZE", "0"),
        ]);
        assert_eq!(unmodelled(&npuw_cpu_partitions(&pinned, host)), None);
    }
}
