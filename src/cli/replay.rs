//! The emulator a diagnosis replays its hypotheses on (issue 34): the device flags of this run
//! with the hypothesis as the only fault. The probes crate sees only the [`Replayer`] trait.

use std::sync::Arc;

use kvprobe_npu::contract::faults::FaultTable;
use kvprobe_npu::Device;
use kvprobe_probes::diagnose::replay::Replayer;
use kvprobe_reference::Model;
use kvprobe_schema::SimManifest;

use super::device_args::{Backend, DeviceArgs};

/// Flags of this run that a reproducer leaves out (they take a value): the faults under test,
/// the output folder, the step count (set again), a manifest (whose faults would win).
const DROPPED_WITH_VALUE: &[&str] = &[
    "--fault",
    "--out",
    "--steps",
    "--sim-manifest",
    "--leave-out",
];
/// Flags without a value it leaves out.
const DROPPED: &[&str] = &["--force", "--json", "--all-probes", "--stage-only"];

pub struct EmulatorReplay {
    args: DeviceArgs,
    model: Arc<Model>,
    table: FaultTable,
    /// Faults the hypothesis set leaves out (`--leave-out`).
    left_out: Vec<String>,
    /// argv of this run (the reproducer is built from it).
    argv: Vec<String>,
    /// A manifest run's device as flags (the reproducer drops `--sim-manifest`).
    flags: Vec<String>,
}

// by hand: the model has no Debug
impl std::fmt::Debug for EmulatorReplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatorReplay")
            .field("args", &self.args)
            .finish_non_exhaustive()
    }
}

impl EmulatorReplay {
    /// A replayer for an emulator run (`--sim`, `--device ane-sim`), with or without a
    /// manifest; `None` for hardware, ONNX Runtime and OpenVINO runs (their replay needs the
    /// device's own description turned into an emulator, not built yet) and for a manifest
    /// whose recorded compile the emulator no longer rebuilds ([`manifest_flags`]).
    pub fn for_run(args: &DeviceArgs, model: &Arc<Model>, argv: &[String]) -> Option<Self> {
        if args.hef.is_some() || args.onnx.is_some() || args.openvino.is_some() {
            return None;
        }
        let mut args = args.clone();
        let left_out = std::mem::take(&mut args.leave_out);
        args.faults.clear();
        args.out = None;
        let mut flags = Vec::new();
        if let Some(path) = args.sim_manifest.take() {
            let m = kvprobe_npu::contract::manifest::read(&path).ok()?;
            flags = manifest_flags(&m, &mut args)?;
            if !rebuilds_manifest(&args, model, &m) {
                return None;
            }
        }
        let table = if args.device.is_some() {
            kvprobe_npu::ane::FAMILY.faults
        } else if args.sim {
            kvprobe_npu::sim::FAMILY.faults
        } else {
            return None;
        };
        Some(EmulatorReplay {
            args,
            model: model.clone(),
            table,
            left_out,
            argv: argv.to_vec(),
            flags,
        })
    }
}

/// A manifest's device as the flags that build it (set on `args` and returned for the
/// reproducer, which drops `--sim-manifest`): its faults give way to the hypothesis, as a
/// `--sim` run's `--fault` does. `None` for a device or a key these flags cannot say.
fn manifest_flags(m: &SimManifest, args: &mut DeviceArgs) -> Option<Vec<String>> {
    let (l, p) = (m.cache_len.to_string(), m.prefill_len.to_string());
    match m.device.as_str() {
        "ane-sim" => {
            args.max_ctx = Some(m.cache_len);
            args.max_query = Some(m.prefill_len);
            Some(vec!["--max-ctx".into(), l, "--max-query".into(), p])
        }
        "hailo-sim" => {
            args.cache_len = Some(m.cache_len);
            args.prefill_len = Some(m.prefill_len);
            let mut flags = vec!["--cache-len".to_string(), l, "--prefill-len".into(), p];
            (args.sim_quant, args.sim_cache_bits) = match m.cache_quant.as_str() {
                "uint8" => (None, None),
                "uint16" => (None, Some(16)),
                "none" => (Some("none".into()), None),
                _ => return None,
            };
            if let Some(q) = &args.sim_quant {
                flags.extend(["--sim-quant".into(), q.clone()]);
            }
            if let Some(b) = args.sim_cache_bits {
                flags.extend(["--sim-cache-bits".into(), b.to_string()]);
            }
            args.sim_cache = Some(m.cache_heads.clone());
            args.sim_weights = Some(m.weights.clone());
            args.sim_rope_theta = Some(m.rope_theta.clone());
            args.sim_taps = m.taps;
            flags.extend(["--sim-cache".into(), m.cache_heads.clone()]);
            flags.extend(["--sim-weights".into(), m.weights.clone()]);
            flags.extend(["--sim-rope-theta".into(), m.rope_theta.clone()]);
            if m.taps {
                flags.push("--sim-taps".into());
            }
            Some(flags)
        }
        _ => None,
    }
}

