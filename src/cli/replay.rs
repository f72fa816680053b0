//! The emulator a diagnosis replays its hypotheses on (issue 34): the device flags of this run
//! with the hypothesis as the only fault, or the Hailo emulator a manifest or a HEF describes
//! with the hypothesis replacing its faults. The probes crate sees only the [`Replayer`] trait.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvprobe_npu::contract::faults::FaultTable;
use kvprobe_npu::sim::{SimDevice, SimOptions};
use kvprobe_npu::Device;
use kvprobe_probes::diagnose::replay::Replayer;
use kvprobe_reference::Model;
use kvprobe_schema::SimManifest;

use super::device_args::{Backend, DeviceArgs};

/// Flags of this run that a reproducer leaves out (they take a value): the faults under test,
/// the output folder, the step count (set again), a manifest (whose faults would win), a HEF
/// (the reproducer runs the emulator it describes).
const DROPPED_WITH_VALUE: &[&str] = &[
    "--fault",
    "--out",
    "--steps",
    "--sim-manifest",
    "--leave-out",
    "--hef",
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
    /// The reproducer's device flags, which replace the same flags of the run: an ane-sim
    /// manifest's settings, a Hailo manifest, the manifest a HEF's description is written to.
    flags: Vec<String>,
    /// The Hailo emulator a `--sim-manifest` file or a `--hef` describes (and the file its
    /// errors name): replays keep its quant infos and replace its faults with the hypothesis.
    described: Option<(SimManifest, PathBuf)>,
    /// What the reproducer runs first: `inspect --emit-sim` for a HEF.
    setup: Vec<String>,
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
    /// A replayer for an emulator run (`--sim`, `--device ane-sim`, with or without a
    /// manifest) and for a `--hef` run (the emulator its description builds, what `inspect
    /// --emit-sim` writes); `None` for ONNX Runtime and OpenVINO runs (their replay needs the
    /// device's own description turned into an emulator, not built yet) and for a manifest or
    /// HEF that cannot be read or described. `ids`: the prompt's tokens as the device ran them
    /// (a HEF's tokenizer encodes a text prompt unlike the emulator's model, so a HEF's
    /// reproducer gives them as `--ids`).
    pub fn for_run(
        args: &DeviceArgs,
        model: &Arc<Model>,
        argv: &[String],
        ids: &[u32],
    ) -> Option<Self> {
        if args.onnx.is_some() || args.openvino.is_some() {
            return None;
        }
        let mut args = args.clone();
        let left_out = std::mem::take(&mut args.leave_out);
        args.faults.clear();
        args.out = None;
        let (mut flags, mut described, mut setup) = (Vec::new(), None, Vec::new());
        if let Some(hef) = args.hef.take() {
            let m = hef_description(&hef, model)?;
            let emitted = emitted_name(&hef);
            setup = inspect_argv(&hef, args.model.as_deref()?, &emitted);
            flags = vec!["--sim".into(), "--sim-manifest".into(), emitted];
            flags.extend(["--ids".into(), join_ids(ids)]);
            described = Some((m, hef));
        } else if let Some(path) = args.sim_manifest.take() {
            let m = kvprobe_npu::contract::manifest::read(&path).ok()?;
            if m.device == "hailo-sim" {
                flags = vec!["--sim-manifest".into(), path.display().to_string()];
                described = Some((m, path));
            } else {
                flags = ane_manifest_flags(&m, &mut args)?;
            }
        }
        let table = if described.is_some() || args.sim {
            kvprobe_npu::sim::FAMILY.faults
        } else if args.device.is_some() {
            kvprobe_npu::ane::FAMILY.faults
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
            described,
            setup,
        })
    }

    /// What the reproducer runs before its command (empty for an emulator run).
    pub fn setup(&self) -> Vec<String> {
        self.setup.clone()
    }
}

/// The HEF's description as the Hailo emulator's manifest (`inspect --emit-sim`'s), made for
/// `model`; `None` when the HEF cannot be read or described (the run itself says why).
fn hef_description(hef: &Path, model: &Model) -> Option<SimManifest> {
    let h = kvprobe_npu::hef::Hef::open(hef).ok()?;
    let identity = kvprobe_npu::sim::manifest::model_identity(model).ok()?;
    kvprobe_npu::hef::describe::to_sim_manifest(&h, identity).ok()
}

