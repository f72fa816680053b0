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
        if non_empty {
            check_replaceable(out)?;
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

/// `--force` replaces an earlier run's folder, never anything else: not a folder without the
/// results.json a run writes, and never the working folder or one of its parents (replacing
/// `--out .` used to delete the working folder's files).
fn check_replaceable(out: &Path) -> anyhow::Result<()> {
    let real = out.canonicalize().map_err(|e| {
        usage(format!(
            "{}: cannot resolve it ({e}); choose another --out",
            out.display()
        ))
    })?;
    let cwd = std::env::current_dir().and_then(|d| d.canonicalize());
    if cwd.as_ref().is_ok_and(|cwd| cwd.starts_with(&real)) || real.parent().is_none() {
        return Err(usage(format!(
            "{}: is the working folder or one of its parents; --force never replaces it, choose a new --out folder",
            out.display()
        )));
    }
    if !real.join(kvprobe_reports::RESULTS_JSON).is_file() {
        return Err(usage(format!(
            "{}: not an earlier kvprobe output folder (no {}); --force replaces only those, choose a new --out folder",
            out.display(),
            kvprobe_reports::RESULTS_JSON
        )));
    }
    Ok(())
}

/// The folder that holds `out` (resolved through links and `..` when `out` exists, so the
/// temporary folder is never made inside the folder it replaces).
fn parent_of(out: &Path) -> PathBuf {
    if let Some(parent) = out
        .canonicalize()
        .ok()
        .and_then(|r| r.parent().map(Path::to_path_buf))
    {
        return parent;
    }
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
    // the earlier run is moved aside, not deleted, until the new one is in place
    let old = if out.exists() {
        let aside = tempfile::Builder::new()
            .prefix(".kvprobe-old-")
            .tempdir_in(parent_of(out))
            .map_err(|e| {
                usage(format!(
                    "{}: cannot replace it ({e}); choose another --out",
                    out.display()
                ))
            })?
            .keep();
        let moved = aside.join("run");
        std::fs::rename(out, &moved).map_err(|e| {
            let _ = std::fs::remove_dir(&aside);
            usage(format!(
                "{}: cannot replace it ({e}); choose another --out",
                out.display()
            ))
        })?;
        Some((aside, moved))
    } else {
        None
    };
    let tmp_path = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp_path, out) {
        let _ = std::fs::remove_dir_all(&tmp_path);
        if let Some((_, moved)) = &old {
            let _ = std::fs::rename(moved, out);
        }
        return Err(usage(format!(
            "{}: cannot move the artefacts into place ({e})",
            out.display()
        )));
    }
    if let Some((aside, _)) = old {
        let _ = std::fs::remove_dir_all(aside);
    }
    Ok(())
}
