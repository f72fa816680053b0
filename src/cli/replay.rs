//! The emulator a diagnosis replays its hypotheses on (issue 34): the device flags of this run
//! with the hypothesis as the only fault. The probes crate sees only the [`Replayer`] trait.

use std::sync::Arc;

use kvprobe_npu::contract::faults::FaultTable;
use kvprobe_npu::Device;
use kvprobe_probes::diagnose::replay::Replayer;
use kvprobe_reference::Model;

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
    /// A replayer for an emulator run (`--sim`, `--device ane-sim`) without a manifest; `None`
    /// for hardware, ONNX Runtime and manifest runs (their replay needs the device's own
    /// description turned into an emulator, not built yet).
    pub fn for_run(args: &DeviceArgs, model: &Arc<Model>, argv: &[String]) -> Option<Self> {
        if args.sim_manifest.is_some() || args.hef.is_some() || args.onnx.is_some() {
            return None;
        }
        let table = if args.device.is_some() {
            kvprobe_npu::ane::FAMILY.faults
        } else if args.sim {
            kvprobe_npu::sim::FAMILY.faults
        } else {
            return None;
        };
        let mut args = args.clone();
        let left_out = std::mem::take(&mut args.leave_out);
        args.faults.clear();
        args.out = None;
        Some(EmulatorReplay {
            args,
            model: model.clone(),
            table,
            left_out,
            argv: argv.to_vec(),
        })
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
        reproducer_argv(&self.argv, fault, steps)
    }
}

/// `kvprobe greedy` with this run's flags minus the faults and outputs, plus `fault` and
/// `steps`.
pub fn reproducer_argv(argv: &[String], fault: &str, steps: usize) -> Vec<String> {
    let mut out = vec!["kvprobe".to_string()];
    let mut it = argv.iter().skip(1);
    let mut subcommand_seen = false;
    while let Some(a) = it.next() {
        if !subcommand_seen && !a.starts_with('-') {
            subcommand_seen = true;
            out.push("greedy".into());
            continue;
        }
        let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
        if DROPPED_WITH_VALUE.contains(&flag) {
            if !a.contains('=') {
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
            reproducer_argv(&argv, "tbt-position=+1", 8),
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
}