/// The file a HEF's reproducer writes its description to: `<hef stem>-sim.json`.
fn emitted_name(hef: &Path) -> String {
    let stem = hef
        .file_stem()
        .map_or("hef".into(), |s| s.to_string_lossy());
    format!("{stem}-sim.json")
}

/// `kvprobe inspect HEF --model MODEL --emit-sim FILE`.
fn inspect_argv(hef: &Path, model: &Path, emitted: &str) -> Vec<String> {
    [
        "kvprobe",
        "inspect",
        &hef.display().to_string(),
        "--model",
        &model.display().to_string(),
        "--emit-sim",
        emitted,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// An ane-sim manifest's device as the flags that build it (set on `args` and returned for the
/// reproducer, which drops `--sim-manifest`): ane-sim records no compile, so its flags rebuild
/// it, and its faults give way to the hypothesis as a run's `--fault` does. `None` for a
/// device these flags cannot say.
fn ane_manifest_flags(m: &SimManifest, args: &mut DeviceArgs) -> Option<Vec<String>> {
    if m.device != "ane-sim" {
        return None;
    }
    args.max_ctx = Some(m.cache_len);
    args.max_query = Some(m.prefill_len);
    Some(vec![
        "--max-ctx".into(),
        m.cache_len.to_string(),
        "--max-query".into(),
        m.prefill_len.to_string(),
    ])
}

impl Replayer for EmulatorReplay {
    fn table(&self) -> FaultTable {
        self.table
    }

    fn open(&self, fault: &str) -> kvprobe_npu::Result<Box<dyn Device>> {
        // "": the healthy hypothesis, the emulator without a fault
        let faults: Vec<String> = (!fault.is_empty())
            .then(|| fault.to_string())
            .into_iter()
            .collect();
        if let Some(described) = &self.described {
            let opts = SimOptions {
                manifest_value: Some(described.clone()),
                faults,
                faults_replace_manifest: true,
                ..SimOptions::default()
            };
            return Ok(Box::new(SimDevice::new(self.model.clone(), opts)?));
        }
        let mut args = self.args.clone();
        args.faults = faults;
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

    fn capacity_command(&self, fault: &str) -> Vec<String> {
        probe_argv(&self.argv, &self.flags, "capacity", fault, None)
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
    probe_argv(argv, device, "greedy", fault, Some(steps))
}

/// [`reproducer_argv`] for the probe `probe`, with `--steps` only when `steps` is given.
fn probe_argv(
    argv: &[String],
    device: &[String],
    probe: &str,
    fault: &str,
    steps: Option<usize>,
) -> Vec<String> {
    let mut out = vec!["kvprobe".to_string()];
    // a flag of `device` takes a value when the next item is not a flag
    let given = |flag: &str| -> Option<bool> {
        // the prompt's ids replace its text
        let flag = if flag == "--prompt" { "--ids" } else { flag };
        let at = device.iter().position(|d| d == flag)?;
        Some(device.get(at + 1).is_some_and(|v| !v.starts_with("--")))
    };
    let mut it = argv.iter().skip(1);
    let mut subcommand_seen = false;
    while let Some(a) = it.next() {
        if !subcommand_seen && !a.starts_with('-') {
            subcommand_seen = true;
            out.push(probe.into());
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
    out.extend(["--fault".into(), fault.into()]);
    if let Some(steps) = steps {
        out.extend(["--steps".into(), steps.to_string()]);
    }
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

    /// A `--hef` run's reproducer runs the emulator the HEF describes on the device's token ids:
    /// the HEF and the text prompt (which the HEF's tokenizer encoded) give way.
    #[test]
    fn a_hef_run_reproducer_runs_the_described_emulator_on_the_device_ids() {
        let argv = strings(&[
            "kvprobe", "diagnose", "--hef", "m.hef", "--model", "llama", "--prompt", "Hi there",
        ]);
        let device = strings(&["--sim", "--sim-manifest", "m-sim.json", "--ids", "7,8"]);
        assert_eq!(
            reproducer_argv(&argv, &device, "mask=left-valid", 4),
            [
                "kvprobe",
                "greedy",
                "--sim",
                "--sim-manifest",
                "m-sim.json",
                "--ids",
                "7,8",
                "--model",
                "llama",
                "--fault",
                "mask=left-valid",
                "--steps",
                "4"
            ]
        );
        assert_eq!(emitted_name(Path::new("/x/m.hef")), "m-sim.json");
    }
}