/// Whether the flags rebuild the manifest's compile: the Hailo emulator recalibrates the quant
/// infos a manifest records, so a manifest of another version (or edited) is not replayed
/// rather than replayed on quant infos its device never had. ane-sim records no compile.
fn rebuilds_manifest(args: &DeviceArgs, model: &Arc<Model>, m: &SimManifest) -> bool {
    if m.device != "hailo-sim" {
        return true;
    }
    match args.open_device(model) {
        Ok(Backend::Sim(d)) => d.manifest().quant == m.quant,
        _ => false,
    }
}

impl Replayer for EmulatorReplay {
    fn table(&self) -> FaultTable {
        self.table
    }

    fn open(&self, fault: &str) -> kvprobe_npu::Result<Box<dyn Device>> {
        let mut args = self.args.clone();
        // "": the healthy hypothesis, the emulator without a fault
        args.faults = (!fault.is_empty())
            .then(|| fault.to_string())
            .into_iter()
            .collect();
        let backend = args
            .open_device(&self.model)
            .map_err(|e| kvprobe_npu::Error::Device(e.to_string()))?;
        Ok(match backend {
            Backend::Sim(d) => d,
            Backend::Ane(d) => d,
            Backend::Onnx(d) => d,
            Backend::OpenVino(d) => d,
            #[cfg(feature = "hailo")]
            Backend::Hailo(_) => {
                return Err(kvprobe_npu::Error::Device(
                    "a replay never opens hardware".into(),
                ))
            }
        })
    }

    fn leaves_out(&self, fault: &str) -> bool {
        self.left_out.iter().any(|f| f == fault)
    }

    fn command(&self, fault: &str, steps: usize) -> Vec<String> {
        reproducer_argv(&self.argv, &self.flags, fault, steps)
    }
}

/// `kvprobe greedy` with this run's flags minus the faults and outputs, plus `device` (a
/// manifest's device as flags, which replace the same flags of the run), `fault` and `steps`.
pub fn reproducer_argv(
    argv: &[String],
    device: &[String],
    fault: &str,
    steps: usize,
) -> Vec<String> {
    let mut out = vec!["kvprobe".to_string()];
    // a flag of `device` takes a value when the next item is not a flag
    let given = |flag: &str| -> Option<bool> {
        let at = device.iter().position(|d| d == flag)?;
        Some(device.get(at + 1).is_some_and(|v| !v.starts_with("--")))
    };
    let mut it = argv.iter().skip(1);
    let mut subcommand_seen = false;
    while let Some(a) = it.next() {
        if !subcommand_seen && !a.starts_with('-') {
            subcommand_seen = true;
            out.push("greedy".into());
            out.extend(device.iter().cloned());
            continue;
        }
        let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
        let takes_value = match given(flag) {
            Some(v) => Some(v),
            None => DROPPED_WITH_VALUE.contains(&flag).then_some(true),
        };
        if let Some(v) = takes_value {
            if v && !a.contains('=') {
                it.next();
            }
            continue;
        }
        if DROPPED.contains(&a.as_str()) {
            continue;
        }
        out.push(a.clone());
    }
    out.extend([
        "--fault".into(),
        fault.into(),
        "--steps".into(),
        steps.to_string(),
    ]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reproducer_keeps_device_and_prompt_and_swaps_faults_and_outputs() {
        let argv: Vec<String> = [
            "/x/kvprobe",
            "diagnose",
            "--sim",
            "--cache-len",
            "64",
            "--fault",
            "kv-swap",
            "--fault=mask=left-valid",
            "--out",
            "o",
            "--force",
            "--prompt",
            "Hi there",
            "--steps",
            "8",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            reproducer_argv(&argv, &[], "tbt-position=+1", 8),
            [
                "kvprobe",
                "greedy",
                "--sim",
                "--cache-len",
                "64",
                "--prompt",
                "Hi there",
                "--fault",
                "tbt-position=+1",
                "--steps",
                "8"
            ]
        );
    }

    fn strings(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_manifest_run_reproducer_spells_its_device_as_flags_once() {
        let argv = strings(&[
            "kvprobe",
            "diagnose",
            "--sim",
            "--cache-len=24",
            "--sim-manifest",
            "m.json",
            "--ids",
            "1,2",
        ]);
        let device = strings(&["--cache-len", "24", "--prefill-len", "8", "--sim-taps"]);
        assert_eq!(
            reproducer_argv(&argv, &device, "kv-swap", 4),
            [
                "kvprobe",
                "greedy",
                "--cache-len",
                "24",
                "--prefill-len",
                "8",
                "--sim-taps",
                "--sim",
                "--ids",
                "1,2",
                "--fault",
                "kv-swap",
                "--steps",
                "4"
            ]
        );
    }
}
