//! `--out DIR`: refused early when unusable, written to a temporary sibling and renamed into place
//! only when complete, so a failed run leaves nothing behind.

use std::path::{Path, PathBuf};

use kvprobe_reports::NamedArray;
use kvprobe_schema::Results;

use crate::cli::common::usage;
use crate::cli::device_args::Backend;

pub fn check_out_dir(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.exists() {
        if !out.is_dir() {
            return Err(usage(format!(
                "{}: exists and is not a folder; choose another --out",
                out.display()
            )));
        }
        let non_empty = std::fs::read_dir(out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true);
        if non_empty && !force {
            return Err(usage(format!(
                "{}: folder exists and is not empty; pass --force to replace it or choose another --out",
                out.display()
            )));
        }
    }
    // Missing parents are created only once the run has succeeded (write_out), so a failed run
    // leaves nothing behind; here we only check that they can be.
    let parent = parent_of(out);
    let existing = parent
        .ancestors()
        .find(|a| a.as_os_str().is_empty() || a.exists());
    if let Some(a) = existing {
        if !a.as_os_str().is_empty() && !a.is_dir() {
            return Err(usage(format!(
                "{}: is not a folder, so {} cannot be created; choose another --out",
                a.display(),
                out.display()
            )));
        }
    }
    Ok(())
}

fn parent_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Artefacts into a temporary sibling folder, renamed into place only when complete.
pub fn write_out(
    out: &Path,
    force: bool,
    results: &Results,
    arrays: &[NamedArray],
    backend: &Backend,
) -> anyhow::Result<()> {
    check_out_dir(out, force)?;
    std::fs::create_dir_all(parent_of(out)).map_err(|e| {
        usage(format!(
            "{}: cannot create its parent folder ({e}); choose another --out",
            out.display()
        ))
    })?;
    let tmp = tempfile::Builder::new()
        .prefix(".kvprobe-out-")
        .tempdir_in(parent_of(out))
        .map_err(|e| {
            usage(format!(
                "{}: cannot create a folder next to it ({e}); choose another --out",
                out.display()
            ))
        })?;
    kvprobe_reports::write_artifacts(results, arrays, tmp.path())
        .map_err(|e| usage(format!("{}: {e}", out.display())))?;
    if let Some(sim) = backend.sim() {
        sim.write_manifest(&tmp.path().join("sim-manifest.json"))
            .map_err(crate::cli::device_args::npu_error)?;
    }
    if let crate::cli::device_args::Backend::Ane(ane) = backend {
        ane.write_manifest(&tmp.path().join("sim-manifest.json"))
            .map_err(crate::cli::device_args::npu_error)?;
    }
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| {
            usage(format!(
                "{}: cannot replace it ({e}); choose another --out",
                out.display()
            ))
        })?;
    }
    let tmp_path = tmp.keep();
    std::fs::rename(&tmp_path, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp_path);
        usage(format!(
            "{}: cannot move the artefacts into place ({e})",
            out.display()
        ))
    })?;
    Ok(())
}
