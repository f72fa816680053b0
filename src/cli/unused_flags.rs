//! Flags the chosen device or a manifest would not use (issue 38): refused, never ignored.

use std::path::Path;

use super::common::usage;

/// The device flags given on the command line.
pub struct Given<'a> {
    pub onnx: bool,
    pub sim: bool,
    pub device: bool,
    pub ep: Option<&'a str>,
    pub ep_option: Option<&'a str>,
    pub cache_len: Option<usize>,
    pub prefill_len: Option<usize>,
    pub sim_manifest: Option<&'a Path>,
}

/// Flags the chosen device or a manifest would not use are refused, never ignored (issue
/// 38): the run's provenance records the command line, so it must hold what ran.
pub fn check(g: &Given) -> anyhow::Result<()> {
    if !g.onnx {
        if let Some(ep) = g.ep {
            return Err(usage(format!(
                "--ep {ep}: an execution provider applies to --onnx DIR only; drop it or add --onnx"
            )));
        }
        if let Some(o) = g.ep_option {
            return Err(usage(format!(
                "--ep-option {o}: applies to --onnx DIR only; drop it or add --onnx"
            )));
        }
    }
    if !g.sim {
        for (value, flag) in [
            (g.cache_len, "--cache-len"),
            (g.prefill_len, "--prefill-len"),
        ] {
            if let Some(n) = value {
                return Err(usage(format!(
                    "{flag} {n}: applies to the Hailo emulator (--sim) only; {}",
                    if g.device {
                        "ane-sim takes --max-ctx and --max-query"
                    } else {
                        "the device declares its own geometry, drop it"
                    }
                )));
            }
        }
    }
    let Some(path) = g.sim_manifest else {
        return Ok(());
    };
    // an unreadable manifest is the device's to report, with its own message
    let Ok(m) = kvprobe_npu::contract::manifest::read(path) else {
        return Ok(());
    };
    let at = path.display();
    for (given, recorded, flag, key) in [
        (g.cache_len, m.cache_len, "--cache-len", "cache_len"),
        (g.prefill_len, m.prefill_len, "--prefill-len", "prefill_len"),
    ] {
        if let Some(n) = given.filter(|&n| n != recorded) {
            return Err(usage(format!(
                "{flag} {n}: the manifest {at} sets {key} {recorded} and reproduces its run with it; drop {flag}"
            )));
        }
    }
    // `--fault` beside a manifest is not refused: on both emulators it replaces the manifest's
    // faults (a reproducer's hypothesis on a device's description; the manifest the run writes
    // records them)
    Ok(())
}
